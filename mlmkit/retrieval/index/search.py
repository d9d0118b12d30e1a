"""Searching an index: query vectors (or texts, embedded with the index's bundle) in, each query's top k
rows out, in bounded memory. No torch.

A flat index scores the float query against every stored vector (dequantized) a CHUNK of rows at a
time, QUERY_BLOCK queries at a time. A two-stage index (binary, a rescoring copy, or --ann) takes
candidates from its first stage (the quantized vectors, or ann.faiss) and scores them again from its
rescoring vectors. A sparse index scores dot products through its postings (retrieval/postings.py); a
multi-vector index, MaxSim in three stages (multivector.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import mlmkit.retrieval.index.multivector as multivector
from mlmkit.errors import ConfigError
from mlmkit.files import JSONObject
from mlmkit.registry import Options
from mlmkit.retrieval import postings
from mlmkit.retrieval.exact import leading_dimensions, masked, normalized, top_k
from mlmkit.retrieval.index.ann import ann_search
from mlmkit.retrieval.index.identity import query_bundle
from mlmkit.retrieval.index.manifest import Manifest
from mlmkit.retrieval.index.store import QUERY_BLOCK, StoredIndex
from mlmkit.retrieval.reranking import late_interaction

SUBSET = 65536
"""A filter (or the deletes) allowing at most this many rows, and at most SUBSET_SHARE of the index, is
searched over them alone, exactly."""
SUBSET_SHARE = 1 / 8
"""Gathering a row from the vectors costs about 13 times scanning one in order (measured on an AMD EPYC:
50,000 of 100,000 float32 rows of 384 dims gathered in 26.0 ms, all 100,000 scanned in 3.9 ms), so a
larger share is searched as a whole, the other rows scored -inf (or through the ANN index's selector)."""


def search_vectors(ix: StoredIndex, queries: Any, k: int, *, rescore: int | None = None,
                   where: np.ndarray | None = None, chunk_agg: str = "max") -> tuple[np.ndarray, np.ndarray]:
    """_search_rows's top k rows; a chunked index's (text/chunks.py): each query's top k documents by
    their best chunk, as the row of that chunk and its score. The top chunks are searched 4 k deep,
    then 4 times deeper while a query has fewer than k documents among them: by the best chunk, the
    k-th document found in the order of the chunks is the k-th best. Another ``chunk_agg``
    (chunk_aggregation): _aggregated."""
    how, n = chunk_aggregation(chunk_agg, ix)
    if how != "max":
        return _aggregated(ix, queries, k, how, n, rescore=rescore, where=where)
    if not ix.chunked or k < 1 or k > ix.count:
        return finite(ix, *_search_rows(ix, queries, k, rescore=rescore, where=where))
    depth = min(ix.count, 4 * k)
    while True:
        rows, scores = finite(ix, *_search_rows(ix, queries, depth,
                                                rescore=max(rescore, depth) if rescore is not None else None,
                                                where=where))
        out_i = np.full((len(rows), k), -1, dtype=np.int64)
        out_s = np.full((len(rows), k), -np.inf, dtype=np.float32)
        short = False
        for j, (row, srow) in enumerate(zip(rows, scores)):
            found = row >= 0
            seen: dict[str, int] = {}
            for r, s_, doc in zip(row[found], srow[found], ix.ids(row[found])):
                if doc not in seen and len(seen) < k:
                    out_i[j, len(seen)], out_s[j, len(seen)] = r, s_
                    seen[doc] = r
            # k documents not yet found, and more chunks to look at
            short = short or (len(seen) < k and bool(found.all()))
        if not short or depth == ix.count:
            return out_i, out_s
        depth = min(ix.count, 4 * depth)


CHUNK_AGGS = ("max", "mean", "sum-top-N")
"""--chunk-agg: a chunked index's document score from its chunks' (N a number: the sum of its best N)."""


def chunk_aggregation(spec: str, ix: StoredIndex | None = None) -> tuple[str, int]:
    """--chunk-agg as (how, N): ("max", 1), ("mean", 0), ("sum", N) for sum-top-N; else one line, and
    one for another than max on ``ix`` when it is not chunked."""
    if spec in ("max", "mean"):
        how, n = spec, int(spec == "max")
    else:
        m = re.fullmatch(r"sum-top-([1-9][0-9]*)", str(spec))
        if m is None:
            raise ConfigError(f"--chunk-agg {spec!r} is not one of max, mean, sum-top-N",
                              "e.g. --chunk-agg sum-top-3")
        how, n = "sum", int(m.group(1))
    if how != "max" and ix is not None and not ix.chunked:
        raise ConfigError(f"--chunk-agg {spec}: {ix.path} is not chunked (a document is one row)",
                          "leave --chunk-agg out, or build the index with --chunk-tokens N")
    return how, n


def _aggregated(ix: StoredIndex, queries: Any, k: int, how: str, n: int, *, rescore: int | None,
                where: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """A chunked index's top k documents by the ``how`` of all their chunks' scores (mean, or the sum of
    the best ``n``), among the max(4 k, 100) documents of the best chunks: each candidate's every chunk
    (not deleted, in ``where``) scored exactly, from the rescoring vectors. Rows: each document's best
    chunk's; scores: the aggregate."""
    depth = min(ix.count, max(4 * k, 100))
    rows, _ = search_vectors(ix, queries, depth, rescore=max(rescore, depth) if rescore is not None else None,
                             where=where)
    allowed = ix.allowed(where)
    groups = ix.document_rows
    out_i = np.full((len(rows), k), -1, dtype=np.int64)
    out_s = np.full((len(rows), k), -np.inf, dtype=np.float32)
    for j, row in enumerate(rows):
        docs = ix.ids(row[row >= 0])
        each = [g[allowed[g]] if allowed is not None else g for g in (groups[d] for d in docs)]
        flat = np.concatenate(each) if each else np.zeros(0, np.int64)
        starts = np.concatenate([[0], np.cumsum([len(g) for g in each])]).astype(np.int64)
        scores = chunk_scores(ix, queries, j, flat)
        agg, best = [], []
        for part in np.split(scores, starts[1:-1]) if len(each) else []:
            agg.append(float(part.mean()) if how == "mean" else float(np.sort(part)[::-1][:n].sum()))
            best.append(int(np.argmax(part)))
        order = np.lexsort((np.arange(len(agg)), -np.asarray(agg)))[:k]
        out_i[j, :len(order)] = [flat[starts[d] + best[d]] for d in order]
        out_s[j, :len(order)] = np.asarray(agg, dtype=np.float32)[order]
    return out_i, out_s


def chunk_scores(ix: StoredIndex, queries: Any, j: int, rows: np.ndarray) -> np.ndarray:
    """Query ``j``'s exact scores with the index's ``rows`` (from the rescoring vectors; a sparse index's
    dot products, a multi-vector index's MaxSim)."""
    if not len(rows):
        return np.zeros(0, np.float32)
    if ix.kind == "multivector":
        q = queries[j] if isinstance(queries, list) else np.asarray(queries)
        return multivector.pair_scores(ix, [q] * len(rows), rows)
    q = queries[j].toarray()[0] if ix.kind == "sparse" else normalized(np.asarray(queries[j:j + 1]))[0]
    return (ix.rows(rows, rescore=True) @ q).astype(np.float32)


STORED = {"dense": "vectors.bin", "sparse": "weights.bin", "multivector": "residuals.bin"}
"""Where each kind of index keeps the values a score is made of (what a NaN score points at)."""


def finite(ix: StoredIndex, rows: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` and ``scores`` as they are, when every hit's score is a number: a NaN or infinite score
    (the queries are checked finite before) comes from a stored vector that is not finite, which no
    build writes (building refuses them): one line naming the shard's file and the row."""
    bad = (rows >= 0) & ~np.isfinite(scores)
    if not bad.any():
        return rows, scores
    row = int(rows[bad][0])
    start = 0
    for s in ix.manifest.shards:
        if row < start + s.count:
            break
        start += s.count
    name = (STORED[ix.kind] if ix.kind != "multivector"
            else f"{STORED[ix.kind]} or {ix.path / multivector.CODEC}")
    raise ConfigError(f"{ix.path / s.name / name} holds values that are not finite (NaN or infinite): row "
                      f"{row - start:,} "
                      f"of the shard (id {ix.row_ids(np.asarray([row]))[0]!r}) scores "
                      f"{float(scores[bad][0])}",
                      "rebuild the index, or restore it from a copy")


def _search_rows(ix: StoredIndex, queries: Any, k: int, *, rescore: int | None = None,
                 where: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The top ``k`` rows of each query vector and their cosines, best first (-1 past a faiss graph's
    reach). A two-stage index (Index.two_stages) takes ``rescore`` candidates (default: 4k, at least
    100) from its first stage (the quantized vectors, or the ANN index) and rescores them from its
    rescoring vectors; the others score the float query against every vector (dequantized) at once.
    A multi-vector index takes a (tokens, dims) array a query, and scores MaxSim (multivector.search).
    A sparse index takes the queries as a CSR matrix (as_queries) and scores dot products through its
    postings; a document that shares no term with a query is no hit (-1).

    Deleted rows (live.py), and with ``where`` ((count,) bool: a filter's rows, filters.py) the rows
    outside it, are never returned: each stage scores them -inf (faiss: an IDSelectorBitmap), so the
    top k is the allowed rows' own, fewer where fewer are allowed (-1 after them)."""
    allowed = ix.allowed(where)
    if k < 1:
        raise ConfigError(f"--top-k must be at least 1, got {k}")
    if k > ix.count:
        raise ConfigError(f"--top-k {k} is past the index's {ix.count:,} documents",
                          f"give --top-k {ix.count} or less")
    if ix.kind == "sparse":
        if rescore is not None:
            raise ConfigError(f"--rescore {rescore}: {ix.path} is a sparse index, searched exactly in one "
                              "stage", "leave --rescore out")
        return _search_postings(ix, queries, k, allowed)
    if rescore is not None and rescore < k:
        raise ConfigError(f"--rescore {rescore} is below --top-k {k}",
                          "rescore at least as many candidates as are kept")
    if ix.kind == "multivector":
        return _search_multivector(ix, queries, k, rescore, allowed)
    q = normalized(queries)
    if q.ndim != 2 or q.shape[1] != ix.dims:
        raise ConfigError(f"query vectors of {q.shape[-1]} dimensions; the index holds {ix.dims}")
    if rescore is not None and not ix.two_stages:
        raise ConfigError(f"--rescore {rescore}: {ix.path} ({ix.quantization}, flat) is searched in one "
                          "stage, with nothing "
                          "to rescore from", "leave --rescore out, or build the index with --rescore-copy "
                                             "float16 (int8) or --ann")
    if len(q) > QUERY_BLOCK:
        parts = [_search_rows(ix, q[a:a + QUERY_BLOCK], k, rescore=rescore, where=where)
                 for a in range(0, len(q), QUERY_BLOCK)]
        return np.concatenate([r for r, _ in parts]), np.concatenate([s for _, s in parts])
    # few rows: each scored
    if allowed is not None and int(allowed.sum()) <= min(SUBSET, SUBSET_SHARE * ix.count):
        # exactly, none other read
        return _search_subset(ix, q, k, np.flatnonzero(allowed))
    n = min(ix.count, rescore or max(4 * k, 100)) if ix.two_stages else k
    # faiss's binary IVF takes no IDSelector: a filtered search of it scores the binary codes themselves
    if ix.ann != "flat" and not (allowed is not None and (ix.ann, ix.quantization) == ("ivf", "binary")):
        rows, scores = ann_search(ix, q, n, allowed)
    else:
        rows, scores = no_hits(*top_k(masked(((a, q @ c.T) for a, c in ix.chunks()), allowed), len(q), n))
    return _rescored(ix, q, rows, k) if ix.two_stages else (rows, scores)


def _search_subset(ix: StoredIndex, q: np.ndarray, k: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The top k among ``rows`` alone (at most SUBSET, ascending), scored from the rescoring vectors
    (what a two-stage search ends with): exact, whatever the index's first stage or ANN."""
    s = q @ ix.rows(rows, rescore=True).T if len(rows) else np.zeros((len(q), 0), np.float32)
    at, scores = top_k([(0, s)], len(q), min(k, len(rows)))
    out_i = np.full((len(q), k), -1, dtype=np.int64)
    out_s = np.full((len(q), k), -np.inf, dtype=np.float32)
    out_i[:, :at.shape[1]], out_s[:, :at.shape[1]] = rows[at], scores
    return out_i, out_s


def no_hits(rows: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A top k with the rows a mask scored -inf (retrieval.masked) marked -1: no hits."""
    return np.where(np.isneginf(scores), -1, rows), scores


def _search_multivector(ix: StoredIndex, queries: Any, k: int, rescore: int | None,
                        allowed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(queries, np.ndarray) and queries.ndim == 2:
        queries = [queries]
    bad = next((np.asarray(q).shape for q in queries if np.asarray(q).ndim != 2 or np.asarray(q).shape[1]
                != ix.dims), None)
    if bad is not None:
        raise ConfigError(f"a query of shape {bad}; the index holds token vectors of {ix.dims} dimensions",
                          "embed queries with the index's colbert bundle")
    return multivector.search(ix, [np.asarray(q, dtype=np.float32) for q in queries], k, rescore=rescore,
                              allowed=allowed)


def _search_postings(ix: StoredIndex, q: Any, k: int, allowed: np.ndarray | None) -> tuple[np.ndarray,
                                                                                           np.ndarray]:
    if q.shape[1] != ix.dims:
        raise ConfigError(f"sparse queries over a vocabulary of {q.shape[1]:,}; the index's is {ix.dims:,}")
    parts = [top_k(masked(postings.scores(ix.sparse, q[a:a + QUERY_BLOCK]), allowed),
                   min(QUERY_BLOCK, q.shape[0] - a), k)
             for a in range(0, q.shape[0], QUERY_BLOCK)]
    rows = np.concatenate([r for r, _ in parts]) if parts else np.zeros((0, k), np.int64)
    scores = np.concatenate([s for _, s in parts]) if parts else np.zeros((0, k), np.float32)
    return np.where(scores > 0, rows, -1), scores


def _rescored(ix: StoredIndex, q: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each query's candidates scored again, float query x the rescoring vectors; the best k."""
    out_i = np.full((len(q), k), -1, dtype=np.int64)
    out_s = np.full((len(q), k), -np.inf, dtype=np.float32)
    for j in range(len(q)):
        cand = rows[j][rows[j] >= 0]
        s = ix.rows(cand, rescore=True) @ q[j]
        order = np.lexsort((cand, -s))[:k]
        out_i[j, : len(order)], out_s[j, : len(order)] = cand[order], s[order]
    return out_i, out_s


def hits(ix: StoredIndex, rows: np.ndarray, scores: np.ndarray) -> list[list[JSONObject]]:
    """Each query's hits, {"id", "score"}, best first (rows past a faiss graph's reach left out); a
    chunked index's also name the best chunk, {"chunk", "start", "end"}: its number and its span of
    characters in the document's text (a title before it)."""
    out = [[{"id": i, "score": float(s)} for i, s in zip(ix.ids(row[row >= 0]), srow[row >= 0])]
           for row, srow in zip(rows, scores)]
    if ix.chunked:  # every query's chunks at once: a shard's chunks.arrow read once
        spans = iter(ix.chunk_spans(rows[rows >= 0]).tolist())
        for got in out:
            for h in got:
                k, a, b = next(spans)
                h.update(chunk=k, start=a, end=b)
    return out


# ---- query texts, embedded with the index's bundle -------------------------------------------------
def is_sparse(pipe: Any) -> bool:
    """Whether a bundle gives sparse vectors (its outputs "indices" and "values", as parity reads
    them): its index is an inverted one."""
    return {"indices", "values"} <= set(pipe.meta.outputs)


def index_kind(pipe: Any) -> str:
    """The index (store.KINDS) a bundle's Pipeline builds: sparse (sparse vectors), multivector (a
    vector a token: colbert) or dense (one vector a text); any other bundle is refused in one line."""
    if is_sparse(pipe):
        return "sparse"
    if late_interaction(pipe):
        return "multivector"
    if "embedding" not in pipe.meta.outputs:
        raise ConfigError(f"{pipe.path} is a {pipe.task} bundle, whose outputs "
                          f"({', '.join(pipe.meta.outputs)}) are not "
                          "vectors of a text: `mlmkit index` indexes embedding, sparse-embedding and colbert "
                          "bundles",
                          "export one of those")
    return "dense"


def as_input(pipe: Any, kind: str, prompt_name: str | None = None,
             dimensions: int | None = None) -> Options:
    """The pipeline options that embed texts as ``kind`` (query or document) with the bundle's prompts
    ({} for a bundle without them: sparse-embedding); ``prompt_name`` one of its named prompts instead,
    ``dimensions`` the leading dimensions kept of each vector (an index's own, `--dimensions`)."""
    names = pipe.option_names
    options: Options = {"input_type": kind} if "input_type" in names else {}
    for flag, key, value in (("--prompt-name", "prompt_name", prompt_name),
                             ("--dimensions", "dimensions", dimensions)):
        if value:
            if key not in names:
                raise ConfigError(f"{flag}: {pipe.path} is a {pipe.task} bundle, which has no {key}",
                                  f"drop {flag}, or use an embedding bundle")
            options[key] = value
    return options


def embedding_settings(manifest: Manifest) -> tuple[str | None, int | None]:
    """The documents' prompt name and the dimensions an index was built with (`mlmkit index
    --prompt-name`, `--dimensions`): an append keeps them, and its queries are cut to the same dimensions."""
    return manifest.prompt_name or None, manifest.dimensions or None


def as_queries(ix: StoredIndex, results: Sequence[JSONObject]) -> Any:
    """The index's bundle's results for query texts as search_vectors takes them: (Q, dims) float32
    vectors, or a sparse index's (Q, vocabulary) CSR matrix."""
    if ix.kind == "sparse":
        return postings.queries(results, ix.dims)
    if ix.kind == "multivector":
        if any("vectors" not in r for r in results):
            raise ConfigError(f"{ix.path} is a multi-vector index: its queries need a colbert bundle's token "
                              "vectors",
                              "search it with the colbert bundle that built it")
        return [np.asarray(r["vectors"], dtype=np.float32).reshape(-1, ix.dims) for r in results]
    if any("embedding" not in r for r in results):
        raise ConfigError(f"{ix.path} is a {ix.kind} index of one vector a text: its bundle gives none",
                          "search it with the embedding bundle that built it")
    q = np.asarray([r["embedding"] for r in results], dtype=np.float32)
    dims = embedding_settings(ix.manifest)[1]
    # an index of the leading dimensions (--dimensions): its queries cut alike
    if dims and q.shape[-1] > dims:
        q = leading_dimensions(q, dims, bool(ix.manifest.normalized))
    return q


def query_vectors(ix: StoredIndex, texts: Sequence[str], bundle: Path | None = None, *, device: str = "cpu",
                  precision: str | None = None, prompt_name: str | None = None) -> Any:
    """``texts`` embedded as queries with the index's bundle (its query prompt, or ``prompt_name``) and
    dimensions, as_queries."""
    from mlmkit.runtime.pipeline import Pipeline

    pipe = Pipeline.load(query_bundle(ix, bundle), device=device, command="embed", precision=precision)
    return as_queries(ix, pipe(list(texts), **as_input(pipe, "query", prompt_name)))


def search_index(ix: StoredIndex, queries: Any, k: int, *,
                 where: str | Sequence[str] | np.ndarray | None = None,
                 rescore: int | None = None, chunk_agg: str = "max", bundle: str | Path | None = None,
                 prompt_name: str | None = None, device: str = "cpu",
                 precision: str | None = None) -> list[list[JSONObject]]:
    """Index.search: ``queries`` as texts (a list of str: embedded as queries with the index's bundle, or
    ``bundle``, its pipeline loaded once on ``ix``) or vectors (as search_vectors takes them), ``where``
    a filter's conditions (`--where`'s, filters.py: all must hold) or its rows; each query's hits."""
    from mlmkit.retrieval.index.filters import parse, rows

    if isinstance(where, str):
        where = [where]
    allowed = where if isinstance(where, np.ndarray) or where is None else rows(ix, parse(list(where)))
    chunk_aggregation(chunk_agg, ix)
    if isinstance(queries, (list, tuple)) and all(isinstance(q, str) for q in queries):
        from mlmkit.runtime.pipeline import Pipeline

        b = query_bundle(ix, None if bundle is None else Path(bundle))
        key = (str(b), device, precision)
        if key not in ix.pipes:
            ix.pipes[key] = Pipeline.load(b, device=device, command="embed", precision=precision)
        pipe = ix.pipes[key]
        queries = as_queries(ix,
                             pipe(list(queries), **as_input(pipe, "query", prompt_name))) if queries else None
    if queries is None:
        return []
    return hits(ix, *search_vectors(ix, queries, k, rescore=rescore, where=allowed, chunk_agg=chunk_agg))
