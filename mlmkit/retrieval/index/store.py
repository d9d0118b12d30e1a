"""An index directory on disk and its reader, ``Index``. No torch.

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
products. It takes no --quantize, --ann or --rescore.

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
import hashlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import mlmkit.retrieval.index.multivector as multivector
from mlmkit.errors import ConfigError
from mlmkit.files import read_json
from mlmkit.retrieval import postings
from mlmkit.retrieval.index.codecs import QUANTIZATIONS, RESCORE_COPIES, dtype, floats, row_bytes
from mlmkit.text.chunks import document_id

KINDS = ("dense", "sparse", "multivector")
ANNS = ("flat", "hnsw", "ivf")
ANN_FILE = re.compile(r"ann(-\d{6})?\.faiss")
"""The names an ANN index's file takes (a compaction's: ann-NNNNNN.faiss, live.py)."""
CHUNK = 65536
"""Rows of vectors scored at once in a flat search."""
QUERY_BLOCK = 64
"""Queries scored together: a block holds QUERY_BLOCK x (CHUNK + k) scores and rows, ~64 MB, whatever
the number of queries asked."""
MANIFEST = "manifest.json"
CHUNKS = "chunks.arrow"
"""A chunked index's shard's chunk numbers and spans (building.write_spans)."""
FORMAT = 1
"""The manifest's format. Fields added since (the bundle's ``model_bytes``, ``model_mtime_ns`` and
``mlmkit_json_sha256``) are optional: a manifest without them is read as before."""


@dataclass
class Index:
    """An index directory opened for reading: its manifest checked against its files."""

    path: Path
    manifest: dict[str, Any]
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

    @property
    def kind(self) -> str:
        """KINDS: dense (vectors) or sparse (an inverted index)."""
        return str(self.manifest.get("kind", "dense"))

    @property
    def dims(self) -> int:
        return int(self.manifest["dims"])

    @property
    def count(self) -> int:
        return int(self.manifest["count"])

    @property
    def quantization(self) -> str:
        return str(self.manifest["quantization"])

    @property
    def copy(self) -> str | None:
        """The rescoring copy's kind (RESCORE_COPIES), or None: rescoring reads the vectors themselves."""
        return self.manifest.get("rescore_copy", "int8" if self.quantization == "binary" else None)

    @property
    def ann(self) -> str:
        """ANNS: flat (exact), or the faiss index in ann.faiss."""
        return str(self.manifest.get("ann", "flat"))

    @property
    def two_stages(self) -> bool:
        """Whether a search takes candidates, then rescores them: binary, a rescoring copy, or --ann."""
        return self.quantization == "binary" or self.copy is not None or self.ann != "flat"

    @property
    def ranges(self) -> np.ndarray | None:
        r = self.manifest.get("ranges")
        return np.asarray(r, dtype=np.float32) if r is not None else None

    @classmethod
    def open(cls, path: str | Path, *, memory: bool = False) -> Index:
        """The index at ``path``, its manifest checked against its files, which are memory-mapped;
        ``memory``: read into memory (what `mlmkit serve --index` does: files rewritten or removed under
        a running server cannot take what it loaded from it)."""
        d = Path(path)
        if not (d / MANIFEST).is_file():
            raise ConfigError(f"{d} is not an index: no {MANIFEST}", "build one with `mlmkit index BUNDLE --corpus DOCS --out DIR`")
        stamp = manifest_stamp(d)
        m = read_json(d / MANIFEST)
        hint = f"rebuild the index, or restore {d} from a copy"
        for k, kind in (("dims", int), ("count", int), ("quantization", str), ("shards", list), ("bundle", dict)):
            if not isinstance(m.get(k), kind) or isinstance(m.get(k), bool):
                raise ConfigError(f"{d / MANIFEST}: field {k} must be {kind.__name__}, got {m.get(k)!r}", hint)
        if m.get("kind", "dense") not in KINDS:
            raise ConfigError(f"{d / MANIFEST}: kind {m.get('kind')!r} is not one of {', '.join(KINDS)}", hint)
        allowed = ("residual",) if m.get("kind") == "multivector" else QUANTIZATIONS
        if m["quantization"] not in allowed:
            raise ConfigError(f"{d / MANIFEST}: quantization {m['quantization']!r} is not one of {', '.join(allowed)}", hint)
        if m.get("ann", "flat") not in ANNS or (m.get("ann", "flat") != "flat" and not ANN_FILE.fullmatch(str(m.get("ann_file", "ann.faiss")))):
            raise ConfigError(f"{d / MANIFEST}: ann {m.get('ann')!r} with ann_file {m.get('ann_file')!r}: ann must be one of "
                              f"{', '.join(ANNS)}, its file ann.faiss or ann-NNNNNN.faiss in the index", hint)
        ix = cls(d, m, memory=memory, stamp=stamp)
        _check_coding(ix, hint)
        if ix.kind == "multivector":
            search = m.get("search")
            if not isinstance(search, dict) or any(not isinstance(search.get(k), int) or isinstance(search.get(k), bool)
                                                   or search[k] < 1 for k in ("nprobe", "candidates")):
                raise ConfigError(f"{d / MANIFEST}: field search must be {{\"nprobe\": N, \"candidates\": N}} of positive ints, "
                                  f"got {search!r}", hint)
            if not isinstance(m.get("tokens"), int) or isinstance(m.get("tokens"), bool) or m["tokens"] < 0:
                raise ConfigError(f"{d / MANIFEST}: field tokens must be a count of token vectors, got {m.get('tokens')!r}", hint)
            ix.codec = multivector.Codec.load(d / multivector.CODEC, ix.dims, hint)
        total = 0
        names = [s.get("name") for s in m["shards"] if isinstance(s, dict)]
        if len(set(map(str, names))) != len(names):
            raise ConfigError(f"{d / MANIFEST}: a shard is listed twice ({', '.join(sorted({str(n) for n in names if names.count(n) > 1}))})", hint)
        for s in m["shards"]:
            n = s.get("count") if isinstance(s, dict) else None
            if not isinstance(n, int) or isinstance(n, bool) or n < 0 or not isinstance(s.get("name"), str):
                raise ConfigError(f"{d / MANIFEST}: a shard must have a name and a count, got {s!r}", hint)
            ix.shards.append(ix.shard(d / s["name"], n, hint))
            total += n
        if total != ix.count:
            raise ConfigError(f"{d / MANIFEST}: count {ix.count} but its shards hold {total} vectors", hint)
        if ix.multi and sum(int(s.starts[-1]) for s in ix.multi) != m["tokens"]:
            raise ConfigError(f"{d / MANIFEST}: tokens {m['tokens']:,} but its shards' lengths.bin count "
                              f"{sum(int(s.starts[-1]) for s in ix.multi):,}", hint)
        if m.get("deleted") is not None:
            ix.deleted = read_deleted(d, m["deleted"], ix.count, hint)
        return ix

    @property
    def chunked(self) -> bool:
        """Whether its rows are chunks of documents (text/chunks.py): ids ``ID#K``, spans in chunks.arrow."""
        return self.manifest.get("chunks") is not None

    def chunk_spans(self, rows: np.ndarray) -> np.ndarray:
        """A chunked index's rows' (chunk number, start, end) in their documents' texts, (len(rows), 3)."""
        out = np.zeros((len(rows), 3), dtype=np.int64)
        start = 0
        for s in self.manifest["shards"]:
            sel = np.nonzero((rows >= start) & (rows < start + s["count"]))[0]
            if len(sel):
                table = read_chunks(self.path / s["name"], s["count"])
                for j, col in enumerate(("chunk", "start", "end")):
                    out[sel, j] = table.column(col).take(rows[sel] - start).to_numpy()
            start += s["count"]
        return out

    @property
    def live(self) -> int:
        """Documents searched: the rows less those deleted."""
        return self.count - (int(self.deleted.sum()) if self.deleted is not None else 0)

    def allowed(self, where: np.ndarray | None = None) -> np.ndarray | None:
        """The rows a search may return, (count,) bool: not deleted, and in ``where`` (a filter's rows,
        (count,) bool) when given; None when every row may be."""
        if where is not None and (where.shape != (self.count,) or where.dtype != np.bool_):
            raise ValueError(f"a filter of shape {where.shape} ({where.dtype}) over an index of {self.count} rows")
        if self.deleted is None:
            return where
        return ~self.deleted if where is None else where & ~self.deleted

    def shard(self, s: Path, n: int, hint: str) -> tuple[np.ndarray, Any, np.ndarray | None]:
        """The shard directory ``s`` of ``n`` documents, memory-mapped and checked against the manifest."""
        if self.kind in ("sparse", "multivector"):
            block = self.manifest.get("block")
            if not isinstance(block, int) or isinstance(block, bool) or block < 1:
                raise ConfigError(f"{self.path / MANIFEST}: a {self.kind} index's block must be a positive int, got {block!r}", hint)
            if self.codec is not None:
                self.multi.append(multivector.Shard.open(s, n, self.codec, block, hint, memory=self.memory))
            else:
                self.sparse.append(postings.Postings.open(s, n, self.dims, block, hint, memory=self.memory))
            return np.zeros((n, 0), dtype=np.float32), read_ids(s / "ids.arrow", n, hint, memory=self.memory), None

        def mapped(name: str, kind: str) -> np.ndarray:
            f, t = s / name, np.dtype(dtype(kind))
            width = row_bytes(kind, self.dims)
            size = f.stat().st_size if f.is_file() else -1
            if size != n * width:
                what = "is missing" if size < 0 else f"holds {size:,} bytes"
                raise ConfigError(f"{f} {what}; the manifest says {n:,} vectors of {width:,} bytes ({n * width:,} bytes): "
                                  "a truncated or replaced file", hint)
            cols = width // t.itemsize
            if not n:
                return np.zeros((0, cols), dtype=t)
            return np.fromfile(f, dtype=t).reshape(n, cols) if self.memory else np.memmap(f, dtype=t, mode="r", shape=(n, cols))

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


