"""store.py: an index opened is the bundle's vectors, searched as a plain numpy top k; damaged files and
manifests are one line naming them; the Python API (docs/retrieval.md's "Python API") runs as documented."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from index_helpers import (
    DOCS,
    built,
    exact,
    one_red_line,
    runner,
)

from mlmkit.cli import app
from mlmkit.errors import ConfigError, DataFormatError
from mlmkit.retrieval.index import BuildArgs, Index, build, hits, search_vectors
from mlmkit.runtime.pipeline import Pipeline

pytest_plugins = ["index_fixtures"]


def test_a_float_index_is_the_bundles_vectors_and_its_search_a_plain_numpy_top_k(setup):
    ix = built(setup, "f32")
    assert ix.count == DOCS and ix.manifest.bundle.sha256 and ix.manifest.quantization == "float32"
    assert np.allclose(np.concatenate([c for _, c in ix.chunks()]), setup["vectors"], atol=1e-6)
    rows, scores = search_vectors(ix, setup["q"], 10)
    want_rows, want_scores = exact(setup, 10)
    assert (rows == want_rows).all() and np.allclose(scores, want_scores, atol=1e-5)
    assert ix.ids(rows[0]) == [f"d{i}" for i in want_rows[0]]


def test_damaged_files_and_manifests_are_refused_in_one_line_naming_them(setup, sparse, tmp_path):
    """Hostile input, round 6: an ANN file faiss cannot read, postings that point past their block or
    vocabulary, edited int8 ranges, non-finite stored vectors: one line naming the file or field, exit 2."""
    pytest.importorskip("faiss")

    def cli(*argv: str) -> str:
        return one_red_line(runner.invoke(app, list(argv)))

    def fresh(name: str, source: Path) -> Path:
        shutil.copytree(source, tmp_path / name)
        return tmp_path / name

    hnsw = built(setup, "float32-hnsw", quantization="float32", ann="hnsw").path
    raw = (hnsw / "ann.faiss").read_bytes()
    for damage, data in (("truncated", raw[:len(raw) // 3]),
                         ("random", np.random.default_rng(0).bytes(len(raw)))):
        ix = fresh(damage, hnsw)
        (ix / "ann.faiss").write_bytes(data)
        assert f"{ix / 'ann.faiss'} is not a readable faiss hnsw index" in cli("search", str(ix), "a dog")
    # --compact builds it again from the stored vectors (no deletes to reclaim): the same hits as before
    assert runner.invoke(app, ["index", str(ix), "--compact"]).exit_code == 0
    assert [h["id"] for h in hits(Index.open(ix), *search_vectors(Index.open(ix), setup["q"][:3], 5))[0]] == \
        [h["id"] for h in hits(Index.open(hnsw), *search_vectors(Index.open(hnsw), setup["q"][:3], 5))[0]]
    ix = fresh("bogus-name", hnsw)
    m = json.loads((ix / "manifest.json").read_text())
    (ix / "manifest.json").write_text(json.dumps({**m, "ann_file": "../../etc/passwd"}))
    assert "manifest.json: 'ann_file' is not ann.faiss or ann-NNNNNN.faiss ('../../etc/passwd')" in \
        cli("search", str(ix), "a dog")
    (ix / "manifest.json").write_text(json.dumps({**m, "ann_settings": {"m": "32"}}))
    assert "manifest.json: 'ann_settings.m' is not a" in cli("search", str(ix), "a dog")
    (ix / "manifest.json").write_text(json.dumps({**m, "ann_settings": {"m": 32}}))
    assert "'ann_settings' is not an object of m, ef_construction, ef_search (a hnsw index)" in \
        cli("search", str(ix), "a dog")
    # the ANN index is read once for every query block of a search, not once a block
    ok = Index.open(hnsw)
    search_vectors(ok, np.repeat(setup["q"], 8, axis=0), 5)
    loaded = ok.ann_index
    search_vectors(ok, setup["q"], 5)
    assert loaded is not None and ok.ann_index is loaded

    # edited int8 ranges: null, one row, short rows, a scalar, a high below its low
    int8 = built(setup, "int8", quantization="int8").path
    m = json.loads((int8 / "manifest.json").read_text())
    lo, hi = m["ranges"]
    ix = fresh("ranges", int8)
    for bad in (None, [lo], [lo[:3], hi[:3]], 0.5, [hi, lo], [lo, ["x"] * len(hi)]):
        (ix / "manifest.json").write_text(json.dumps({**m, "ranges": bad}))
        assert "manifest.json: 'ranges' is not " in cli("search", str(ix), "a dog")

    # non-finite vectors: a build or an append refuses them, naming the document (dense, sparse, token
    # vectors) ...
    from mlmkit.retrieval.index.pending import _check_finite

    nan = np.float32("nan")
    ids = ["a", "b", "c"]
    for x, kinds in ((np.asarray([[1, 0], [nan, 1], [0, 1]], np.float32), {}),
                     ((np.asarray([1, 2, 1]), np.asarray([3, 4, 5, 6]),
                       np.asarray([1, 1, np.inf, 1], np.float32)), {"sparse": True}),
                     ([np.ones((2, 2)), np.asarray([[1, nan]]), np.ones((1, 2))], {"multi": True})):
        with pytest.raises(ConfigError, match="document 'b' \\(window 4\\): the bundle gave it a vector that "
                                              "is not finite"):
            _check_finite(3, ids, x, sparse=kinds.get("sparse", False), multi=kinds.get("multi", False))
    # ... and one written by hand is named at search
    ix = fresh("nan", built(setup, "f32").path)
    v = np.memmap(ix / "shard-000000" / "vectors.bin", dtype=np.float32, mode="r+")
    v[:] = np.nan
    v.flush()
    del v
    text = cli("search", str(ix), "a dog", "--json")
    assert ("vectors.bin holds values that are not finite" in text
            and "NaN" not in runner.invoke(app, ["search", str(ix), "x"]).stdout)

    # sparse postings: a row past its block, a term past the vocabulary, offsets or starts going down
    build(BuildArgs(sparse["bundle"], setup["corpus"], tmp_path / "sp", window=256))
    for name, dtype, value, where, said in (
            ("rows.bin", np.int32, 10**6, 0, "rows.bin: a posting of block 1 points at row 1,000,000"),
            ("offsets.bin", np.int64, 10**9, 5, "offsets.bin does not begin at 0, goes down"),
            ("starts.bin", np.int64, 10**9, 3, "starts.bin does not begin at 0 or goes down"),
            ("terms.bin", np.int32, 10**8, 0, "terms.bin holds term 100,000,000, outside the vocabulary")):
        ix = fresh(f"sp-{name}", tmp_path / "sp")
        f = np.memmap(ix / "shard-000000" / name, dtype=dtype, mode="r+")
        f[where] = value
        f.flush()
        del f
        argv = ("search", str(ix),
                "a dog") + (("--export", str(tmp_path / f"{name}.parquet")) if name == "terms.bin" else ())
        assert said in cli(*argv), name


def test_the_python_api_runs_as_docs_retrieval_md_shows_it(setup, tmp_path):
    """docs/retrieval.md's "Python API" example, run as written (its paths this test's): build, open,
    add, search, delete, upsert, compact, stats; each change as the command line makes it."""
    doc = (Path(__file__).parents[2] / "docs" / "retrieval.md").read_text()
    code = re.search(r"## Python API\n.*?```python\n(.*?)```", doc, re.S).group(1)
    paths = 'bundle, corpus, out = "exports/embedder", "corpus.jsonl", "my-index"'
    assert paths in code
    code = code.replace(paths, f"bundle, corpus, out = {str(setup['bundle'])!r}, {str(setup['corpus'])!r}, "
                               f"{str(tmp_path / 'my-index')!r}")
    scope: dict = {}
    exec(compile(code, "docs/retrieval.md", "exec"), scope)  # noqa: S102 - the documentation's own example
    ix, stats = scope["ix"], scope["stats"]
    assert {h["id"] for h in scope["both"][0]} == {"new-1", "new-2"} and len(scope["hits"][0]) == 3
    assert (stats.count, stats.live, stats.deleted, stats.shards) == (DOCS + 1, DOCS + 1, 0, 2)
    assert ix.manifest.quantization == "int8" and ix.deleted is None and stats.disk["bytes"] > 0
    # new-1 now holds the upserted text: its stored vector is the bundle's of that text
    pipe = Pipeline.load(setup["bundle"])
    v = np.asarray(pipe(["a cat sat on the sofa"], input_type="document")[0]["embedding"], dtype=np.float32)
    found = ix.search(v[None, :], k=1, where=["id=new-1"])[0]
    assert [h["id"] for h in found] == ["new-1"] and found[0]["score"] > 0.97
    assert "new-2" not in ix.document_rows and ix.ids(np.asarray([ix.count - 1])) == ["new-1"]
    # the same index through the command line: its search answers the object's hits
    r = runner.invoke(app, ["search", str(ix.path), "where did the cat sit?", "--top-k", "3", "--json"])
    assert r.exit_code == 0, r.output
    assert [h["id"] for h in json.loads(r.stdout)["hits"]] == [h["id"]
                                                               for h in ix.search(["where did the cat sit?"],
                                                                                  k=3)[0]]


def test_the_object_takes_ids_and_records_as_python_values_and_refuses_bad_ones_in_one_line(setup, tmp_path):
    ix = Index.build(setup["bundle"], setup["docs"][:40], tmp_path / "ix", window=16)
    assert ix.count == 40 and ix.ids(np.arange(3)) == ["d0", "d1", "d2"]
    with pytest.raises(DataFormatError, match="the ids given, id 2: the id 'nope' is not in"):
        ix.delete(["d1", "nope"])
    assert ix.live == 40
    ix.delete("d1")  # a lone string: one id
    assert ix.live == 39 and ix.stats().deleted == 1
    with pytest.raises(DataFormatError, match="the ids given: no ids"):
        ix.delete([])
    with pytest.raises(ConfigError, match="--upsert adds documents with the index's own settings"):
        ix.upsert([{"id": "d2", "text": "x"}], quantization="int8")
    with pytest.raises(DataFormatError, match="the id 'd3' comes twice"):
        ix.add([{"id": "d3", "text": "again"}])
    assert Index.open(ix.path).count == 40
