"""The one typed reader of mlmkit's JSON files: a dataclass's annotations checked field by field,
each refusal one line naming the file and the field."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from mlmkit.errors import BundleError, ConfigError
from mlmkit.typed import check_version, from_json, rule, to_json


@dataclass(frozen=True)
class Inner:
    rows: int
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Shape:
    kind: Literal["dense", "sparse"]
    dims: int = field(metadata=rule(lambda n: n >= 1, "a positive whole number"))
    scale: float = 1.0
    normalized: bool = False
    label: str | None = None
    inner: Inner | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    other: dict[str, Any] = field(default_factory=dict)


GOOD = {"kind": "dense", "dims": 8, "scale": 2, "inner": {"rows": 3, "names": ["a", "b"]}, "later": [1]}


def test_a_good_object_is_read_typed_and_written_back_as_read():
    s = from_json(Shape, GOOD, "x.json", fix="re-create it", rest="other")
    assert s.inner == Inner(3, ("a", "b")) and s.dims == 8 and s.scale == 2 and s.other == {"later": [1]}
    assert to_json(s, rest="other") == {**GOOD, "normalized": False, "label": None, "extra": {}, "counts": {},
                                        "inner": {"rows": 3, "names": ["a", "b"]}}


@pytest.mark.parametrize("change, field_named, said", [
    ({"dims": True}, "'dims'", "a positive whole number"),
    ({"dims": 0}, "'dims'", "a positive whole number"),
    ({"kind": "late"}, "'kind'", "one of 'dense', 'sparse'"),
    ({"scale": "2"}, "'scale'", "a number"),
    ({"label": 5}, "'label'", "a string or null"),
    ({"inner": {"rows": "3"}}, "'inner.rows'", "a whole number"),
    ({"inner": {"rows": 3, "names": [1]}}, "'inner.names'", "a list of strings"),
    ({"inner": []}, "'inner'", "an object or null"),
    ({"counts": {"long": 2, "short": "x"}}, "'counts.short'", "a whole number"),
])
def test_a_wrong_field_is_one_line_naming_the_file_and_the_field(change, field_named, said):
    with pytest.raises(BundleError) as e:
        from_json(Shape, {**GOOD, **change}, "dir/x.json", error=BundleError, fix="re-create it",
                  rest="other")
    assert "dir/x.json" in str(e.value) and field_named in str(e.value) and said in str(e.value)
    assert "\n" not in str(e.value) and e.value.hint == "re-create it"


def test_missing_and_unknown_fields_are_refused():
    with pytest.raises(ConfigError, match="it has no 'dims'"):
        from_json(Shape, {"kind": "dense"}, "x.json", fix="f")
    with pytest.raises(ConfigError, match="'later' is not a field"):
        from_json(Shape, GOOD, "x.json", fix="f")
    with pytest.raises(ConfigError, match="is not a JSON object"):
        from_json(Shape, [GOOD], "x.json", fix="f")


def test_another_format_version_is_refused_with_how_to_recreate_it():
    check_version({"format": 2}, "m.json", key="format", reads=2, what="an index", fix="f")
    with pytest.raises(ConfigError, match="an index of format 1; this mlmkit reads format 2") as e:
        check_version({"format": 1}, "m.json", key="format", reads=2, what="an index", fix="build it again")
    assert e.value.hint == "build it again"
