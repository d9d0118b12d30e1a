"""Retrieval and its metrics: retrievers (BM25 with bm25s; dense, over an embedding bundle, with an
exact cosine search in chunks), and nDCG@k, MRR@k, MAP@k, Recall@k and
Precision@k with trec_eval's definitions (what BEIR reports through pytrec_eval). No torch.

Definitions, per query, then the mean over the queries (``relevant``: a judged grade > 0):

- ``ndcg@k``: sum of grade / log2(rank + 1) over the top k, over the same for the ideal ordering of
  the judged documents (trec_eval's ndcg_cut: linear gains);
- ``mrr@k``: 1 / the rank of the first relevant document in the top k, 0 when there is none;
- ``map@k``: the sum of precision at the rank of each relevant document in the top k, over the number
  of relevant documents (trec_eval's map_cut);
- ``recall@k``: relevant documents in the top k over the relevant documents;
- ``precision@k``: relevant documents in the top k over k.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

METRICS = ("ndcg@10", "mrr@10", "map@100", "recall@10", "recall@100", "precision@10")
"""What retrieval evaluation reports, the main metric first."""


def normalized(x: np.ndarray) -> np.ndarray:
    """Rows (or one vector) scaled to unit length (a zero row stays zero): cosine becomes a dot product."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def leading_dimensions(x: np.ndarray, n: int | None, normalize: bool) -> np.ndarray:
    """Rows (or one vector) cut to their first ``n`` dimensions (Matryoshka embeddings; None: all), scaled
    to unit length again when ``normalize`` (a model whose vectors are): `--dimensions`, the routes'
    ``dimensions``, the queries of an index of leading dimensions."""
    x = np.asarray(x, dtype=np.float32)
    x = x[..., :n] if n else x
    return normalized(x) if normalize else x


