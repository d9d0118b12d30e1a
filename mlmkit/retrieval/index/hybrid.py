"""Hybrid retrieval: several retrievers of one corpus, fused into one ranking (``--hybrid``,
``--fusion``) by `mlmkit search`, `mlmkit evaluate INDEX`, `mlmkit mine` and ``POST /v1/search``. No torch.

A retriever here ranks documents by id (``Ranker``): an index of any kind (its stored vectors; the
queries embedded with its bundle), or BM25 (bm25s) over the corpus's texts. Each gives its top
``max(k, DEPTH)`` documents a query, and the fusion (FUSIONS) ranks the union:

- ``rrf`` (reciprocal rank fusion, Cormack et al. 2009): a document scores the sum over the
  retrievers that returned it of ``weight / (RRF_K + rank)``, rank from 1;
- ``weighted``: each retriever's scores for the query min-max normalised over its returned
  documents (its best 1, its last 0; all 1 when they are equal), a document scoring the weighted
  sum of its normalised scores (0 from a retriever that did not return it).

Ties go by id, ascending. The retrievers must hold the same documents (the same ids): fusing an
index of one corpus with BM25 over another is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from mlmkit.args import check_weights
from mlmkit.errors import ConfigError
from mlmkit.files import JSONObject
from mlmkit.retrieval.index.disk import id_hashes
from mlmkit.retrieval.index.identity import query_bundle
from mlmkit.retrieval.index.search import as_input, as_queries, hits, search_vectors
from mlmkit.retrieval.index.store import CHUNK, StoredIndex

FUSIONS = ("rrf", "weighted")
RRF_K = 60
"""rrf's constant: a first rank scores 1/61, a tenth 1/70 (the paper's k, and Elasticsearch's, Vespa's)."""
DEPTH = 100
"""Documents each retriever gives a query, at least: what the fusion ranks (more when k is larger)."""
BM25 = "bm25"

Ranking = list[tuple[Any, float]]
"""A query's documents, best first: (id, score); mining's retrievers rank places in its corpus."""


class Ranker(Protocol):
    """A retriever that ranks a corpus's documents by id."""

    name: str

    def id_hashes(self) -> np.ndarray:
        """The sorted hashes of its documents' ids (store.id_hashes): what the same-corpus check compares."""

    def rank(self, queries: Sequence[str], depth: int, only: set[str] | None = None) -> list[Ranking]:
        """Each query's top ``depth`` documents (fewer where it has fewer), best first; ``only``: of
        these ids alone (a filter of the first index's, hybrid's ``where``), applied inside the search."""


class IndexRanker:
    """An index (store.StoredIndex) searched with its bundle: ``rescore`` as `mlmkit search` takes it."""

    def __init__(self, path: Path, *, bundle: Path | None = None, device: str = "cpu",
                 precision: str | None = None,
                 rescore: int | None = None, name: str | None = None) -> None:
        self.ix, self.name = StoredIndex.open(path), name or str(path)
        self.bundle, self.device, self.precision, self.rescore = bundle, device, precision, rescore
        self._pipe: Any = None  # the bundle's Pipeline, loaded at the first query
        self._only: tuple[Any, np.ndarray | None] = (None, None)  # the last ``only`` and its rows

    def id_hashes(self) -> np.ndarray:
        return self.ix.id_hashes

    def rank(self, queries: Sequence[str], depth: int, only: set[str] | None = None) -> list[Ranking]:
        if self._pipe is None:
            from mlmkit.runtime.pipeline import Pipeline

            self._pipe = Pipeline.load(query_bundle(self.ix, self.bundle), device=self.device,
                                       command="embed",
                                       precision=self.precision)
        return self.rank_vectors(as_queries(self.ix, self._pipe(list(queries),
                                                                **as_input(self._pipe, "query"))), depth,
                                 self.rows_of(only))

    def rank_vectors(self, q: Any, depth: int, where: np.ndarray | None = None) -> list[Ranking]:
        """Rankings of query vectors already embedded with the index's bundle (search.as_queries)."""
        return ranking_of(self.ix, q, depth, self.rescore, where)

    def remember(self, only: set[str], rows: np.ndarray) -> None:
        """``rows`` ((count,) bool) are the rows of the ids ``only``: what rows_of gives for that set."""
        self._only = (only, rows)

    def rows_of(self, only: set[str] | None) -> np.ndarray | None:
        """The rows of the ids ``only`` ((count,) bool), kept for the next call with the same set."""
        if only is None:
            return None
        if self._only[0] is not only:
            self._only = (only, rows_of_ids(self.ix, only))
        return self._only[1]


