"""`mlmkit index` / `mlmkit search` (retrieval/index/): an on-disk index equals the plain numpy search
over the bundle's own vectors, at every quantization; resumed, appended and exported indexes equal
straight ones; bad input is one line, exit 2, the index untouched."""

from __future__ import annotations

import json
import random
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import make_base_model, run_export
from task_runs import corpus, make_task_run, sentence
from typer.testing import CliRunner

from mlmkit.cli import app
from mlmkit.errors import ConfigError
from mlmkit.files import cache_root
from mlmkit.retrieval.exact import normalized
from mlmkit.retrieval.index import BuildArgs, Index, build, hits, search_vectors
from mlmkit.runtime.pipeline import Pipeline

runner = CliRunner()
DOCS = 1200


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("index")
    base = make_base_model(root / "base", corpus())
    run_export(make_task_run(base, "embedding", root / "run"), root / "bundle")
    rng = random.Random(0)
    docs = [{"_id": f"d{i}", "title": sentence(rng, 2), "text": sentence(rng, rng.randint(3, 20))} for i in range(DOCS)]
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    pipe = Pipeline.load(root / "bundle")
    texts = [f"{d['title']} {d['text']}" for d in docs]
    vectors = normalized(np.asarray([r["embedding"] for r in pipe(texts, input_type="document")], dtype=np.float32))
    queries = [sentence(rng, 4) for _ in range(20)]
    q = normalized(np.asarray([r["embedding"] for r in pipe(queries, input_type="query")], dtype=np.float32))
    return {"root": root, "bundle": root / "bundle", "corpus": root / "corpus.jsonl", "docs": docs, "vectors": vectors, "q": q,
            "queries": queries}


def built(setup, name: str, **kw) -> Index:
    out = setup["root"] / name
    if not (out / "manifest.json").exists():
        build(BuildArgs(setup["bundle"], kw.pop("corpus", setup["corpus"]), out, window=kw.pop("window", 256), **kw))
    return Index.open(out)


def exact(setup, k: int) -> tuple[np.ndarray, np.ndarray]:
    s = setup["q"] @ setup["vectors"].T
    order = np.lexsort((np.broadcast_to(np.arange(s.shape[1]), s.shape), -s), axis=1)[:, :k]
    return order, np.take_along_axis(s, order, 1)


def one_red_line(r) -> str:
    assert r.exit_code == 2, r.output
    text = " ".join(r.stderr.split())
    assert text.startswith("error:") and "Traceback" not in r.output and text.count("error:") == 1, r.output
    return text


def test_a_float_index_is_the_bundles_vectors_and_its_search_a_plain_numpy_top_k(setup):
    ix = built(setup, "f32")
    assert ix.count == DOCS and ix.manifest["bundle"]["sha256"] and ix.manifest["quantization"] == "float32"
    assert np.allclose(np.concatenate([c for _, c in ix.chunks()]), setup["vectors"], atol=1e-6)
    rows, scores = search_vectors(ix, setup["q"], 10)
    want_rows, want_scores = exact(setup, 10)
    assert (rows == want_rows).all() and np.allclose(scores, want_scores, atol=1e-5)
    assert ix.ids(rows[0]) == [f"d{i}" for i in want_rows[0]]


def test_quantized_indexes_keep_the_exact_hits_and_binary_rescored_over_everything_is_int8(setup):
    want, _ = exact(setup, 10)
    recall = {}
    for q in ("float16", "int8", "binary"):
        ix = built(setup, q, quantization=q)
        rows, scores = search_vectors(ix, setup["q"], 10)
        recall[q] = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, want)])
        assert np.allclose(scores, (setup["q"][:, None, :] * setup["vectors"][rows]).sum(-1), atol=0.02)
    assert recall["float16"] >= 0.98 and recall["int8"] >= 0.9 and recall["binary"] >= 0.6, recall
    # (near-tied tiny-model vectors: int8 swaps a few, and 64 sign bits say little; all-MiniLM-L6-v2 on the
    # built-in set: int8 0.994, binary rescored from 100 0.994, docs/retrieval.md "Large corpora")
    # binary's rescoring reads the int8 copy: rescoring every document is int8's own search
    b, i8 = built(setup, "binary", quantization="binary"), built(setup, "int8", quantization="int8")
    rows_b, scores_b = search_vectors(b, setup["q"], 10, rescore=DOCS)
    assert (b.manifest["ranges"] == i8.manifest["ranges"]) and (b.shards[0][2] == i8.shards[0][0]).all()
    exact_i8 = normalized(setup["q"]) @ np.concatenate([c for _, c in i8.chunks()]).T
    top = np.lexsort((np.broadcast_to(np.arange(DOCS), exact_i8.shape), -exact_i8), axis=1)[:, :10]
    assert (rows_b == top).all() and np.allclose(scores_b, np.take_along_axis(exact_i8, top, 1), atol=1e-5)
    assert (b.path / "shard-000000" / "vectors.bin").stat().st_size == DOCS * 64 // 8


def test_a_float16_rescoring_copy_gives_int8_and_binary_the_exact_hits(setup, tmp_path):
    want, want_scores = exact(setup, 10)
    for q in ("int8", "binary"):
        ix = built(setup, f"{q}-copy", quantization=q, rescore_copy="float16")
        assert ix.copy == "float16" and (ix.path / "shard-000000" / "rescore.bin").stat().st_size == DOCS * 64 * 2
        rows, scores = search_vectors(ix, setup["q"], 10, rescore=DOCS)  # every document rescored: float16's own top 10
        recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, want)])
        assert recall >= 0.98 and np.allclose(scores, want_scores, atol=2e-3), (q, recall)  # float16 swaps near ties only
    assert built(setup, "int8", quantization="int8").copy is None and built(setup, "binary", quantization="binary").copy == "int8"
    for quant, copy in (("int8", "int8"), ("float32", "float16"), ("int8", "float32")):
        with pytest.raises(ConfigError, match="--rescore-copy"):
            BuildArgs(setup["bundle"], setup["corpus"], tmp_path / "x", quantization=quant, rescore_copy=copy)
    # an append keeps the index's copy: asking for none is refused, the index untouched
    idx = tmp_path / "ix"
    shutil.copytree(built(setup, "int8-copy").path, idx)
    (tmp_path / "new.jsonl").write_text(json.dumps({"_id": "new", "text": "a dog"}) + "\n")
    r = runner.invoke(app, ["index", str(setup["bundle"]), "--corpus", str(tmp_path / "new.jsonl"), "--out", str(idx), "--append",
                            "--quantize", "int8"])
    assert "--rescore-copy float16" in one_red_line(r) and Index.open(idx).count == DOCS


