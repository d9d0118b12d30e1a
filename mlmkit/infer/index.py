"""`mlmkit index` and `mlmkit search`: a corpus embedded once into an on-disk index, searched in
bounded memory. No torch.

An index is a directory:

    manifest.json       what it is: the bundle (its path and the sha256 of its graph and description),
                        its prompts, dims, count, quantization, the int8 ranges, the ANN settings, and
                        its shards; written last, atomically: it names only complete shards
    shard-NNNNNN/       one per build or append, never changed once in place:
      ids.arrow           the documents' ids (an Arrow IPC file, memory-mapped)
      vectors.bin         the unit-length vectors as the quantization stores them, row-major:
                          float32 or float16 (D values), int8 (D values, the ranges below), binary
                          (D / 8 bytes of sign bits, numpy.packbits order)
      rescore.bin         the rescoring copy (RESCORE_COPIES): binary's int8 copy, or with
                          --rescore-copy float16 the vectors as float16 (int8 and binary)
    ann.faiss           --ann hnsw | ivf: a faiss index over every shard's vectors, in shard order
    .pending/           a build or append in progress: the batch job that embeds the documents
                        (resumable with --resume), then the shard being written

A sparse-embedding (SPLADE) bundle builds a sparse index (the manifest's ``kind``): its shards hold an
inverted index on disk instead of vectors.bin (infer/postings.py: the postings of each term, a block of
documents at a time, and the documents' own terms), ``dims`` is the vocabulary, and its scores are dot
products. It takes no --quantize, --ann or --rescore.

Embedding is a batch job (infer/jobs.py): windows of documents, worker processes, a killed job resumed
after its last finished window. Memory while building: a window of documents and their vectors (the
faiss structure, with --ann, is held whole while it is built). Memory while searching: the vectors are
memory-mapped and read a chunk of CHUNK rows at a time, and queries are scored QUERY_BLOCK at a time, so a
search holds QUERY_BLOCK x (CHUNK + k) scores, never queries x corpus.

Quantization (scores are dot products of unit vectors, so cosines):

- ``float16``: half the disk, scores within ~1e-3 of float32;
- ``int8``: each dimension's range (the 0.1 and 99.9 percentiles of the first window's values, the
  calibration) cut into 255 steps; the float query is scored against the dequantized vectors
  (asymmetric: quantizing the query too, to the documents' ranges, lost a tenth of recall@10 on a
  static model at 100k documents, 0.881 against 0.976, 2026-12-04);
- ``binary``: one bit a dimension (positive or not); a query (float) is scored against +-1 vectors,
  then its ``rescore`` best are scored again with the int8 copy, and the best ``top_k`` of those kept.
  (Bits cut at each dimension's median instead of 0 were measured no better on all-MiniLM-L6-v2 and
  worse on a tiny random model, 2026-12-04.)

``--rescore-copy float16`` keeps the vectors as float16 beside an int8 or binary index: the first
stage still reads only the quantized vectors (what must stay in memory for speed), and the candidates
are rescored from the float16 copy, read from disk for them alone: recall@10 1.000 for int8 from 100
candidates on that set.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from mlmkit.args import check_precision
from mlmkit.errors import ConfigError, DataFormatError, MlmkitError
from mlmkit.files import LOCK, atomic_write, exclusive, read_json, write_json
from mlmkit.infer import postings
from mlmkit.infer.retrieval import normalized, top_k
from mlmkit.text.readers import Record

log = logging.getLogger("mlmkit")

KINDS = ("dense", "sparse")
QUANTIZATIONS = ("float32", "float16", "int8", "binary")
ANNS = ("flat", "hnsw", "ivf")
CHUNK = 65536
"""Rows of vectors scored at once in a flat search."""
QUERY_BLOCK = 64
"""Queries scored together: a block holds QUERY_BLOCK x (CHUNK + k) scores and rows, ~64 MB, whatever
the number of queries asked."""
CALIBRATION = (0.1, 99.9)
"""The percentiles of each dimension's values that bound int8's range."""
RESCORE_COPIES = ("int8", "float16")
"""What a quantized index may keep beside its vectors for rescoring: int8 (binary's default), float16."""
MANIFEST = "manifest.json"
FORMAT = 1


# ---- the manifest --------------------------------------------------------------------------------
def bundle_checksum(bundle: Path) -> str:
    """sha256 over the bundle's graph and description: the same bundle wherever it is copied."""
    h = hashlib.sha256()
    for name in ("model.onnx", "mlmkit.json"):
        with open(bundle / name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def row_bytes(quantization: str, dims: int) -> int:
    return {"float32": 4 * dims, "float16": 2 * dims, "int8": dims, "binary": (dims + 7) // 8}[quantization]


def _dtype(quantization: str) -> Any:
    return {"float32": np.float32, "float16": np.float16, "int8": np.int8, "binary": np.uint8}[quantization]


@dataclass
class Index:
    """An index directory opened for reading: its manifest checked against its files."""

    path: Path
    manifest: dict[str, Any]
    shards: list[tuple[np.ndarray, Any, np.ndarray | None]] = field(default_factory=list)
    """(vectors, ids, rescore vectors) per shard, memory-mapped (a sparse index's vectors: (count, 0))."""
    sparse: list[postings.Postings] = field(default_factory=list)
    """A sparse index's shards (kind "sparse")."""

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
    def open(cls, path: str | Path) -> Index:
        d = Path(path)
        if not (d / MANIFEST).is_file():
            raise ConfigError(f"{d} is not an index: no {MANIFEST}", "build one with `mlmkit index BUNDLE --corpus DOCS --out DIR`")
        m = read_json(d / MANIFEST)
        hint = f"rebuild the index, or restore {d} from a copy"
        for k, kind in (("dims", int), ("count", int), ("quantization", str), ("shards", list), ("bundle", dict)):
            if not isinstance(m.get(k), kind) or isinstance(m.get(k), bool):
                raise ConfigError(f"{d / MANIFEST}: field {k} must be {kind.__name__}, got {m.get(k)!r}", hint)
        if m.get("kind", "dense") not in KINDS:
            raise ConfigError(f"{d / MANIFEST}: kind {m.get('kind')!r} is not one of {', '.join(KINDS)}", hint)
        if m["quantization"] not in QUANTIZATIONS:
            raise ConfigError(f"{d / MANIFEST}: quantization {m['quantization']!r} is not one of {', '.join(QUANTIZATIONS)}", hint)
        ix = cls(d, m)
        total = 0
        for s in m["shards"]:
            n = s.get("count") if isinstance(s, dict) else None
            if not isinstance(n, int) or isinstance(n, bool) or n < 0 or not isinstance(s.get("name"), str):
                raise ConfigError(f"{d / MANIFEST}: a shard must have a name and a count, got {s!r}", hint)
            ix.shards.append(ix._shard(d / s["name"], n, hint))
            total += n
        if total != ix.count:
            raise ConfigError(f"{d / MANIFEST}: count {ix.count} but its shards hold {total} vectors", hint)
        return ix

    def _shard(self, s: Path, n: int, hint: str) -> tuple[np.ndarray, Any, np.ndarray | None]:
        if self.kind == "sparse":
            block = self.manifest.get("block")
            if not isinstance(block, int) or isinstance(block, bool) or block < 1:
                raise ConfigError(f"{self.path / MANIFEST}: a sparse index's block must be a positive int, got {block!r}", hint)
            self.sparse.append(postings.Postings.open(s, n, self.dims, block, hint))
            return np.zeros((n, 0), dtype=np.float32), _read_ids(s / "ids.arrow", n, hint), None
        q, width = self.quantization, row_bytes(self.quantization, self.dims)

        def mapped(name: str, dtype: Any, cols: int, per: int) -> np.ndarray:
            f = s / name
            size = f.stat().st_size if f.is_file() else -1
            if size != n * cols * per:
                what = "is missing" if size < 0 else f"holds {size:,} bytes"
                raise ConfigError(f"{f} {what}; the manifest says {n:,} vectors of {cols * per:,} bytes ({n * cols * per:,} bytes): "
                                  "a truncated or replaced file", hint)
            return np.memmap(f, dtype=dtype, mode="r", shape=(n, cols)) if n else np.zeros((0, cols), dtype=dtype)

        cols = width // np.dtype(_dtype(q)).itemsize
        vectors = mapped("vectors.bin", _dtype(q), cols, np.dtype(_dtype(q)).itemsize)
        copy = np.float16 if self.copy == "float16" else np.int8
        rescore = mapped("rescore.bin", copy, self.dims, np.dtype(copy).itemsize) if self.copy else None
        ids = _read_ids(s / "ids.arrow", n, hint)
        return vectors, ids, rescore

    def ids(self, rows: np.ndarray) -> list[str]:
        """The ids of global row numbers."""
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
        binary as +-1."""
        start = 0
        for vectors, _, rescore in self.shards:
            source = rescore if which == "rescore" and rescore is not None else vectors
            for a in range(0, len(source), CHUNK):
                yield start + a, self.floats(np.asarray(source[a:a + CHUNK]), copy=source is rescore)
            start += len(vectors)

    def floats(self, raw: np.ndarray, *, copy: bool = False) -> np.ndarray:
        """Stored rows as float32: as stored (floats), dequantized (int8), +-1 (binary); ``copy``: rows of
        the rescoring copy (int8 dequantized, float16 as they are)."""
        if copy and self.copy == "float16":
            return raw.astype(np.float32)
        if self.quantization == "binary" and not copy:
            return np.unpackbits(raw, axis=1, count=self.dims).astype(np.float32) * 2 - 1
        if self.quantization in ("int8", "binary"):
            return dequantize(raw, self.ranges)
        return raw.astype(np.float32)

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


def _read_ids(path: Path, n: int, hint: str) -> Any:
    import pyarrow as pa

    try:
        ids = pa.ipc.open_file(pa.memory_map(str(path))).read_all().column(0)
    except (OSError, pa.ArrowInvalid) as e:
        raise ConfigError(f"{path}: not a readable ids file ({str(e).splitlines()[0]})", hint) from None
    if len(ids) != n:
        raise ConfigError(f"{path} holds {len(ids):,} ids; the manifest says {n:,} vectors", hint)
    return ids


# ---- quantization --------------------------------------------------------------------------------
def calibrate(x: np.ndarray) -> np.ndarray:
    """(2, D) int8 ranges: each dimension's CALIBRATION percentiles of the sample ``x`` (a range of 0
    widened, so that every step is positive)."""
    lo, hi = np.percentile(x, CALIBRATION, axis=0).astype(np.float32)
    hi = np.maximum(hi, lo + 1e-6)
    return np.stack([lo, hi])


def quantize(x: np.ndarray, ranges: np.ndarray) -> np.ndarray:
    lo, hi = ranges
    return (np.clip(np.rint((x - lo) / (hi - lo) * 255), 0, 255) - 128).astype(np.int8)


def dequantize(q: np.ndarray, ranges: np.ndarray | None) -> np.ndarray:
    assert ranges is not None
    lo, hi = ranges
    return lo + (q.astype(np.float32) + 128) * ((hi - lo) / 255)


def stored(x: np.ndarray, quantization: str, ranges: np.ndarray | None,
           copy: str | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """(vectors as stored, the rescoring copy of kind ``copy`` or None) of unit-length float32 rows."""
    if quantization == "float32":
        return x.astype(np.float32), None
    if quantization == "float16":
        return x.astype(np.float16), None
    assert ranges is not None
    q8 = quantize(x, ranges)
    kept = x.astype(np.float16) if copy == "float16" else q8 if copy == "int8" else None
    return (q8 if quantization == "int8" else np.packbits(x > 0, axis=1)), kept


# ---- search --------------------------------------------------------------------------------------
def search_vectors(ix: Index, queries: Any, k: int, *, rescore: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The top ``k`` rows of each query vector and their cosines, best first (-1 past a faiss graph's
    reach). A two-stage index (Index.two_stages) takes ``rescore`` candidates (default: 4k, at least
    100) from its first stage (the quantized vectors, or the ANN index) and rescores them from its
    rescoring vectors; the others score the float query against every vector (dequantized) at once.
    A sparse index takes the queries as a CSR matrix (as_queries) and scores dot products through its
    postings; a document that shares no term with a query is no hit (-1)."""
    if k < 1:
        raise ConfigError(f"--top-k must be at least 1, got {k}")
    if k > ix.count:
        raise ConfigError(f"--top-k {k} is past the index's {ix.count:,} documents", f"give --top-k {ix.count} or less")
    if ix.kind == "sparse":
        if rescore is not None:
            raise ConfigError(f"--rescore {rescore}: {ix.path} is a sparse index, searched exactly in one stage", "leave --rescore out")
        return _search_postings(ix, queries, k)
    q = normalized(queries)
    if q.ndim != 2 or q.shape[1] != ix.dims:
        raise ConfigError(f"query vectors of {q.shape[-1]} dimensions; the index holds {ix.dims}")
    if rescore is not None and rescore < k:
        raise ConfigError(f"--rescore {rescore} is below --top-k {k}", "rescore at least as many candidates as are kept")
    if rescore is not None and not ix.two_stages:
        raise ConfigError(f"--rescore {rescore}: {ix.path} ({ix.quantization}, flat) is searched in one stage, with nothing "
                          "to rescore from", "leave --rescore out, or build the index with --rescore-copy float16 (int8) or --ann")
    if len(q) > QUERY_BLOCK:
        parts = [search_vectors(ix, q[a:a + QUERY_BLOCK], k, rescore=rescore) for a in range(0, len(q), QUERY_BLOCK)]
        return np.concatenate([r for r, _ in parts]), np.concatenate([s for _, s in parts])
    n = min(ix.count, rescore or max(4 * k, 100)) if ix.two_stages else k
    if ix.ann != "flat":
        rows, scores = _ann_search(ix, ix.path / "ann.faiss", q, n)
    else:
        rows, scores = top_k(((a, q @ c.T) for a, c in ix.chunks()), len(q), n)
    return _rescored(ix, q, rows, k) if ix.two_stages else (rows, scores)


def _search_postings(ix: Index, q: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
    if q.shape[1] != ix.dims:
        raise ConfigError(f"sparse queries over a vocabulary of {q.shape[1]:,}; the index's is {ix.dims:,}")
    parts = [top_k(postings.scores(ix.sparse, q[a:a + QUERY_BLOCK]), min(QUERY_BLOCK, q.shape[0] - a), k)
             for a in range(0, q.shape[0], QUERY_BLOCK)]
    rows = np.concatenate([r for r, _ in parts]) if parts else np.zeros((0, k), np.int64)
    scores = np.concatenate([s for _, s in parts]) if parts else np.zeros((0, k), np.float32)
    return np.where(scores > 0, rows, -1), scores


def _rescored(ix: Index, q: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each query's candidates scored again, float query x the rescoring vectors; the best k."""
    out_i = np.full((len(q), k), -1, dtype=np.int64)
    out_s = np.full((len(q), k), -np.inf, dtype=np.float32)
    for j in range(len(q)):
        cand = rows[j][rows[j] >= 0]
        s = ix.rows(cand, rescore=True) @ q[j]
        order = np.lexsort((cand, -s))[:k]
        out_i[j, : len(order)], out_s[j, : len(order)] = cand[order], s[order]
    return out_i, out_s


def _ann_search(ix: Index, path: Path, q: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    faiss = _faiss()
    index = faiss.read_index_binary(str(path)) if ix.quantization == "binary" else faiss.read_index(str(path))
    settings = ix.manifest.get("ann_settings", {})
    if ix.ann == "hnsw":
        faiss.ParameterSpace().set_index_parameter(index, "efSearch", max(int(settings.get("ef_search", 128)), n))
    else:
        faiss.ParameterSpace().set_index_parameter(index, "nprobe", int(settings.get("nprobe", 16)))
    x = np.packbits(q > 0, axis=1) if ix.quantization == "binary" else np.ascontiguousarray(q)
    scores, rows = index.search(x, n)
    return rows.astype(np.int64), scores.astype(np.float32)


def _faiss() -> Any:
    try:
        import faiss
    except ImportError:
        raise ConfigError("--ann hnsw and ivf need faiss", "pip install 'mlmkit[retrieval]' (faiss-cpu), or --ann flat") from None
    return faiss


# ---- building ------------------------------------------------------------------------------------
def corpus_records(items: Iterable[Any], id_column: str | None, text_column: str) -> Iterator[Any]:
    """Records as the index takes them, {"id", "text"}: a BEIR corpus's ``_id`` (or ``id``), its
    ``title`` before its ``text``; a text line's id is its line number. A record without an id, or
    with an empty text, names its file and line."""
    for rec in items:
        if not isinstance(rec, Record):
            yield rec
            continue
        if isinstance(rec.data, str):
            if id_column is not None:
                raise rec.error(f"a text line has no id column {id_column!r}", hint="give JSON lines or Parquet with that column")
            yield replace(rec, data={"id": str(rec.line), "text": rec.data})
            continue
        f = rec.fields()
        col = id_column or next((c for c in ("_id", "id") if c in f), None)
        value = f.get(col) if col is not None else None
        if value is None or isinstance(value, (dict, list, bool)) or str(value) == "":
            raise rec.error("no document id" if col is None or col not in f else f"its id is {value!r}", col or "_id",
                            hint="every document needs an id: _id (BEIR) or id, or name the column with --id-column")
        title = f.get("title")
        title = title.strip() if isinstance(title, str) else ""
        text = rec.text(text_column, required=not title)  # a title alone is a document, as in BEIR
        yield replace(rec, data={"id": str(value), "text": f"{title} {text or ''}".strip() if title else text}, schema=None)


@dataclass
class BuildArgs:
    bundle: Path
    corpus: Path
    out: Path
    quantization: str = "float32"
    ann: str = "flat"
    append: bool = False
    resume: bool = False
    id_column: str | None = None
    text_column: str = "text"
    window: int = 4096
    workers: int = 1
    threads: int | None = None
    batch_size: int = 32
    device: str = "cpu"
    hnsw_m: int = 32
    ivf_lists: int | None = None
    engine: str = "local"
    address: str | None = None
    rescore_copy: str | None = None
    """RESCORE_COPIES, for int8 and binary (None: binary keeps int8, int8 none)."""
    precision: str | None = None  # --precision (mlmkit.infer.precision): the documents' vectors are computed in it

    def __post_init__(self) -> None:
        check_precision(self.precision, None)
        if self.rescore_copy is not None and (self.rescore_copy not in RESCORE_COPIES
                                              or self.quantization not in ("int8", "binary")
                                              or (self.quantization, self.rescore_copy) == ("int8", "int8")):
            raise ConfigError(f"--rescore-copy {self.rescore_copy} with --quantize {self.quantization}",
                              "--rescore-copy float16 keeps the vectors for rescoring beside an int8 or binary index")
        if self.rescore_copy is None and self.quantization == "binary":
            self.rescore_copy = "int8"
        if self.engine not in ("local", "ray"):
            raise ConfigError(f"--engine {self.engine}: use local or ray")
        if self.quantization not in QUANTIZATIONS:
            raise ConfigError(f"--quantize {self.quantization}: use one of {', '.join(QUANTIZATIONS)}")
        if self.ann not in ANNS:
            raise ConfigError(f"--ann {self.ann}: use one of {', '.join(ANNS)}")
        if self.address is not None and self.engine != "ray":
            raise ConfigError("--address goes with --engine ray (the cluster to join)", "add --engine ray, or leave --address out")


def build(args: BuildArgs, progress: Any = None) -> dict[str, Any]:
    """Embed the corpus into a new shard of ``args.out`` (a new index, or ``append``), then write the
    manifest that names it. Returns the manifest."""
    from mlmkit.infer.jobs import batch
    from mlmkit.infer.pipeline import Pipeline
    from mlmkit.text.records import input_files, iter_inputs

    out = Path(args.out)
    exists = (out / MANIFEST).is_file()
    if exists and not args.append and not args.resume:
        raise ConfigError(f"{out} is an index already", "pass --append to add documents to it, or give a new --out")
    if args.append and not exists:
        raise ConfigError(f"--append: {out} is not an index", "build it first, without --append")
    if out.exists() and not exists and any(p.name not in (".pending", LOCK) and not p.name.startswith(("shard-", "ann.faiss"))
                                           for p in out.iterdir()):
        raise ConfigError(f"--out {out} is a directory that is not an index", "give a new or empty directory")
    out.mkdir(parents=True, exist_ok=True)
    pipe = Pipeline.load(args.bundle, device=args.device, threads=args.threads, batch_size=args.batch_size, command="embed",
                         precision=args.precision)
    checksum = bundle_checksum(Path(args.bundle))
    if is_sparse(pipe) and (args.quantization, args.ann, args.rescore_copy) != ("float32", "flat", None):
        raise ConfigError(f"{args.bundle} gives sparse vectors (sparse-embedding): its index is an inverted index, which takes "
                          "no --quantize, --ann or --rescore-copy", "drop them")
    with exclusive(out):
        old = Index.open(out) if exists else None
        if old is not None:
            if old.manifest["bundle"].get("sha256") != checksum:
                raise ConfigError(f"{out} was built with the bundle {old.manifest['bundle'].get('path')}, not {args.bundle} "
                                  "(another graph or description)", "append with the index's own bundle, or build a new index")
            if (args.quantization, args.ann, args.rescore_copy) != (old.quantization, old.ann, old.copy):
                copy = f" --rescore-copy {old.copy}" if old.copy and old.quantization != "binary" else ""
                raise ConfigError(f"{out} is a {old.quantization} index with --ann {old.ann}"
                                  f"{f' and a {old.copy} rescoring copy' if old.copy else ''}; --append takes the index's own "
                                  "settings", f"pass --quantize {old.quantization} --ann {old.ann}{copy}")
        pending = out / ".pending"
        if pending.exists() and not args.resume:
            raise ConfigError(f"an unfinished build is in {pending}", "pass --resume to continue it, or delete that directory")
        if args.resume and not pending.exists():  # else it would add the corpus again, as an --append
            raise ConfigError(f"--resume: no unfinished build in {out}", "drop --resume (--append adds documents to a finished index)")
        pending.mkdir(exist_ok=True)
        embedded = pending / "embedded.parquet"
        try:
            files = input_files(args.corpus)
            if not embedded.is_file() and args.engine == "ray":
                _embed_on_ray(args, pending, embedded, progress, pipe)
            elif not embedded.is_file():
                items = corpus_records(iter_inputs(args.corpus), args.id_column, args.text_column)
                resume = (pending / ".embedded.parquet.job" / "progress.json").is_file() and args.resume
                for w, _ in batch(pipe, items, options=as_input(pipe, "document"), window=args.window, workers=args.workers,
                                  threads=args.threads, id_column="id", output=embedded, resume=resume, inputs=files):
                    if progress is not None:
                        progress(len(w.items))
            manifest = _write_shard(args, out, old, embedded, pipe, checksum)
        except BaseException as e:
            resumable = (pending / ".embedded.parquet.job" / "progress.json").is_file()
            if (embedded.is_file() and isinstance(e, MlmkitError)) or (not embedded.is_file() and not resumable):
                # the documents were bad (duplicate ids: a resume would meet them again), or nothing finished
                shutil.rmtree(pending, ignore_errors=True)
            raise
        shutil.rmtree(pending, ignore_errors=True)
    return manifest


def is_sparse(pipe: Any) -> bool:
    """Whether a bundle gives sparse vectors (its outputs "indices" and "values", as parity reads
    them): its index is an inverted one."""
    return {"indices", "values"} <= set(pipe.meta.get("outputs") or {})


def as_input(pipe: Any, kind: str) -> dict[str, Any]:
    """The pipeline options that embed texts as ``kind`` (query or document) with the bundle's prompts
    ({} for a bundle without them: sparse-embedding)."""
    return {"input_type": kind} if "input_type" in pipe.option_names else {}


def _embedded_schema(sparse: bool) -> Any:
    """What the embedding job leaves for the shard writer: ids and vectors (dense, or sparse terms)."""
    import pyarrow as pa

    if sparse:
        return pa.schema([("id", pa.string()), ("indices", pa.list_(pa.int32())), ("values", pa.list_(pa.float32()))])
    return pa.schema([("id", pa.string()), ("embedding", pa.list_(pa.float32()))])


def _embed_on_ray(args: BuildArgs, pending: Path, embedded: Path, progress: Any, pipe: Any) -> None:
    """--engine ray: the documents read and checked here (ids, titles: each bad one names its file and
    line, as in a local build) into Parquet files of ``args.window`` documents under ``pending``, which
    the cluster reads (on a cluster of several machines ``--out`` must be on storage they share), then
    embedded there and streamed back, in order, into ``embedded``. A resumed Ray build starts over."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mlmkit.infer.integrations.ray import embed_in_order
    from mlmkit.text.records import iter_inputs

    docs = pending / "documents"
    shutil.rmtree(docs, ignore_errors=True)
    docs.mkdir()
    files: list[Path] = []
    part: list[dict[str, str]] = []

    def flush() -> None:
        files.append(docs / f"part-{len(files):06d}.parquet")
        pq.write_table(pa.Table.from_pylist(part, schema=pa.schema([("id", pa.string()), ("text", pa.string())])), files[-1])
        part.clear()

    for rec in corpus_records(iter_inputs(args.corpus), args.id_column, args.text_column):
        part.append(rec.data if isinstance(rec, Record) else rec)
        if len(part) == args.window:
            flush()
    if part:
        flush()
    if not files:
        raise DataFormatError(args.corpus, "no documents", hint="one document per line or record")
    schema = _embedded_schema(is_sparse(pipe))

    def write(tmp: str) -> None:
        with pq.ParquetWriter(tmp, schema) as w:
            for b in embed_in_order(files, args.bundle, options=as_input(pipe, "document"), address=args.address,
                                    workers=args.workers, threads=args.threads, batch_size=args.batch_size,
                                    rows_per_batch=args.window):
                w.write_table(pa.table({f.name: b.column(f.name).cast(f.type) for f in schema}, schema=schema))
                if progress is not None:
                    progress(b.num_rows)

    atomic_write(embedded, write)
    shutil.rmtree(docs, ignore_errors=True)


def _embedded_batches(path: Path, *, sparse: bool = False) -> Iterator[tuple[list[str], Any]]:
    """The embedded documents, 8,192 at a time: (ids, (n, dims) float32 vectors), or with ``sparse``
    (ids, (starts, terms, weights): CSR rows, postings.Writer.add)."""
    import pyarrow.parquet as pq

    # pre_buffer=False: pyarrow's pre-buffering (its default) kept what it read, row group after row group:
    # building a 1M-document index peaked at 2.1 GB (0.65 GB at 100k); 270 MB for 400 MB of vectors without
    # it (pyarrow 25.0.1, measured 2026-12-04)
    f = pq.ParquetFile(path, pre_buffer=False)
    for b in f.iter_batches(batch_size=8192, columns=["id", "indices", "values"] if sparse else ["id", "embedding"]):
        if sparse:  # CSR rows: (starts, terms, weights)
            terms, weights = b.column("indices"), b.column("values")
            yield [str(v) for v in b.column("id").to_pylist()], (terms.offsets.to_numpy(), terms.flatten().to_numpy(),
                                                                  weights.flatten().to_numpy())
            continue
        vec = b.column("embedding")
        dims = len(vec[0]) if len(vec) else 0
        x = np.asarray(vec.flatten().to_numpy(zero_copy_only=False), dtype=np.float32).reshape(len(vec), dims)
        yield [str(v) for v in b.column("id").to_pylist()], x


def _write_shard(args: BuildArgs, out: Path, old: Index | None, embedded: Path, pipe: Any, checksum: str) -> dict[str, Any]:
    """The embedded documents as a shard (ids, vectors as quantized), the ANN index with them, then
    the manifest: a kill before the manifest's rename leaves the index as it was."""
    import pyarrow as pa

    name = f"shard-{len(old.shards) if old else 0:06d}"
    shard = out / ".pending" / name
    shutil.rmtree(shard, ignore_errors=True)
    shard.mkdir()
    ranges = old.ranges if old is not None else None
    seen = _id_hashes(old)
    n = dims = 0
    writer = None
    sparse = is_sparse(pipe)
    block = old.manifest.get("block") if old is not None else postings.BLOCK if sparse else None
    if sparse:
        dims = int(pipe.meta["model"]["vocab_size"])
    with contextlib.ExitStack() as stack:
        vf, rf = (stack.enter_context(open(shard / name, "wb")) for name in ("vectors.bin", "rescore.bin"))
        terms = stack.enter_context(postings.Writer(shard, dims, int(block or 0))) if sparse else None
        for ids, x in _embedded_batches(embedded, sparse=sparse):
            table = pa.table({"id": pa.array(ids, pa.string())})
            if writer is None:
                writer = pa.ipc.new_file(str(shard / "ids.arrow"), table.schema)
            writer.write_table(table)
            seen.append(_hashes(ids))
            n += len(ids)
            if terms is not None:
                terms.add(*x)
                continue
            x = normalized(x)
            if dims == 0:
                dims = x.shape[1]
                if old is not None and dims != old.dims:
                    raise ConfigError(f"the bundle gives {dims} dimensions; {out} holds {old.dims}")
                if ranges is None and args.quantization in ("int8", "binary"):
                    ranges = calibrate(x)
            v, r = stored(x, args.quantization, ranges, args.rescore_copy)
            vf.write(np.ascontiguousarray(v).tobytes())
            if r is not None:
                rf.write(np.ascontiguousarray(r).tobytes())
        if terms is not None:
            terms.finish()
    if writer is not None:
        writer.close()
    if n == 0:
        raise DataFormatError(args.corpus, "no documents", hint="one document per line or record")
    if args.rescore_copy is None:
        (shard / "rescore.bin").unlink()
    if sparse:
        (shard / "vectors.bin").unlink()
    _check_unique(seen, old, shard, args.corpus)
    total = (old.count if old else 0) + n
    manifest = {
        "format": FORMAT, "kind": "sparse" if sparse else "dense", **({"block": block} if sparse else {}),
        "bundle": {"path": str(Path(args.bundle).resolve()), "sha256": checksum},
        "prompts": {k: (pipe.meta.get("options") or {}).get(k, "") for k in ("query_prompt", "document_prompt")},
        "dims": dims, "count": total, "quantization": args.quantization,
        "ranges": ranges.tolist() if ranges is not None else None, "rescore_copy": args.rescore_copy,
        "ann": args.ann, "ann_settings": old.manifest.get("ann_settings", {}) if old else _ann_settings(args, total),
        "shards": [*(old.manifest["shards"] if old else []), {"name": name, "count": n}],
    }
    shutil.rmtree(out / name, ignore_errors=True)  # a killed build's shard that no manifest names
    os.replace(shard, out / name)  # named by no manifest yet: harmless if what follows is killed
    if args.ann != "flat":
        _build_ann(out, manifest)
    write_json(out / MANIFEST, manifest)
    return manifest


def _hashes(ids: Sequence[str]) -> np.ndarray:
    return np.asarray([int.from_bytes(hashlib.blake2b(i.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")
                       for i in ids], dtype=np.uint64)


def _id_hashes(old: Index | None) -> list[np.ndarray]:
    if old is None:
        return []
    return [_hashes(ids.to_pylist()) for _, ids, _ in old.shards]


def _check_unique(seen: list[np.ndarray], old: Index | None, shard: Path, corpus: Path) -> None:
    """Every id once, over the index and the new shard (8-byte hashes held, not the ids; an equal
    hash is looked up by id, so a collision is never an error)."""
    h = np.sort(np.concatenate(seen)) if seen else np.zeros(0, np.uint64)
    dup = h[1:][h[1:] == h[:-1]]
    if not len(dup):
        return
    import pyarrow as pa

    new = pa.ipc.open_file(pa.memory_map(str(shard / "ids.arrow"))).read_all().column(0).to_pylist()
    before = [i for _, ids, _ in (old.shards if old else []) for i in ids.to_pylist()]
    seen_ids: set[str] = set()
    for k, i in enumerate([*before, *new]):
        if i in seen_ids:
            where = f"document {k - len(before) + 1} of the corpus" if k >= len(before) else "the index"
            raise DataFormatError(corpus, f"the id {i!r} comes twice ({where}; {'once in the index already' if i in set(before) else 'earlier in the corpus'})",
                                  field="_id", hint="give every document its own id; nothing was added to the index")
        seen_ids.add(i)


def _ann_settings(args: BuildArgs, count: int) -> dict[str, Any]:
    if args.ann == "hnsw":
        return {"m": args.hnsw_m, "ef_construction": 80, "ef_search": 128}
    if args.ann == "ivf":
        return {"lists": args.ivf_lists or max(1, min(65536, int(4 * np.sqrt(count)))), "nprobe": 16}
    return {}


def _build_ann(out: Path, manifest: dict[str, Any]) -> None:
    """ann.faiss over every shard's vectors, written atomically (an append rebuilds it: its IVF lists
    are trained again on the whole corpus)."""
    faiss = _faiss()
    ix = Index(out, manifest)
    ix.shards = [ix._shard(out / s["name"], s["count"], "rebuild the index") for s in manifest["shards"]]
    q, d, s = ix.quantization, ix.dims, manifest["ann_settings"]
    if q == "binary":
        spec = f"BHNSW{s['m']}" if manifest["ann"] == "hnsw" else f"BIVF{s['lists']}"
        index = faiss.index_binary_factory(d, spec)
    else:
        code = {"float32": "Flat", "float16": "SQfp16", "int8": "SQ8"}[q]
        spec = f"HNSW{s['m']}" + ("" if code == "Flat" else f"_{code}") if manifest["ann"] == "hnsw" else f"IVF{s['lists']},{code}"
        index = faiss.index_factory(d, spec, faiss.METRIC_INNER_PRODUCT)
    if manifest["ann"] == "hnsw":
        faiss.ParameterSpace().set_index_parameter(index, "efConstruction", int(s["ef_construction"]))

    def raw() -> Iterator[np.ndarray]:
        for vectors, _, _ in ix.shards:
            for a in range(0, len(vectors), CHUNK):
                chunk = np.asarray(vectors[a:a + CHUNK])
                yield chunk if q == "binary" else np.ascontiguousarray(ix.floats(chunk))

    if not index.is_trained:
        rng = np.random.default_rng(0)
        sample = np.concatenate(list(raw()))  # training sample: at most 256 a list (faiss's own advice)
        sample = sample[rng.permutation(len(sample))[: 256 * int(s.get("lists", 1))]]
        index.train(sample)
    for chunk in raw():
        index.add(chunk)
    writer = faiss.write_index_binary if q == "binary" else faiss.write_index
    atomic_write(out / "ann.faiss", lambda tmp: writer(index, tmp))


# ---- what a search needs besides the vectors -------------------------------------------------------
def check_bundle(ix: Index, bundle: Path) -> None:
    """A bundle given to search an index must be the one it was built with."""
    if bundle_checksum(bundle) != ix.manifest["bundle"].get("sha256"):
        raise ConfigError(f"{ix.path} was built with the bundle {ix.manifest['bundle'].get('path')}, not {bundle} "
                          "(another graph or description): its queries would be embedded into another space",
                          "search with the index's own bundle (the default), or build the index with this one")


def query_bundle(ix: Index, bundle: Path | None) -> Path:
    b = Path(bundle) if bundle is not None else Path(ix.manifest["bundle"]["path"])
    if not (b / "model.onnx").is_file():
        raise ConfigError(f"the index's bundle {b} is not there", "pass --bundle with the bundle it was built with")
    check_bundle(ix, b)
    return b


def served_indexes(indexes: dict[str, Path], bundles: dict[str, Path]) -> dict[str, tuple[str, Index]]:
    """`mlmkit serve --index`: each index opened and paired with the served bundle that built it (by
    checksum), {index name: (model name, Index)}; one that no served bundle built is refused."""
    if not indexes:
        return {}  # no checksums to read: a served bundle's graph can be hundreds of MB
    sums = {name: bundle_checksum(path) for name, path in bundles.items() if (path / "model.onnx").is_file()}
    out: dict[str, tuple[str, Index]] = {}
    for name, path in indexes.items():
        ix = Index.open(path)
        model = next((m for m, c in sums.items() if c == ix.manifest["bundle"].get("sha256")), None)
        if model is None:
            raise ConfigError(f"--index {path} was built with the bundle {ix.manifest['bundle'].get('path')}, which is not served "
                              "(no served bundle has its graph and description)", "serve that bundle beside the index")
        out[name] = (model, ix)
    return out


def as_queries(ix: Index, results: Sequence[dict[str, Any]]) -> Any:
    """The index's bundle's results for query texts as search_vectors takes them: (Q, dims) float32
    vectors, or a sparse index's (Q, vocabulary) CSR matrix."""
    if ix.kind == "sparse":
        return postings.queries(results, ix.dims)
    return np.asarray([r["embedding"] for r in results], dtype=np.float32)


def query_vectors(ix: Index, texts: Sequence[str], bundle: Path | None = None, *, device: str = "cpu",
                  precision: str | None = None) -> Any:
    """``texts`` embedded as queries with the index's bundle (its query prompt), as_queries."""
    from mlmkit.infer.pipeline import Pipeline

    pipe = Pipeline.load(query_bundle(ix, bundle), device=device, command="embed", precision=precision)
    return as_queries(ix, pipe(list(texts), **as_input(pipe, "query")))


def evaluate_index(path: Path, data: Path, *, k: int = 100, rescore: int | None = None, device: str = "cpu",
                   batch: int = 1024) -> dict[str, float]:
    """The retrieval metrics (infer/retrieval.py's METRICS) of a BEIR split's queries searched in the
    index: the stored vectors, never the corpus embedded again. Judged documents the index does not
    hold count as not retrieved."""
    from mlmkit.infer.retrieval import mean_metrics
    from mlmkit.text.beir import read_split

    ix = Index.open(path)
    split = read_split(data, training=False)
    qids = list(split.queries)
    runs: dict[str, list[str]] = {}
    for a in range(0, len(qids), batch):
        part = qids[a:a + batch]
        rows, scores = search_vectors(ix, query_vectors(ix, [split.queries[q] for q in part], device=device), min(k, ix.count),
                                      rescore=rescore)
        for qid, found in zip(part, hits(ix, rows, scores)):
            ranked = sorted(found, key=lambda h: h["id"], reverse=True)  # ties by id, descending: trec_eval's order
            runs[qid] = [h["id"] for h in sorted(ranked, key=lambda h: -h["score"])]
    return mean_metrics(runs, split.qrels)


def through_index(bundle: Path, data: Path, options: dict[str, Any]) -> bool:
    """Whether `mlmkit evaluate BUNDLE --data DATA` scores through a temporary index
    (evaluate_bundle_by_index): an embedding bundle, a BEIR directory, and none of the options that only
    the in-memory evaluation reads (--option index, save_run, matryoshka_dims)."""
    from mlmkit.text.beir import is_beir

    if options or not (bundle / "mlmkit.json").is_file() or not is_beir(data):
        return False
    return bool(read_json(bundle / "mlmkit.json").get("task") == "embedding")


def evaluate_bundle_by_index(bundle: Path, data: Path, *, device: str = "cpu") -> dict[str, float]:
    """An embedding bundle's retrieval metrics on a BEIR directory (``DIR[:SPLIT]``) in bounded memory:
    its corpus embedded into a float32 index under $MLMKIT_CACHE (a window at a time, vectors on disk),
    the queries searched there, the index removed. Equal to the bundle's in-memory evaluation (tested)."""
    import tempfile

    from mlmkit.files import cache_root
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

    def __init__(self, path: Path, places: dict[str, int], *, device: str = "cpu", precision: str | None = None) -> None:
        self.ix, self.places, self.device, self.precision = Index.open(path), places, device, precision
        self.outside = sum(1 for a in range(0, self.ix.count, CHUNK)
                           for i in self.ix.ids(np.arange(a, min(a + CHUNK, self.ix.count))) if i not in places)
        if self.outside == self.ix.count:
            raise ConfigError(f"{path} holds none of the data's documents (no id in common)",
                              "build the index from the corpus of the BEIR directory being mined")
        self._rows: dict[int, int] | None = None  # a corpus place -> the index's row, built when asked

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        rows, scores = search_vectors(self.ix, query_vectors(self.ix, queries, device=self.device, precision=self.precision),
                                      min(self.ix.count, k + self.outside))
        places = np.full((len(rows), k), -1, dtype=np.int64)
        kept = np.full((len(rows), k), -np.inf, dtype=np.float32)
        for j, (row, srow) in enumerate(zip(rows, scores)):
            at = np.asarray([self.places.get(i, -1) for i in self.ix.ids(np.where(row >= 0, row, 0))], dtype=np.int64)
            ok = (row >= 0) & (at >= 0)
            n = min(k, int(ok.sum()))
            places[j, :n], kept[j, :n] = at[ok][:n], srow[ok][:n]
        return places, kept

    def pair_scores(self, queries: Sequence[str], docs: Sequence[int]) -> np.ndarray:
        """The cosine of each query with a document of the corpus (by its place), from the index."""
        if self._rows is None:
            self._rows = {}
            for a in range(0, self.ix.count, CHUNK):
                for r, i in enumerate(self.ix.ids(np.arange(a, min(a + CHUNK, self.ix.count))), a):
                    if (p := self.places.get(i)) is not None:
                        self._rows[p] = r
        lost = [d for d in docs if d not in self._rows]
        if lost:
            raise ConfigError(f"{self.ix.path} does not hold a positive of the data ({len(lost)} of this batch)",
                              "build the index from the whole corpus being mined")
        q = query_vectors(self.ix, queries, device=self.device, precision=self.precision)
        q = q.toarray() if self.ix.kind == "sparse" else normalized(q)  # dot products (sparse), cosines
        return np.einsum("qh,qh->q", q, self.ix.rows(np.asarray([self._rows[d] for d in docs], dtype=np.int64), rescore=True))


def export_parquet(ix: Index, path: Path) -> int:
    """ids and float32 vectors (dequantized) as a Parquet table: ``id`` string, ``vector``
    fixed_size_list<float32>[dims], what LanceDB, DuckDB and Qdrant's importers read; a sparse index's
    as ``indices`` list<int32> and ``values`` list<float32> (Qdrant's sparse vectors). Written a chunk
    at a time, whole or not at all."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = (_embedded_schema(sparse=True) if ix.kind == "sparse"
              else pa.schema([("id", pa.string()), ("vector", pa.list_(pa.float32(), ix.dims))]))

    def write(tmp: str) -> None:
        with pq.ParquetWriter(tmp, schema) as w:
            start = 0
            for p in ix.sparse:
                for a in range(0, p.count, CHUNK):
                    e = min(p.count, a + CHUNK)
                    terms, values = p.vectors(a, e)
                    w.write_table(pa.table({"id": ix.ids(np.arange(start + a, start + e)), "indices": terms, "values": values},
                                           schema=schema))
                start += p.count
            for start, x in ix.chunks("rescore") if ix.kind == "dense" else ():
                ids = ix.ids(np.arange(start, start + len(x)))
                w.write_table(pa.table({"id": pa.array(ids, pa.string()),
                                        "vector": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), ix.dims)}, schema=schema))

    atomic_write(path, write)
    return ix.count


def hits(ix: Index, rows: np.ndarray, scores: np.ndarray) -> list[list[dict[str, Any]]]:
    """Each query's hits, {"id", "score"}, best first (rows past a faiss graph's reach left out)."""
    return [[{"id": i, "score": float(s)} for i, s in zip(ix.ids(row[row >= 0]), srow[row >= 0])]
            for row, srow in zip(rows, scores)]

