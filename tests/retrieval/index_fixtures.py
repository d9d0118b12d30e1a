"""The shared fixtures of tests/retrieval/ (a pytest plugin: ``pytest_plugins = ["index_fixtures"]`` in a
test module), built once a session: a tiny embedding bundle and a corpus of DOCS documents with their
vectors, a sparse bundle, a BEIR set, a corpus with fields. The helpers are index_helpers.py's."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from conftest import make_base_model, run_export
from index_helpers import DOCS
from task_runs import corpus, make_task_run, sentence

from mlmkit.retrieval.exact import normalized
from mlmkit.retrieval.index import BuildArgs, build
from mlmkit.runtime.pipeline import Pipeline


@pytest.fixture(scope="session")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("index")
    base = make_base_model(root / "base", corpus())
    run_export(make_task_run(base, "embedding", root / "run"), root / "bundle")
    rng = random.Random(0)
    docs = [{"_id": f"d{i}", "title": sentence(rng, 2), "text": sentence(rng, rng.randint(3, 20))}
            for i in range(DOCS)]
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    pipe = Pipeline.load(root / "bundle")
    texts = [f"{d['title']} {d['text']}" for d in docs]
    vectors = normalized(np.asarray([r["embedding"] for r in pipe(texts, input_type="document")],
                                    dtype=np.float32))
    queries = [sentence(rng, 4) for _ in range(20)]
    q = normalized(np.asarray([r["embedding"] for r in pipe(queries, input_type="query")], dtype=np.float32))
    return {"root": root, "bundle": root / "bundle", "corpus": root / "corpus.jsonl", "docs": docs,
            "vectors": vectors, "q": q,
            "queries": queries}


@pytest.fixture(scope="session")
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
    return {"bundle": root / "sparse-bundle", "docs": dense(pipe(texts)), "q": dense(pipe(setup["queries"])),
            "width": width,
            "results": pipe(texts[:5])}


@pytest.fixture(scope="session")
def beir(setup):
    from mlmkit.quickstart.retrieval_set import write_retrieval_set

    d = setup["root"] / "beir"
    write_retrieval_set(d, max_documents=150)
    build(BuildArgs(setup["bundle"], d / "corpus.jsonl", setup["root"] / "beir-ix"))
    build(BuildArgs(setup["bundle"], d / "corpus.jsonl", setup["root"] / "beir-int8", quantization="int8"))
    return d


@pytest.fixture(scope="session")
def tagged(setup):
    """The fixture's corpus with fields: lang (en for a half), year (a twelfth each: 1% is one year and a
    document more), a flag, a list, and a field only some documents have."""
    docs = [{**d, "lang": "en" if i % 2 else "de", "year": 2000 + i % 100, "ok": i % 3 == 0,
             "tags": ["a", "b"][: i % 3],
             **({"extra": "x"} if i < 100 else {})} for i, d in enumerate(setup["docs"])]
    path = setup["root"] / "tagged.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return {"docs": docs, "corpus": path}
