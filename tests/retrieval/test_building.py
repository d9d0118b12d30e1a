"""building.py: a killed build resumes to a straight one, an append equals one build, a sparse bundle
builds an inverted index, bad input is one line and leaves the index as it was."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from index_helpers import (
    DOCS,
    built,
    killed_after,
    one_red_line,
    runner,
)

from mlmkit.cli import app
from mlmkit.errors import ConfigError
from mlmkit.retrieval.index import BuildArgs, Index, build, search_vectors
from mlmkit.runtime.pipeline import Pipeline

pytest_plugins = ["index_fixtures"]


def test_a_killed_build_resumes_to_the_vectors_of_a_straight_one_and_an_append_equals_one_build(setup,
                                                                                                tmp_path):
    straight = built(setup, "f32")
    out = tmp_path / "killed"
    kill = killed_after(512)
    with pytest.raises(KeyboardInterrupt):
        build(BuildArgs(setup["bundle"], setup["corpus"], out, window=256), kill)
    assert not (out / "manifest.json").exists() and (out / ".pending").is_dir()
    with pytest.raises(ConfigError, match="unfinished build"):
        build(BuildArgs(setup["bundle"], setup["corpus"], out, window=256))
    got = [0]
    build(BuildArgs(setup["bundle"], setup["corpus"], out, window=256, resume=True),
          lambda n: got.__setitem__(0, got[0] + n))
    assert got[0] == DOCS - 512  # the finished windows are not embedded again
    resumed = Index.open(out)
    assert (np.asarray(resumed.shards[0][0]) == np.asarray(straight.shards[0][0])).all()
    assert resumed.ids(np.arange(DOCS)) == straight.ids(np.arange(DOCS)) and not (out / ".pending").exists()
    # the first 700 documents, then the rest appended: the index built at once
    lines = setup["corpus"].read_text().splitlines(keepends=True)
    (tmp_path / "a.jsonl").write_text("".join(lines[:700]))
    (tmp_path / "b.jsonl").write_text("".join(lines[700:]))
    build(BuildArgs(setup["bundle"], tmp_path / "a.jsonl", tmp_path / "app"))
    build(BuildArgs(setup["bundle"], tmp_path / "b.jsonl", tmp_path / "app", append=True))
    app_ix = Index.open(tmp_path / "app")
    assert app_ix.count == DOCS and len(app_ix.shards) == 2
    # (other windows, other length buckets: the same vectors to float rounding)
    assert np.allclose(np.concatenate([c for _, c in app_ix.chunks()]),
                       np.concatenate([c for _, c in straight.chunks()]), atol=1e-6)
    assert app_ix.ids(np.arange(DOCS)) == straight.ids(np.arange(DOCS))
    (rows_a, scores_a), (rows_s, scores_s) = search_vectors(app_ix, setup["q"],
                                                            10), search_vectors(straight, setup["q"], 10)
    # near ties may swap
    assert (rows_a == rows_s).mean() > 0.95 and np.allclose(scores_a, scores_s, atol=1e-6)


def test_bad_input_is_one_line_and_leaves_the_index_as_it_was(setup, tmp_path):
    ix = built(setup, "f32")
    idx = tmp_path / "ix"
    shutil.copytree(ix.path, idx)
    before = (idx / "manifest.json").read_text()
    lines = setup["corpus"].read_text().splitlines(keepends=True)
    (tmp_path / "dup.jsonl").write_text(lines[0] + lines[1] + lines[1])
    (tmp_path / "noid.jsonl").write_text(lines[0] + json.dumps({"text": "a dog"}) + "\n")
    (tmp_path / "new.jsonl").write_text(json.dumps({"_id": "new", "text": "a dog"}) + "\n" + lines[5])
    other = tmp_path / "other-bundle"
    shutil.copytree(setup["bundle"], other)
    meta = json.loads((other / "mlmkit.json").read_text())
    (other / "mlmkit.json").write_text(json.dumps({**meta, "note": "another"}))

    def cli(*argv: str) -> str:
        return one_red_line(runner.invoke(app, list(argv)))

    assert "the id 'd1' comes twice" in cli("index", str(setup["bundle"]), "--corpus",
                                            str(tmp_path / "dup.jsonl"), "--out", str(tmp_path / "d"))
    assert "line 2" in cli("index", str(setup["bundle"]), "--corpus", str(tmp_path / "noid.jsonl"), "--out",
                           str(tmp_path / "n"))
    # an append whose documents repeat an id of the index: nothing added
    assert "'d5' comes twice" in cli("index", str(setup["bundle"]), "--corpus", str(tmp_path / "new.jsonl"),
                                     "--out", str(idx), "--append")
    assert "built with the bundle" in cli("index", str(other), "--corpus", str(tmp_path / "new.jsonl"),
                                          "--out", str(idx), "--append")
    assert "built with the bundle" in cli("search", str(idx), "a dog", "--bundle", str(other))
    assert "is an index already" in cli("index", str(setup["bundle"]), "--corpus",
                                        str(tmp_path / "new.jsonl"), "--out", str(idx))
    assert "--top-k 0" in cli("search", str(idx), "a dog", "--top-k", "0")
    assert f"--top-k {DOCS + 1}" in cli("search", str(idx), "a dog", "--top-k", str(DOCS + 1))
    assert ((idx / "manifest.json").read_text() == before and sorted(p.name for p in idx.iterdir())
            == ["manifest.json", "shard-000000"])
    # a manifest that disagrees with its vectors, a truncated vectors file
    m = json.loads(before)
    (idx / "manifest.json").write_text(json.dumps({**m, "count": DOCS + 1}))
    assert "shards hold 1200 vectors" in cli("search", str(idx), "a dog")
    (idx / "manifest.json").write_text(before)
    with open(idx / "shard-000000" / "vectors.bin", "r+b") as f:
        f.truncate(1000)
    assert "truncated or replaced" in cli("search", str(idx), "a dog")
    with pytest.raises(ConfigError, match="searched in one stage"):
        search_vectors(built(setup, "int8", quantization="int8"), setup["q"], 3, rescore=100)
    with pytest.raises(ConfigError, match="query vectors of 3 dimensions"):
        search_vectors(ix, np.ones((1, 3), np.float32), 3)


def test_a_sparse_bundle_builds_an_inverted_index_searched_as_a_plain_dot_product_top_k(
    setup, sparse, tmp_path, monkeypatch):
    """SPLADE vectors go into postings on disk (several blocks, two shards by an append) and come back
    as the numpy top k of the dense dot products, zero scores no hits; the export is the vectors."""
    from mlmkit.retrieval import postings
    from mlmkit.retrieval.index import as_queries

    monkeypatch.setattr(postings, "BLOCK", 100)  # 12 blocks; the manifest keeps it for the append
    lines = setup["corpus"].read_text().splitlines(keepends=True)
    (tmp_path / "a.jsonl").write_text("".join(lines[:730]))
    (tmp_path / "b.jsonl").write_text("".join(lines[730:]))
    r = runner.invoke(app, ["index", str(sparse["bundle"]), "--corpus", str(tmp_path / "a.jsonl"), "--out",
                            str(tmp_path / "ix")])
    assert r.exit_code == 0, r.output
    monkeypatch.setattr(postings, "BLOCK", 7)  # not what the index says: the append keeps 100
    build(BuildArgs(sparse["bundle"], tmp_path / "b.jsonl", tmp_path / "ix", append=True))
    ix = Index.open(tmp_path / "ix")
    assert (ix.kind, ix.count, ix.dims, ix.manifest.block, len(ix.sparse)) == ("sparse", DOCS,
                                                                               sparse["width"], 100, 2)
    assert not (tmp_path / "ix" / "shard-000000" / "vectors.bin").exists()
    s = sparse["q"] @ sparse["docs"].T
    want = np.lexsort((np.broadcast_to(np.arange(DOCS), s.shape), -s), axis=1)[:, :10]
    want_s = np.take_along_axis(s, want, 1)
    q = as_queries(ix, Pipeline.load(sparse["bundle"])(setup["queries"]))
    rows, scores = search_vectors(ix, q, 10)
    # float sums in another order: near ties
    assert (rows == np.where(want_s > 0, want, -1)).mean() > 0.97, (rows, want)
    assert np.allclose(scores, want_s, atol=1e-5) and (want_s > 0).any()
    assert np.allclose(ix.rows(np.asarray([0, 729, 730, DOCS - 1]), rescore=True),
                       sparse["docs"][[0, 729, 730, DOCS - 1]])
    # a document sharing no term with the query is no hit
    lone = as_queries(ix, [{"indices": [0], "values": [1.0]}])
    got, _ = search_vectors(ix, lone, 5)
    assert set(got[0][got[0] >= 0]) <= set(np.nonzero(sparse["docs"][:, 0])[0])
    # the command line, and the export (Qdrant's sparse vectors: indices, values)
    cli = runner.invoke(app, ["search", str(ix.path), *setup["queries"][:2], "--top-k", "3", "--json"])
    assert [h["id"] for h in json.loads(cli.stdout.splitlines()[1])["hits"]] == ix.ids(rows[1][:3])
    assert runner.invoke(app,
                         ["search", str(ix.path), "--export", str(tmp_path / "sp.parquet")]).exit_code == 0
    t = pytest.importorskip("pyarrow.parquet").read_table(tmp_path / "sp.parquet").slice(0, 5).to_pylist()
    for row, want_r, d in zip(t, sparse["results"], setup["docs"]):
        assert row["id"] == d["_id"] and row["indices"] == want_r["indices"]
        assert np.allclose(row["values"], want_r["values"], atol=1e-6)


def test_a_killed_sparse_build_resumes_to_the_files_of_a_straight_one(setup, sparse, tmp_path):
    """A sparse build's terms wait on disk (the postings are written when all are in): a kill after two
    windows, then --resume, gives the shard a straight build gives, file for file."""
    build(BuildArgs(sparse["bundle"], setup["corpus"], tmp_path / "straight", window=256))
    kill = killed_after(512)
    with pytest.raises(KeyboardInterrupt):
        build(BuildArgs(sparse["bundle"], setup["corpus"], tmp_path / "killed", window=256), kill)
    with open(tmp_path / "killed" / ".pending" / "terms.bin", "ab") as f:
        f.write(b"half a window")  # what a kill midway through the third window's terms leaves
    build(BuildArgs(sparse["bundle"], setup["corpus"], tmp_path / "killed", window=256, resume=True))
    a, b = tmp_path / "straight" / "shard-000000", tmp_path / "killed" / "shard-000000"
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    for f in a.iterdir():
        assert f.read_bytes() == (b / f.name).read_bytes(), f.name
    assert Index.open(b.parent).count == DOCS


@pytest.mark.slow  # ~30 s: starts a Ray cluster
def test_a_ray_built_index_equals_a_local_one(setup, tmp_path):
    ray = pytest.importorskip("ray")
    local = built(setup, "f32")
    try:
        r = runner.invoke(app, ["index", str(setup["bundle"]), "--corpus", str(setup["corpus"]), "--out",
                                str(tmp_path / "ray"),
                                "--engine", "ray", "--workers", "2", "--threads", "2", "--window", "300",
                                "--json"])
        assert r.exit_code == 0, (r.output, r.exception)
    finally:
        ray.shutdown()
    got = Index.open(tmp_path / "ray")
    assert got.count == DOCS and got.ids(np.arange(DOCS)) == local.ids(np.arange(DOCS))
    a = np.concatenate([c for _, c in got.chunks()])
    # Ray's batches pad otherwise
    assert np.allclose(a, np.concatenate([c for _, c in local.chunks()]), atol=1e-5)
    assert sorted(p.name for p in (tmp_path / "ray").iterdir()) == ["manifest.json", "shard-000000"]