def test_ann_indexes_find_the_exact_hits(setup, tmp_path):
    pytest.importorskip("faiss")
    want, _ = exact(setup, 10)
    for q, ann in (("float32", "hnsw"), ("int8", "hnsw"), ("float32", "ivf")):
        ix = built(setup, f"{q}-{ann}", quantization=q, ann=ann)
        rows, _ = search_vectors(ix, setup["q"], 10, rescore=200)
        recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, want)])
        assert recall >= 0.85, (q, ann, recall)
    # an ann.faiss over other vectors than the manifest's (an append stopped between the two) is refused
    lines = setup["corpus"].read_text().splitlines(keepends=True)
    (tmp_path / "few.jsonl").write_text("".join(lines[:40]))
    build(BuildArgs(setup["bundle"], tmp_path / "few.jsonl", tmp_path / "few", ann="hnsw"))
    shutil.copytree(built(setup, "float32-hnsw").path, tmp_path / "ix")
    shutil.copy(tmp_path / "few" / "ann.faiss", tmp_path / "ix" / "ann.faiss")
    with pytest.raises(ConfigError, match="holds 40 vectors; the manifest says 1,200"):
        search_vectors(Index.open(tmp_path / "ix"), setup["q"], 10)



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
    for damage, data in (("truncated", raw[:len(raw) // 3]), ("random", np.random.default_rng(0).bytes(len(raw)))):
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
    assert "ann_file '../../etc/passwd'" in cli("search", str(ix), "a dog")
    (ix / "manifest.json").write_text(json.dumps({**m, "ann_settings": {"m": "32"}}))
    assert "ann_settings of a hnsw index must hold" in cli("search", str(ix), "a dog")
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
        assert "field ranges must be two lists of" in cli("search", str(ix), "a dog")

    # non-finite vectors: a build or an append refuses them, naming the document (dense, sparse, token vectors) ...
    from mlmkit.retrieval.index.pending import _check_finite

    nan = np.float32("nan")
    ids = ["a", "b", "c"]
    for x, kinds in ((np.asarray([[1, 0], [nan, 1], [0, 1]], np.float32), {}),
                     ((np.asarray([1, 2, 1]), np.asarray([3, 4, 5, 6]), np.asarray([1, 1, np.inf, 1], np.float32)), {"sparse": True}),
                     ([np.ones((2, 2)), np.asarray([[1, nan]]), np.ones((1, 2))], {"multi": True})):
        with pytest.raises(ConfigError, match="document 'b' \\(window 4\\): the bundle gave it a vector that is not finite"):
            _check_finite(3, ids, x, sparse=kinds.get("sparse", False), multi=kinds.get("multi", False))
    # ... and one written by hand is named at search
    ix = fresh("nan", built(setup, "f32").path)
    v = np.memmap(ix / "shard-000000" / "vectors.bin", dtype=np.float32, mode="r+")
    v[:] = np.nan
    v.flush()
    del v
    text = cli("search", str(ix), "a dog", "--json")
    assert "vectors.bin holds values that are not finite" in text and "NaN" not in runner.invoke(app, ["search", str(ix), "x"]).stdout

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
        argv = ("search", str(ix), "a dog") + (("--export", str(tmp_path / f"{name}.parquet")) if name == "terms.bin" else ())
        assert said in cli(*argv), name


def killed_after(documents: int):
    """A build's progress callback that stops it (as a kill would) once ``documents`` are embedded."""
    seen = [0]

    def kill(n: int) -> None:
        seen[0] += n
        if seen[0] >= documents:
            raise KeyboardInterrupt

    return kill

def test_a_killed_build_resumes_to_the_vectors_of_a_straight_one_and_an_append_equals_one_build(setup, tmp_path):
    straight = built(setup, "f32")
    out = tmp_path / "killed"
    kill = killed_after(512)
    with pytest.raises(KeyboardInterrupt):
        build(BuildArgs(setup["bundle"], setup["corpus"], out, window=256), kill)
    assert not (out / "manifest.json").exists() and (out / ".pending").is_dir()
    with pytest.raises(ConfigError, match="unfinished build"):
        build(BuildArgs(setup["bundle"], setup["corpus"], out, window=256))
    got = [0]
    build(BuildArgs(setup["bundle"], setup["corpus"], out, window=256, resume=True), lambda n: got.__setitem__(0, got[0] + n))
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
    assert np.allclose(np.concatenate([c for _, c in app_ix.chunks()]), np.concatenate([c for _, c in straight.chunks()]), atol=1e-6)
    assert app_ix.ids(np.arange(DOCS)) == straight.ids(np.arange(DOCS))
    (rows_a, scores_a), (rows_s, scores_s) = search_vectors(app_ix, setup["q"], 10), search_vectors(straight, setup["q"], 10)
    assert (rows_a == rows_s).mean() > 0.95 and np.allclose(scores_a, scores_s, atol=1e-6)  # near ties may swap


def test_search_on_the_command_line_and_the_parquet_export_round_trips(setup, tmp_path):
    pa = pytest.importorskip("pyarrow.parquet")
    ix = built(setup, "f32")
    r = runner.invoke(app, ["search", str(ix.path), *setup["queries"][:2], "--top-k", "3", "--json"])
    assert r.exit_code == 0, r.output
    got = [json.loads(line) for line in r.stdout.splitlines()]
    want, _ = exact(setup, 3)
    assert [h["id"] for h in got[1]["hits"]] == [f"d{i}" for i in want[1]] and got[0]["query"] == setup["queries"][0]
    r = runner.invoke(app, ["search", str(ix.path), "--export", str(tmp_path / "v.parquet")])
    assert r.exit_code == 0, r.output
    t = pa.read_table(tmp_path / "v.parquet")
    vtype = t.schema.field("vector").type
    assert vtype.list_size == 64 and str(vtype.value_type) == "float" and "fixed_size_list" in str(vtype)
    assert t.column("id").to_pylist() == [d["_id"] for d in setup["docs"]]
    assert np.allclose(np.asarray(t.column("vector").to_pylist(), dtype=np.float32), setup["vectors"], atol=1e-6)


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

    assert "the id 'd1' comes twice" in cli("index", str(setup["bundle"]), "--corpus", str(tmp_path / "dup.jsonl"), "--out", str(tmp_path / "d"))
    assert "line 2" in cli("index", str(setup["bundle"]), "--corpus", str(tmp_path / "noid.jsonl"), "--out", str(tmp_path / "n"))
    # an append whose documents repeat an id of the index: nothing added
    assert "'d5' comes twice" in cli("index", str(setup["bundle"]), "--corpus", str(tmp_path / "new.jsonl"), "--out", str(idx), "--append")
    assert "built with the bundle" in cli("index", str(other), "--corpus", str(tmp_path / "new.jsonl"), "--out", str(idx), "--append")
    assert "built with the bundle" in cli("search", str(idx), "a dog", "--bundle", str(other))
    assert "is an index already" in cli("index", str(setup["bundle"]), "--corpus", str(tmp_path / "new.jsonl"), "--out", str(idx))
    assert "--top-k 0" in cli("search", str(idx), "a dog", "--top-k", "0")
    assert f"--top-k {DOCS + 1}" in cli("search", str(idx), "a dog", "--top-k", str(DOCS + 1))
    assert (idx / "manifest.json").read_text() == before and sorted(p.name for p in idx.iterdir()) == ["manifest.json", "shard-000000"]
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


def test_evaluating_an_index_scores_its_stored_vectors_as_the_bundle_scores_the_corpus(setup, tmp_path):
    from mlmkit.quickstart.retrieval_set import write_retrieval_set

    write_retrieval_set(tmp_path / "beir", max_documents=150)
    r = runner.invoke(app, ["index", str(setup["bundle"]), "--corpus", str(tmp_path / "beir" / "corpus.jsonl"),
                            "--out", str(tmp_path / "ix"), "--json"])
    assert r.exit_code == 0, r.output
    by_index = runner.invoke(app, ["evaluate", str(tmp_path / "ix"), "--data", str(tmp_path / "beir"), "--json"])
    by_bundle = runner.invoke(app, ["evaluate", str(setup["bundle"]), "--data", str(tmp_path / "beir"), "--json"])
    assert by_index.exit_code == 0 and by_bundle.exit_code == 0, by_index.output + by_bundle.output
    got, want = json.loads(by_index.stdout), json.loads(by_bundle.stdout)
    # the bundle itself is scored through a temporary index too (bounded memory): equal to its in-memory
    # evaluation, which an option only that path reads still takes
    from mlmkit.retrieval.index import through_index
    from mlmkit.runtime.pipeline import evaluate_bundle

    in_memory = evaluate_bundle(setup["bundle"], tmp_path / "beir")
    assert through_index(setup["bundle"], tmp_path / "beir", {}) and not through_index(setup["bundle"], tmp_path / "beir", {"index": "exact"})
    for m in ("ndcg@10", "mrr@10", "recall@100"):
        assert got[m] == pytest.approx(want[m], abs=1e-4) == pytest.approx(in_memory[m], abs=1e-4), (m, got, want, in_memory)
    assert set(want) == set(in_memory) and 0 < got["recall@100"] <= 1
    assert not list(cache_root().glob("evaluate-index-*"))  # the temporary index is gone


def test_mining_from_an_index_mines_what_its_bundle_mines(setup, tmp_path):
    from mlmkit.quickstart.retrieval_set import write_retrieval_set

    write_retrieval_set(tmp_path / "beir", max_documents=150)
    build(BuildArgs(setup["bundle"], tmp_path / "beir" / "corpus.jsonl", tmp_path / "ix"))
    rows = {}
    for name, retriever in (("index", tmp_path / "ix"), ("bundle", setup["bundle"])):
        r = runner.invoke(app, ["mine", str(tmp_path / "beir"), "--retriever", str(retriever), "--out", str(tmp_path / f"{name}.jsonl"),
                                "--negatives", "3", "--range", "0:20", "--with-scores", "--json"])
        assert r.exit_code == 0, r.output
        rows[name] = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    assert len(rows["index"]) == len(rows["bundle"]) > 50
    same = [a["negative_1"] == b["negative_1"] and np.allclose(a["scores"], b["scores"], atol=1e-5)
            for a, b in zip(rows["index"], rows["bundle"])]
    assert np.mean(same) > 0.95, np.mean(same)  # float rounding may swap a near tie
    bad = runner.invoke(app, ["mine", str(tmp_path / "beir"), "--retriever", "bm25", "--index", "faiss", "--out", str(tmp_path / "x.jsonl")])
    assert "--index faiss is for an embedding bundle" in one_red_line(bad)


def test_serve_answers_v1_search_with_the_indexs_hits_for_texts_and_vectors(setup, tmp_path):
    """`mlmkit serve BUNDLE --index INDEX`: POST /v1/search equals the plain numpy top-k for query
    vectors, and `mlmkit search` for query texts; bad requests are one 4xx each."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from serve_process import Server

    ix = built(setup, "f32")
    small = built(setup, "binary", quantization="binary")
    live = tmp_path / "live"
    shutil.copytree(ix.path, live)
    s = Server(tmp_path, f"emb={setup['bundle']}", "--index", f"docs={ix.path}", "--index", f"small={small.path}",
               "--index", f"live={live}")
    try:
        def post(body):
            return httpx.post(s.url + "/v1/search", json=body, timeout=30)

        def live_hits():
            r = post({"index": "live", "vector": setup["q"][0].tolist(), "top_k": 5})
            assert r.status_code == 200, r.text
            return [h["id"] for h in r.json()["results"][0]["hits"]]

        # files rewritten in place under the server: it keeps serving what it loaded (read into memory)
        first = live_hits()
        vectors = live / "shard-000000" / "vectors.bin"
        kept = vectors.read_bytes()
        with open(vectors, "r+b") as f:
            f.truncate(0)
            f.write(b"\xff" * 100)
        (live / "shard-000000" / "ids.arrow").write_bytes(b"garbage")
        assert live_hits() == first and httpx.get(s.url + "/health", timeout=5).status_code == 200
        vectors.write_bytes(kept)
        shutil.copy(ix.path / "shard-000000" / "ids.arrow", live / "shard-000000" / "ids.arrow")
        # a delete under the server: the new manifest is loaded (within a second or two), the document gone
        (tmp_path / "gone.txt").write_text(first[0] + "\n")
        assert runner.invoke(app, ["index", str(live), "--delete", str(tmp_path / "gone.txt")]).exit_code == 0
        deadline = time.monotonic() + 20
        while live_hits()[0] == first[0] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert live_hits() == first[1:] + [h for h in live_hits() if h not in first] and first[0] not in live_hits()
        # a manifest damaged under the server: it keeps serving the last one it could open, and says so once
        (live / "manifest.json").write_text("{not json")
        time.sleep(2.5)
        assert first[0] not in live_hits() and s.proc.poll() is None
        log = " ".join(s.log.read_text().split())  # the log's lines wrap at the terminal's width
        assert "changed on disk: now serving its 1,199 documents (was 1,200)" in log, log
        assert log.count("is still served as it was (1,199 documents)") == 1, log

        want, want_scores = exact(setup, 5)
        r = post({"index": "docs", "vector": setup["q"][:3].tolist(), "top_k": 5})
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["index"] == "docs" and got["model"] == "emb" and len(got["results"]) == 3
        for j, res in enumerate(got["results"]):
            assert [h["id"] for h in res["hits"]] == [f"d{i}" for i in want[j]]
            assert np.allclose([h["score"] for h in res["hits"]], want_scores[j], atol=1e-5)
        one = post({"index": "docs", "vector": setup["q"][1].tolist(), "top_k": 5}).json()  # one vector, not a list of them
        assert [h["id"] for h in one["results"][0]["hits"]] == [h["id"] for h in got["results"][1]["hits"]]
        texts = post({"index": "docs", "query": setup["queries"][:2], "top_k": 3})
        assert texts.status_code == 200 and texts.json()["usage"]["total_tokens"] > 0, texts.text
        cli = runner.invoke(app, ["search", str(ix.path), *setup["queries"][:2], "--top-k", "3", "--json"])
        by_cli = [json.loads(x)["hits"] for x in cli.stdout.splitlines()]
        for a, b in zip([r["hits"] for r in texts.json()["results"]], by_cli, strict=True):
            assert [h["id"] for h in a] == [h["id"] for h in b]
            assert np.allclose([h["score"] for h in a], [h["score"] for h in b], atol=1e-5)
        assert post({"index": "small", "vector": setup["q"][0].tolist(), "top_k": 3, "rescore": 50}).status_code == 200
        bad = {
            "no index named 'nope'": ({"index": "nope", "query": "a dog"}, 404),
            "say which index": ({"query": "a dog"}, 422),
            "has 3 values; the index holds 64": ({"index": "docs", "vector": [0.1, 0.2, 0.3]}, 422),
            "not a finite float32": ({"index": "docs", "vector": [1e39] * 64}, 422),
            "past index 'docs''s 1,200 documents": ({"index": "docs", "query": "a dog", "top_k": DOCS + 1}, 422),
            "'top_k' must be a positive whole number": ({"index": "docs", "query": "a dog", "top_k": 0}, 422),
            "rescore 2 is below top_k 3": ({"index": "small", "query": "a dog", "top_k": 3, "rescore": 2}, 422),
            "one of the two": ({"index": "docs", "query": "a dog", "vector": [0.0] * 64}, 422),
            "is searched in one stage": ({"index": "docs", "query": "a dog", "top_k": 3, "rescore": 50}, 422),
            "unknown field(s) model": ({"index": "docs", "query": "a dog", "model": "emb"}, 422),
        }
        for message, (body, status) in bad.items():
            r = post(body)
            assert r.status_code == status and message in r.json()["error"], (message, r.status_code, r.text)
        assert httpx.get(s.url + "/health", timeout=5).status_code == 200
    finally:
        s.stop()
    # an index that no served bundle built is refused before the server starts
    other = tmp_path / "other-bundle"
    shutil.copytree(setup["bundle"], other)
    meta = json.loads((other / "mlmkit.json").read_text())
    (other / "mlmkit.json").write_text(json.dumps({**meta, "note": "another"}))
    r = runner.invoke(app, ["serve", str(other), "--index", str(ix.path), "--port", "0"])
    assert "which is not served" in one_red_line(r)


# ---- a sparse-embedding (SPLADE) bundle: an inverted index ----------------------------------------------
@pytest.fixture(scope="module")
def sparse(setup):
    root = setup["root"]
    run_export(make_task_run(root / "base", "sparse-embedding", root / "sparse-run"), root / "sparse-bundle")
    pipe = Pipeline.load(root / "sparse-bundle")
    width = json.loads((root / "sparse-bundle" / "mlmkit.json").read_text())["model"]["vocab_size"]

    def dense(results) -> np.ndarray:
        out = np.zeros((len(results), width), dtype=np.float32)
        for row, r in zip(out, results):
            row[r["indices"]] = r["values"]
        return out

    texts = [f"{d['title']} {d['text']}" for d in setup["docs"]]
    return {"bundle": root / "sparse-bundle", "docs": dense(pipe(texts)), "q": dense(pipe(setup["queries"])), "width": width,
            "results": pipe(texts[:5])}


def test_a_sparse_bundle_builds_an_inverted_index_searched_as_a_plain_dot_product_top_k(setup, sparse, tmp_path, monkeypatch):
    """SPLADE vectors go into postings on disk (several blocks, two shards by an append) and come back
    as the numpy top k of the dense dot products, zero scores no hits; the export is the vectors."""
    from mlmkit.retrieval import postings
    from mlmkit.retrieval.index import as_queries

    monkeypatch.setattr(postings, "BLOCK", 100)  # 12 blocks; the manifest keeps it for the append
    lines = setup["corpus"].read_text().splitlines(keepends=True)
    (tmp_path / "a.jsonl").write_text("".join(lines[:730]))
    (tmp_path / "b.jsonl").write_text("".join(lines[730:]))
    r = runner.invoke(app, ["index", str(sparse["bundle"]), "--corpus", str(tmp_path / "a.jsonl"), "--out", str(tmp_path / "ix")])
    assert r.exit_code == 0, r.output
    monkeypatch.setattr(postings, "BLOCK", 7)  # not what the index says: the append keeps 100
    build(BuildArgs(sparse["bundle"], tmp_path / "b.jsonl", tmp_path / "ix", append=True))
    ix = Index.open(tmp_path / "ix")
    assert (ix.kind, ix.count, ix.dims, ix.manifest["block"], len(ix.sparse)) == ("sparse", DOCS, sparse["width"], 100, 2)
    assert not (tmp_path / "ix" / "shard-000000" / "vectors.bin").exists()
    s = sparse["q"] @ sparse["docs"].T
    want = np.lexsort((np.broadcast_to(np.arange(DOCS), s.shape), -s), axis=1)[:, :10]
    want_s = np.take_along_axis(s, want, 1)
    q = as_queries(ix, Pipeline.load(sparse["bundle"])(setup["queries"]))
    rows, scores = search_vectors(ix, q, 10)
    assert (rows == np.where(want_s > 0, want, -1)).mean() > 0.97, (rows, want)  # float sums in another order: near ties
    assert np.allclose(scores, want_s, atol=1e-5) and (want_s > 0).any()
    assert np.allclose(ix.rows(np.asarray([0, 729, 730, DOCS - 1]), rescore=True), sparse["docs"][[0, 729, 730, DOCS - 1]])
    # a document sharing no term with the query is no hit
    lone = as_queries(ix, [{"indices": [0], "values": [1.0]}])
    got, _ = search_vectors(ix, lone, 5)
    assert set(got[0][got[0] >= 0]) <= set(np.nonzero(sparse["docs"][:, 0])[0])
    # the command line, and the export (Qdrant's sparse vectors: indices, values)
    cli = runner.invoke(app, ["search", str(ix.path), *setup["queries"][:2], "--top-k", "3", "--json"])
    assert [h["id"] for h in json.loads(cli.stdout.splitlines()[1])["hits"]] == ix.ids(rows[1][:3])
    assert runner.invoke(app, ["search", str(ix.path), "--export", str(tmp_path / "sp.parquet")]).exit_code == 0
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


def test_a_sparse_index_evaluates_as_its_bundle_and_refuses_what_it_cannot_do(setup, sparse, tmp_path):
    from types import SimpleNamespace

    from mlmkit.quickstart.retrieval_set import write_retrieval_set
    from mlmkit.runtime.pipeline import evaluate_bundle
    from mlmkit.serve.routes import HTTPError, Search

    write_retrieval_set(tmp_path / "beir", max_documents=150)
    build(BuildArgs(sparse["bundle"], tmp_path / "beir" / "corpus.jsonl", tmp_path / "ix"))
    by_index = runner.invoke(app, ["evaluate", str(tmp_path / "ix"), "--data", str(tmp_path / "beir"), "--json"])
    assert by_index.exit_code == 0, by_index.output
    got, want = json.loads(by_index.stdout), evaluate_bundle(sparse["bundle"], tmp_path / "beir")  # in memory: scipy.sparse
    for m in ("ndcg@10", "mrr@10", "recall@100"):
        assert got[m] == pytest.approx(want[m], abs=1e-4), (m, got, want)
    assert 0 < got["recall@100"] <= 1
    r = runner.invoke(app, ["mine", str(tmp_path / "beir"), "--retriever", str(tmp_path / "ix"), "--out", str(tmp_path / "m.jsonl"),
                            "--negatives", "2", "--range", "0:20", "--with-scores"])
    assert r.exit_code == 0, r.output
    mined = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert len(mined) > 50 and all(len(m["scores"]) == 3 and m["negative_2"] for m in mined[:10])

    def cli(*argv: str) -> str:
        return one_red_line(runner.invoke(app, list(argv)))

    corpus_file = str(tmp_path / "beir" / "corpus.jsonl")
    assert "takes no --quantize" in cli("index", str(sparse["bundle"]), "--corpus", corpus_file, "--out", str(tmp_path / "q"),
                                        "--quantize", "int8")
    assert "sparse index, searched exactly" in cli("search", str(tmp_path / "ix"), "a dog", "--rescore", "50")
    ix = Index.open(tmp_path / "ix")
    with pytest.raises(HTTPError, match="is sparse .* send 'query' texts"):
        Search().parse({"index": "sp", "vector": [0.5] * ix.dims}, {"m": SimpleNamespace(indexes={"sp": ix})})
    with open(tmp_path / "ix" / "shard-000000" / "weights.bin", "r+b") as f:
        f.truncate(100)
    assert "weights.bin holds 100 bytes" in cli("search", str(tmp_path / "ix"), "a dog")
    (tmp_path / "ix" / "shard-000000" / "offsets.bin").unlink()
    assert "offsets.bin is missing" in cli("search", str(tmp_path / "ix"), "a dog")


@pytest.mark.slow  # ~30 s: starts a Ray cluster
def test_a_ray_built_index_equals_a_local_one(setup, tmp_path):
    ray = pytest.importorskip("ray")
    local = built(setup, "f32")
    try:
        r = runner.invoke(app, ["index", str(setup["bundle"]), "--corpus", str(setup["corpus"]), "--out", str(tmp_path / "ray"),
                                "--engine", "ray", "--workers", "2", "--threads", "2", "--window", "300", "--json"])
        assert r.exit_code == 0, (r.output, r.exception)
    finally:
        ray.shutdown()
    got = Index.open(tmp_path / "ray")
    assert got.count == DOCS and got.ids(np.arange(DOCS)) == local.ids(np.arange(DOCS))
    a = np.concatenate([c for _, c in got.chunks()])
    assert np.allclose(a, np.concatenate([c for _, c in local.chunks()]), atol=1e-5)  # Ray's batches pad otherwise
    assert sorted(p.name for p in (tmp_path / "ray").iterdir()) == ["manifest.json", "shard-000000"]


def test_vectors_are_written_once_into_the_pending_shard_and_a_killed_int8_build_resumes_to_a_straight_one(setup, tmp_path,
                                                                                                           monkeypatch):
    """A window's vectors go from the model into .pending/shard-NNNNNN/vectors.bin, quantized, and the
    shard is renamed into the index: no other file holds them. A kill leaves the windows on disk (after
    the calibration's first rows), a resume equals a straight build byte for byte, and a resume with
    other settings is refused."""
    from mlmkit.retrieval.index import live, pending

    monkeypatch.setattr(pending, "CALIBRATION_ROWS", 300)  # calibrated after two windows of 256, not at the end
    straight = built(setup, "int8-cal300", quantization="int8")
    out = tmp_path / "killed"
    kill = killed_after(768)
    with pytest.raises(KeyboardInterrupt):
        build(BuildArgs(setup["bundle"], setup["corpus"], out, quantization="int8", window=256), kill)
    files = {str(f.relative_to(out / ".pending")): f.stat().st_size for f in (out / ".pending").rglob("*") if f.is_file()}
    assert files == {"progress.json": files["progress.json"], "ids.jsonl": files["ids.jsonl"],
                     "shard-000000/vectors.bin": 768 * 64}, files  # int8: a byte a dimension, nowhere else
    with pytest.raises(ConfigError, match="was for other quantization"):
        build(BuildArgs(setup["bundle"], setup["corpus"], out, quantization="float16", window=256, resume=True))
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
    assert resumed.manifest["ranges"] == straight.manifest["ranges"] and not (out / ".pending").exists()
    assert (np.asarray(resumed.shards[0][0]) == np.asarray(straight.shards[0][0])).all()
    assert resumed.ids(np.arange(DOCS)) == straight.ids(np.arange(DOCS))


def test_a_search_knows_the_bundle_by_its_recorded_size_and_time_and_hashes_only_a_changed_or_copied_one(setup, tmp_path,
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
    recorded = ix.manifest["bundle"]
    assert (recorded["model_bytes"], recorded["model_mtime_ns"], len(recorded["sha256"])) == (graph.st_size, graph.st_mtime_ns, 64)

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
    r = runner.invoke(app, ["search", str(ix.path), "a dog", "--bundle", str(copy), "--json"])  # the graph as it was
    assert r.exit_code == 0 and json.loads(r.stdout)["hits"], r.output


# ---- hybrid retrieval (retrieval/index/hybrid.py) -----------------------------------------------------------
def by_hand(rankings, fusion, weights):
    """The fusion of one query's rankings, written out: rrf's 1 / (60 + rank), or min-max normalised scores."""
    total = {}
    for w, ranking in zip(weights, rankings):
        scores = [s for _, s in ranking]
        for rank, (doc, s) in enumerate(ranking, 1):
            if fusion == "rrf":
                part = 1 / (60 + rank)
            else:
                part = (s - min(scores)) / (max(scores) - min(scores)) if max(scores) > min(scores) else 1.0
            total[doc] = total.get(doc, 0.0) + w * part
    return sorted(total.items(), key=lambda x: (-x[1], x[0]))


@pytest.fixture(scope="module")
def beir(setup):
    from mlmkit.quickstart.retrieval_set import write_retrieval_set

    d = setup["root"] / "beir"
    write_retrieval_set(d, max_documents=150)
    build(BuildArgs(setup["bundle"], d / "corpus.jsonl", setup["root"] / "beir-ix"))
    build(BuildArgs(setup["bundle"], d / "corpus.jsonl", setup["root"] / "beir-int8", quantization="int8"))
    return d


def test_hybrid_search_and_evaluation_equal_a_fusion_by_hand_of_each_retriever_alone(setup, beir):
    import bm25s
    import Stemmer

    from mlmkit.retrieval.exact import bm25_metrics, mean_metrics
    from mlmkit.retrieval.index.hybrid import BM25Ranker, Hybrid, IndexRanker, corpus_texts
    from mlmkit.text.beir import read_split

    ix, corpus = setup["root"] / "beir-ix", beir / "corpus.jsonl"
    split = read_split(beir, training=False)
    qids = list(split.queries)
    texts = [split.queries[q] for q in qids]
    ids, docs = corpus_texts(corpus)
    assert ids == list(split.corpus) and docs == list(split.corpus.values())
    # each retriever's own ranking, outside hybrid.py: the index's search, and bm25s itself
    opened = Index.open(ix)
    dense = [[(i, float(s)) for i, s in zip(opened.ids(r), sr)] for r, sr in zip(*search_vectors(opened, query_embeddings(ix, texts), 100))]
    stem = Stemmer.Stemmer("english")  # BM25's words are stemmed (retrieval.STEMMER)
    lexical = bm25s.BM25()
    lexical.index(bm25s.tokenize(docs, stemmer=stem, show_progress=False), show_progress=False)
    rows, scores = lexical.retrieve(bm25s.tokenize(texts, stemmer=stem, show_progress=False), k=100, show_progress=False)
    sparse = [[(ids[r], float(s)) for r, s in zip(row, sr) if s > 0] for row, sr in zip(rows, scores)]
    for fusion, weights in (("rrf", [1.0, 1.0]), ("weighted", [0.3, 0.7])):
        fused = Hybrid([IndexRanker(ix), BM25Ranker(ids, docs)], fusion, weights).rank(texts, 100)
        for got, d, s in zip(fused, dense, sparse):
            want = by_hand([d, s], fusion, weights)[:100]
            assert [x for x, _ in got] == [x for x, _ in want] and np.allclose([v for _, v in got], [v for _, v in want], atol=1e-6)
    # evaluate --hybrid: each retriever alone as it evaluates alone, and the fusion's metrics from the hand fusion
    r = runner.invoke(app, ["evaluate", str(ix), "--data", str(beir), "--hybrid", "bm25", "--json"])
    assert r.exit_code == 0, r.output
    got = {row["model"]: row for row in map(json.loads, r.stdout.splitlines())}
    assert list(got) == [str(ix), "bm25", "hybrid (rrf)"]
    alone = json.loads(runner.invoke(app, ["evaluate", str(ix), "--data", str(beir), "--json"]).stdout)
    assert all(got[str(ix)][m] == pytest.approx(alone[m], abs=1e-6) for m in alone)
    assert got["bm25"]["ndcg@10"] == pytest.approx(bm25_metrics(beir)["ndcg@10"], abs=1e-6)
    hand = mean_metrics({q: [x for x, _ in by_hand([d, s], "rrf", [1, 1])] for q, d, s in zip(qids, dense, sparse)}, split.qrels)
    assert got["hybrid (rrf)"]["ndcg@10"] == pytest.approx(hand["ndcg@10"], abs=1e-6)
    # search --hybrid: the same fusion's top k, over two indexes too (an int8 one of the same corpus)
    r = runner.invoke(app, ["search", str(ix), texts[0], "--hybrid", "bm25", "--corpus", str(corpus), "--top-k", "5", "--json"])
    assert r.exit_code == 0, r.output
    assert [(h["id"], round(h["score"], 6)) for h in json.loads(r.stdout)["hits"]] == \
        [(d, round(v, 6)) for d, v in by_hand([dense[0], sparse[0]], "rrf", [1, 1])[:5]]
    r = runner.invoke(app, ["search", str(ix), texts[0], "--hybrid", str(setup["root"] / "beir-int8"), "--fusion", "weighted",
                            "--top-k", "3", "--json"])
    assert r.exit_code == 0 and len(json.loads(r.stdout)["hits"]) == 3, r.output


def query_embeddings(ix, texts):
    pipe = Pipeline.load(Index.open(ix).manifest["bundle"]["path"])
    return np.asarray([r["embedding"] for r in pipe(texts, input_type="query")], dtype=np.float32)


def test_hybrid_refuses_retrievers_of_other_corpora_and_bad_settings_in_one_line(setup, beir):
    ix = str(setup["root"] / "beir-ix")
    other = built(setup, "f32")  # the fixture's own corpus, not the BEIR one
    cases = [
        (["search", ix, "q", "--hybrid", str(other.path)], "retrievers of different corpora"),
        (["search", ix, "q", "--hybrid", "bm25", "--corpus", str(setup["corpus"])], "retrievers of different corpora"),
        (["search", ix, "q", "--hybrid", "bm25"], "--hybrid bm25 needs the documents' texts"),
        (["search", ix, "q", "--corpus", str(setup["corpus"])], "it goes with --hybrid bm25"),
        (["search", ix, "q", "--hybrid", "nowhere"], "neither bm25 nor an index"),
        (["search", ix, "q", "--fusion", "weighted"], "they need --hybrid"),
        (["search", ix, "q", "--hybrid", "bm25", "--fusion", "max", "--corpus", str(beir / "corpus.jsonl")], "--fusion max"),
        (["evaluate", ix, "--data", str(beir), "--hybrid", "bm25", "--weights", "1,2,3"], "3 weights for 2 retrievers"),
        (["evaluate", ix, "--data", str(beir), "--hybrid", "bm25", "--weights", "1,x"], "give numbers separated by commas"),
        (["evaluate", ix, "--data", str(beir), "--hybrid", "bm25", "--weights", "0,0"], "one above 0"),
        (["evaluate", str(setup["bundle"]), "--data", str(beir), "--hybrid", "bm25"], "is not an index"),
    ]
    for argv, said in cases:
        assert said in one_red_line(runner.invoke(app, argv)), argv


def test_mining_with_hybrid_mines_from_the_fused_ranking_and_refuses_what_a_fused_score_cannot_give(setup, beir, tmp_path):
    from mlmkit.retrieval.index.hybrid import FusedRetriever

    class Fixed:  # a retriever of places whose rankings are given
        def __init__(self, rows, scores):
            self.rows, self.scores = np.asarray(rows), np.asarray(scores, dtype=np.float32)

        def search(self, queries, k):
            return self.rows[:, :k], self.scores[:, :k]

    a = Fixed([[3, 1, 2, -1]], [[0.9, 0.5, 0.1, -np.inf]])
    b = Fixed([[2, 4, 3, 0]], [[7.0, 3.0, 2.0, 1.0]])
    for fusion, w in (("rrf", [1.0, 2.0]), ("weighted", [1.0, 1.0])):
        rows, scores = FusedRetriever([("a", a), ("b", b)], fusion, w).search(["q"], 4)
        want = by_hand([[(3, 0.9), (1, 0.5), (2, 0.1)], [(2, 7.0), (4, 3.0), (3, 2.0), (0, 1.0)]], fusion, w)[:4]
        assert rows[0].tolist() == [d for d, _ in want] and np.allclose(scores[0], [s for _, s in want]), (fusion, rows, want)
    ix = setup["root"] / "beir-ix"
    mined = {}
    for name, extra in (("index", []), ("hybrid", ["--hybrid", "bm25", "--fusion", "weighted"])):
        r = runner.invoke(app, ["mine", str(beir), "--retriever", str(ix), *extra, "--out", str(tmp_path / f"{name}.jsonl"),
                                "--negatives", "3", "--range", "0:20", "--json"])
        assert r.exit_code == 0, r.output
        mined[name] = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    assert len(mined["hybrid"]) == len(mined["index"]) > 50
    assert all(row["negative_1"] != row["positive"] for row in mined["hybrid"])
    assert np.mean([x["negative_1"] == y["negative_1"] for x, y in zip(mined["hybrid"], mined["index"])]) < 0.9  # BM25 moved them
    for extra, said in ((["--margin", "0.1"], "no --margin"), (["--with-scores"], "--with-scores only from --score-with"),
                        (["--weights", "1"], "1 weights for 2 retrievers")):
        r = runner.invoke(app, ["mine", str(beir), "--retriever", str(ix), "--hybrid", "bm25", *extra, "--out", str(tmp_path / "x.jsonl")])
        assert said in one_red_line(r), extra


def test_serve_fuses_bm25_and_other_served_indexes_as_search_hybrid_does(setup, sparse, beir, tmp_path):
    """POST /v1/search with "hybrid": BM25 over --corpus, and another served index (a SPLADE one, its
    queries embedded by its own model through its queue) fused as `mlmkit search --hybrid` fuses them."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from serve_process import Server

    ix, corpus, splade = setup["root"] / "beir-ix", beir / "corpus.jsonl", tmp_path / "splade-ix"
    build(BuildArgs(sparse["bundle"], corpus, splade))
    queries = ["how do I read a file", "a list of numbers"]
    s = Server(tmp_path, f"emb={setup['bundle']}", f"sp={sparse['bundle']}", "--index", f"docs={ix}", "--index", f"sp={splade}",
               "--index", f"other={built(setup, 'f32').path}", "--corpus", f"docs={corpus}")
    try:
        def post(body):
            return httpx.post(s.url + "/v1/search", json=body, timeout=60)

        for hybrid, fusion, flags in ((["bm25"], "rrf", ["--hybrid", "bm25", "--corpus", str(corpus)]),
                                      (["bm25", "sp"], "weighted", ["--hybrid", "bm25", "--corpus", str(corpus), "--hybrid", str(splade)])):
            r = post({"index": "docs", "query": queries, "top_k": 5, "hybrid": hybrid, "fusion": fusion})
            assert r.status_code == 200 and r.json()["hybrid"] == hybrid, r.text
            cli = runner.invoke(app, ["search", str(ix), *queries, "--top-k", "5", "--fusion", fusion, *flags, "--json"])
            assert cli.exit_code == 0, cli.output
            for a, b in zip([x["hits"] for x in r.json()["results"]], [json.loads(x)["hits"] for x in cli.stdout.splitlines()], strict=True):
                assert [h["id"] for h in a] == [h["id"] for h in b] and np.allclose([h["score"] for h in a], [h["score"] for h in b], atol=1e-6)
        ids = [json.loads(line)["_id"] for line in open(corpus)][:30]
        for hybrid in (None, "bm25", ["bm25", "sp"]):  # a filter, alone and fused: the hits are the ids it keeps
            body = {"index": "docs", "query": queries, "top_k": 5, "where": f"id in {','.join(ids)}",
                    **({"hybrid": hybrid} if hybrid else {})}
            r = post(body)
            assert r.status_code == 200 and all(h["id"] in ids for x in r.json()["results"] for h in x["hits"]), r.text
            cli = runner.invoke(app, ["search", str(ix), *queries, "--top-k", "5", "--where", f"id in {','.join(ids)}", "--json",
                                      *(["--hybrid", "bm25", "--corpus", str(corpus)] if hybrid == "bm25" else [])])
            if hybrid != ["bm25", "sp"]:
                assert [[h["id"] for h in x["hits"]] for x in r.json()["results"]] == \
                    [[h["id"] for h in json.loads(x)["hits"]] for x in cli.stdout.splitlines()], hybrid
        bad = {
            "the index has no field 'colour'": {"index": "docs", "query": "a", "where": "colour=red"},
            "no @FILE on the server": {"index": "docs", "query": "a", "where": ["id in @/etc/passwd"]},
            "retrievers of different corpora": {"index": "docs", "query": "a", "hybrid": "other"},
            "neither bm25 nor another served index": {"index": "docs", "query": "a", "hybrid": ["nope"]},
            "the server has no --corpus for it": {"index": "sp", "query": "a", "hybrid": "bm25"},
            "send 'query', not 'vector'": {"index": "docs", "vector": [0.0] * 64, "hybrid": "bm25"},
            "'fusion' must be one of rrf, weighted": {"index": "docs", "query": "a", "hybrid": "bm25", "fusion": "max"},
            "3 weights for 2 retrievers": {"index": "docs", "query": "a", "hybrid": "bm25", "weights": [1, 1, 1]},
        }
        for message, body in bad.items():
            r = post(body)
            assert r.status_code == 422 and message in r.json()["error"], (message, r.status_code, r.text)
        assert httpx.get(s.url + "/health", timeout=5).status_code == 200
    finally:
        s.stop()
    r = runner.invoke(app, ["serve", str(setup["bundle"]), "--index", f"docs={ix}", "--corpus", f"docs={setup['corpus']}", "--port", "0"])
    assert "retrievers of different corpora" in one_red_line(r)


# ---- a live index: delete, upsert, compact (retrieval/index/live.py) -------------------------------------------
class Hits(list):
    """What a search answers: each query's hits as {id: score}; equal to another's with the same ids and
    scores to 1e-5 (vectors embedded in other batches round apart; a near tie's order aside)."""

    def __eq__(self, other):
        return len(self) == len(other) and all(a.keys() == b.keys() and all(abs(a[i] - b[i]) < 1e-5 for i in a)
                                               for a, b in zip(self, other))


def hits_of(path, q, k=10):
    ix = Index.open(path)
    rows, scores = search_vectors(ix, q, k)
    return Hits({i: float(s) for i, s in zip(ix.ids(r[r >= 0]), sr[r >= 0])} for r, sr in zip(rows, scores))


def test_deletes_upserts_and_a_compaction_equal_an_index_built_from_the_final_corpus_and_a_kill_leaves_before_or_after(
        setup, tmp_path, monkeypatch):
    from mlmkit.retrieval.index import live

    ix = tmp_path / "live"
    shutil.copytree(built(setup, "f32").path, ix)
    (tmp_path / "gone.txt").write_text("".join(f"d{i}\n" for i in range(100)))
    changed = [{"_id": f"d{i}", "title": "changed", "text": sentence(random.Random(i), 6)} for i in range(100, 150)]
    added = [{"_id": f"n{i}", "title": "", "text": sentence(random.Random(1000 + i), 8)} for i in range(50)]
    (tmp_path / "up.jsonl").write_text("".join(json.dumps(d) + "\n" for d in changed + added))
    final = setup["docs"][150:] + changed + added
    (tmp_path / "final.jsonl").write_text("".join(json.dumps(d) + "\n" for d in final))
    build(BuildArgs(setup["bundle"], tmp_path / "final.jsonl", tmp_path / "scratch"))
    want = hits_of(tmp_path / "scratch", setup["q"])

    def killed(step, after):  # the operation stopped as a kill would: just before its manifest is written, or just after
        real = live.write_json

        def stop(*a, **kw):
            if after:
                real(*a, **kw)
            raise KeyboardInterrupt
        monkeypatch.setattr(live, "write_json", stop)
        with pytest.raises(KeyboardInterrupt):
            step()
        monkeypatch.setattr(live, "write_json", real)

    before = hits_of(ix, setup["q"])
    r = runner.invoke(app, ["index", str(ix), "--delete", str(tmp_path / "gone.txt"), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["deleted"] == 100, r.output
    deleted = hits_of(ix, setup["q"])
    assert not {f"d{j}" for j in range(100)} & {i for hits in deleted for i in hits}
    assert deleted != before and all(len(h) == 10 for h in deleted)  # never fewer: the deleted rows never take a place
    r = runner.invoke(app, ["index", str(ix), "--upsert", str(tmp_path / "up.jsonl"), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["deleted"] == 150, r.output
    assert hits_of(ix, setup["q"]) == want
    snapshot = tmp_path / "snapshot"
    shutil.copytree(ix, snapshot)
    killed(lambda: live.compact(ix), after=False)  # new shards written, no manifest: the index as it was
    assert hits_of(ix, setup["q"]) == want and Index.open(ix).count == DOCS + 100
    killed(lambda: live.compact(ix), after=True)  # the manifest written, the old shard not yet removed: compacted
    assert hits_of(ix, setup["q"]) == want and Index.open(ix).count == len(final) and Index.open(ix).deleted is None
    r = runner.invoke(app, ["index", str(ix), "--compact", "--json"])  # nothing left to do but the sweep
    assert r.exit_code == 0 and json.loads(r.stdout)["count"] == len(final), r.output
    assert sorted(p.name for p in ix.iterdir() if p.name.startswith(("shard-", "deleted-"))) == \
        sorted(s["name"] for s in Index.open(ix).manifest["shards"])
    # the snapshot (deletes and an upsert, not compacted) compacts by the command to the same
    r = runner.invoke(app, ["index", str(snapshot), "--compact", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["freed_bytes"] > 0, r.output
    assert hits_of(snapshot, setup["q"]) == want
    # a delete killed before its manifest: as before; an upsert killed mid-embedding: as before, --resume finishes it
    (tmp_path / "gone2.txt").write_text("d150\n")
    killed(lambda: live.delete(snapshot, tmp_path / "gone2.txt"), after=False)
    assert hits_of(snapshot, setup["q"]) == want
    (tmp_path / "up2.jsonl").write_text("".join(json.dumps({**d, "title": "again"}) + "\n" for d in setup["docs"][150:700]))
    with pytest.raises(KeyboardInterrupt):
        build(BuildArgs(snapshot, upsert=tmp_path / "up2.jsonl", window=128), killed_after(256))
    assert hits_of(snapshot, setup["q"]) == want
    build(BuildArgs(snapshot, upsert=tmp_path / "up2.jsonl", window=128, resume=True))
    assert Index.open(snapshot).live == len(final)


def live_documents(path: Path) -> dict[str, bytes]:
    """An index's live documents: each id with its stored vector's bytes."""
    ix, out, start = Index.open(path), {}, 0
    for vectors, ids, _ in ix.shards:
        for r, i in enumerate(ids.to_pylist()):
            if ix.deleted is None or not ix.deleted[start + r]:
                out[i] = np.asarray(vectors[r]).tobytes()
        start += len(vectors)
    return out


def test_a_sigkill_at_any_file_operation_of_a_delete_an_upsert_or_a_compaction_leaves_the_index_before_or_after(
        setup, tmp_path):
    """A process SIGKILLed (no cleanup runs) just before each of its renames and removals
    (tests/retrieval/kill_points.py): every copy it leaves holds the documents of before or of after, exactly,
    is searchable, and the next operation goes on from it (an upsert --resume ends at after; a
    compaction removes what the kill left and keeps the documents)."""
    import subprocess
    import sys

    from mlmkit.retrieval.index import live

    ix = tmp_path / "ix"
    shutil.copytree(built(setup, "f32").path, ix)
    (tmp_path / "first.txt").write_text("d0\nd1\n")
    live.delete(ix, tmp_path / "first.txt")  # a bitmap already: the delete below replaces it, compaction has work
    (tmp_path / "gone.txt").write_text("d2\nd3\n")
    up = tmp_path / "up.jsonl"
    up.write_text("".join(json.dumps({"_id": i, "title": "", "text": sentence(random.Random(n), 6)}) + "\n"
                          for n, i in enumerate(["d4", "d5", "n0", "n1", "n2"])))
    def state(path):  # the documents, and the files the manifest names for them
        m = Index.open(path).manifest
        return live_documents(path), [s["name"] for s in m["shards"]], (m.get("deleted") or {}).get("file")

    before = state(ix)
    r = subprocess.run([sys.executable, str(Path(__file__).with_name("kill_points.py")), str(ix), str(tmp_path / "kills"),
                        f"delete={tmp_path / 'gone.txt'}", f"upsert={up}", "compact="], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    for line in r.stdout.splitlines():
        op, points = json.loads(line)["op"], json.loads(line)["points"]
        work = tmp_path / "kills" / op
        after = state(work / str(points + 1))
        assert points >= 3 and after != before, (op, points)
        seen = set()
        for k in range(1, points + 1):
            copy = work / str(k)
            now = state(copy)
            assert now in (before, after), (op, k)
            seen.add(now == after)
            rows, _ = search_vectors(Index.open(copy), setup["q"][:2], 5)
            assert (rows >= 0).all()
            if (copy / ".pending").exists():  # an upsert killed before its manifest: --resume finishes it
                build(BuildArgs(copy, upsert=up, window=8, resume=True))
                assert live_documents(copy) == after[0], (op, k)
            else:
                live.compact(copy)
                assert live_documents(copy) == now[0], (op, k)
            m = Index.open(copy).manifest
            named = {s["name"] for s in m["shards"]} | {(m.get("deleted") or {}).get("file")}
            assert not [p.name for p in copy.iterdir() if live.OURS.fullmatch(p.name) and p.name not in named], (op, k)
        assert seen == {False, True}, (op, seen)  # kills before the switch and after it
    assert len(r.stdout.splitlines()) == 3


def test_a_live_change_refuses_bad_input_in_one_line_and_changes_nothing(setup, tmp_path):
    ix = tmp_path / "live"
    shutil.copytree(built(setup, "f32").path, ix)
    manifest = (ix / "manifest.json").read_text()
    (tmp_path / "ids.txt").write_text("d1\nnope\nd2\n")
    (tmp_path / "empty.txt").write_text("")
    cases = [
        (["index", str(ix), "--delete", str(tmp_path / "ids.txt")], "ids.txt, line 2: the id 'nope' is not in"),
        (["index", str(ix), "--delete", str(tmp_path / "empty.txt")], "no ids"),
        (["index", str(ix), "--delete", str(tmp_path / "ids.txt"), "--compact"], "one change of an index at a time"),
        (["index", str(ix), "--compact", "--out", str(tmp_path / "x")], "it takes no --corpus, --out or --append"),
        (["index", str(ix), "--compact", "--resume"], "takes no --resume"),
        (["index", str(ix), "--upsert", str(setup["corpus"]), "--quantize", "int8"], "the index's own settings"),
        (["index", str(setup["bundle"])], "needs --corpus DOCS and --out INDEX"),
        (["index", str(tmp_path / "nowhere"), "--compact"], "is not an index"),
    ]
    for argv, said in cases:
        assert said in one_red_line(runner.invoke(app, argv)), argv
        assert (ix / "manifest.json").read_text() == manifest and not list(ix.glob("deleted-*"))
    # a deleted id is not there to delete again; an id deleted can be added again
    (tmp_path / "one.txt").write_text("d1\n")
    assert runner.invoke(app, ["index", str(ix), "--delete", str(tmp_path / "one.txt")]).exit_code == 0
    assert "(or was deleted)" in one_red_line(runner.invoke(app, ["index", str(ix), "--delete", str(tmp_path / "one.txt")]))
    (tmp_path / "back.jsonl").write_text(json.dumps(setup["docs"][1]) + "\n")
    r = runner.invoke(app, ["index", str(setup["bundle"]), "--corpus", str(tmp_path / "back.jsonl"), "--out", str(ix), "--append", "--json"])
    assert r.exit_code == 0 and Index.open(ix).live == DOCS, r.output
    dup = runner.invoke(app, ["index", str(setup["bundle"]), "--corpus", str(tmp_path / "back.jsonl"), "--out", str(ix), "--append"])
    assert "comes twice" in one_red_line(dup)


def test_sparse_and_ann_indexes_compact_to_an_index_of_the_documents_left(setup, sparse, tmp_path):
    keep = setup["docs"][300:]
    (tmp_path / "left.jsonl").write_text("".join(json.dumps(d) + "\n" for d in keep))
    (tmp_path / "gone.txt").write_text("".join(f"d{i}\n" for i in range(300)))
    for name, bundle, kw in (("sparse", sparse["bundle"], {}), ("hnsw", setup["bundle"], {"ann": "hnsw", "quantization": "int8"})):
        ix, scratch = tmp_path / name, tmp_path / f"{name}-scratch"
        build(BuildArgs(bundle, setup["corpus"], ix, **kw))
        if name == "hnsw":  # the same int8 ranges as the index's: calibrated on its first documents
            build(BuildArgs(bundle, setup["corpus"], scratch, **kw))
            (tmp_path / "gone-all.txt").write_text("".join(f"d{i}\n" for i in range(300)))
        else:
            build(BuildArgs(bundle, tmp_path / "left.jsonl", scratch))
        q = as_queries_of(Index.open(ix), bundle, setup["queries"])
        assert runner.invoke(app, ["index", str(ix), "--delete", str(tmp_path / "gone.txt")]).exit_code == 0
        if name == "hnsw":
            assert runner.invoke(app, ["index", str(scratch), "--delete", str(tmp_path / "gone-all.txt")]).exit_code == 0
        deleted = hits_of(ix, q)
        assert runner.invoke(app, ["index", str(ix), "--compact"]).exit_code == 0
        compacted = Index.open(ix)
        assert compacted.count == len(keep) and compacted.deleted is None
        assert hits_of(ix, q) == deleted
        if name == "sparse":
            assert hits_of(ix, q) == hits_of(scratch, q)
        else:
            assert compacted.manifest["ann_file"] == "ann-000000.faiss" and not (ix / "ann.faiss").exists()


def as_queries_of(ix, bundle, texts):
    from mlmkit.retrieval.index import as_input, as_queries

    pipe = Pipeline.load(bundle)
    return as_queries(ix, pipe(texts, **as_input(pipe, "query")))


# ---- metadata filters (retrieval/index/filters.py) ------------------------------------------------------------
@pytest.fixture(scope="module")
def tagged(setup):
    """The fixture's corpus with fields: lang (en for a half), year (a twelfth each: 1% is one year and a
    document more), a flag, a list, and a field only some documents have."""
    docs = [{**d, "lang": "en" if i % 2 else "de", "year": 2000 + i % 100, "ok": i % 3 == 0, "tags": ["a", "b"][: i % 3],
             **({"extra": "x"} if i < 100 else {})} for i, d in enumerate(setup["docs"])]
    path = setup["root"] / "tagged.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return {"docs": docs, "corpus": path}


def brute(setup, keep, k=10):
    """The top k of the documents ``keep`` alone (a bool mask), by the bundle's own vectors."""
    s = np.where(keep[None, :], setup["q"] @ setup["vectors"].T, -np.inf)
    order = np.lexsort((np.broadcast_to(np.arange(s.shape[1]), s.shape), -s), axis=1)[:, :k]
    return [[int(j) for j in row if keep[j]] for row in order]


def test_a_filter_returns_the_true_top_k_of_the_documents_it_keeps_in_every_kind_of_search(setup, tagged, tmp_path, monkeypatch):
    from mlmkit.retrieval.index import filters
    from mlmkit.retrieval.index import search as search_module

    docs, defaults = tagged["docs"], (search_module.SUBSET, search_module.SUBSET_SHARE)
    year = np.asarray([d["year"] for d in docs])
    cases = {"year=2042": year == 2042, "year>=2090": year >= 2090, "lang=en": np.asarray([d["lang"] == "en" for d in docs]),
             "lang in de,fr": np.asarray([d["lang"] == "de" for d in docs]), "ok=true": np.asarray([d["ok"] for d in docs]),
             "extra!=x": np.arange(len(docs)) >= 100, "id in d5,d7,d1100": np.isin(np.arange(len(docs)), [5, 7, 1100])}
    for name, kw in (("flat", {}), ("hnsw", {"ann": "hnsw"}), ("ivf", {"ann": "ivf", "ivf_lists": 8}),
                     ("binary", {"quantization": "binary", "rescore_copy": "float16"})):
        ix = tmp_path / name
        build(BuildArgs(setup["bundle"], tagged["corpus"], ix, window=256, **kw))
        index = Index.open(ix)
        for subset in (True, False):  # few rows: scored alone, exactly; else inside each stage (forced here)
            monkeypatch.setattr(search_module, "SUBSET", 65536 if subset else 0)
            monkeypatch.setattr(search_module, "SUBSET_SHARE", 1.0 if subset else 0.0)
            for where, keep in cases.items():
                rows, _ = search_vectors(index, setup["q"], 10, where=filters.rows(index, filters.parse([where])),
                                         rescore=index.count if name == "binary" else None)  # binary: its own recall aside
                want = brute(setup, keep)
                got = [[int(r) for r in row if r >= 0] for row in rows]
                if name == "flat":
                    assert got == want, (name, where)
                else:  # approximate (float16 rescoring, ANN): the filter holds, and the top 10 is mostly found
                    assert all(keep[r] for row in got for r in row), (name, where)
                    assert np.mean([len(set(g) & set(w)) / len(w) for g, w in zip(got, want)]) > (0.95 if subset else 0.8), (name, where)
    monkeypatch.setattr(search_module, "SUBSET", defaults[0])  # the defaults: a filter keeping a few rows is searched
    monkeypatch.setattr(search_module, "SUBSET_SHARE", defaults[1])  # over them alone, one keeping half is not
    subsets = []
    real = search_module._search_subset
    monkeypatch.setattr(search_module, "_search_subset", lambda *a: subsets.append(len(a[3])) or real(*a))
    flat = Index.open(tmp_path / "flat")
    for where in ("id in d5,d7,d1100", "ok=true"):
        search_vectors(flat, setup["q"], 10, where=filters.rows(flat, filters.parse([where])))
    assert subsets == [3], subsets
    r = runner.invoke(app, ["search", str(tmp_path / "flat"), setup["queries"][0], "--where", "lang=en", "--where", "year<2010",
                            "--top-k", "3", "--json"])
    assert r.exit_code == 0, r.output
    both = np.asarray([d["lang"] == "en" and d["year"] < 2010 for d in docs])
    assert [h["id"] for h in json.loads(r.stdout)["hits"]] == [f"d{j}" for j in brute(setup, both, 3)[0]]
    (tmp_path / "ids.txt").write_text("d3\nd9\n")
    r = runner.invoke(app, ["search", str(tmp_path / "flat"), "a dog", "--where", f"id in @{tmp_path / 'ids.txt'}", "--json"])
    assert r.exit_code == 0 and {h["id"] for h in json.loads(r.stdout)["hits"]} == {"d3", "d9"}, r.output
    for where, said in (("colour=red", "the index has no field 'colour'"), ("lang>=en", "lang holds string values; >= compares"),
                        ("year=soon", "year holds numbers; 'soon' is not one"), ("ok=maybe", "give true or false"),
                        ("lang", "not FIELD=VALUE"), ("tags=a", "tags holds lists or objects")):
        assert said in one_red_line(runner.invoke(app, ["search", str(tmp_path / "flat"), "a dog", "--where", where])), where


def test_fields_of_another_kind_in_a_later_document_name_the_line_and_filters_survive_an_upsert_and_a_compaction(
        setup, tagged, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"_id": "a", "text": "one", "year": 2020}) + "\n" + json.dumps({"_id": "b", "text": "two", "year": "soon"}) + "\n")
    r = runner.invoke(app, ["index", str(setup["bundle"]), "--corpus", str(bad), "--out", str(tmp_path / "bad")])
    assert "bad.jsonl, line 2" in one_red_line(r) and "field 'year' is a string here and a number before" in r.stderr
    ix = tmp_path / "ix"
    build(BuildArgs(setup["bundle"], tagged["corpus"], ix))
    (tmp_path / "up.jsonl").write_text("".join(json.dumps({**d, "lang": "fr"}) + "\n" for d in tagged["docs"][:50]))
    assert runner.invoke(app, ["index", str(ix), "--upsert", str(tmp_path / "up.jsonl")]).exit_code == 0
    (tmp_path / "gone.txt").write_text("d60\nd61\n")
    assert runner.invoke(app, ["index", str(ix), "--delete", str(tmp_path / "gone.txt")]).exit_code == 0
    from mlmkit.retrieval.index import filters

    for step in ("deleted", "compacted"):
        index = Index.open(ix)
        fr = filters.rows(index, filters.parse(["lang=fr"]))
        assert sorted(index.ids(np.flatnonzero(fr & ~(index.deleted if index.deleted is not None else False)))) == \
            sorted(f"d{i}" for i in range(50))
        rows, _ = search_vectors(index, setup["q"], 100, where=filters.rows(index, filters.parse(["lang=de"])))
        got = {i for row in rows for i in index.ids(row[row >= 0])}
        assert got and not got & ({f"d{i}" for i in range(50)} | {"d60"}), step
        assert runner.invoke(app, ["index", str(ix), "--compact"]).exit_code == 0


# ---- chunked documents (text/chunks.py) ------------------------------------------------------------------
def test_a_chunker_cuts_at_word_boundaries_within_the_size_and_refuses_what_the_model_cannot_read(setup):
    from mlmkit.text.chunks import Chunker, Chunking

    pipe = Pipeline.load(setup["bundle"])
    chunker = Chunker(pipe.tokenizer, pipe.max_length, Chunking.of(12, 3))
    tok = chunker.tokenizer
    rng = random.Random(3)
    for _ in range(30):
        text = " ".join(sentence(rng, rng.randint(1, 12)) + rng.choice([".", ",", ""]) for _ in range(rng.randint(1, 12)))
        spans = chunker.spans(text)
        if len(tok.encode(text, add_special_tokens=False).ids) <= 12:
            assert spans == [(0, len(text))]
            continue
        words = [(m.start(), m.end()) for m in re.finditer(r"\w+|[^\w\s]", text)]
        starts, ends = {a for a, _ in words}, {b for _, b in words}
        for (a, b), (a2, _) in zip(spans, spans[1:] + [(len(text), 0)]):
            assert a in starts and b in ends, (text, a, b)  # never inside a word
            assert len(tok.encode(text[a:b], add_special_tokens=False).ids) <= 12
            assert a < a2 <= b or a2 == len(text)  # each starts inside the one before: they overlap, and go on
        assert spans[0][0] == 0 and spans[-1][1] == len(text.rstrip())
    for tokens, overlap, said in ((12, 12, "the overlap must be 0 or more and less than the chunk"), (0, None, "at least 1"),
                                  (None, 3, "--chunk-overlap goes with --chunk-tokens")):
        with pytest.raises(ConfigError, match=said):
            Chunking.of(tokens, overlap)
    with pytest.raises(ConfigError, match="past what the model reads of a text: 32 tokens"):
        Chunker(pipe.tokenizer, pipe.max_length, Chunking.of(40, 0))
    with pytest.raises(ConfigError, match="--chunk-sentences goes with --chunk-tokens"):
        Chunking.of(None, None, True)
    # --chunk-sentences: a chunk ends at a sentence end where its second half has one, and the overlap
    # starts at a sentence start; otherwise at words, as above
    by_sentence = Chunker(pipe.tokenizer, pipe.max_length, Chunking.of(20, 6, True))
    ended = cut = 0
    for _ in range(40):
        text = " ".join(sentence(rng, rng.randint(2, 9)) + "." for _ in range(rng.randint(3, 10)))
        enc = tok.encode(text, add_special_tokens=False)
        spans = by_sentence.spans(text)
        for a, b in spans[:-1]:
            assert len(tok.encode(text[a:b], add_special_tokens=False).ids) <= 20
            inside = [i for i, (x, y) in enumerate(enc.offsets) if a <= x and y <= b]
            half = inside[len(inside) // 2]
            has_end = any(text[enc.offsets[i][1] - 1] == "." for i in inside if i > half)
            ended += text[b - 1] == "."
            cut += 1
            assert text[b - 1] == "." or not has_end, (text[a:b],)  # a sentence end in the second half is where it ends
        assert spans[0][0] == 0 and spans[-1][1] == len(text)
    assert cut > 20 and ended > 0.8 * cut, (ended, cut)
    assert by_sentence.spans("one two. three") == [(0, 14)]


def test_a_chunked_index_ranks_documents_by_their_best_chunk_whatever_files_they_came_in(setup, tmp_path):
    rng = random.Random(7)
    docs = [{"_id": f"L{i}", "text": " . ".join(sentence(rng, rng.randint(3, 9)) for _ in range(rng.randint(1, 9))),
             "part": i % 3} for i in range(120)]
    (tmp_path / "all.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs[:50]))
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs[50:]))
    r = runner.invoke(app, ["index", str(setup["bundle"]), "--corpus", str(tmp_path / "all.jsonl"), "--out", str(tmp_path / "one"),
                            "--chunk-tokens", "12", "--chunk-overlap", "3", "--window", "64", "--json"])
    assert r.exit_code == 0, r.output
    build(BuildArgs(setup["bundle"], tmp_path / "a.jsonl", tmp_path / "two", chunk_tokens=12, chunk_overlap=3))
    build(BuildArgs(setup["bundle"], tmp_path / "b.jsonl", tmp_path / "two", append=True))  # takes the index's chunks
    ix, two = Index.open(tmp_path / "one"), Index.open(tmp_path / "two")
    assert ix.manifest["chunks"] == {"tokens": 12, "overlap": 3} == two.manifest["chunks"] and ix.count == two.count > 150
    # by hand: every chunk's text embedded, a document's score its best chunk's cosine
    pipe = Pipeline.load(setup["bundle"])
    spans = ix.chunk_spans(np.arange(ix.count))
    texts = [docs[int(i[1:])]["text"][a:b] for i, (_, a, b) in zip(ix.ids(np.arange(ix.count)), spans)]
    chunk_vectors = normalized(np.asarray([r["embedding"] for r in pipe(texts, input_type="document")], dtype=np.float32))
    owner = np.asarray([int(i[1:]) for i in ix.ids(np.arange(ix.count))])
    best = np.full((len(setup["q"]), len(docs)), -np.inf)
    np.maximum.at(best.T, owner, (setup["q"] @ chunk_vectors.T).T)
    want = np.argsort(-best, axis=1, kind="stable")[:, :5]
    for index in (ix, two):
        rows, scores = search_vectors(index, setup["q"], 5)
        found = hits(index, rows, scores)
        assert [[h["id"] for h in f] for f in found] == [[f"L{j}" for j in w] for w in want]
        assert np.allclose(scores, np.take_along_axis(best, want, 1), atol=1e-5)
        h = found[0][0]
        assert docs[int(h["id"][1:])]["text"][h["start"]:h["end"]] == texts[rows[0][0]] and "chunk" in h
    # --chunk-agg mean and sum-top-2: a document's score from all its chunks, as by hand (the top 5 of the
    # 100 documents of the best chunks: here every document)
    sims = setup["q"] @ chunk_vectors.T
    for agg, of in (("mean", lambda v: v.mean()), ("sum-top-2", lambda v: np.sort(v)[::-1][:2].sum())):
        by_doc = np.asarray([[of(sims[j][owner == d]) for d in range(len(docs))] for j in range(len(sims))])
        want_agg = np.argsort(-by_doc, axis=1, kind="stable")[:, :5]
        rows, scores = search_vectors(ix, setup["q"], 5, chunk_agg=agg)
        assert [[h["id"] for h in f] for f in hits(ix, rows, scores)] == [[f"L{j}" for j in w] for w in want_agg], agg
        assert np.allclose(scores, np.take_along_axis(by_doc, want_agg, 1), atol=1e-5)
        assert all(sims[j][r] == pytest.approx(sims[j][owner == owner[r]].max(), abs=1e-5) for j, row in enumerate(rows)
                   for r in row)  # each hit names its best chunk
    r = runner.invoke(app, ["search", str(tmp_path / "one"), "a dog", "--chunk-agg", "sum-top-2", "--json"])
    assert r.exit_code == 0 and len(json.loads(r.stdout.splitlines()[0])["hits"]) == 10, r.output
    assert "not one of max, mean, sum-top-N" in one_red_line(runner.invoke(app, ["search", str(tmp_path / "one"), "x",
                                                                                  "--chunk-agg", "median"]))
    assert "is not chunked" in one_red_line(runner.invoke(app, ["search", str(built(setup, "f32").path), "x",
                                                                "--chunk-agg", "mean"]))
    assert "is not an index" in one_red_line(runner.invoke(app, ["evaluate", str(setup["bundle"]), "--data", str(tmp_path),
                                                                 "--chunk-agg", "mean"]))
    from types import SimpleNamespace

    from mlmkit.serve.routes import HTTPError, Search

    served = {"m": SimpleNamespace(indexes={"c": ix, "f": built(setup, "f32")}, pipe=SimpleNamespace(option_names=()))}
    assert Search().parse({"index": "c", "query": "a dog", "chunk_agg": "sum-top-2"}, served).state["chunk_agg"] == "sum-top-2"
    for body, said in (({"index": "c", "query": "a dog", "chunk_agg": "median"}, "not one of max, mean, sum-top-N"),
                       ({"index": "f", "query": "a dog", "chunk_agg": "mean"}, "this index is not chunked")):
        with pytest.raises(HTTPError, match=said):
            Search().parse(body, served)
    # filters and deletes hold for every chunk of a document; an append with other chunks is refused
    from mlmkit.retrieval.index import filters

    where = filters.rows(ix, filters.parse(["part=1"]))
    assert all(docs[int(i[1:])]["part"] == 1 for i in ix.ids(np.flatnonzero(where)))
    (tmp_path / "gone.txt").write_text("L0\nL1\n")
    assert runner.invoke(app, ["index", str(tmp_path / "one"), "--delete", str(tmp_path / "gone.txt")]).exit_code == 0
    assert Index.open(tmp_path / "one").deleted.sum() == (owner < 2).sum()
    r = runner.invoke(app, ["index", str(setup["bundle"]), "--corpus", str(tmp_path / "b.jsonl"), "--out", str(tmp_path / "two"),
                            "--append", "--chunk-tokens", "20"])
    assert "take the index's own chunks" in one_red_line(r)
    r = runner.invoke(app, ["index", str(setup["bundle"]), "--corpus", str(tmp_path / "b.jsonl"), "--out", str(tmp_path / "s"),
                            "--chunk-tokens", "12", "--chunk-sentences"])
    assert r.exit_code == 0 and Index.open(tmp_path / "s").manifest["chunks"] == {"tokens": 12, "overlap": 1, "sentences": True}
    r = runner.invoke(app, ["index", str(setup["bundle"]), "--corpus", str(tmp_path / "b.jsonl"), "--out", str(tmp_path / "two"),
                            "--append", "--chunk-tokens", "12", "--chunk-overlap", "3", "--chunk-sentences"])
    assert "is chunked at 12 tokens, 3 overlapping; --append" in one_red_line(r)
    r = runner.invoke(app, ["index", str(setup["bundle"]), "--corpus", str(tmp_path / "b.jsonl"), "--out", str(tmp_path / "x"),
                            "--chunk-tokens", "8", "--chunk-overlap", "8"])
    assert "the overlap must be 0 or more and less than the chunk" in one_red_line(r) and not (tmp_path / "x").exists()


def test_embed_with_chunk_tokens_gives_each_text_its_chunks_spans_and_vectors(setup, sparse, tmp_path):
    """`mlmkit embed --chunk-tokens`: each text's chunks are the index's chunker's spans (the document
    prompt counted, with --as document), each vector the bundle's embedding of its chunk's text, in
    Parquet and JSON lines alike; a .npy output and a bundle of another kind are one line each."""
    import pyarrow.parquet as pq

    from mlmkit.text.chunks import Chunker, Chunking

    rng = random.Random(11)
    texts = [" . ".join(sentence(rng, rng.randint(3, 9)) for _ in range(rng.randint(1, 8))) for _ in range(12)] + ["one"]
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    pipe = Pipeline.load(setup["bundle"])
    chunker = Chunker(pipe.tokenizer, pipe.max_length, Chunking.of(12, 2), str(pipe.meta.options.get("document_prompt", "")))
    spans = [chunker.spans(t) for t in texts]
    assert sum(len(s) > 1 for s in spans) >= 5  # long texts are cut
    want = np.asarray([r["embedding"] for r in pipe([t[a:b] for t, s in zip(texts, spans) for a, b in s], input_type="document")])
    cmd = ["embed", str(setup["bundle"]), "--input", str(data), "--as", "document", "--chunk-tokens", "12", "--chunk-overlap", "2",
           "--id-column", "id", "--output"]
    for out in (tmp_path / "out.parquet", tmp_path / "out.jsonl"):
        r = runner.invoke(app, [*cmd, str(out)])
        assert r.exit_code == 0, r.output
        got = pq.read_table(out).to_pylist() if out.suffix == ".parquet" else [json.loads(x) for x in out.read_text().splitlines()]
        assert [g["id"] for g in got] == list(range(len(texts)))
        assert [[(c["start"], c["end"]) for c in g["chunks"]] for g in got] == [[tuple(x) for x in s] for s in spans]
        have = np.asarray([c["embedding"] for g in got for c in g["chunks"]])
        assert have.shape == want.shape and np.abs(have - want).max() < 1e-5
    assert "a .npy holds a vector per text" in one_red_line(runner.invoke(app, [*cmd, str(tmp_path / "out.npy")]))
    assert "is a sparse-embedding bundle, and embed chunks texts for embedding bundles" in one_red_line(
        runner.invoke(app, ["embed", str(sparse["bundle"]), "x", "--chunk-tokens", "12"]))
    assert f"past what the model reads of a text: {pipe.max_length} tokens" in one_red_line(
        runner.invoke(app, ["embed", str(setup["bundle"]), "x", "--chunk-tokens", "400"]))
    (tmp_path / "pairs.jsonl").write_text(json.dumps({"text": texts[0], "text_pair": texts[1], "score": 0.5}) + "\n")
    assert "not pairs, training rows or evaluation data" in one_red_line(runner.invoke(
        app, ["evaluate", str(setup["bundle"]), "--data", str(tmp_path / "pairs.jsonl"), "--option", "chunk_tokens=8"]))
