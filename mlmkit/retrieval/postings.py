"""The on-disk inverted index of a sparse-embedding (SPLADE) bundle: what `mlmkit index` builds in a
shard when the bundle gives sparse vectors (retrieval/index/store.py has the directory, the manifest and the
commands). No torch.

A sparse shard holds, beside its ids.arrow:

    starts.bin      int64, count + 1: document i's terms are terms[starts[i]:starts[i + 1]]  (forward)
    terms.bin       int32 term ids, each document's highest weight first                     (forward)
    values.bin      float32 weights, beside terms                                            (forward)
    offsets.bin     int64, blocks x (width + 1): per block of ``block`` documents (the manifest's),
                    where each term's postings begin in rows / weights (the block's postings end at its
                    last offset)
    rows.bin        int32: a posting's document, its row within its block, ascending per term
    weights.bin     float32: the posting's weight

``width`` is the vocabulary (the manifest's ``dims``). A multi-vector index's shards keep the inverted
files alone (``forward=False``: its "terms" are the centroids of each document's token vectors,
retrieval/index/multivector.py, whose codes are its forward index already). Every file is memory-mapped. A
query block (QUERY_BLOCK queries, a scipy CSR matrix) is scored against one block of documents at a time by a
sparse product that reads only the postings of the query's terms; the block's scores ((queries,
block) floats) go through the same running top k as dense search. Scores are dot products (SPLADE's
similarity); a document that shares no term with a query scores 0 and is no hit.

Memory while building: one block's postings, inverted by a sort (about 28 bytes a posting: 16,384
documents of 256 terms, 120 MB at most). While searching: the pages of the postings read, plus
QUERY_BLOCK x BLOCK scores (4 MB).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from mlmkit.errors import ConfigError

BLOCK = 16384
"""Documents per block of a new index's inverted shards (their postings are sorted in memory while
building); the manifest keeps the index's own."""

FORWARD = ("starts.bin", "terms.bin", "values.bin")
INVERTED = ("offsets.bin", "rows.bin", "weights.bin")


def mapped_file(f: Path, dtype: Any, shape: tuple[int, ...], documents: int, hint: str, *,
                memory: bool = False) -> np.ndarray:
    """The file ``f`` memory-mapped read-only as ``shape`` of ``dtype``, its size checked first: a
    missing, truncated or replaced file is one line naming it (``documents``: the manifest's count).
    ``memory``: read into memory instead (a server's: what it loaded outlives the file)."""
    size = f.stat().st_size if f.is_file() else -1
    want = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if size != want:
        what = "is missing" if size < 0 else f"holds {size:,} bytes"
        raise ConfigError(f"{f} {what}; the manifest's {documents:,} documents need {want:,} bytes: a "
                          "truncated or replaced file",
                          hint)
    if not want:
        return np.zeros(shape, dtype=dtype)
    return np.fromfile(f, dtype=dtype).reshape(shape) if memory else np.memmap(f, dtype=dtype, mode="r",
                                                                               shape=shape)


