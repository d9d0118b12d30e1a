"""evaluation.py: `mlmkit evaluate INDEX` and mining from an index equal the bundle's own."""

from __future__ import annotations

import json

import numpy as np
import pytest
from index_helpers import (
    one_red_line,
    runner,
)

from mlmkit.cli import app
from mlmkit.files import cache_root
from mlmkit.retrieval.index import BuildArgs, Index, build

pytest_plugins = ["index_fixtures"]


def test_evaluating_an_index_scores_its_stored_vectors_as_the_bundle_scores_the_corpus(setup, tmp_path):
    from mlmkit.quickstart.retrieval_set import write_retrieval_set

    write_retrieval_set(tmp_path / "beir", max_documents=150)
    r = runner.invoke(app,
                      ["index", str(setup["bundle"]), "--corpus", str(tmp_path / "beir" / "corpus.jsonl"),
                       "--out", str(tmp_path / "ix"), "--json"])
    assert r.exit_code == 0, r.output
    by_index = runner.invoke(app,
                             ["evaluate", str(tmp_path / "ix"), "--data", str(tmp_path / "beir"), "--json"])
    by_bundle = runner.invoke(app,
                              ["evaluate", str(setup["bundle"]), "--data", str(tmp_path / "beir"), "--json"])
    assert by_index.exit_code == 0 and by_bundle.exit_code == 0, by_index.output + by_bundle.output
    got, want = json.loads(by_index.stdout), json.loads(by_bundle.stdout)
    # the bundle itself is scored through a temporary index too (bounded memory): equal to its in-memory
    # evaluation, which an option only that path reads still takes
    from mlmkit.retrieval.index import through_index
    from mlmkit.runtime.pipeline import evaluate_bundle

    in_memory = evaluate_bundle(setup["bundle"], tmp_path / "beir")
    assert through_index(setup["bundle"], tmp_path / "beir",
                         {}) and not through_index(setup["bundle"], tmp_path / "beir", {"index": "exact"})
    for m in ("ndcg@10", "mrr@10", "recall@100"):
        assert got[m] == pytest.approx(want[m], abs=1e-4) == pytest.approx(in_memory[m], abs=1e-4), (
            m, got, want, in_memory)
    assert set(want) == set(in_memory) and 0 < got["recall@100"] <= 1
    assert not list(cache_root().glob("evaluate-index-*"))  # the temporary index is gone


def test_mining_from_an_index_mines_what_its_bundle_mines(setup, tmp_path):
    from mlmkit.quickstart.retrieval_set import write_retrieval_set

    write_retrieval_set(tmp_path / "beir", max_documents=150)
    build(BuildArgs(setup["bundle"], tmp_path / "beir" / "corpus.jsonl", tmp_path / "ix"))
    rows = {}
    for name, retriever in (("index", tmp_path / "ix"), ("bundle", setup["bundle"])):
        r = runner.invoke(app, ["mine", str(tmp_path / "beir"), "--retriever", str(retriever), "--out",
                                str(tmp_path / f"{name}.jsonl"),
                                "--negatives", "3", "--range", "0:20", "--with-scores", "--json"])
        assert r.exit_code == 0, r.output
        rows[name] = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    assert len(rows["index"]) == len(rows["bundle"]) > 50
    same = [a["negative_1"] == b["negative_1"] and np.allclose(a["scores"], b["scores"], atol=1e-5)
            for a, b in zip(rows["index"], rows["bundle"])]
    assert np.mean(same) > 0.95, np.mean(same)  # float rounding may swap a near tie
    bad = runner.invoke(app, ["mine", str(tmp_path / "beir"), "--retriever", "bm25", "--index", "faiss",
                              "--out", str(tmp_path / "x.jsonl")])
    assert "--index faiss is for an embedding bundle" in one_red_line(bad)


def test_a_sparse_index_evaluates_as_its_bundle_and_refuses_what_it_cannot_do(setup, sparse, tmp_path):
    from types import SimpleNamespace

    from mlmkit.quickstart.retrieval_set import write_retrieval_set
    from mlmkit.runtime.pipeline import evaluate_bundle
    from mlmkit.serve.http import HTTPError
    from mlmkit.serve.search import Search

    write_retrieval_set(tmp_path / "beir", max_documents=150)
    build(BuildArgs(sparse["bundle"], tmp_path / "beir" / "corpus.jsonl", tmp_path / "ix"))
    by_index = runner.invoke(app,
                             ["evaluate", str(tmp_path / "ix"), "--data", str(tmp_path / "beir"), "--json"])
    assert by_index.exit_code == 0, by_index.output
    # in memory: scipy.sparse
    got, want = json.loads(by_index.stdout), evaluate_bundle(sparse["bundle"], tmp_path / "beir")
    for m in ("ndcg@10", "mrr@10", "recall@100"):
        assert got[m] == pytest.approx(want[m], abs=1e-4), (m, got, want)
    assert 0 < got["recall@100"] <= 1
    r = runner.invoke(app, ["mine", str(tmp_path / "beir"), "--retriever", str(tmp_path / "ix"), "--out",
                            str(tmp_path / "m.jsonl"),
                            "--negatives", "2", "--range", "0:20", "--with-scores"])
    assert r.exit_code == 0, r.output
    mined = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert len(mined) > 50 and all(len(m["scores"]) == 3 and m["negative_2"] for m in mined[:10])

    def cli(*argv: str) -> str:
        return one_red_line(runner.invoke(app, list(argv)))

    corpus_file = str(tmp_path / "beir" / "corpus.jsonl")
    assert "takes no --quantization" in cli("index", str(sparse["bundle"]), "--corpus", corpus_file, "--out",
                                        str(tmp_path / "q"),
                                        "--quantization", "int8")
    assert "sparse index, searched exactly" in cli("search", str(tmp_path / "ix"), "a dog", "--rescore", "50")
    ix = Index.open(tmp_path / "ix")
    with pytest.raises(HTTPError, match="is sparse .* send 'query' texts"):
        Search().parse({"index": "sp", "vector": [0.5] * ix.dims}, {"m": SimpleNamespace(indexes={"sp": ix})})
    with open(tmp_path / "ix" / "shard-000000" / "weights.bin", "r+b") as f:
        f.truncate(100)
    assert "weights.bin holds 100 bytes" in cli("search", str(tmp_path / "ix"), "a dog")
    (tmp_path / "ix" / "shard-000000" / "offsets.bin").unlink()
    assert "offsets.bin is missing" in cli("search", str(tmp_path / "ix"), "a dog")