def rows_of_ids(ix: StoredIndex, only: set[str]) -> np.ndarray:
    """The rows of ``ix`` whose ids are in ``only``, (count,) bool (the ids read a chunk at a time)."""
    return np.fromiter((i in only for a in range(0, ix.count, CHUNK)
                        for i in ix.ids(np.arange(a, min(a + CHUNK, ix.count)))),
                       dtype=np.bool_, count=ix.count)


def ranking_of(ix: StoredIndex, q: Any, depth: int, rescore: int | None = None,
               where: np.ndarray | None = None) -> list[Ranking]:
    """Each query's top ``depth`` documents of ``ix`` (query vectors as search.as_queries gives them), by
    id; ``rescore`` raised to ``depth`` where it is below; ``where``: search_vectors'."""
    depth = min(depth, ix.count)
    rows, scores = search_vectors(ix, q, depth, rescore=max(rescore, depth) if rescore is not None else None,
                                  where=where)
    return [[(h["id"], h["score"]) for h in found] for found in hits(ix, rows, scores)]


class BM25Ranker:
    """BM25 (retrieval/exact.py's, bm25s) over documents' texts, by id."""

    def __init__(self, ids: Sequence[str], texts: Sequence[str], name: str = BM25) -> None:
        from mlmkit.retrieval.exact import BM25 as Lexical

        if not ids:
            raise ConfigError("--hybrid bm25: the corpus holds no documents")
        self.ids, self.name, self.bm25 = list(ids), name, Lexical(texts)

    def id_hashes(self) -> np.ndarray:
        return np.sort(id_hashes(self.ids))

    def rank(self, queries: Sequence[str], depth: int, only: set[str] | None = None) -> list[Ranking]:
        mask = None if only is None else np.fromiter((i in only for i in self.ids), dtype=np.float32,
                                                     count=len(self.ids))
        rows, scores = self.bm25.search(queries, min(depth, len(self.ids)), mask=mask)
        # bm25s ranks a document that shares no term with the query too, at score 0: no hit, as a sparse index
        return [[(self.ids[r], float(s)) for r, s in zip(row, srow) if s > 0]
                for row, srow in zip(rows, scores)]


def fuse(rankings: Sequence[Ranking], fusion: str = "rrf", weights: Sequence[float] | None = None,
         k: int | None = None) -> Ranking:
    """One query's rankings (one a retriever) fused (FUSIONS), best first, ties by id; the top ``k``."""
    if fusion not in FUSIONS:
        raise ConfigError(f"--fusion {fusion}: use one of {', '.join(FUSIONS)}")
    w = check_weights(list(weights) if weights is not None else None, len(rankings))
    total: dict[str, float] = {}
    for weight, ranking in zip(w, rankings):
        for doc, part in zip((d for d, _ in ranking), _parts(ranking, fusion)):
            total[doc] = total.get(doc, 0.0) + weight * part
    fused = sorted(total.items(), key=lambda x: (-x[1], x[0]))
    return fused if k is None else fused[:k]


def _parts(ranking: Ranking, fusion: str) -> list[float]:
    if fusion == "rrf":
        return [1.0 / (RRF_K + r) for r in range(1, len(ranking) + 1)]
    s = np.asarray([x for _, x in ranking], dtype=np.float64)
    if not len(s):
        return []
    spread = float(s.max() - s.min())
    return list((s - s.min()) / spread) if spread > 0 else [1.0] * len(s)


def check_same_corpus(rankers: Sequence[Ranker]) -> None:
    """Refuse retrievers that hold different documents: their rankings would not be of one corpus."""
    first = rankers[0].id_hashes()
    for other in rankers[1:]:
        same_corpus((rankers[0].name, first), (other.name, other.id_hashes()))


def same_corpus(a: tuple[str, np.ndarray], b: tuple[str, np.ndarray]) -> None:
    """Two retrievers' sorted id hashes, (name, hashes), equal; else one line naming both."""
    (name_a, first), (name_b, h) = a, b
    if len(h) != len(first) or not np.array_equal(h, first):
        missing = len(np.setdiff1d(first, h, assume_unique=True))
        raise ConfigError(f"--hybrid: {name_a} holds {len(first):,} documents and {name_b} {len(h):,}, "
                          f"{missing:,} of the first's ids not among the second's: retrievers of different "
                          "corpora",
                          "fuse retrievers of one corpus: indexes built from it, and BM25 over its texts")


