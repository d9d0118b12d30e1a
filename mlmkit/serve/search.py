"""POST /v1/search: the top k documents of an index served with --search-index (mlmkit index), for query
texts (embedded by the index's bundle, with its query prompt) or query vectors (no model run); with
``where`` a filter, ``chunk_agg`` a chunked index's merge, ``hybrid`` other retrievers fused with it
(BM25 over --corpus, other served indexes). No torch.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, TypedDict

import numpy as np

from mlmkit.contract import Prediction
from mlmkit.errors import MlmkitError
from mlmkit.files import JSONObject
from mlmkit.retrieval.index.filters import Condition
from mlmkit.retrieval.index.store import StoredIndex
from mlmkit.serve.http import HTTPError
from mlmkit.serve.responses import SearchResponse
from mlmkit.serve.routes import Answer, Call, Model, Models, Route, usage
from mlmkit.serve.schemas import SearchRequest

Served = dict[str, tuple[str, StoredIndex]]
"""The served indexes by name: (the model whose bundle built it, the index)."""


class SearchState(TypedDict, total=False):
    name: str
    index: StoredIndex
    top_k: int
    rescore: int | None
    where: list[Condition]  # the parsed conditions
    chunk_agg: str
    vectors: np.ndarray  # query vectors sent as they are
    partners: list[tuple[str, Any]]  # a hybrid search's: ("bm25", its ranker) or (index name, (model, index))
    fusion: str
    weights: list[float]
    loop: asyncio.AbstractEventLoop  # the server's: a partner model's queue is awaited on it
    models: Models


class Search(Route[SearchRequest, SearchState]):
    """An index's top k for query texts (embedded as queries by the bundle that built the index) or for
    query vectors (the model does not run). The search itself runs off the event loop (``offload``), one
    at a time, so that its memory stays one search's (retrieval/index/search.py: QUERY_BLOCK x (CHUNK + k)
    scores)."""

    path = "/v1/search"
    summary = ("Search an index (mlmkit serve --search-index): {index, query, vector, top_k, rescore, "
               "hybrid, fusion, weights} -> {results: [{hits: [{id, score}]}]}: query texts or vectors, a "
               "result per query, hits best first; \"hybrid\": \"bm25\" (with --corpus) or other indexes' "
               "names fuses their rankings.")
    request, response = SearchRequest, SearchResponse
    offload = True
    searching = threading.Lock()

    def call(self, request: SearchRequest, models: Models) -> Call[SearchState]:
        served: Served = {n: (m, ix) for m, model in models.items() for n, ix in model.indexes.items()}
        if not served:
            raise HTTPError(404, f"{self.path}: no index is served",
                            "start the server with --search-index PATH (built by mlmkit index)")
        name = request.index
        if name is None and len(served) == 1:
            name = next(iter(served))
        if name is None:
            raise HTTPError(422, f"{self.path}: say which index (\"index\": NAME)",
                            f"the indexes: {', '.join(served)}")
        if name not in served:
            raise HTTPError(404, f"{self.path}: no index named {name!r}", f"the indexes: {', '.join(served)}")
        model, ix = served[name]
        top_k = request.top_k or 10
        if top_k > ix.count:
            raise HTTPError(422, f"{self.path}: top_k {top_k} is past index '{name}''s {ix.count:,} "
                                 "documents", f"ask for {ix.count} or fewer")
        if request.rescore is not None and request.rescore < top_k:
            raise HTTPError(422, f"{self.path}: rescore {request.rescore} is below top_k {top_k}",
                            "rescore at least top_k candidates")
        hybrid = request.hybrid is not None
        state: SearchState = {"name": name, "index": ix, "top_k": top_k, "rescore": request.rescore,
                              "where": _conditions(request.where, self.path),
                              "chunk_agg": _chunk_agg(request.chunk_agg, ix, hybrid, self.path)}
        if (request.query is None) == (request.vector is None):
            raise HTTPError(422, f"{self.path}: send 'query' (a text or a list of texts) or 'vector' (a list "
                                 "of numbers, or a list of those), one of the two")
        if request.vector is not None and ix.kind in ("sparse", "multivector"):
            what = "sparse (an inverted index)" if ix.kind == "sparse" else "multi-vector (a vector a token)"
            raise HTTPError(422, f"{self.path}: index '{name}' is {what}: send 'query' texts, not 'vector'")
        if request.hybrid is None and (request.weights is not None or request.fusion is not None):
            raise HTTPError(422, f"{self.path}: 'fusion' and 'weights' fuse retrievers: they need 'hybrid'",
                            "add \"hybrid\": \"bm25\" (or another served index), or leave them out")
        if request.hybrid is not None:
            state.update(self._hybrid(request, request.hybrid, name, models, served))
            if request.vector is not None:
                raise HTTPError(422, f"{self.path}: a hybrid search ranks query texts with each retriever: "
                                     "send 'query', not 'vector'")
        if request.vector is not None:
            state["vectors"] = _vectors(request.vector, ix.dims, self.path)
            return Call(model, [], state, size=len(state["vectors"]))
        from mlmkit.retrieval.index import as_input

        texts = request.query or []
        return Call(model, list(texts), state, as_input(models[model].pipe, "query"))

    def _hybrid(self, request: SearchRequest, wanted: list[str], name: str, models: Models,
                served: Served) -> SearchState:
        """A hybrid search's partners ("bm25": the index's --corpus; other served indexes by name), fusion
        and weights."""
        from mlmkit.args import check_weights
        from mlmkit.retrieval.index.hybrid import FUSIONS

        partners: list[tuple[str, Any]] = []
        for other in wanted:
            if other == "bm25":
                lexical = models[served[name][0]].bm25.get(name)
                if lexical is None:
                    raise HTTPError(422, f"{self.path}: no BM25 for index '{name}': the server has no "
                                         "--corpus for it",
                                    f"start the server with --corpus {name}=FILE (the documents the index "
                                    "was built from)")
                partners.append(("bm25", lexical))
            elif other in served and other != name:
                partners.append((other, served[other]))
            else:
                others = ", ".join(n for n in served if n != name) or "none but this one"
                raise HTTPError(422, f"{self.path}: hybrid {other!r} is neither bm25 nor another served "
                                     "index", f"the indexes: {others}")
        fusion = request.fusion or "rrf"
        if fusion not in FUSIONS:
            raise HTTPError(422, f"{self.path}: 'fusion' must be one of {', '.join(FUSIONS)}, got {fusion!r}")
        try:
            weights = check_weights(request.weights, len(partners) + 1)
        except MlmkitError as e:
            raise HTTPError(422, f"{self.path}: {e.message}", e.hint) from None
        return {"partners": partners, "fusion": fusion, "weights": weights,
                "loop": asyncio.get_running_loop(), "models": models}

    def answer(self, call: Call[SearchState], results: list[Prediction], model: Model) -> Answer:
        from mlmkit.retrieval.index import as_queries, hits, search_vectors
        from mlmkit.retrieval.index.filters import rows as filtered

        st = call.state
        q = st.get("vectors")
        if q is None:
            q = as_queries(st["index"], results)
        try:
            where = filtered(st["index"], st["where"])
            if st.get("partners"):
                found = self._fused(call, q, results, where)
            else:
                with self.searching:
                    rows, scores = search_vectors(st["index"], q, st["top_k"], rescore=st["rescore"],
                                                  where=where, chunk_agg=st["chunk_agg"])
                found = hits(st["index"], rows, scores)
        except MlmkitError as e:
            raise HTTPError(422, f"{self.path}: {e.message}", e.hint) from None
        body: JSONObject = {"object": "search", "index": st["name"], "model": call.model,
                            "results": [{"hits": h} for h in found], "usage": usage(call)}
        if st.get("partners"):
            body.update(hybrid=[n for n, _ in st["partners"]], fusion=st["fusion"])
        return body

    def _fused(self, call: Call[SearchState], q: Any, results: list[Prediction],
               where: np.ndarray | None) -> list[list[JSONObject]]:
        """Each query's hits fused from this index's ranking and its partners' (retrieval/index/hybrid.py): a
        partner index of another model has the queries embedded by that model, through its queue;
        ``where``: this index's rows a filter keeps, whose ids the partners keep."""
        from mlmkit.retrieval.index import as_input, as_queries
        from mlmkit.retrieval.index.hybrid import DEPTH, fuse, ranking_of, rows_of_ids, same_corpus

        st = call.state
        depth, texts = max(st["top_k"], DEPTH), [str(t) for t in call.inputs]
        vectors: list[Any] = []
        for other, partner in st["partners"]:
            if other != "bm25":
                owner, ix = partner
                got = results if owner == call.model else asyncio.run_coroutine_threadsafe(
                    st["models"][owner].predict(list(texts), as_input(st["models"][owner].pipe, "query")),
                    st["loop"]).result()[0]
                vectors.append(as_queries(ix, got))
        only = None if where is None else set(st["index"].ids(np.flatnonzero(where)))
        with self.searching:
            each = [ranking_of(st["index"], q, depth, st["rescore"], where)]
            for other, partner in st["partners"]:
                if other == "bm25":
                    each.append(partner.rank(texts, depth, only))
                    continue
                same_corpus((f"index '{st['name']}'", st["index"].id_hashes),
                            (f"index '{other}'", partner[1].id_hashes))
                kept = None if only is None else rows_of_ids(partner[1], only)
                each.append(ranking_of(partner[1], vectors.pop(0), depth, None, kept))
        return [[{"id": d, "score": s} for d, s in fuse(parts, st["fusion"], st["weights"], st["top_k"])]
                for parts in zip(*each)]