def _check_coding(ix: Index, hint: str) -> None:
    """The manifest's fields that decode and search vectors, each of its type and shape: the rescoring
    copy, the int8 ranges ((2, dims) finite numbers, each high above its low: int8 vectors or an int8
    copy need them), the ANN settings (positive ints)."""
    m, where = ix.manifest, ix.path / MANIFEST
    if m.get("rescore_copy") is not None and m["rescore_copy"] not in RESCORE_COPIES:
        raise ConfigError(f"{where}: rescore_copy {m['rescore_copy']!r} is not one of {', '.join(RESCORE_COPIES)}", hint)
    if m.get("ranges") is not None or "int8" in (ix.quantization, ix.copy):
        r = m.get("ranges")
        ok = (isinstance(r, list) and len(r) == 2 and all(isinstance(row, list) and len(row) == ix.dims for row in r)
              and all(isinstance(v, (int, float)) and not isinstance(v, bool) for row in r for v in row))
        if ok:
            with np.errstate(invalid="ignore"):
                lo, hi = np.asarray(r, dtype=np.float64)
                ok = bool(np.isfinite(lo).all() and np.isfinite(hi).all() and (hi > lo).all())
        if not ok:
            raise ConfigError(f"{where}: field ranges must be two lists of {ix.dims} finite numbers (each dimension's low, "
                              f"then its high, above it), got {str(r)[:80]}", hint)
    if ix.ann != "flat":
        a = m.get("ann_settings")
        keys = ("m", "ef_construction", "ef_search") if ix.ann == "hnsw" else ("lists", "nprobe")
        if not isinstance(a, dict) or any(not isinstance(a.get(k), int) or isinstance(a.get(k), bool) or a[k] < 1 for k in keys):
            raise ConfigError(f"{where}: field ann_settings of a {ix.ann} index must hold {', '.join(keys)}, positive ints, "
                              f"got {str(a)[:80]}", hint)


