"""hybrid.py: a fused search equals a fusion by hand of each retriever alone; other corpora are refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
from index_helpers import (
    built,
    by_hand,
    one_red_line,
    query_embeddings,
    runner,
)

from mlmkit.cli import app
from mlmkit.retrieval.index import BuildArgs, Index, build, search_vectors

pytest_plugins = ["index_fixtures"]


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
    dense = [[(i, float(s)) for i, s in zip(opened.ids(r), sr)]
             for r, sr in zip(*search_vectors(opened, query_embeddings(ix, texts), 100))]
    stem = Stemmer.Stemmer("english")  # BM25's words are stemmed (retrieval.STEMMER)
    lexical = bm25s.BM25()
    lexical.index(bm25s.tokenize(docs, stemmer=stem, show_progress=False), show_progress=False)
    sparse = []  # bm25s's scores, ranked by the one tie rule: the higher score, then the earlier document
    for words in bm25s.tokenize(texts, stemmer=stem, show_progress=False, return_ids=False):
        s = lexical.get_scores(words).astype(np.float32)
        sparse.append([(ids[r], float(s[r])) for r in sorted(range(len(s)), key=lambda r: (-s[r], r))[:100]
                       if s[r] > 0])
    for fusion, weights in (("rrf", [1.0, 1.0]), ("weighted", [0.3, 0.7])):
        fused = Hybrid([IndexRanker(ix), BM25Ranker(ids, docs)], fusion, weights).rank(texts, 100)
        for got, d, s in zip(fused, dense, sparse):
            want = by_hand([d, s], fusion, weights)[:100]
            assert ([x for x, _ in got] == [x for x, _ in want]
                    and np.allclose([v for _, v in got], [v for _, v in want], atol=1e-6))
    # evaluate --hybrid: each retriever alone as it evaluates alone, and the fusion's metrics from the hand
    # fusion
    r = runner.invoke(app, ["evaluate", str(ix), "--data", str(beir), "--hybrid", "bm25", "--json"])
    assert r.exit_code == 0, r.output
    got = {row["model"]: row for row in map(json.loads, r.stdout.splitlines())}
    assert list(got) == [str(ix), "bm25", "hybrid (rrf)"]
    alone = json.loads(runner.invoke(app, ["evaluate", str(ix), "--data", str(beir), "--json"]).stdout)
    assert all(got[str(ix)][m] == pytest.approx(alone[m], abs=1e-6) for m in alone)
    assert got["bm25"]["ndcg@10"] == pytest.approx(bm25_metrics(beir)["ndcg@10"], abs=1e-6)
    hand = mean_metrics({q: [x for x, _ in by_hand([d, s], "rrf", [1, 1])]
                         for q, d, s in zip(qids, dense, sparse)}, split.qrels)
    assert got["hybrid (rrf)"]["ndcg@10"] == pytest.approx(hand["ndcg@10"], abs=1e-6)
    # search --hybrid: the same fusion's top k, over two indexes too (an int8 one of the same corpus)
    r = runner.invoke(app, ["search", str(ix), texts[0], "--hybrid", "bm25", "--corpus", str(corpus),
                            "--top-k", "5", "--json"])
    assert r.exit_code == 0, r.output
    assert [(h["id"], round(h["score"], 6)) for h in json.loads(r.stdout)["hits"]] == \
        [(d, round(v, 6)) for d, v in by_hand([dense[0], sparse[0]], "rrf", [1, 1])[:5]]
    r = runner.invoke(app, ["search", str(ix), texts[0], "--hybrid", str(setup["root"] / "beir-int8"),
                            "--fusion", "weighted",
                            "--top-k", "3", "--json"])
    assert r.exit_code == 0 and len(json.loads(r.stdout)["hits"]) == 3, r.output


def test_hybrid_refuses_retrievers_of_other_corpora_and_bad_settings_in_one_line(setup, beir):
    ix = str(setup["root"] / "beir-ix")
    other = built(setup, "f32")  # the fixture's own corpus, not the BEIR one
    cases = [
        (["search", ix, "q", "--hybrid", str(other.path)], "retrievers of different corpora"),
        (["search", ix, "q", "--hybrid", "bm25", "--corpus", str(setup["corpus"])],
         "retrievers of different corpora"),
        (["search", ix, "q", "--hybrid", "bm25"], "--hybrid bm25 needs the documents' texts"),
        (["search", ix, "q", "--corpus", str(setup["corpus"])], "it goes with --hybrid bm25"),
        (["search", ix, "q", "--hybrid", "nowhere"], "neither bm25 nor an index"),
        (["search", ix, "q", "--fusion", "weighted"], "they need --hybrid"),
        (["search", ix, "q", "--hybrid", "bm25", "--fusion", "max", "--corpus", str(beir / "corpus.jsonl")],
         "--fusion max"),
        (["evaluate", ix, "--data", str(beir), "--hybrid", "bm25", "--weights", "1,2,3"],
         "3 weights for 2 retrievers"),
        (["evaluate", ix, "--data", str(beir), "--hybrid", "bm25", "--weights", "1,x"],
         "give numbers separated by commas"),
        (["evaluate", ix, "--data", str(beir), "--hybrid", "bm25", "--weights", "0,0"], "one above 0"),
        (["evaluate", str(setup["bundle"]), "--data", str(beir), "--hybrid", "bm25"], "is not an index"),
        (["search", ix, "q", "--hybrid", "bm25", "--corpus", str(beir / "corpus.jsonl"), "--corpus-column",
          "nosuch"], "field 'nosuch': no field 'nosuch'"),
    ]
    for argv, said in cases:
        assert said in one_red_line(runner.invoke(app, argv)), argv


def test_mining_with_hybrid_mines_from_the_fused_ranking_and_refuses_what_a_fused_score_cannot_give(
    setup, beir, tmp_path):
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
        want = by_hand([[(3, 0.9), (1, 0.5), (2, 0.1)], [(2, 7.0), (4, 3.0), (3, 2.0), (0, 1.0)]], fusion,
                       w)[:4]
        assert (rows[0].tolist() == [d for d, _ in want]
                and np.allclose(scores[0], [s for _, s in want])), (fusion, rows, want)
    ix = setup["root"] / "beir-ix"
    mined = {}
    for name, extra in (("index", []), ("hybrid", ["--hybrid", "bm25", "--fusion", "weighted"])):
        r = runner.invoke(app, ["mine", str(beir), "--retriever", str(ix), *extra, "--out",
                                str(tmp_path / f"{name}.jsonl"),
                                "--negatives", "3", "--range", "0:20", "--json"])
        assert r.exit_code == 0, r.output
        mined[name] = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    assert len(mined["hybrid"]) == len(mined["index"]) > 50
    assert all(row["negative_1"] != row["positive"] for row in mined["hybrid"])
    # BM25 moved them
    assert np.mean([x["negative_1"] == y["negative_1"]
                    for x, y in zip(mined["hybrid"], mined["index"])]) < 0.9
    for extra, said in ((["--margin", "0.1"], "no --margin"),
                        (["--with-scores"], "--with-scores only from --score-with"),
                        (["--weights", "1"], "1 weights for 2 retrievers")):
        r = runner.invoke(app, ["mine", str(beir), "--retriever", str(ix), "--hybrid", "bm25", *extra,
                                "--out", str(tmp_path / "x.jsonl")])
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
    s = Server(tmp_path, f"emb={setup['bundle']}", f"sp={sparse['bundle']}", "--search-index", f"docs={ix}",
               "--search-index", f"sp={splade}",
               "--search-index", f"other={built(setup, 'f32').path}", "--corpus", f"docs={corpus}")
    try:
        def post(body):
            return httpx.post(s.url + "/v1/search", json=body, timeout=60)

        for hybrid, fusion, flags in ((["bm25"], "rrf", ["--hybrid", "bm25", "--corpus", str(corpus)]),
                                      (["bm25", "sp"], "weighted", ["--hybrid", "bm25", "--corpus",
                                                                    str(corpus), "--hybrid", str(splade)])):
            r = post({"index": "docs", "query": queries, "top_k": 5, "hybrid": hybrid, "fusion": fusion})
            assert r.status_code == 200 and r.json()["hybrid"] == hybrid, r.text
            cli = runner.invoke(app, ["search", str(ix), *queries, "--top-k", "5", "--fusion", fusion, *flags,
                                      "--json"])
            assert cli.exit_code == 0, cli.output
            for a, b in zip([x["hits"] for x in r.json()["results"]],
                            [json.loads(x)["hits"] for x in cli.stdout.splitlines()], strict=True):
                assert ([h["id"] for h in a] == [h["id"] for h in b]
                        and np.allclose([h["score"] for h in a], [h["score"] for h in b], atol=1e-6))
        ids = [json.loads(line)["_id"] for line in open(corpus)][:30]
        # a filter, alone and fused: the hits are the ids it keeps
        for hybrid in (None, "bm25", ["bm25", "sp"]):
            body = {"index": "docs", "query": queries, "top_k": 5, "where": f"id in {','.join(ids)}",
                    **({"hybrid": hybrid} if hybrid else {})}
            r = post(body)
            assert r.status_code == 200 and all(h["id"] in ids for x in r.json()["results"]
                                                for h in x["hits"]), r.text
            cli = runner.invoke(app, ["search", str(ix), *queries, "--top-k", "5", "--where",
                                      f"id in {','.join(ids)}", "--json",
                                      *(["--hybrid", "bm25", "--corpus", str(corpus)] if hybrid == "bm25"
                                        else [])])
            if hybrid != ["bm25", "sp"]:
                assert [[h["id"] for h in x["hits"]] for x in r.json()["results"]] == \
                    [[h["id"] for h in json.loads(x)["hits"]] for x in cli.stdout.splitlines()], hybrid
        bad = {
            "the index has no field 'colour'": {"index": "docs", "query": "a", "where": "colour=red"},
            "given inline here": {"index": "docs", "query": "a", "where": ["id in @/etc/passwd"]},
            "'id\\tin\\t@/etc/passwd'": {"index": "docs", "query": "a", "where": ["id\tin\t@/etc/passwd"]},
            "retrievers of different corpora": {"index": "docs", "query": "a", "hybrid": "other"},
            "neither bm25 nor another served index": {"index": "docs", "query": "a", "hybrid": ["nope"]},
            "the server has no --corpus for it": {"index": "sp", "query": "a", "hybrid": "bm25"},
            "send 'query', not 'vector'": {"index": "docs", "vector": [0.0] * 64, "hybrid": "bm25"},
            "'fusion' must be one of rrf, weighted": {"index": "docs", "query": "a", "hybrid": "bm25",
                                                      "fusion": "max"},
            "3 weights for 2 retrievers": {"index": "docs", "query": "a", "hybrid": "bm25",
                                           "weights": [1, 1, 1]},
            "'fusion' and 'weights' fuse retrievers: they need 'hybrid'": {"index": "docs", "query": "a",
                                                                           "weights": [1.0]},
        }
        for message, body in bad.items():
            r = post(body)
            assert r.status_code == 422 and message in r.json()["error"], (message, r.status_code, r.text)
        assert httpx.get(s.url + "/health", timeout=5).status_code == 200
    finally:
        s.stop()
    r = runner.invoke(app, ["serve", str(setup["bundle"]), "--search-index", f"docs={ix}", "--corpus",
                            f"docs={setup['corpus']}", "--port", "0"])
    assert "retrievers of different corpora" in one_red_line(r)


def test_a_corpus_column_no_document_has_is_refused_not_ranked_over_the_titles(tmp_path):
    from mlmkit.errors import ConfigError
    from mlmkit.retrieval.index.hybrid import corpus_texts

    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "title": f"title {i}", "text": f"text {i}"}) + "\n"
                              for i in range(3)))
    assert corpus_texts(corpus) == (["d0", "d1", "d2"], [f"title {i} text {i}" for i in range(3)])
    with pytest.raises(ConfigError, match="--corpus-column body: no document of .* has that field") as e:
        corpus_texts(corpus, None, "body")
    assert e.value.hint == "its fields: _id, text, title"
