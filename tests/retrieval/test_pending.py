"""pending.py: vectors are written once into the pending shard; a killed build resumes byte for byte."""

from __future__ import annotations

import numpy as np
import pytest
from index_helpers import (
    DOCS,
    built,
    killed_after,
)

from mlmkit.errors import ConfigError
from mlmkit.retrieval.index import BuildArgs, Index, build

pytest_plugins = ["index_fixtures"]


def test_vectors_are_written_once_into_the_pending_shard_and_a_killed_int8_build_resumes_to_a_straight_one(
    setup, tmp_path,
                                                                                                           monkeypatch):
    """A window's vectors go from the model into .pending/shard-NNNNNN/vectors.bin, quantized, and the
    shard is renamed into the index: no other file holds them. A kill leaves the windows on disk (after
    the calibration's first rows), a resume equals a straight build byte for byte, and a resume with
    other settings is refused."""
    from mlmkit.retrieval.index import live, pending

    # calibrated after two windows of 256, not at the end
    monkeypatch.setattr(pending, "CALIBRATION_ROWS", 300)
    straight = built(setup, "int8-cal300", quantization="int8")
    out = tmp_path / "killed"
    kill = killed_after(768)
    with pytest.raises(KeyboardInterrupt):
        build(BuildArgs(setup["bundle"], setup["corpus"], out, quantization="int8", window=256), kill)
    files = {str(f.relative_to(out / ".pending")): f.stat().st_size for f in (out / ".pending").rglob("*")
             if f.is_file()}
    assert files == {"progress.json": files["progress.json"], "ids.jsonl": files["ids.jsonl"],
                     "shard-000000/vectors.bin": 768 * 64}, files  # int8: a byte a dimension, nowhere else
    with pytest.raises(ConfigError, match="was for other quantization"):
        build(BuildArgs(setup["bundle"], setup["corpus"], out, quantization="float16", window=256,
                        resume=True))
    # a kill between the shard's rename into the index and the manifest: the resume writes the manifest
    real = live.write_json
    monkeypatch.setattr(live, "write_json", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    got = [0]
    with pytest.raises(KeyboardInterrupt):
        build(BuildArgs(setup["bundle"], setup["corpus"], out, quantization="int8", window=256, resume=True),
              lambda n: got.__setitem__(0, got[0] + n))
    assert got[0] == DOCS - 768 and (out / "shard-000000").is_dir() and not (out / "manifest.json").exists()
    # and a kill after the manifest, before .pending/ is removed: the resume removes it, adding nothing

    def written_then_killed(*a):
        real(*a)
        raise KeyboardInterrupt

    monkeypatch.setattr(live, "write_json", written_then_killed)
    with pytest.raises(KeyboardInterrupt):
        build(BuildArgs(setup["bundle"], setup["corpus"], out, quantization="int8", window=256, resume=True))
    monkeypatch.setattr(live, "write_json", real)
    assert (out / ".pending").is_dir() and Index.open(out).count == DOCS
    build(BuildArgs(setup["bundle"], setup["corpus"], out, quantization="int8", window=256, resume=True))
    resumed = Index.open(out)
    assert resumed.manifest.ranges == straight.manifest.ranges and not (out / ".pending").exists()
    assert (np.asarray(resumed.shards[0][0]) == np.asarray(straight.shards[0][0])).all()
    assert resumed.ids(np.arange(DOCS)) == straight.ids(np.arange(DOCS))


@pytest.mark.parametrize(("field", "value", "said"), [
    ("windows", -1, "'windows' is not a whole number, 0 or more (-1)"),
    ("rows", "3", "'rows' is not a whole number, 0 or more ('3')"),
    ("what", [], "'what' is not an object ([])"),
    ("ranges", [1.0, 2.0], "'ranges' is not a list of values or null ([1.0, 2.0])"),
])
def test_a_wrong_field_in_a_builds_progress_is_named_in_one_line(tmp_path, field, value, said):
    """An index build's .pending/progress.json is read by the typed reader: --resume refuses a damaged
    or hand-edited one naming the file and the field, and says how to start over."""
    import json

    from mlmkit.retrieval.index.pending import PROGRESS, BuildProgress
    from mlmkit.typed import to_json

    good = to_json(BuildProgress(what={"bundle": "b"}, windows=2, rows=3, dims=4,
                                 ranges=[[0.0] * 4, [1.0] * 4]))
    (tmp_path / PROGRESS).write_text(json.dumps(good))
    assert BuildProgress.read(tmp_path) == BuildProgress(**good)
    (tmp_path / PROGRESS).write_text(json.dumps({**good, field: value}))
    with pytest.raises(ConfigError) as e:
        BuildProgress.read(tmp_path)
    assert e.value.message == f"{tmp_path / PROGRESS}: {said}"
    assert e.value.hint == f"delete {tmp_path} to start over"
