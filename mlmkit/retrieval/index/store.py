"""An index directory on disk and its reader, ``StoredIndex`` (``Index``, api.py, adds the changes). No torch.

An index is a directory:

    manifest.json       what it is (``FORMAT``): its kind, the bundle (identity.py: its path, the sha256
                        of its graph and description, and the graph's size and time), its prompts, dims,
                        count, quantization (codecs.py), the int8 ranges, the rescoring copy, the ANN
                        settings, and its shards; written last, atomically: it names only complete shards
    shard-NNNNNN/       one per build or append, never changed once in place:
      ids.arrow           the documents' ids (an Arrow IPC file, memory-mapped)
      vectors.bin         the unit-length vectors as the quantization stores them, row-major
      rescore.bin         the rescoring copy (codecs.RESCORE_COPIES): binary's int8 copy, or with
                          --rescore-copy float16 the vectors as float16 (int8 and binary)
    ann.faiss           --ann hnsw | ivf: a faiss index over every shard's vectors, in shard order (ann.py;
                        after a compaction, ann-NNNNNN.faiss, as the manifest's ann_file names it)
    deleted-NNNNNN.bin  the rows deleted (live.py): a bit a row, as the manifest's ``deleted`` names it
    .pending/           a build or append in progress (building.py, pending.py), resumable with --resume

A sparse-embedding (SPLADE) bundle builds a sparse index (the manifest's ``kind``): its shards hold an
inverted index on disk instead of vectors.bin (retrieval/postings.py: the postings of each term, a block of
documents at a time, and the documents' own terms), ``dims`` is the vocabulary, and its scores are dot
products. It takes no --quantization, --ann or --rescore.

A colbert bundle builds a multi-vector index (kind "multivector", multivector.py): a vector per token,
coded as a centroid and a residual of ``bits`` a dimension (the index's codec.npz), with the
centroids' postings; ``dims`` is a token vector's, its quantization "residual", and its scores
MaxSim. It takes no --ann or --rescore-copy.

Memory while searching: the vectors are memory-mapped and read a chunk of CHUNK rows at a time, and
queries are scored QUERY_BLOCK at a time (search.py), so a search holds QUERY_BLOCK x (CHUNK + k)
scores, never queries x corpus.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

import mlmkit.retrieval.index.multivector as multivector
from mlmkit.errors import ConfigError
from mlmkit.retrieval import postings
from mlmkit.retrieval.index.codecs import dtype, floats, row_bytes
from mlmkit.retrieval.index.disk import (
    footprint,
    id_hashes,
    manifest_stamp,
    read_chunks,
    read_deleted,
    read_ids,
)
from mlmkit.retrieval.index.manifest import MANIFEST, Manifest, read_manifest
from mlmkit.text.chunks import document_id

CHUNK = 65536
"""Rows of vectors scored at once in a flat search."""
QUERY_BLOCK = 64
"""Queries scored together: a block holds QUERY_BLOCK x (CHUNK + k) scores and rows, ~64 MB, whatever
the number of queries asked."""

Documents = str | Path | Iterable[Mapping[str, Any]]
"""A corpus as `mlmkit index --corpus` reads it (a file), or records: {"id" (or "_id"), "text"}, a
"title" before its text, any other field kept for --where (filters.py)."""
Progress = Callable[[int], Any] | None
"""Called with the number of documents of each window as it is embedded."""


@dataclass(frozen=True)
class Stats:
    """What ``StoredIndex.stats`` says of an index: its documents, its settings, what it takes on disk."""

    path: str
    kind: str
    count: int
    live: int
    deleted: int
    dims: int
    quantization: str
    ann: str
    shards: int
    chunked: bool
    disk: dict[str, int | float]
    """footprint's: bytes, bytes_per_document, and a multi-vector index's tokens and bytes a token."""


S = TypeVar("S", bound="StoredIndex")


@dataclass
class StoredIndex:
    """An index directory, opened: its manifest checked against its files, which are memory-mapped.
    What building, search, filters and the server read; users call its subclass ``Index`` (api.py),
    which adds the changes (build, add, delete, upsert, compact) and search."""

    path: Path
    manifest: Manifest
    shards: list[tuple[np.ndarray, Any, np.ndarray | None]] = field(default_factory=list)
    """(vectors, ids, rescore vectors) per shard, memory-mapped (a sparse index's vectors: (count, 0))."""
    sparse: list[postings.Postings] = field(default_factory=list)
    """A sparse index's shards (kind "sparse")."""
    multi: list[multivector.Shard] = field(default_factory=list)
    """A multi-vector index's shards (kind "multivector"), coded by ``codec``."""
    codec: multivector.Codec | None = None
    deleted: np.ndarray | None = None
    """(count,) bool: the rows deleted (live.py) and not yet compacted away; None when there are none."""
    ann_index: Any = None
    """The faiss index of an --ann index, once read (ann.load_ann)."""
    memory: bool = False
    """Whether its shards' files were read into memory (a server's), not memory-mapped."""
    stamp: tuple[int, int, int] = (0, 0, 0)
    """Its manifest's (inode, mtime in ns, size) when opened: what tells it changed since (changed)."""
    pipes: dict[tuple[str, str, str | None], Any] = field(default_factory=dict, repr=False, compare=False)
    """The query pipelines ``search`` loaded, by (bundle, device, precision): loaded once."""

    @property
    def kind(self) -> str:
        """KINDS: dense (vectors), sparse (an inverted index) or multivector (a vector a token)."""
        return self.manifest.kind

    @property
    def dims(self) -> int:
        return self.manifest.dims

    @property
    def count(self) -> int:
        return self.manifest.count

    @property
    def quantization(self) -> str:
        return self.manifest.quantization

    @property
    def copy(self) -> str | None:
        """The rescoring copy's kind (RESCORE_COPIES), or None: rescoring reads the vectors themselves."""
        return self.manifest.copy

    @property
    def ann(self) -> str:
        """ANNS: flat (exact), or the faiss index in ann.faiss."""
        return self.manifest.ann

    @property
    def two_stages(self) -> bool:
        """Whether a search takes candidates, then rescores them: binary, a rescoring copy, or --ann."""
        return self.quantization == "binary" or self.copy is not None or self.ann != "flat"

    @property
    def ranges(self) -> np.ndarray | None:
        r = self.manifest.ranges
        return np.asarray(r, dtype=np.float32) if r is not None else None

    @classmethod
    def open(cls: type[S], path: str | Path, *, memory: bool = False) -> S:
        """The index at ``path``, its manifest checked against its files, which are memory-mapped;
        ``memory``: read into memory (what `mlmkit serve --search-index` does: files rewritten or removed
        under a running server cannot take what it loaded from it)."""
        d = Path(path)
        if not (d / MANIFEST).is_file():
            raise ConfigError(f"{d} is not an index: no {MANIFEST}",
                              "build one with `mlmkit index BUNDLE --corpus DOCS --out DIR`")
        stamp = manifest_stamp(d)
        m = read_manifest(d)
        hint = f"rebuild the index, or restore {d} from a copy"
        ix = cls(d, m, memory=memory, stamp=stamp)
        if ix.kind == "multivector":
            ix.codec = multivector.Codec.load(d / multivector.CODEC, ix.dims, hint)
        for s in m.shards:
            ix.shards.append(ix.shard(d / s.name, s.count, hint))
        if ix.multi and sum(int(s.starts[-1]) for s in ix.multi) != m.tokens:
            raise ConfigError(f"{d / MANIFEST}: tokens {m.tokens:,} but its shards' lengths.bin count "
                              f"{sum(int(s.starts[-1]) for s in ix.multi):,}", hint)
        if m.deleted is not None:
            ix.deleted = read_deleted(d, m.deleted, ix.count, hint)
        return ix

    def stats(self) -> Stats:
        """Its documents (all, live, deleted), settings and footprint on disk."""
        return Stats(str(self.path), self.kind, self.count, self.live, self.count - self.live, self.dims,
                     self.quantization, self.ann, len(self.shards), self.chunked,
                     footprint(self.path, self.manifest))

    def reopen(self) -> None:
        """This object opened again on the index as it is on disk (after a change), its pipelines kept."""
        fresh = type(self).open(self.path, memory=self.memory)
        fresh.pipes = self.pipes
        self.__dict__.clear()  # cached properties (id_hashes, document_rows) too
        self.__dict__.update(fresh.__dict__)

    # ---- reading ---------------------------------------------------------------------------------------
    @property
    def chunked(self) -> bool:
        """Whether its rows are chunks of documents (text/chunks.py): ids ``ID#K``, spans in chunks.arrow."""
        return self.manifest.chunks is not None

    def chunk_spans(self, rows: np.ndarray) -> np.ndarray:
        """A chunked index's rows' (chunk number, start, end) in their documents' texts, (len(rows), 3)."""
        out = np.zeros((len(rows), 3), dtype=np.int64)
        start = 0
        for s in self.manifest.shards:
            sel = np.nonzero((rows >= start) & (rows < start + s.count))[0]
            if len(sel):
                table = read_chunks(self.path / s.name, s.count)
                for j, col in enumerate(("chunk", "start", "end")):
                    out[sel, j] = table.column(col).take(rows[sel] - start).to_numpy()
            start += s.count
        return out

    @property
    def live(self) -> int:
        """Documents searched: the rows less those deleted."""
        return self.count - (int(self.deleted.sum()) if self.deleted is not None else 0)

    def allowed(self, where: np.ndarray | None = None) -> np.ndarray | None:
        """The rows a search may return, (count,) bool: not deleted, and in ``where`` (a filter's rows,
        (count,) bool) when given; None when every row may be."""
        if where is not None and (where.shape != (self.count,) or where.dtype != np.bool_):
            raise ValueError(f"a filter of shape {where.shape} ({where.dtype}) over an index of "
                             f"{self.count} rows")
        if self.deleted is None:
            return where
        return ~self.deleted if where is None else where & ~self.deleted

    def shard(self, s: Path, n: int, hint: str) -> tuple[np.ndarray, Any, np.ndarray | None]:
        """The shard directory ``s`` of ``n`` documents, memory-mapped and checked against the manifest."""
        if self.kind in ("sparse", "multivector"):
            block = int(self.manifest.block or 0)  # manifest.check: a sparse or multi-vector index has one
            if self.codec is not None:
                self.multi.append(multivector.Shard.open(s, n, self.codec, block, hint, memory=self.memory))
            else:
                self.sparse.append(postings.Postings.open(s, n, self.dims, block, hint, memory=self.memory))
            ids = read_ids(s / "ids.arrow", n, hint, memory=self.memory)
            return np.zeros((n, 0), dtype=np.float32), ids, None

        def mapped(name: str, kind: str) -> np.ndarray:
            f, t = s / name, np.dtype(dtype(kind))
            width = row_bytes(kind, self.dims)
            size = f.stat().st_size if f.is_file() else -1
            if size != n * width:
                what = "is missing" if size < 0 else f"holds {size:,} bytes"
                raise ConfigError(f"{f} {what}; the manifest says {n:,} vectors of {width:,} bytes "
                                  f"({n * width:,} bytes): a truncated or replaced file", hint)
            cols = width // t.itemsize
            if not n:
                return np.zeros((0, cols), dtype=t)
            if self.memory:
                return np.fromfile(f, dtype=t).reshape(n, cols)
            return np.memmap(f, dtype=t, mode="r", shape=(n, cols))

        vectors = mapped("vectors.bin", self.quantization)
        rescore = mapped("rescore.bin", self.copy) if self.copy else None
        return vectors, read_ids(s / "ids.arrow", n, hint, memory=self.memory), rescore

    def changed(self) -> bool:
        """Whether its manifest on disk is another than the one it opened (a delete, an upsert, an append,
        a compaction or a rebuild since): what a server's reload looks at (identity.reloaded)."""
        try:
            return manifest_stamp(self.path) != self.stamp
        except OSError:
            return True

    @functools.cached_property
    def id_hashes(self) -> np.ndarray:
        """The sorted hashes of its ids (id_hashes), read a chunk at a time, once: what tells a hybrid
        search (hybrid.py) that two retrievers hold one corpus."""
        return np.unique(np.concatenate([id_hashes(self.ids(np.arange(a, min(a + CHUNK, self.count))))
                                         for a in range(0, self.count, CHUNK)] or [np.zeros(0, np.uint64)]))

    @functools.cached_property
    def document_rows(self) -> dict[str, np.ndarray]:
        """Each document's rows (a chunked index's: its chunks'; deleted ones among them), ascending, read
        a chunk of ids at a time, once: what --chunk-agg and mining's pair scores read."""
        out: dict[str, list[int]] = {}
        for a in range(0, self.count, CHUNK):
            for r, d in enumerate(self.ids(np.arange(a, min(a + CHUNK, self.count))), a):
                out.setdefault(d, []).append(r)
        return {d: np.asarray(r, dtype=np.int64) for d, r in out.items()}

    def ids(self, rows: np.ndarray) -> list[str]:
        """The documents' ids of global row numbers (a chunked index's rows: their documents')."""
        got = self.row_ids(rows)
        return [document_id(i) for i in got] if self.chunked else got

    def row_ids(self, rows: np.ndarray) -> list[str]:
        """The ids of global row numbers as stored (a chunked index's: ``ID#K``)."""
        out: list[str] = [""] * len(rows)
        start = 0
        for _, ids, _ in self.shards:
            n = len(ids)
            sel = np.nonzero((rows >= start) & (rows < start + n))[0]
            if len(sel):
                got = ids.take(rows[sel] - start).to_pylist()
                for j, v in zip(sel, got):
                    out[j] = v
            start += n
        return out

    def chunks(self, which: str = "vectors") -> Iterator[tuple[int, np.ndarray]]:
        """(first row, a chunk of float32 vectors as the first stage scores them): dequantized,
        binary as +-1; ``which="rescore"``: the rescoring copy's rows where there is one."""
        start = 0
        for vectors, _, rescore in self.shards:
            source = rescore if which == "rescore" and rescore is not None else vectors
            for a in range(0, len(source), CHUNK):
                yield start + a, self.floats(np.asarray(source[a:a + CHUNK]), copy=source is rescore)
            start += len(vectors)

    def floats(self, raw: np.ndarray, *, copy: bool = False) -> np.ndarray:
        """Stored rows as float32: as stored (floats), dequantized (int8), +-1 (binary); ``copy``: rows of
        the rescoring copy (int8 dequantized, float16 as they are)."""
        kind = self.copy if copy and self.copy else self.quantization
        return floats(raw, kind, self.dims, self.ranges)

    def rows(self, rows: np.ndarray, *, rescore: bool) -> np.ndarray:
        """The float32 vectors of global rows (what rescoring reads: the int8 copy of a binary index)."""
        out = np.zeros((len(rows), self.dims), dtype=np.float32)
        start = 0
        for s, (vectors, _, copy) in enumerate(self.shards):
            n = len(vectors)
            sel = np.nonzero((rows >= start) & (rows < start + n))[0]
            if len(sel) and self.kind == "sparse":
                out[sel] = self.sparse[s].dense(rows[sel] - start)
            elif len(sel):
                src = copy if rescore and copy is not None else vectors
                out[sel] = self.floats(np.asarray(src[rows[sel] - start]), copy=src is copy)
            start += n
        return out
