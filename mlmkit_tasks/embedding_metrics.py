"""The embedding task's evaluation: retrieval metrics over an exact (or indexed) search of the
whole corpus, at the full dimension and at each matryoshka dimension (``retrieval_metrics``), and
the Spearman and Pearson correlation of scored pairs' cosine with their gold scores
(``pair_correlations``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mlmkit.taskkit import Example, Prediction, TaskError, mean_metrics, retrieve, write_trec


def retrieval_metrics(predictions: list[Prediction], examples: list[Example], dims: list[int],
                      options: Mapping[str, Any]) -> dict[str, float]:
    """Every query searches the whole corpus (cosine, exact or through ``index``, retrieval/exact.py);
    the metrics at the full dimension, and with matryoshka dimensions the same at each as
    METRIC@dimD. ``save_run``: the full dimension's ranking goes to that file (TREC run format)."""
    queries = [(ex, p) for ex, p in zip(examples, predictions) if ex["kind"] == "query"]
    docs = [(ex, p) for ex, p in zip(examples, predictions) if ex["kind"] == "doc"]
    if not queries or not docs:
        raise TaskError("retrieval evaluation needs queries and documents")
    q = np.asarray([p["embedding"] for _, p in queries], dtype=np.float32)
    d = np.asarray([p["embedding"] for _, p in docs], dtype=np.float32)
    qids, dids = [ex["id"] for ex, _ in queries], [ex["id"] for ex, _ in docs]
    qrels = {ex["id"]: ex["judged"] for ex, _ in queries}
    out: dict[str, float] = {}
    for dim in [None, *[x for x in dims if x < q.shape[1]]]:
        ranked = retrieve(qids, q[:, :dim], dids, d[:, :dim], k=100, index=options.get("index", "exact"))
        if dim is None and options.get("save_run"):
            write_trec(options["save_run"], ranked)
        got = mean_metrics({k: [did for did, _ in v] for k, v in ranked.items()}, qrels)
        out.update(got if dim is None else {f"{m}@dim{dim}": v for m, v in got.items()})
    return out


def pair_correlations(predictions: list[Prediction], examples: list[Example]) -> dict[str, float]:
    """The Spearman and Pearson correlation of the pairs' cosine with their gold scores (0 where
    undefined)."""
    from scipy.stats import pearsonr, spearmanr

    if any("cosine" not in p or "score" not in ex for p, ex in zip(predictions, examples)):
        raise TaskError("embedding evaluation needs pairs with a score, rows, or a BEIR directory",
                        "give text, text_pair and score per record, anchor and positive, or a BEIR directory")
    cos, gold = [p["cosine"] for p in predictions], [ex["score"] for ex in examples]
    if len(gold) < 2:
        raise TaskError("embedding evaluation needs at least two pairs")
    r, rho = float(pearsonr(cos, gold)[0]), float(spearmanr(cos, gold)[0])
    return {"spearman": 0.0 if rho != rho else rho, "pearson": 0.0 if r != r else r}
