"""identity.py: a search knows the bundle by its recorded size and time, and hashes only a changed one."""

from __future__ import annotations

import json
import shutil

from index_helpers import (
    one_red_line,
    runner,
)

from mlmkit.cli import app
from mlmkit.retrieval.index import BuildArgs, Index, build

pytest_plugins = ["index_fixtures"]


def test_a_search_knows_the_bundle_by_its_recorded_size_and_time_and_hashes_only_a_changed_or_copied_one(
    setup, tmp_path,
                                                                                                        monkeypatch):
    """The manifest records the bundle's graph size and time at build; a search with the bundle as it was
    reads no model.onnx, a copy is hashed once a process, and a graph changed since is refused."""
    import builtins
    import os

    from mlmkit.retrieval.index import identity, query_bundle

    bundle = tmp_path / "bundle"
    shutil.copytree(setup["bundle"], bundle)
    lines = setup["corpus"].read_text().splitlines(keepends=True)
    (tmp_path / "docs.jsonl").write_text("".join(lines[:40]))
    build(BuildArgs(bundle, tmp_path / "docs.jsonl", tmp_path / "ix"))
    ix = Index.open(tmp_path / "ix")
    graph = (bundle / "model.onnx").stat()
    recorded = ix.manifest.bundle
    assert (recorded.model_bytes, recorded.model_mtime_ns, len(recorded.sha256)) == \
        (graph.st_size, graph.st_mtime_ns, 64)

    reads: list[str] = []

    def spy(path, *a, **kw):
        if str(path).endswith("model.onnx"):
            reads.append(str(path))
        return builtins.open(path, *a, **kw)

    monkeypatch.setattr(identity, "open", spy, raising=False)
    identity._checksum.cache_clear()
    for _ in range(3):
        assert query_bundle(ix, None) == bundle
    assert reads == []  # the same path, size and time: model.onnx not read
    copy = tmp_path / "copy"
    shutil.copytree(bundle, copy)
    for _ in range(3):
        assert query_bundle(ix, copy) == copy
    assert reads == [str(copy / "model.onnx")]  # elsewhere: hashed once, then known
    # an index built before the size and time were recorded: hashed once, and searched
    old = tmp_path / "old-ix"
    shutil.copytree(ix.path, old)
    m = json.loads((old / "manifest.json").read_text())
    m["bundle"] = {k: m["bundle"][k] for k in ("path", "sha256")}
    (old / "manifest.json").write_text(json.dumps(m))
    assert query_bundle(Index.open(old), None) == bundle and len(reads) == 2
    # the graph changed in place, its size kept (its time is not): hashed, and refused with the reason
    with open(bundle / "model.onnx", "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    assert (bundle / "model.onnx").stat().st_size == graph.st_size
    monkeypatch.setattr(identity, "open", builtins.open, raising=False)
    assert "has changed since" in one_red_line(runner.invoke(app, ["search", str(ix.path), "a dog"]))
    # the graph as it was
    r = runner.invoke(app, ["search", str(ix.path), "a dog", "--bundle", str(copy), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["hits"], r.output