def ann_file(manifest: dict[str, Any]) -> str | None:
    """The ANN index's file: ann.faiss, or a compaction's ann-NNNNNN.faiss (live.py); None for a flat index."""
    return None if manifest.get("ann", "flat") == "flat" else str(manifest.get("ann_file", "ann.faiss"))


def footprint(path: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """What an index takes on disk: its bytes (the files its manifest names), a document's on average,
    and for a multi-vector index a token vector's (its codes and residuals alone) and the whole
    index's a token."""
    files = [f for s in manifest["shards"] for f in (path / s["name"]).iterdir()]
    files += [path / n for n in (ann_file(manifest), multivector.CODEC, MANIFEST, (manifest.get("deleted") or {}).get("file"))
              if n and (path / n).is_file()]
    total = sum(f.stat().st_size for f in files)
    out: dict[str, Any] = {"bytes": total, "bytes_per_document": round(total / max(1, manifest["count"]), 1)}
    if manifest.get("kind") == "multivector":
        tokens = max(1, int(manifest.get("tokens", 0)))
        coded = sum(f.stat().st_size for f in files if f.name in ("codes.bin", "residuals.bin"))
        out.update(tokens=int(manifest.get("tokens", 0)), bytes_per_token_vector=round(coded / tokens, 1),
                   bytes_per_token=round(total / tokens, 1))
    return out


def read_deleted(d: Path, field: Any, count: int, hint: str) -> np.ndarray:
    """The manifest's ``deleted`` ({"file", "rows", "count"}: a bitmap of the first ``rows`` rows, the
    rows after them live) as a (count,) bool array, checked against the file and the count."""
    ok = isinstance(field, dict) and isinstance(field.get("file"), str) and "/" not in field["file"] and all(
        isinstance(field.get(k), int) and not isinstance(field.get(k), bool) and field[k] >= 0 for k in ("rows", "count"))
    if not ok or field["rows"] > count:
        raise ConfigError(f"{d / MANIFEST}: field deleted must be {{\"file\": NAME, \"rows\": N, \"count\": N}} "
                          f"of rows the index holds, got {field!r}", hint)
    f = d / field["file"]
    raw = np.fromfile(f, dtype=np.uint8) if f.is_file() else None
    if raw is None or len(raw) != -(-field["rows"] // 8):
        what = "is missing" if raw is None else f"holds {len(raw):,} bytes"
        raise ConfigError(f"{f} {what}; the manifest says a bitmap of {field['rows']:,} rows ({-(-field['rows'] // 8):,} "
                          "bytes): a truncated or replaced file", hint)
    out = np.zeros(count, dtype=np.bool_)
    out[:field["rows"]] = np.unpackbits(raw, count=field["rows"], bitorder="little").astype(np.bool_)
    if int(out.sum()) != field["count"]:
        raise ConfigError(f"{f} marks {int(out.sum()):,} rows deleted; the manifest says {field['count']:,}", hint)
    return out


def shard_name(manifest: dict[str, Any] | None, after: int = 0) -> str:
    """The name of the next new shard: one past the highest number the manifest's shards have (and
    past ``after``), so a shard of a compaction or an append never takes a name in use."""
    numbers = [int(s["name"].removeprefix("shard-")) for s in (manifest or {}).get("shards", [])
               if str(s.get("name", "")).removeprefix("shard-").isdigit()]
    return f"shard-{max([after - 1, *numbers], default=-1) + 1:06d}"


def read_chunks(shard: Path, n: int) -> Any:
    """A chunked shard's chunks.arrow (memory-mapped): chunk, start, end a row."""
    import pyarrow as pa

    f = shard / CHUNKS
    try:
        table = pa.ipc.open_file(pa.memory_map(str(f))).read_all()
    except (OSError, pa.ArrowInvalid) as e:
        raise ConfigError(f"{f}: not a readable chunks file ({str(e).splitlines()[0]})", "rebuild the index") from None
    if table.num_rows != n or table.column_names != ["chunk", "start", "end"]:
        raise ConfigError(f"{f} holds {table.num_rows:,} chunks; the manifest says {n:,}", "rebuild the index")
    return table


def manifest_stamp(d: Path) -> tuple[int, int, int]:
    """The manifest's (inode, mtime in ns, size): a commit replaces the file, so any change moves it."""
    st = (d / MANIFEST).stat()
    return st.st_ino, st.st_mtime_ns, st.st_size


def read_ids(path: Path, n: int, hint: str, *, memory: bool = False) -> Any:
    """An ids.arrow of ``n`` ids, memory-mapped (a pyarrow string column); ``memory``: read into memory."""
    import pyarrow as pa

    try:
        source = pa.OSFile(str(path)) if memory else pa.memory_map(str(path))
        ids = pa.ipc.open_file(source).read_all().column(0)
    except (OSError, pa.ArrowInvalid) as e:
        raise ConfigError(f"{path}: not a readable ids file ({str(e).splitlines()[0]})", hint) from None
    if len(ids) != n:
        raise ConfigError(f"{path} holds {len(ids):,} ids; the manifest says {n:,} vectors", hint)
    return ids


def id_hashes(ids: Sequence[str]) -> np.ndarray:
    """8-byte hashes of ids (blake2b): what the uniqueness check over an index holds instead of the ids."""
    return np.asarray([int.from_bytes(hashlib.blake2b(i.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")
                       for i in ids], dtype=np.uint64)