@dataclass
class Postings:
    """One sparse shard, memory-mapped."""

    count: int
    width: int
    block: int
    starts: np.ndarray
    terms: np.ndarray
    values: np.ndarray
    offsets: np.ndarray
    rows: np.ndarray
    weights: np.ndarray
    path: Path = Path()
    checked: set[int] = field(default_factory=set)
    """The blocks whose rows were checked in bounds (inverted): each once, when first read."""

    @classmethod
    def open(cls, shard: Path, count: int, width: int, block: int, hint: str, *, forward: bool = True,
             memory: bool = False) -> Postings:
        """The shard's files, each checked against the manifest's count and the others' sizes: a
        truncated or replaced file is one line naming it. ``forward=False``: the inverted files alone;
        ``memory``: read into memory, not mapped (mapped_file)."""
        blocks = -(-count // block)

        def mapped(name: str, dtype: Any, n: int) -> np.ndarray:
            return mapped_file(shard / name, dtype, (n,), count, hint, memory=memory)

        offsets = mapped("offsets.bin", np.int64, blocks * (width + 1)).reshape(blocks, width + 1)
        _check_offsets(shard / "offsets.bin", offsets, hint)
        nnz = int(offsets[-1, -1]) if blocks else 0
        if forward:
            starts = mapped("starts.bin", np.int64, count + 1)
            if starts[0] != 0 or (count and (np.diff(starts) < 0).any()):
                raise ConfigError(f"{shard / 'starts.bin'} does not begin at 0 or goes down: a corrupted "
                                  "file", hint)
            if int(starts[-1]) != nnz:
                raise ConfigError(f"{shard / 'offsets.bin'} ends at posting {nnz:,}; {shard / 'starts.bin'} "
                                  "counts "
                                  f"{int(starts[-1]):,} terms: files of two builds", hint)
            terms, values = mapped("terms.bin", np.int32, nnz), mapped("values.bin", np.float32, nnz)
        else:
            starts, terms = np.zeros(0, np.int64), np.zeros(0, np.int32)
            values = terms.view(np.float32)
        return cls(count, width, block, starts, terms, values, offsets, mapped("rows.bin", np.int32, nnz),
                   mapped("weights.bin", np.float32, nnz), shard)

    def inverted(self, b: int) -> Any:
        """Block ``b`` of the inverted index as a (width, documents of the block) CSR matrix over
        the memory-mapped postings (nothing copied but its offsets)."""
        from scipy.sparse import csr_matrix

        off = np.asarray(self.offsets[b])
        a, e = int(off[0]), int(off[-1])
        n = min(self.block, self.count - b * self.block)
        if b not in self.checked:  # rows read from disk index the block's scores: never trusted unchecked
            rows = np.asarray(self.rows[a:e])
            if len(rows) and (int(rows.min()) < 0 or int(rows.max()) >= n):
                raise ConfigError(f"{self.path / 'rows.bin'}: a posting of block {b + 1} points at row "
                                  f"{int(rows.max() if rows.max() >= n else rows.min()):,} of a block of "
                                  f"{n:,} "
                                  "documents: a corrupted file",
                                  "rebuild the index, or restore it from a copy")
            self.checked.add(b)
        return csr_matrix((self.weights[a:e], self.rows[a:e], off - a), shape=(self.width, n), copy=False)

    def dense(self, rows: np.ndarray) -> np.ndarray:
        """The vectors of rows of this shard as dense (len(rows), width) float32 rows."""
        out = np.zeros((len(rows), self.width), dtype=np.float32)
        for j, r in enumerate(rows):
            a, e = int(self.starts[r]), int(self.starts[r + 1])
            out[j, self._terms(a, e)] = self.values[a:e]
        return out

    def _terms(self, a: int, e: int) -> np.ndarray:
        """terms[a:e], checked inside the vocabulary (a term read from disk indexes a vector)."""
        t = np.asarray(self.terms[a:e])
        if len(t) and (int(t.min()) < 0 or int(t.max()) >= self.width):
            raise ConfigError(f"{self.path / 'terms.bin'} holds term "
                              f"{int(t.max() if t.max() >= self.width else t.min()):,}, "
                              f"outside the vocabulary of {self.width:,}: a corrupted file",
                              "rebuild the index, or restore it from a copy")
        return t

    def vectors(self, a: int, e: int) -> tuple[list[list[int]], list[list[float]]]:
        """Documents a..e (rows of this shard) as (term lists, weight lists)."""
        s = np.asarray(self.starts[a:e + 1])
        t, v = self._terms(int(s[0]), int(s[-1])), np.asarray(self.values[s[0]:s[-1]])
        cuts = s[1:-1] - s[0]
        return [x.tolist() for x in np.split(t, cuts)], [x.tolist() for x in np.split(v, cuts)]


def _check_offsets(f: Path, offsets: np.ndarray, hint: str) -> None:
    """The inverted files' offsets ((blocks, width + 1)): from 0, never going down, each block's first
    where the one before ended; else a corrupted file, one line naming it (they slice rows.bin)."""
    if not len(offsets):
        return
    flat = offsets.reshape(-1)
    if int(flat[0]) != 0 or (np.diff(offsets, axis=1) < 0).any() or (offsets[1:, 0]
                                                                     != offsets[:-1, -1]).any():
        raise ConfigError(f"{f} does not begin at 0, goes down, or skips postings between blocks: a "
                          "corrupted file", hint)


def queries(results: Sequence[Mapping[str, Any]], width: int) -> Any:
    """Sparse vectors ({"indices", "values"}, as a sparse-embedding bundle gives them) as a (Q, width)
    scipy CSR matrix; a term id outside the vocabulary is refused."""
    from scipy.sparse import csr_matrix

    idx = [np.asarray(r["indices"], dtype=np.int64) for r in results]
    val = [np.asarray(r["values"], dtype=np.float32) for r in results]
    flat = np.concatenate(idx) if idx else np.zeros(0, np.int64)
    if len(flat) and (flat.min() < 0 or flat.max() >= width):
        raise ConfigError(f"a query's term id {int(flat.max() if flat.max() >= width else flat.min())} is "
                          "outside the index's "
                          f"vocabulary of {width:,}", "embed queries with the index's bundle")
    indptr = np.cumsum([0] + [len(i) for i in idx])
    return csr_matrix((np.concatenate(val) if val else np.zeros(0, np.float32), flat, indptr),
                      shape=(len(results), width))


def scores(shards: Sequence[Postings], q: Any) -> Any:
    """(first row, (Q, block) dot products) over every block of every shard, in row order."""
    start = 0
    for p in shards:
        for b in range(-(-p.count // p.block)):
            yield start + b * p.block, (q @ p.inverted(b)).toarray()
        start += p.count


class Writer:
    """A sparse shard written as documents come: the forward files at once (unless ``forward=False``),
    the inverted ones a block at a time (its postings sorted by term)."""

    def __init__(self, shard: Path, width: int, block: int, *, forward: bool = True) -> None:
        self.width, self.block, self.count, self.nnz, self.forward = width, block, 0, 0, forward
        self.files: dict[str, BinaryIO] = {n: open(shard / n, "wb")
                                           for n in (*(FORWARD if forward else ()), *INVERTED)}
        if forward:
            self.files["starts.bin"].write(np.zeros(1, np.int64).tobytes())
        # (lengths, terms, weights) of the block so far
        self.pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.in_block = 0

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        for f in self.files.values():
            f.close()

    def add(self, starts: np.ndarray, terms: np.ndarray, weights: np.ndarray) -> None:
        """Documents as CSR rows: document i's terms are terms[starts[i] - starts[0]:starts[i + 1] -
        starts[0]]."""
        starts = np.asarray(starts, dtype=np.int64) - int(starts[0])
        t, w = np.asarray(terms, dtype=np.int32), np.asarray(weights, dtype=np.float32)
        if len(t) != starts[-1] or len(w) != len(t) or (len(t) and (t.min() < 0 or t.max() >= self.width)):
            raise ConfigError(f"documents {self.count + 1}-{self.count + len(starts) - 1}: sparse vectors "
                              "with "
                              f"{len(t):,} terms and {len(w):,} weights, or a term outside the bundle's "
                              "vocabulary of "
                              f"{self.width:,}", "re-export the bundle")
        a = 0
        while a < len(starts) - 1:  # as much of the batch as the block has room for
            e = min(len(starts) - 1, a + self.block - self.in_block)
            lo, hi = int(starts[a]), int(starts[e])
            if self.forward:
                self.files["terms.bin"].write(t[lo:hi].tobytes())
                self.files["values.bin"].write(w[lo:hi].tobytes())
                self.files["starts.bin"].write((self.nnz + starts[a + 1:e + 1] - lo).tobytes())
            self.pending.append((np.diff(starts[a:e + 1]), t[lo:hi], w[lo:hi]))
            self.count, self.nnz, self.in_block = (self.count + e - a, self.nnz + hi - lo,
                                                   self.in_block + e - a)
            if self.in_block == self.block:
                self._invert()
            a = e

    def _invert(self) -> None:
        lengths = np.concatenate([x for x, _, _ in self.pending])
        t = np.concatenate([x for _, x, _ in self.pending])
        w = np.concatenate([x for _, _, x in self.pending])
        self.pending = []
        order = np.argsort(t, kind="stable")  # by term; rows stay ascending within a term
        offsets = self.nnz - len(t) + np.concatenate([[0], np.cumsum(np.bincount(t, minlength=self.width))])
        self.files["offsets.bin"].write(offsets.astype(np.int64).tobytes())
        self.files["rows.bin"].write(np.repeat(np.arange(len(lengths), dtype=np.int32),
                                               lengths)[order].tobytes())
        self.files["weights.bin"].write(w[order].tobytes())
        self.in_block = 0

    def finish(self) -> int:
        """The last block inverted; the number of documents (the files close on leaving the with)."""
        if self.in_block:
            self._invert()
        return self.count