class Hybrid:
    """Rankers of one corpus (checked), fused: ``rank`` gives each query's fused ranking, and
    ``rank_each`` every retriever's ranking beside it (what `mlmkit evaluate --hybrid` reports)."""

    def __init__(self, rankers: Sequence[Ranker], fusion: str = "rrf", weights: Sequence[float] | None = None,
                 *,
                 check: bool = True) -> None:
        if fusion not in FUSIONS:
            raise ConfigError(f"--fusion {fusion}: use one of {', '.join(FUSIONS)}")
        self.rankers, self.fusion, self.weights = (list(rankers), fusion,
                                                   check_weights(list(weights) if weights is not None
                                                                 else None, len(rankers)))
        if check:  # mining's retrievers rank one corpus's places: nothing to check
            check_same_corpus(self.rankers)
        self.name = f"hybrid ({fusion}: {' + '.join(r.name for r in self.rankers)})"

    def rank_each(self, queries: Sequence[str], k: int,
                  where: np.ndarray | None = None) -> tuple[list[Ranking], list[list[Ranking]]]:
        """(each query's fused top k, each retriever's rankings of the queries); ``where``: the first
        retriever's (an index's) rows a filter keeps, whose ids the others keep too."""
        first = self.rankers[0]
        only = None
        if where is not None and isinstance(first, IndexRanker):
            only = set(first.ix.ids(np.flatnonzero(where)))
            first.remember(only, where)  # its rows are ``where`` itself: not found again from the ids
        each = [r.rank(queries, max(k, DEPTH), only) for r in self.rankers]
        return [fuse(parts, self.fusion, self.weights, k) for parts in zip(*each)], each

    def rank(self, queries: Sequence[str], k: int, where: np.ndarray | None = None) -> list[Ranking]:
        return self.rank_each(queries, k, where)[0]


def rankers(index: Path, hybrid: Sequence[str], corpus: Callable[[], tuple[list[str], list[str]]] | None, *,
            bundle: Path | None = None, device: str = "cpu", precision: str | None = None,
            rescore: int | None = None) -> list[Ranker]:
    """The index at ``index`` and each ``--hybrid`` retriever: ``bm25`` (BM25 over ``corpus()``: the
    documents' ids and texts; None where no corpus is at hand) or another index's path."""
    out: list[Ranker] = [IndexRanker(index, bundle=bundle, device=device, precision=precision,
                                     rescore=rescore)]
    for spec in hybrid:
        if spec == BM25:
            if corpus is None:
                raise ConfigError("--hybrid bm25 needs the documents' texts",
                                  "give the corpus the index was built from: --corpus FILE")
            out.append(BM25Ranker(*corpus()))
        elif (Path(spec) / "manifest.json").is_file():
            out.append(IndexRanker(Path(spec), device=device, precision=precision))
        else:
            raise ConfigError(f"--hybrid {spec}: neither bm25 nor an index (no "
                              f"{Path(spec) / 'manifest.json'})",
                              "give bm25, or the directory of an index (mlmkit index) of the same corpus")
    return out


def evaluate_hybrid(path: Path, data: Path, hybrid: Sequence[str], *, fusion: str = "rrf",
                    weights: Sequence[float] | None = None, k: int = 100, device: str = "cpu",
                    batch: int = 1024) -> dict[str, dict[str, float]]:
    """`mlmkit evaluate INDEX --data BEIR --hybrid ...`: the retrieval metrics of each retriever alone
    (the index's equal to `evaluate INDEX`'s) and of their fusion, by name, from one ranking of the
    split's queries by each. BM25 ranks the BEIR directory's corpus."""
    from mlmkit.retrieval.exact import mean_metrics
    from mlmkit.text.beir import read_split

    split = read_split(data, training=False)
    fused = Hybrid(rankers(path, hybrid, lambda: (list(split.corpus), list(split.corpus.values())),
                           device=device),
                   fusion, weights)
    qids = list(split.queries)
    runs: list[dict[str, list[str]]] = [{} for _ in range(len(fused.rankers) + 1)]
    for a in range(0, len(qids), batch):
        part = qids[a:a + batch]
        top, each = fused.rank_each([split.queries[q] for q in part], k)
        for run, rankings in zip(runs, [*each, top]):
            for qid, ranking in zip(part, rankings):
                # ties by id, descending: trec_eval's order
                ranked = sorted(ranking[:k], key=lambda h: h[0], reverse=True)
                run[qid] = [d for d, _ in sorted(ranked, key=lambda h: -h[1])]
    names = [r.name for r in fused.rankers] + [f"hybrid ({fusion})"]
    return {name: mean_metrics(run, split.qrels) for name, run in zip(names, runs)}