def top_k(scores_of: Iterable[tuple[int, np.ndarray]], queries: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best (rows, scores) per query over chunks of (first row, (Q, chunk) scores), best first:
    memory is Q x (chunk + k), never Q x every row. The one tie rule of every ranking: the higher
    score first, then the lower row (the document's position), whatever the CPU's selection kernel."""
    best_s = np.full((queries, 0), -np.inf, dtype=np.float32)
    best_i = np.zeros((queries, 0), dtype=np.int64)
    for start, cs in scores_of:
        s = np.concatenate([best_s, cs.astype(np.float32)], axis=1)
        i = np.concatenate([best_i, np.broadcast_to(np.arange(start, start + cs.shape[1]), cs.shape)], axis=1)
        best_s, best_i = keep_best(s, i, k) if s.shape[1] > k else (s, i)
    order = np.lexsort((best_i, -best_s), axis=1)
    return np.take_along_axis(best_i, order, 1), np.take_along_axis(best_s, order, 1)


def keep_best(s: np.ndarray, i: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best of (Q, n) scores ``s`` and their rows ``i`` (n > k), unordered: np.argpartition,
    except where scores equal to a query's k-th best fall on both sides of the cut, which are then
    kept by the lower row (argpartition leaves that choice to the CPU's selection kernel). A -inf
    cut needs no rule: a -inf is no hit."""
    top = np.argpartition(-s, k - 1, axis=1)[:, :k]
    ks, ki = np.take_along_axis(s, top, 1), np.take_along_axis(i, top, 1)
    kth = ks.min(axis=1)
    tied = np.flatnonzero(((s >= kth[:, None]).sum(axis=1) > k) & np.isfinite(kth))
    for q in tied:
        order = np.lexsort((i[q], -s[q]))[:k]
        ks[q], ki[q] = s[q, order], i[q, order]
    return ks, ki


def masked(scores_of: Iterable[tuple[int, np.ndarray]],
           allowed: np.ndarray | None) -> Iterator[tuple[int, np.ndarray]]:
    """``top_k``'s chunks with the rows not ``allowed`` ((rows,) bool; None: all are) scored -inf: a
    filter applied inside the search, so the top k is the allowed rows' (a -inf that is kept is no hit)."""
    for start, cs in scores_of:
        if allowed is not None:  # in place: the chunk's scores are the search's own, made for this
            np.copyto(cs, np.float32(-np.inf), where=~allowed[start:start + cs.shape[1]])
        yield start, cs


def search(queries: np.ndarray, docs: np.ndarray, k: int, *, chunk: int = 16384) -> tuple[np.ndarray,
                                                                                          np.ndarray]:
    """The top ``k`` documents of each query by cosine: (indices (Q, k'), scores (Q, k')), best first,
    k' = min(k, D). The documents are normalised and scored a chunk at a time (a memory-mapped corpus
    is read a chunk at a time too), so memory is Q x (chunk + k) scores, never Q x D."""
    q = normalized(queries)
    return top_k(((a, q @ normalized(docs[a:a + chunk]).T) for a in range(0, len(docs), chunk)), len(q),
                 min(k, len(docs)))


INDEXES = ("exact", "faiss")
"""How a dense search finds the top k: exactly (a chunk of documents at a time), or with a faiss HNSW
graph (approximate; for corpora too large for exact search; `pip install 'mlmkit[retrieval]'`)."""


class FaissIndex:
    """A faiss HNSW graph (inner product) over the normalised documents, added a chunk at a time:
    memory is the index, never a second copy of the corpus. Approximate: a query may get fewer than
    k documents (the graph's reach), marked -1."""

    def __init__(self, docs: np.ndarray, *, chunk: int = 16384) -> None:
        try:
            import faiss
        except ImportError:
            from mlmkit.errors import ConfigError

            raise ConfigError("--index faiss needs faiss",
                              "pip install 'mlmkit[retrieval]' (faiss-cpu)") from None
        self.size = len(docs)
        self.graph = faiss.IndexHNSWFlat(int(docs.shape[1]), 32, faiss.METRIC_INNER_PRODUCT)
        self.graph.hnsw.efConstruction = 80
        for start in range(0, len(docs), chunk):
            self.graph.add(np.ascontiguousarray(normalized(docs[start:start + chunk])))

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, self.size)
        self.graph.hnsw.efSearch = max(128, 2 * k)
        scores, idx = self.graph.search(np.ascontiguousarray(normalized(queries)), k)
        return idx.astype(np.int64), scores.astype(np.float32)


def dense_search(queries: np.ndarray, docs: np.ndarray, k: int, *, index: str = "exact") -> tuple[np.ndarray,
                                                                                                  np.ndarray]:
    """``search`` (exact), or through a FaissIndex of the documents (``index="faiss"``)."""
    if index not in INDEXES:
        from mlmkit.errors import ConfigError

        raise ConfigError(f"index {index!r} is not one of {', '.join(INDEXES)}")
    return search(queries, docs, k) if index == "exact" else FaissIndex(docs).search(queries, k)


def _at(metric: str) -> tuple[str, int]:
    name, _, k = metric.partition("@")
    return name, int(k)


def query_metrics(ranked: Sequence[str], judged: Mapping[str, int],
                  metrics: Sequence[str] = METRICS) -> dict[str, float]:
    """The metrics of one query's ranking (document ids, best first) against its judgements."""
    relevant = {d for d, g in judged.items() if g > 0}
    out: dict[str, float] = {}
    for metric in metrics:
        name, k = _at(metric)
        top = list(ranked[:k])
        hits = [d in relevant for d in top]
        if name == "ndcg":
            dcg = sum(judged.get(d, 0) / math.log2(r + 2) for r, d in enumerate(top) if judged.get(d, 0) > 0)
            ideal = sorted((g for g in judged.values() if g > 0), reverse=True)[:k]
            idcg = sum(g / math.log2(r + 2) for r, g in enumerate(ideal))
            out[metric] = dcg / idcg if idcg else 0.0
        elif name == "mrr":
            out[metric] = next((1.0 / (r + 1) for r, h in enumerate(hits) if h), 0.0)
        elif name == "map":
            found, total = 0, 0.0
            for r, h in enumerate(hits):
                if h:
                    found += 1
                    total += found / (r + 1)
            out[metric] = total / len(relevant) if relevant else 0.0
        elif name == "recall":
            out[metric] = sum(hits) / len(relevant) if relevant else 0.0
        elif name == "precision":
            out[metric] = sum(hits) / k
        else:
            raise ValueError(f"unknown retrieval metric {metric!r}")
    return out


def mean_metrics(runs: Mapping[str, Sequence[str]], qrels: Mapping[str, Mapping[str, int]],
                 metrics: Sequence[str] = METRICS) -> dict[str, float]:
    """The mean of ``query_metrics`` over the judged queries (a query missing from ``runs`` scores 0)."""
    totals = dict.fromkeys(metrics, 0.0)
    for qid, judged in qrels.items():
        for m, v in query_metrics(runs.get(qid, ()), judged, metrics).items():
            totals[m] += v
    return {m: v / len(qrels) for m, v in totals.items()} if qrels else totals


def retrieve(query_ids: Sequence[str], q: np.ndarray, doc_ids: Sequence[str], d: np.ndarray,
             k: int = 100, *, index: str = "exact") -> dict[str, list[tuple[str, float]]]:
    """Each query's top ``k`` documents with their cosine scores, best first (``index``: see INDEXES);
    equal scores (equal texts, or equal after truncation) in trec_eval's order: by document id,
    descending, so the metrics of a saved run are the ones printed."""
    idx, scores = dense_search(q, d, k, index=index)
    out = {}
    for qid, row, srow in zip(query_ids, idx, scores):
        docs = sorted(((doc_ids[j], float(s)) for j, s in zip(row, srow) if j >= 0), key=lambda x: x[0],
                      reverse=True)
        out[qid] = sorted(docs, key=lambda x: -x[1])  # stable: ties stay by id, descending
    return out


def write_trec(path: str | Path, ranked: Mapping[str, Sequence[tuple[str, float]]],
               tag: str = "mlmkit") -> None:
    """A ranking in TREC run format, ``qid Q0 docid rank score tag`` per line (rank from 1), written
    whole or not at all; what trec_eval, ranx and pytrec_eval read."""
    from mlmkit.files import atomic_write_text

    # 9 significant digits tell every float32 apart: the file has the ties the ranking had, no others
    lines = [f"{qid} Q0 {did} {r} {s:.9g} {tag}" for qid, docs in ranked.items()
             for r, (did, s) in enumerate(docs, 1)]
    atomic_write_text(path, "\n".join(lines) + "\n")


# ---- retrievers: queries -> the top k documents of a corpus, and the score of a given pair ----------------
STEMMER = "english"
"""BM25's stemmer (Snowball's, through PyStemmer): BEIR's BM25 (Elasticsearch's english analyzer) and
Anserini's stem English too. On the built-in retrieval set it lifts BM25's nDCG@10 from 0.396 to
0.407, and the fusion with the fine-tuned MiniLM above both (docs/retrieval.md, Hybrid search)."""


BM25_QUERY_BLOCK = 64
"""Queries whose BM25 scores over the whole corpus are held at once (64 x documents floats)."""


class BM25:
    """BM25 over the corpus (the bm25s library: sparse matrices; English stop words, words stemmed)."""

    def __init__(self, docs: Sequence[str]) -> None:
        try:
            import bm25s
            import Stemmer
        except ImportError:
            from mlmkit.errors import ConfigError

            raise ConfigError("BM25 needs the bm25s and PyStemmer packages",
                              "pip install 'mlmkit[retrieval]'") from None
        self.bm25s, self.stemmer = bm25s, Stemmer.Stemmer(STEMMER)
        self.index = bm25s.BM25()
        tokens = self._tokens(docs)
        if not tokens.vocab:
            from mlmkit.errors import ConfigError

            raise ConfigError(f"BM25: the {len(docs)} documents hold no word but English stop words and "
                              "punctuation", "give documents with words to match, or another retriever")
        self.index.index(tokens, show_progress=False)
        self.size = len(docs)

    def _tokens(self, texts: Sequence[str], ids: bool = True) -> Any:
        return self.bm25s.tokenize(list(texts), stemmer=self.stemmer, show_progress=False, return_ids=ids)

    def search(self, queries: Sequence[str], k: int, *, mask: np.ndarray | None = None) -> tuple[np.ndarray,
                                                                                                 np.ndarray]:
        """The top k documents of each query; ``mask`` ((documents,) 0 or 1): those with 1 alone (bm25s's
        weight_mask: the others score 0, a score no hit has)."""
        tokens, n = self._tokens(queries, ids=False), min(k, self.size)
        docs, best = [np.zeros((0, n), np.int64)], [np.zeros((0, n), np.float32)]
        for a in range(0, len(tokens), BM25_QUERY_BLOCK):  # every document's score, a block of queries
            block = tokens[a:a + BM25_QUERY_BLOCK]
            s = np.stack([self.index.get_scores(q) for q in block]).astype(np.float32)
            if mask is not None:
                s = np.where(np.asarray(mask) > 0, s, np.float32(0.0))
            d, b = top_k([(0, s)], len(s), n)  # top_k's tie rule (score, then the document's position)
            docs.append(d)
            best.append(b)
        return np.concatenate(docs), np.concatenate(best)

    def pair_scores(self, queries: Sequence[str], docs: Sequence[int]) -> np.ndarray:
        tokens = self._tokens(queries, ids=False)
        return np.asarray([float(self.index.get_scores(t)[d]) for t, d in zip(tokens, docs)],
                          dtype=np.float32)


class Dense:
    """Cosine over an embedding bundle's vectors. The corpus is embedded once into a memory-mapped file
    in ``work`` (a resumed job's is used again), and searched a chunk at a time: memory is the query
    batch and one chunk, never the corpus's vectors at once; or through a faiss index (``index``)."""

    def __init__(self, bundle: str | Path, docs: Sequence[str], work: str | Path, *, device: str = "cpu",
                 batch: int = 1024, index: str = "exact", precision: str | None = None) -> None:
        from mlmkit.runtime.pipeline import Pipeline

        self.pipe = Pipeline.load(bundle, device=device, precision=precision)
        if self.pipe.task != "embedding":
            from mlmkit.errors import ConfigError

            raise ConfigError(f"{bundle} is a {self.pipe.task} bundle, not an embedding one",
                              "give --retriever bm25 or an embedding bundle (mlmkit export RUN --task "
                              "embedding)")
        path, done = Path(work) / "corpus-embeddings.npy", Path(work) / "corpus-embeddings.json"
        if _embedded(done) == len(docs):  # a resumed job's
            self.vectors = np.load(path, mmap_mode="r")
        else:
            first = self.embed(docs[:batch], "document")
            self.vectors = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32,
                                                     shape=(len(docs), first.shape[1]))
            self.vectors[: len(first)] = normalized(first)
            for start in range(len(first), len(docs), batch):
                self.vectors[start:start
                             + batch] = normalized(self.embed(docs[start:start + batch], "document"))
            self.vectors.flush()
            done.write_text(json.dumps({"documents": len(docs)}))
        self.index = FaissIndex(self.vectors) if index == "faiss" else None

    def embed(self, texts: Sequence[str], input_type: str) -> np.ndarray:
        """Vectors of ``texts`` as queries or documents (each with its prompt, if the bundle has one)."""
        return np.asarray([r["embedding"] for r in self.pipe(list(texts), input_type=input_type)],
                          dtype=np.float32)

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        q = self.embed(queries, "query")
        return self.index.search(q, k) if self.index is not None else search(q, self.vectors, k)

    def pair_scores(self, queries: Sequence[str], docs: Sequence[int]) -> np.ndarray:
        q = normalized(self.embed(queries, "query"))
        return np.einsum("qh,qh->q", q, self.vectors[np.asarray(docs, dtype=np.int64)])


def bm25_metrics(data: str | Path) -> dict[str, float]:
    """The retrieval metrics of BM25 (bm25s) on a BEIR directory's evaluation split: the lexical
    baseline a dense model should beat."""
    from mlmkit.text.beir import read_split

    split = read_split(data, training=False)
    dids = list(split.corpus)
    qids = list(split.queries)
    idx, _ = BM25([split.corpus[d] for d in dids]).search([split.queries[q] for q in qids], 100)
    return mean_metrics({q: [dids[i] for i in row] for q, row in zip(qids, idx)}, split.qrels)


@dataclass(frozen=True)
class _Embedded:
    """corpus-embeddings.json, written once corpus-embeddings.npy holds the vectors of every document."""

    documents: int


def _embedded(done: Path) -> int | None:
    """The documents whose vectors a resumed job finished (None: none, or a damaged marker: embedded
    again)."""
    from mlmkit.errors import MlmkitError
    from mlmkit.files import read_json
    from mlmkit.typed import from_json

    if not done.is_file():
        return None
    try:
        return from_json(_Embedded, read_json(done), done, fix="").documents
    except MlmkitError:
        return None
