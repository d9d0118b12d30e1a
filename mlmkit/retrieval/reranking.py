"""Reranking documents with a cross-encoder bundle: `mlmkit rerank`, the rerank routes and Python alike.

A cross-encoder is a classification bundle with one output (what sentence-transformers' CrossEncoder
saves: ms-marco-MiniLM, bge-reranker; mlmkit's rerank task), each (query, document) pair one input.
A late-interaction bundle (the colbert task: token vectors) reranks too, by MaxSim of the query's
vectors against each document's (`mlmkit rerank`, the rerank routes, Python): no index, one encoder
pass over the documents.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import numpy as np

from mlmkit.errors import ConfigError
from mlmkit.registry import per_token
from mlmkit.retrieval.maxsim import maxsim, padded
from mlmkit.runtime.bundle import BundleMeta


def relevance(results: Sequence[Mapping[str, Any]], raw: bool, meta: BundleMeta | None = None) -> list[float]:
    """Each pair's relevance: the cross-encoder's logit under its activation (a rerank bundle records
    it; sigmoid otherwise, as CrossEncoder's default for one label), or the logit itself (``raw``)."""
    logits = np.asarray([float(r.get("logit", r["score"])) for r in results], dtype=np.float64)
    identity = meta is not None and meta.options.get("activation") == "identity"
    return (logits if raw or identity else 1.0 / (1.0 + np.exp(-logits))).tolist()


def ranked(scores: list[float], top_n: int | None) -> list[int]:
    """Document indices, most relevant first (ties in input order), at most ``top_n``."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return order[:top_n] if top_n is not None else order


class Ranked(TypedDict):
    """A document as rerank_documents ranks it: its index among the documents, its score, its text."""

    index: int
    score: float
    text: str


def rerank_documents(pipe: Any, query: str, documents: list[str], *, top_n: int | None = None,
                     raw: bool = False) -> list[Ranked]:
    """``documents`` most relevant to ``query`` first, by a cross-encoder bundle's Pipeline:
    [{"index", "score", "text"}] (score: the sigmoid of the logit, or the logit with ``raw``); or by a
    colbert bundle's (score: MaxSim)."""
    if late_interaction(pipe):
        scores = maxsim_scores(pipe, query, documents)
        return [{"index": i, "score": scores[i], "text": documents[i]} for i in ranked(scores, top_n)]
    labels = pipe.meta.labels or ()
    if "logits" not in pipe.meta.outputs or len(labels) != 1:
        raise ConfigError(f"{pipe.path} is not a cross-encoder ({pipe.task}, {len(labels)} labels)",
                          "rerank with a one-label sequence classifier (a sentence-transformers "
                          "CrossEncoder, bge-reranker ...)")
    scores = relevance(pipe([{"text": query, "text_pair": d} for d in documents]), raw, pipe.meta)
    return [{"index": i, "score": scores[i], "text": documents[i]} for i in ranked(scores, top_n)]


def late_interaction(of: Any) -> bool:
    """Whether a bundle gives token vectors (an output "vectors" per token: a colbert bundle); ``of``: its
    Pipeline, or its outputs (BundleMeta.outputs)."""
    outputs = of if isinstance(of, Mapping) else of.meta.outputs
    axes = outputs.get("vectors")
    return axes is not None and per_token(axes)


def maxsim_scores(pipe: Any, query: str, documents: list[str]) -> list[float]:
    """MaxSim of ``query``'s token vectors (read as a query) against each document's (as documents)."""
    return maxsim_of(pipe([query], input_type="query")[0], pipe(documents, input_type="document"))


def maxsim_of(query: Mapping[str, Any], documents: Sequence[Mapping[str, Any]]) -> list[float]:
    """MaxSim of a query's prediction ({"vectors": ...}) against each document's."""
    q = np.asarray(query["vectors"], dtype=np.float32)
    docs = [np.asarray(r["vectors"], dtype=np.float32).reshape(-1, q.shape[-1]) for r in documents]
    D, mask = padded(docs, q.shape[-1])
    return [float(x) for x in maxsim(q[None], D, None, mask)[0]]
