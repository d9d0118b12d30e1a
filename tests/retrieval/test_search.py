"""search.py: `mlmkit search` and /v1/search answer the index's hits; a chunked index ranks documents by
their best chunk; --export round-trips."""

from __future__ import annotations

import json
import random
import re
import shutil
import time

import numpy as np
import pytest
from index_helpers import (
    DOCS,
    built,
    exact,
    one_red_line,
    runner,
)
from task_runs import sentence

from mlmkit.cli import app
from mlmkit.errors import ConfigError
from mlmkit.retrieval.exact import normalized
from mlmkit.retrieval.index import BuildArgs, Index, build, hits, search_vectors
from mlmkit.runtime.pipeline import Pipeline
from mlmkit.text.chunks import Chunking

pytest_plugins = ["index_fixtures"]


def test_search_on_the_command_line_and_the_parquet_export_round_trips(setup, tmp_path):
    pa = pytest.importorskip("pyarrow.parquet")
    ix = built(setup, "f32")
    r = runner.invoke(app, ["search", str(ix.path), *setup["queries"][:2], "--top-k", "3", "--json"])
    assert r.exit_code == 0, r.output
    got = [json.loads(line) for line in r.stdout.splitlines()]
    want, _ = exact(setup, 3)
    assert [h["id"] for h in got[1]["hits"]] == [f"d{i}"
                                                 for i in want[1]] and got[0]["query"] == setup["queries"][0]
    r = runner.invoke(app, ["search", str(ix.path), "--export", str(tmp_path / "v.parquet")])
    assert r.exit_code == 0, r.output
    t = pa.read_table(tmp_path / "v.parquet")
    vtype = t.schema.field("vector").type
    assert vtype.list_size == 64 and str(vtype.value_type) == "float" and "fixed_size_list" in str(vtype)
    assert t.column("id").to_pylist() == [d["_id"] for d in setup["docs"]]
    assert np.allclose(np.asarray(t.column("vector").to_pylist(), dtype=np.float32), setup["vectors"],
                       atol=1e-6)