def corpus_texts(path: Path, id_column: str | None = None, text_column: str = "text") -> tuple[list[str],
                                                                                               list[str]]:
    """A corpus's ids and texts as `mlmkit index` reads them (building.corpus_records: a title before
    the text): what BM25 ranks beside an index built from it."""
    from mlmkit.retrieval.index.embedding import corpus_records
    from mlmkit.text.records import iter_inputs

    ids, texts, fields = [], [], set[str]()

    def noted(records: Iterator[Any]) -> Iterator[Any]:  # which fields the documents have
        for rec in records:
            fields.update(rec.data if isinstance(rec.data, dict) else (text_column,))
            yield rec

    for rec in corpus_records(noted(iter_inputs(path)), id_column, text_column):
        ids.append(rec.data["id"])
        texts.append(rec.data["text"])
    if ids and text_column not in fields:  # else BM25 would rank the titles alone, saying nothing
        raise ConfigError(f"--corpus-column {text_column}: no document of {path} has that field",
                          f"its fields: {', '.join(sorted(fields)) or 'none'}")
    return ids, texts


def hybrid_search(args: Any, where: np.ndarray | None = None) -> Callable[[list[str], int],
                                                                          list[list[JSONObject]]]:
    """`mlmkit search INDEX --hybrid ...` (args: SearchArgs): a function of (query texts, k) -> each
    query's fused hits, {"id", "score"} (the fused score: rrf's sum, or the weighted sum); ``where``:
    the index's rows a filter keeps (Hybrid.rank_each)."""
    from mlmkit.args import fusion_weights

    corpus = None if args.corpus is None else (lambda: corpus_texts(args.corpus, args.id_column,
                                                                    args.corpus_column))
    fused = Hybrid(rankers(args.index, args.hybrid, corpus, bundle=args.bundle, precision=args.precision,
                           rescore=args.rescore),
                   args.fusion, fusion_weights(args.weights, args.hybrid, args.fusion))

    def search(queries: list[str], k: int) -> list[list[JSONObject]]:
        return [[{"id": d, "score": s} for d, s in ranking] for ranking in fused.rank(queries, k, where)]
    return search


class Places:
    """One of mining's retrievers (search -> (places, scores) arrays, -1 for no hit) as a Ranker of places."""

    def __init__(self, retriever: Any, name: str) -> None:
        self.retriever, self.name = retriever, name

    def id_hashes(self) -> np.ndarray:
        raise NotImplementedError("mining's retrievers rank one corpus: Hybrid(check=False)")

    def rank(self, queries: Sequence[str], depth: int, only: set[str] | None = None) -> list[Ranking]:
        rows, scores = self.retriever.search(queries, depth)
        return [[(int(r), float(s)) for r, s in zip(row, srow) if r >= 0] for row, srow in zip(rows, scores)]


class FusedRetriever:
    """`mlmkit mine --hybrid`: mining's retrievers of its corpus, fused; ``search`` as theirs (places and
    fused scores, (Q, k) arrays, -1 past the fused documents). A fused score is no similarity: there is
    no ``pair_scores`` (mining refuses --margin and --max-score-ratio, and takes --with-scores from
    --score-with)."""

    def __init__(self, retrievers: Sequence[tuple[str, Any]], fusion: str,
                 weights: Sequence[float] | None) -> None:
        self.hybrid = Hybrid([Places(r, name) for name, r in retrievers], fusion, weights, check=False)

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        rows = np.full((len(queries), k), -1, dtype=np.int64)
        scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        for j, ranking in enumerate(self.hybrid.rank(queries, k)):
            rows[j, :len(ranking)] = [p for p, _ in ranking]
            scores[j, :len(ranking)] = [s for _, s in ranking]
        return rows, scores

    def pair_scores(self, queries: Sequence[str], docs: Sequence[int]) -> np.ndarray:
        raise ConfigError("--hybrid: a fused score is no similarity, so mining has no positive's score to "
                          "compare",
                          "leave out --margin and --max-score-ratio; --with-scores takes its scores from "
                          "--score-with")