def _conditions(value: list[str] | None, route: str) -> list[Condition]:
    """'where': conditions as `mlmkit search --where` takes them (filters.py), parsed; else a 422."""
    from mlmkit.retrieval.index.filters import parse

    if value is None:
        return []
    try:
        return parse(value, files=False)  # a request never names a file of the server
    except MlmkitError as e:
        raise HTTPError(422, f"{route}: {e.message}", e.hint) from None


def _chunk_agg(value: str | None, ix: StoredIndex, hybrid: bool, route: str) -> str:
    """"chunk_agg" (max, mean, sum-top-N) for a chunked index, not with "hybrid"; else a 422."""
    from mlmkit.retrieval.index.search import chunk_aggregation

    if value is None or value == "max":
        return "max"
    try:
        chunk_aggregation(value)
    except MlmkitError as e:
        said = e.message.removeprefix("--chunk-agg ")
        raise HTTPError(422, f"{route}: 'chunk_agg' {said}", e.hint) from None
    if not ix.chunked or hybrid:
        raise HTTPError(422, f"{route}: 'chunk_agg' {value} ranks a chunked index's documents alone: "
                             + ("this index is not chunked" if not ix.chunked else "not with 'hybrid'"))
    return value


def _vectors(rows: list[list[float]], dims: int, route: str) -> np.ndarray:
    """Query vectors as a (Q, dims) float32 array of finite values; else a 422."""
    for i, row in enumerate(rows):
        if len(row) != dims:
            raise HTTPError(422, f"{route}: query vector {i + 1} has {len(row)} values; the index holds "
                                 f"{dims}-dimensional vectors",
                            "embed queries with the index's bundle, or send its dimensions")
    with np.errstate(over="ignore"):
        x = np.asarray(rows, dtype=np.float32)
    if not np.isfinite(x).all():
        raise HTTPError(422, f"{route}: a query vector holds a value that is not a finite float32 (NaN, "
                             "infinite or too large)")
    return x


ROUTES = (Search(),)
