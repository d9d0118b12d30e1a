"""Model cards (mlmkit/rundir/cards.py): the front matter reads back as written, whatever the names hold
(hypothesis), and a run and data named with YAML syntax are named as they are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

YAML_TEXT = st.one_of(st.text(max_size=24),
                      st.sampled_from(["a: b", "- x", "--- ", "#c", "null", "yes", "~", "&a *a",
                                       "'q\"\\", "{x: 1}", "\u2028", "\x85", "\ufeff"]))
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=False),
                   YAML_TEXT)
NESTED = st.recursive(SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(YAML_TEXT, inner, max_size=3)),
                      max_leaves=10)


@settings(max_examples=150, deadline=None)
@given(value=NESTED)
def test_card_front_matter_is_read_back_as_written(value: Any) -> None:
    """YAML syntax in a label, run or file name is text, never structure (a card's front matter
    parsed to other values is an injection)."""
    import yaml

    from mlmkit.rundir.cards import yaml_lines

    assert yaml.safe_load("\n".join(yaml_lines({"root": value}))) == {"root": value}


def test_a_card_names_a_run_and_data_with_yaml_syntax_as_they_are(tmp_path: Path) -> None:
    import yaml

    from mlmkit.rundir.cards import card

    run = tmp_path / "run: x # - ---"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (run / "mlmkit.json").write_text(json.dumps({"task": "classification", "max_length": 128,
                                                 "data": {"eval": "held: out\n---.csv"},
                                                 "final_metrics": {"eval_accuracy": 0.5},
                                                 "labels": ["a: b", "- c"]}))
    front = yaml.safe_load(card(run).split("---\n", 2)[1])
    index = front["model-index"][0]
    assert index["name"] == run.name and index["results"][0]["dataset"]["name"] == "held: out\n---.csv"


def test_a_card_reads_mlmkit_json_through_the_typed_reader(tmp_path: Path) -> None:
    """A wrong field is refused in one line naming the file and the field, as everywhere the run is read."""
    import pytest

    from mlmkit.errors import ConfigError
    from mlmkit.rundir.cards import write_card

    run = tmp_path / "run"
    run.mkdir()
    (run / "mlmkit.json").write_text(json.dumps({"task": "classification", "max_length": "128"}))
    with pytest.raises(ConfigError) as e:
        write_card(run)
    said = "'max_length' is not a positive whole number of tokens ('128')"
    assert e.value.message == f"{run / 'mlmkit.json'}: {said}"
    assert not (run / "README.md").exists()
