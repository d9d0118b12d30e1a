"""manifest.py: the manifest read by the typed reader: a build's manifest reads back as written; a wrong
type, a missing field or another format version is one line naming the file and the field, exit 2."""

from __future__ import annotations

import json
import shutil

import pytest
from index_helpers import DOCS, built, one_red_line, runner

from mlmkit.cli import app
from mlmkit.errors import ConfigError
from mlmkit.retrieval.index import FORMAT, Index, Manifest, read_manifest
from mlmkit.retrieval.index.manifest import ShardEntry

pytest_plugins = ["index_fixtures"]


def test_a_built_manifest_reads_back_typed_and_is_written_as_read(setup):
    ix = built(setup, "f32")
    on_disk = json.loads((ix.path / "manifest.json").read_text())
    m = read_manifest(ix.path)
    assert isinstance(m, Manifest) and m.to_json() == on_disk and m == ix.manifest
    assert (m.format, m.kind, m.count, m.dims, m.quantization, m.ann) == (FORMAT, "dense", DOCS, 64,
                                                                          "float32", "flat")
    assert m.shards == (ShardEntry("shard-000000", DOCS),) and m.bundle.sha256 and m.deleted is None
    assert m["count"] == DOCS and m["bundle"]["path"] == m.bundle.path  # the JSON form, for scripts


@pytest.mark.parametrize("change, said", [
    ({"dims": "64"}, "manifest.json: 'dims' is not a"),
    ({"count": None}, "manifest.json: it has no 'count'"),
    ({"shards": [{"name": "shard-000000", "count": "1200"}]}, "manifest.json: 'shards[0].count' is not a"),
    ({"bundle": {"path": 3, "sha256": "x"}}, "manifest.json: 'bundle.path' is not a string (3)"),
    ({"kind": "dense2"}, "manifest.json: 'kind' is not one of 'dense', 'sparse', 'multivector'"),
    ({"quantization": "int4"}, "manifest.json: 'quantization' is not one of float32, float16, int8, binary"),
    ({"count": 1201}, "manifest.json: 'count' 1201 but its shards hold 1200 vectors"),
    ({"format": 0}, "manifest.json: an index of format 0; this mlmkit reads format 1"),
])
def test_a_wrong_or_missing_field_or_another_format_is_one_line_naming_the_file_and_the_field(setup, tmp_path,
                                                                                           change, said):
    ix = tmp_path / "ix"
    shutil.copytree(built(setup, "f32").path, ix)
    m = json.loads((ix / "manifest.json").read_text())
    m = {k: v for k, v in {**m, **change}.items() if v is not None}
    (ix / "manifest.json").write_text(json.dumps(m))
    assert "error: " + str(ix / "manifest.json") in one_red_line(runner.invoke(app,
                                                                               ["search", str(ix), "a dog"]))
    with pytest.raises(ConfigError) as e:
        Index.open(ix)
    assert said in e.value.message, e.value.message
    assert str(ix / "manifest.json") in e.value.message and "\n" not in str(e.value)
    if "format" in change:
        assert "mlmkit index BUNDLE --corpus DOCS --out DIR` again" in (e.value.hint or "")
