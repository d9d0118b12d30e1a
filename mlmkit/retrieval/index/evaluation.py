"""An index put to use beyond `mlmkit search`: the retrieval metrics of a BEIR split searched in it
(`mlmkit evaluate INDEX`, and `mlmkit evaluate BUNDLE` through a temporary index), and mining's
retriever over it (`mlmkit mine --retriever INDEX`). No torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

import mlmkit.retrieval.index.multivector as multivector
from mlmkit.errors import ConfigError, MlmkitError
from mlmkit.registry import Options
from mlmkit.retrieval.exact import normalized
from mlmkit.retrieval.index.search import hits, query_vectors, search_vectors
from mlmkit.retrieval.index.store import CHUNK, StoredIndex


def evaluate_index(path: Path, data: Path, *, k: int = 100, rescore: int | None = None, device: str = "cpu",
                   batch: int = 1024, chunk_agg: str = "max") -> dict[str, float]:
    """The retrieval metrics (retrieval/exact.py's METRICS) of a BEIR split's queries searched in the
    index: the stored vectors, never the corpus embedded again. Judged documents the index does not
    hold count as not retrieved."""
    from mlmkit.retrieval.exact import mean_metrics
    from mlmkit.text.beir import read_split

    ix = StoredIndex.open(path)
    split = read_split(data, training=False)
    qids = list(split.queries)
    runs: dict[str, list[str]] = {}
    for a in range(0, len(qids), batch):
        part = qids[a:a + batch]
        rows, scores = search_vectors(ix, query_vectors(ix, [split.queries[q] for q in part], device=device),
                                      min(k, ix.count),
                                      rescore=rescore, chunk_agg=chunk_agg)
        for qid, found in zip(part, hits(ix, rows, scores)):
            # ties by id, descending: trec_eval's order
            ranked = sorted(found, key=lambda h: h["id"], reverse=True)
            runs[qid] = [h["id"] for h in sorted(ranked, key=lambda h: -h["score"])]
    return mean_metrics(runs, split.qrels)


def through_index(bundle: Path, data: Path, options: Options) -> bool:
    """Whether `mlmkit evaluate BUNDLE --data DATA` scores through a temporary index
    (evaluate_bundle_by_index): an embedding bundle, a BEIR directory, and none of the options that only
    the in-memory evaluation reads (--option index, save_run, matryoshka_dims)."""
    from mlmkit.text.beir import is_beir

    if options or not (bundle / "mlmkit.json").is_file() or not is_beir(data):
        return False
    from mlmkit.runtime.bundle import read_bundle_meta

    try:
        return read_bundle_meta(bundle).task == "embedding"
    except MlmkitError:  # not a bundle, or a broken one: the in-memory evaluation says what is wrong
        return False


def evaluate_bundle_by_index(bundle: Path, data: Path, *, device: str = "cpu") -> dict[str, float]:
    """An embedding bundle's retrieval metrics on a BEIR directory (``DIR[:SPLIT]``) in bounded memory:
    its corpus embedded into a float32 index under $MLMKIT_CACHE (a window at a time, vectors on disk),
    the queries searched there, the index removed. Equal to the bundle's in-memory evaluation (tested)."""
    import tempfile

    from mlmkit.files import cache_root
    from mlmkit.retrieval.index.build_args import BuildArgs
    from mlmkit.retrieval.index.building import build
    from mlmkit.text.beir import split_spec

    d, _ = split_spec(data)
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="evaluate-index-", dir=root) as tmp:
        build(BuildArgs(bundle, d / "corpus.jsonl", Path(tmp) / "index", device=device))
        return evaluate_index(Path(tmp) / "index", data, device=device)


class IndexRetriever:
    """Mining's retriever over an index of the data's corpus: the stored vectors, the queries embedded
    with the index's bundle. ``places``: document id -> its place in the mined corpus. Hits the corpus
    does not hold (another split's answers, left out) are dropped from the ranking, which is searched
    that much deeper, so that ranks count the mined corpus's documents as the other retrievers' do."""

    def __init__(self, path: Path, places: dict[str, int], *, device: str = "cpu",
                 precision: str | None = None) -> None:
        self.ix, self.places, self.device, self.precision = StoredIndex.open(path), places, device, precision
        self.outside = sum(1 for a in range(0, self.ix.count, CHUNK)
                           for i in self.ix.ids(np.arange(a, min(a + CHUNK, self.ix.count)))
                           if i not in places)
        if self.outside == self.ix.count:
            raise ConfigError(f"{path} holds none of the data's documents (no id in common)",
                              "build the index from the corpus of the BEIR directory being mined")
        self._rows: dict[int, list[int]] | None = None  # a corpus place -> the index's rows, built when asked

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        rows, scores = search_vectors(self.ix, query_vectors(self.ix, queries, device=self.device,
                                                             precision=self.precision),
                                      min(self.ix.count, k + self.outside))
        places = np.full((len(rows), k), -1, dtype=np.int64)
        kept = np.full((len(rows), k), -np.inf, dtype=np.float32)
        for j, (row, srow) in enumerate(zip(rows, scores)):
            at = np.asarray([self.places.get(i, -1) for i in self.ix.ids(np.where(row >= 0, row, 0))],
                            dtype=np.int64)
            ok = (row >= 0) & (at >= 0)
            n = min(k, int(ok.sum()))
            places[j, :n], kept[j, :n] = at[ok][:n], srow[ok][:n]
        return places, kept

    def pair_scores(self, queries: Sequence[str], docs: Sequence[int]) -> np.ndarray:
        """The cosine of each query with a document of the corpus (by its place), from the index (a
        sparse index's dot product, a multi-vector index's MaxSim)."""
        if self._rows is None:  # a chunked index's: each chunk's row
            self._rows = {p: rows.tolist() for d, rows in self.ix.document_rows.items()
                          if (p := self.places.get(d)) is not None}
        lost = [d for d in docs if d not in self._rows]
        if lost:
            raise ConfigError(f"{self.ix.path} does not hold a positive of the data ({len(lost)} of this "
                              "batch)",
                              "build the index from the whole corpus being mined")
        q = query_vectors(self.ix, queries, device=self.device, precision=self.precision)
        which = np.concatenate([[j] * len(self._rows[d]) for j, d in enumerate(docs)]).astype(np.int64)
        rows = np.asarray([r for d in docs for r in self._rows[d]], dtype=np.int64)
        if self.ix.kind == "multivector":  # MaxSim, from the decoded token vectors
            each = multivector.pair_scores(self.ix, [q[j] for j in which], rows)
        else:
            q = q.toarray() if self.ix.kind == "sparse" else normalized(q)  # dot products (sparse), cosines
            each = np.einsum("qh,qh->q", q[which], self.ix.rows(rows, rescore=True))
        best = np.full(len(docs), -np.inf, dtype=np.float32)
        np.maximum.at(best, which, each)  # a document's score: its best chunk's
        return best
