"""The helpers tests/retrieval/ shares (index_fixtures.py has its fixtures): an index built once a
session by name, the exact top k, one red line, a kill after N documents, fusion by hand, hits compared."""


from __future__ import annotations

from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from mlmkit.retrieval.index import BuildArgs, Index, build, search_vectors
from mlmkit.runtime.pipeline import Pipeline

runner = CliRunner()
DOCS = 1200


def built(setup, name: str, **kw) -> Index:
    out = setup["root"] / name
    if not (out / "manifest.json").exists():
        build(BuildArgs(setup["bundle"], kw.pop("corpus", setup["corpus"]), out, window=kw.pop("window", 256),
                        **kw))
    return Index.open(out)


def exact(setup, k: int) -> tuple[np.ndarray, np.ndarray]:
    s = setup["q"] @ setup["vectors"].T
    order = np.lexsort((np.broadcast_to(np.arange(s.shape[1]), s.shape), -s), axis=1)[:, :k]
    return order, np.take_along_axis(s, order, 1)


def one_red_line(r) -> str:
    assert r.exit_code == 2, r.output
    text = " ".join(r.stderr.split())
    assert text.startswith("error:") and "Traceback" not in r.output and text.count("error:") == 1, r.output
    return text


def killed_after(documents: int):
    """A build's progress callback that stops it (as a kill would) once ``documents`` are embedded."""
    seen = [0]

    def kill(n: int) -> None:
        seen[0] += n
        if seen[0] >= documents:
            raise KeyboardInterrupt

    return kill


def by_hand(rankings, fusion, weights):
    """The fusion of one query's rankings, written out: rrf's 1 / (60 + rank), or min-max normalised
    scores."""
    total = {}
    for w, ranking in zip(weights, rankings):
        scores = [s for _, s in ranking]
        for rank, (doc, s) in enumerate(ranking, 1):
            if fusion == "rrf":
                part = 1 / (60 + rank)
            else:
                part = (s - min(scores)) / (max(scores) - min(scores)) if max(scores) > min(scores) else 1.0
            total[doc] = total.get(doc, 0.0) + w * part
    return sorted(total.items(), key=lambda x: (-x[1], x[0]))


def query_embeddings(ix, texts):
    pipe = Pipeline.load(Index.open(ix).manifest.bundle.path)
    return np.asarray([r["embedding"] for r in pipe(texts, input_type="query")], dtype=np.float32)


class Hits(list):
    """What a search answers: each query's hits as {id: score}; equal to another's with the same ids and
    scores to 1e-5 (vectors embedded in other batches round apart; a near tie's order aside)."""

    def __eq__(self, other):
        return len(self) == len(other) and all(a.keys() == b.keys()
                                               and all(abs(a[i] - b[i]) < 1e-5 for i in a)
                                               for a, b in zip(self, other))


def hits_of(path, q, k=10):
    ix = Index.open(path)
    rows, scores = search_vectors(ix, q, k)
    return Hits({i: float(s) for i, s in zip(ix.ids(r[r >= 0]), sr[r >= 0])} for r, sr in zip(rows, scores))


def live_documents(path: Path) -> dict[str, bytes]:
    """An index's live documents: each id with its stored vector's bytes."""
    ix, out, start = Index.open(path), {}, 0
    for vectors, ids, _ in ix.shards:
        for r, i in enumerate(ids.to_pylist()):
            if ix.deleted is None or not ix.deleted[start + r]:
                out[i] = np.asarray(vectors[r]).tobytes()
        start += len(vectors)
    return out


def as_queries_of(ix, bundle, texts):
    from mlmkit.retrieval.index import as_input, as_queries

    pipe = Pipeline.load(bundle)
    return as_queries(ix, pipe(texts, **as_input(pipe, "query")))


def brute(setup, keep, k=10):
    """The top k of the documents ``keep`` alone (a bool mask), by the bundle's own vectors."""
    s = np.where(keep[None, :], setup["q"] @ setup["vectors"].T, -np.inf)
    order = np.lexsort((np.broadcast_to(np.arange(s.shape[1]), s.shape), -s), axis=1)[:, :k]
    return [[int(j) for j in row if keep[j]] for row in order]