def test_serve_answers_v1_search_with_the_indexs_hits_for_texts_and_vectors(setup, tmp_path):
    """`mlmkit serve BUNDLE --search-index INDEX`: POST /v1/search equals the plain numpy top-k for query
    vectors, and `mlmkit search` for query texts; bad requests are one 4xx each."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from serve_process import Server

    ix = built(setup, "f32")
    small = built(setup, "binary", quantization="binary")
    live = tmp_path / "live"
    shutil.copytree(ix.path, live)
    s = Server(tmp_path, f"emb={setup['bundle']}", "--search-index", f"docs={ix.path}", "--search-index",
               f"small={small.path}",
               "--search-index", f"live={live}")
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
        assert live_hits() == first[1:] + [h for h in live_hits()
                                           if h not in first] and first[0] not in live_hits()
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
        # one vector, not a list of them
        one = post({"index": "docs", "vector": setup["q"][1].tolist(), "top_k": 5}).json()
        assert [h["id"] for h in one["results"][0]["hits"]] == [h["id"] for h in got["results"][1]["hits"]]
        texts = post({"index": "docs", "query": setup["queries"][:2], "top_k": 3})
        assert texts.status_code == 200 and texts.json()["usage"]["total_tokens"] > 0, texts.text
        cli = runner.invoke(app, ["search", str(ix.path), *setup["queries"][:2], "--top-k", "3", "--json"])
        by_cli = [json.loads(x)["hits"] for x in cli.stdout.splitlines()]
        for a, b in zip([r["hits"] for r in texts.json()["results"]], by_cli, strict=True):
            assert [h["id"] for h in a] == [h["id"] for h in b]
            assert np.allclose([h["score"] for h in a], [h["score"] for h in b], atol=1e-5)
        assert post({"index": "small", "vector": setup["q"][0].tolist(), "top_k": 3,
                     "rescore": 50}).status_code == 200
        bad = {
            "no index named 'nope'": ({"index": "nope", "query": "a dog"}, 404),
            "say which index": ({"query": "a dog"}, 422),
            "has 3 values; the index holds 64": ({"index": "docs", "vector": [0.1, 0.2, 0.3]}, 422),
            "not a finite float32": ({"index": "docs", "vector": [1e39] * 64}, 422),
            "past index 'docs''s 1,200 documents": ({"index": "docs", "query": "a dog", "top_k": DOCS + 1},
                                                    422),
            "'top_k' must be a positive whole number": ({"index": "docs", "query": "a dog", "top_k": 0}, 422),
            "rescore 2 is below top_k 3": ({"index": "small", "query": "a dog", "top_k": 3, "rescore": 2},
                                           422),
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
    r = runner.invoke(app, ["serve", str(other), "--search-index", str(ix.path), "--port", "0"])
    assert "which is not served" in one_red_line(r)


def test_a_chunker_cuts_at_word_boundaries_within_the_size_and_refuses_what_the_model_cannot_read(setup):
    from mlmkit.text.chunks import Chunker, Chunking

    pipe = Pipeline.load(setup["bundle"])
    chunker = Chunker(pipe.tokenizer, pipe.max_length, Chunking.of(12, 3))
    tok = chunker.tokenizer
    rng = random.Random(3)
    for _ in range(30):
        text = " ".join(sentence(rng, rng.randint(1, 12)) + rng.choice([".", ",", ""])
                        for _ in range(rng.randint(1, 12)))
        spans = chunker.spans(text)
        if len(tok.encode(text, add_special_tokens=False).ids) <= 12:
            assert spans == [(0, len(text))]
            continue
        words = [(m.start(), m.end()) for m in re.finditer(r"\w+|[^\w\s]", text)]
        starts, ends = {a for a, _ in words}, {b for _, b in words}
        for (a, b), (a2, _) in zip(spans, spans[1:] + [(len(text), 0)]):
            assert a in starts and b in ends, (text, a, b)  # never inside a word
            assert len(tok.encode(text[a:b], add_special_tokens=False).ids) <= 12
            # each starts inside the one before: they overlap, and go on
            assert a < a2 <= b or a2 == len(text)
        assert spans[0][0] == 0 and spans[-1][1] == len(text.rstrip())
    for tokens, overlap, said in ((12, 12, "the overlap must be 0 or more and less than the chunk"),
                                  (0, None, "at least 1"),
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
            # a sentence end in the second half is where it ends
            assert text[b - 1] == "." or not has_end, (text[a:b],)
        assert spans[0][0] == 0 and spans[-1][1] == len(text)
    assert cut > 20 and ended > 0.8 * cut, (ended, cut)
    assert by_sentence.spans("one two. three") == [(0, 14)]


def test_a_chunked_index_ranks_documents_by_their_best_chunk_whatever_files_they_came_in(setup, tmp_path):
    rng = random.Random(7)
    docs = [{"_id": f"L{i}",
             "text": " . ".join(sentence(rng, rng.randint(3, 9)) for _ in range(rng.randint(1, 9))),
             "part": i % 3} for i in range(120)]
    (tmp_path / "all.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs[:50]))
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs[50:]))
    r = runner.invoke(app, ["index", str(setup["bundle"]), "--corpus", str(tmp_path / "all.jsonl"), "--out",
                            str(tmp_path / "one"),
                            "--chunk-tokens", "12", "--chunk-overlap", "3", "--window", "64", "--json"])
    assert r.exit_code == 0, r.output
    build(BuildArgs(setup["bundle"], tmp_path / "a.jsonl", tmp_path / "two", chunk_tokens=12,
                    chunk_overlap=3))
    # takes the index's chunks
    build(BuildArgs(setup["bundle"], tmp_path / "b.jsonl", tmp_path / "two", append=True))
    ix, two = Index.open(tmp_path / "one"), Index.open(tmp_path / "two")
    assert (ix.manifest["chunks"] == {"tokens": 12, "overlap": 3} == two.manifest.to_json()["chunks"]
            and ix.count == two.count > 150)
    # by hand: every chunk's text embedded, a document's score its best chunk's cosine
    pipe = Pipeline.load(setup["bundle"])
    spans = ix.chunk_spans(np.arange(ix.count))
    texts = [docs[int(i[1:])]["text"][a:b] for i, (_, a, b) in zip(ix.ids(np.arange(ix.count)), spans)]
    chunk_vectors = normalized(np.asarray([r["embedding"] for r in pipe(texts, input_type="document")],
                                          dtype=np.float32))
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
        assert [[h["id"] for h in f] for f in hits(ix, rows, scores)] == [[f"L{j}" for j in w]
                                                                          for w in want_agg], agg
        assert np.allclose(scores, np.take_along_axis(by_doc, want_agg, 1), atol=1e-5)
        assert all(sims[j][r] == pytest.approx(sims[j][owner == owner[r]].max(), abs=1e-5)
                   for j, row in enumerate(rows)
                   for r in row)  # each hit names its best chunk
    r = runner.invoke(app, ["search", str(tmp_path / "one"), "a dog", "--chunk-agg", "sum-top-2", "--json"])
    assert r.exit_code == 0 and len(json.loads(r.stdout.splitlines()[0])["hits"]) == 10, r.output
    assert "not one of max, mean, sum-top-N" in one_red_line(runner.invoke(app, ["search",
                                                                                 str(tmp_path / "one"), "x",
                                                                                  "--chunk-agg", "median"]))
    assert "is not chunked" in one_red_line(runner.invoke(app, ["search", str(built(setup, "f32").path), "x",
                                                                "--chunk-agg", "mean"]))
    assert "is not an index" in one_red_line(runner.invoke(app, ["evaluate", str(setup["bundle"]), "--data",
                                                                 str(tmp_path),
                                                                 "--chunk-agg", "mean"]))
    from types import SimpleNamespace

    from mlmkit.serve.http import HTTPError
    from mlmkit.serve.search import Search

    served = {"m": SimpleNamespace(indexes={"c": ix, "f": built(setup, "f32")},
                                   pipe=SimpleNamespace(option_names=()))}
    assert Search().parse({"index": "c", "query": "a dog", "chunk_agg": "sum-top-2"},
                          served).state["chunk_agg"] == "sum-top-2"
    for body, said in (({"index": "c", "query": "a dog", "chunk_agg": "median"},
                        "not one of max, mean, sum-top-N"),
                       ({"index": "f", "query": "a dog", "chunk_agg": "mean"}, "this index is not chunked")):
        with pytest.raises(HTTPError, match=said):
            Search().parse(body, served)
    # filters and deletes hold for every chunk of a document; an append with other chunks is refused
    from mlmkit.retrieval.index import filters

    where = filters.rows(ix, filters.parse(["part=1"]))
    assert all(docs[int(i[1:])]["part"] == 1 for i in ix.ids(np.flatnonzero(where)))
    (tmp_path / "gone.txt").write_text("L0\nL1\n")
    assert runner.invoke(app, ["index", str(tmp_path / "one"), "--delete",
                               str(tmp_path / "gone.txt")]).exit_code == 0
    assert Index.open(tmp_path / "one").deleted.sum() == (owner < 2).sum()
    r = runner.invoke(app, ["index", str(setup["bundle"]), "--corpus", str(tmp_path / "b.jsonl"), "--out",
                            str(tmp_path / "two"),
                            "--append", "--chunk-tokens", "20"])
    assert "take the index's own chunks" in one_red_line(r)
    r = runner.invoke(app, ["index", str(setup["bundle"]), "--corpus", str(tmp_path / "b.jsonl"), "--out",
                            str(tmp_path / "s"),
                            "--chunk-tokens", "12", "--chunk-sentences"])
    assert r.exit_code == 0 and Index.open(tmp_path / "s").manifest.chunks == Chunking(12, 1, True)
    r = runner.invoke(app, ["index", str(setup["bundle"]), "--corpus", str(tmp_path / "b.jsonl"), "--out",
                            str(tmp_path / "two"),
                            "--append", "--chunk-tokens", "12", "--chunk-overlap", "3", "--chunk-sentences"])
    assert "is chunked at 12 tokens, 3 overlapping; --append" in one_red_line(r)
    r = runner.invoke(app, ["index", str(setup["bundle"]), "--corpus", str(tmp_path / "b.jsonl"), "--out",
                            str(tmp_path / "x"),
                            "--chunk-tokens", "8", "--chunk-overlap", "8"])
    assert ("the overlap must be 0 or more and less than the chunk" in one_red_line(r)
            and not (tmp_path / "x").exists())


def test_embed_with_chunk_tokens_gives_each_text_its_chunks_spans_and_vectors(setup, sparse, tmp_path):
    """`mlmkit embed --chunk-tokens`: each text's chunks are the index's chunker's spans (the document
    prompt counted, with --as document), each vector the bundle's embedding of its chunk's text, in
    Parquet and JSON lines alike; a .npy output and a bundle of another kind are one line each."""
    import pyarrow.parquet as pq

    from mlmkit.text.chunks import Chunker, Chunking

    rng = random.Random(11)
    texts = [" . ".join(sentence(rng, rng.randint(3, 9)) for _ in range(rng.randint(1, 8)))
             for _ in range(12)] + ["one"]
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    pipe = Pipeline.load(setup["bundle"])
    chunker = Chunker(pipe.tokenizer, pipe.max_length, Chunking.of(12, 2),
                      str(pipe.meta.options.get("document_prompt", "")))
    spans = [chunker.spans(t) for t in texts]
    assert sum(len(s) > 1 for s in spans) >= 5  # long texts are cut
    want = np.asarray([r["embedding"] for r in pipe([t[a:b] for t, s in zip(texts, spans) for a, b in s],
                                                    input_type="document")])
    cmd = ["embed", str(setup["bundle"]), "--input", str(data), "--as", "document", "--chunk-tokens", "12",
           "--chunk-overlap", "2",
           "--id-column", "id", "--output"]
    for out in (tmp_path / "out.parquet", tmp_path / "out.jsonl"):
        r = runner.invoke(app, [*cmd, str(out)])
        assert r.exit_code == 0, r.output
        got = (pq.read_table(out).to_pylist() if out.suffix == ".parquet"
               else [json.loads(x) for x in out.read_text().splitlines()])
        assert [g["id"] for g in got] == list(range(len(texts)))
        assert [[(c["start"], c["end"]) for c in g["chunks"]] for g in got] == [[tuple(x) for x in s]
                                                                                for s in spans]
        have = np.asarray([c["embedding"] for g in got for c in g["chunks"]])
        assert have.shape == want.shape and np.abs(have - want).max() < 1e-5
    assert "a .npy holds a vector per text" in one_red_line(runner.invoke(app,
                                                                          [*cmd, str(tmp_path / "out.npy")]))
    assert "is a sparse-embedding bundle, and embed chunks texts for embedding bundles" in one_red_line(
        runner.invoke(app, ["embed", str(sparse["bundle"]), "x", "--chunk-tokens", "12"]))
    assert f"past what the model reads of a text: {pipe.max_length} tokens" in one_red_line(
        runner.invoke(app, ["embed", str(setup["bundle"]), "x", "--chunk-tokens", "400"]))
    (tmp_path / "pairs.jsonl").write_text(json.dumps({"text": texts[0], "text_pair": texts[1], "score": 0.5})
                                          + "\n")
    assert "not pairs, training rows or evaluation data" in one_red_line(runner.invoke(
        app, ["evaluate", str(setup["bundle"]), "--data", str(tmp_path / "pairs.jsonl"), "--option",
              "chunk_tokens=8"]))
