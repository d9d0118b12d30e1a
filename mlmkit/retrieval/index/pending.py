"""A shard being written: the ``.pending/`` directory of an index, where a build or an append puts its
documents a window at a time, resumable after a kill. No torch.

    .pending/
      progress.json     written last after each window, atomically: what the build is (the bundle's and
                        the corpus files' path, size and time, the settings: a resume must find them
                        unchanged), the windows and records done, the rows and bytes written, the dims,
                        the int8 ranges, and ``complete`` once every document is in and checked
      ids.jsonl         the documents' ids, a JSON string a line, appended
      shard-NNNNNN/     the shard itself: vectors.bin and rescore.bin appended a window at a time, as
                        quantized (a dense bundle); ids.arrow (and a sparse shard's postings) written
                        when every document is in; renamed into the index, then the manifest written
      lengths.bin       a sparse bundle's documents (their term counts, then terms.bin and weights.bin:
                        their terms and weights), appended
      codec.npz         a new multi-vector index's centroids and residual buckets (multivector.py),
                        trained on its first SAMPLE_TOKENS token vectors; a colbert bundle's shard
                        appends lengths.bin, codes.bin and residuals.bin a window at a time, and
                        gets its centroids' postings when every document is in
      documents/        --engine ray: the documents, read and checked here, for the cluster

Vectors are written once: a window's vectors go from the model into the shard's vectors.bin (and
rescore.bin), quantized, and the shard is renamed into the index, never copied. A kill leaves
progress.json naming the windows whose bytes are all there; a resume cuts each file back to what it
names and goes on after them. One thing waits in memory instead of on disk: the first CALIBRATION_ROWS
documents of a new int8 or binary index, until their percentiles give the ranges every row is
quantized with, and the first SAMPLE_TOKENS token vectors of a new multi-vector index, until the
centroids are trained on them (a kill before then resumes from the first document).

Two things are written once more before the shard's own files, because those cannot be appended to
and cut back: the ids (ids.jsonl, then the shard's ids.arrow, an Arrow file whose footer comes last),
and a sparse bundle's terms (lengths.bin, terms.bin, weights.bin as they come, then the shard's files,
retrieval/postings.py, when all are in): the postings of a block of documents are sorted in memory and
written whole (postings.Writer), so a resume could not continue a block half written, and the terms
on disk are what the postings are written from again.

What is kept is safe against a killed process (every file is flushed before progress.json is
replaced), not against a machine losing power: nothing is fsync'ed, as the batch jobs' part files
are not (jobs/jobdir.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

import mlmkit.retrieval.index.multivector as multivector
from mlmkit.errors import ConfigError, DataFormatError
from mlmkit.files import JSONObject, read_json, write_json
from mlmkit.retrieval import postings
from mlmkit.retrieval.exact import normalized
from mlmkit.retrieval.index.codecs import CALIBRATION_ROWS, calibrate, row_bytes, stored
from mlmkit.retrieval.index.disk import id_hashes
from mlmkit.retrieval.index.store import CHUNK
from mlmkit.typed import COUNT, from_json, to_json

PROGRESS = "progress.json"
SPARSE = ("lengths.bin", "terms.bin", "weights.bin")


@dataclass
class BuildProgress:
    """progress.json, typed (read by mlmkit.typed): what the build is for (compared on --resume), the
    windows and records done, the rows, ids bytes, sparse terms and token vectors written, the dims,
    the int8 ranges, the postings' block, whether a codec was trained, and ``complete``."""

    what: JSONObject
    windows: int = field(default=0, metadata=COUNT)
    records: int = field(default=0, metadata=COUNT)
    rows: int = field(default=0, metadata=COUNT)
    ids_bytes: int = field(default=0, metadata=COUNT)
    nnz: int = field(default=0, metadata=COUNT)
    tokens: int = field(default=0, metadata=COUNT)  # 0 in a build of an mlmkit before multi-vector indexes
    dims: int = field(default=0, metadata=COUNT)
    ranges: list[list[float]] | None = None  # (2, dims): int8's low and high ends
    block: int | None = None
    codec: bool = False
    complete: bool = False

    @classmethod
    def read(cls, dir: Path) -> BuildProgress:
        return from_json(cls, read_json(dir / PROGRESS), dir / PROGRESS, fix=f"delete {dir} to start over")


class Pending:
    """The shard ``name`` being written under ``dir`` (an index's .pending/): see the module's docstring.
    ``what``: what a resume must find unchanged; ``quantization``, ``copy``: how vectors are stored;
    ``ranges``: an append's int8 ranges (the index's), None to calibrate; ``dims``: an append's or a
    sparse bundle's (the vocabulary), 0 to take the first window's; ``kind``: the index's (store.KINDS);
    ``block``: a sparse or multi-vector index's; ``codec``: a multi-vector append's (the index's), None
    to train one with ``bits`` and ``centroids`` (None: from the sample's size)."""

    def __init__(self, dir: Path, name: str, what: JSONObject, *, quantization: str, copy: str | None,
                 ranges: np.ndarray | None, dims: int, kind: str, block: int | None, resume: bool,
                 codec: multivector.Codec | None = None, bits: int = 2, centroids: int | None = None) -> None:
        self.dir, self.name, self.shard = dir, name, dir / name
        self.what = json.loads(json.dumps(what, default=str))
        self.quantization, self.copy, self.kind = quantization, copy, kind
        self.sparse, self.multi = kind == "sparse", kind == "multivector"
        self.codec, self.bits, self.centroids, self.trains = (codec, bits, centroids,
                                                              self.multi and codec is None)
        self.start = BuildProgress(what=self.what, dims=dims, block=block,
                                   ranges=ranges.tolist() if ranges is not None else None)
        self.state = dataclasses.replace(self.start)
        # windows waiting for the calibration or the centroids
        self.buffer: list[tuple[int, int, list[str], Any]] = []
        self.files: dict[str, BinaryIO] = {}
        p = dir / PROGRESS
        if resume and p.is_file():
            self._resume(BuildProgress.read(dir))
        else:
            self.restart()

    @staticmethod
    def committed(dir: Path, shards: int) -> bool:
        """Whether the build in ``dir`` finished, its manifest written (naming ``shards`` shards, its own
        the last), and only the removal of ``dir`` was stopped: nothing is left to do but that."""
        try:
            saved = BuildProgress.read(dir)
        except (OSError, ValueError, ConfigError):
            return False
        return saved.complete and saved.what.get("shards") == shards - 1

    # ---- where it stands --------------------------------------------------------------------------
    @property
    def windows(self) -> int:
        """Windows of the corpus whose documents are all on disk: a resume reads past them."""
        return self.state.windows

    @property
    def rows(self) -> int:
        return self.state.rows

    @property
    def dims(self) -> int:
        return self.state.dims

    @property
    def ranges(self) -> np.ndarray | None:
        r = self.state.ranges
        return np.asarray(r, dtype=np.float32) if r is not None else None

    @property
    def block(self) -> int | None:
        return self.state.block

    @property
    def complete(self) -> bool:
        """Every document in, ids.arrow (and the postings) written, the ids checked: what is left is the
        rename into the index, the ANN index and the manifest."""
        return self.state.complete

    def _paths(self) -> dict[str, tuple[Path, int]]:
        """Each appended file and the bytes progress.json says it holds."""
        n, d = self.rows, self.dims
        out = {"ids.jsonl": (self.dir / "ids.jsonl", self.state.ids_bytes)}
        if self.sparse:
            nnz = self.state.nnz
            return {**out, "lengths.bin": (self.dir / "lengths.bin", 8 * n),
                    "terms.bin": (self.dir / "terms.bin", 4 * nnz),
                    "weights.bin": (self.dir / "weights.bin", 4 * nnz)}
        if self.multi:
            t, width = self.state.tokens, self.codec.residual_bytes() if self.codec else 0
            return {**out, "lengths.bin": (self.shard / "lengths.bin", 4 * n),
                    "codes.bin": (self.shard / "codes.bin", 2 * t),
                    "residuals.bin": (self.shard / "residuals.bin", t * width)}
        out["vectors.bin"] = (self.shard / "vectors.bin", n * row_bytes(self.quantization, d))
        if self.copy:
            out["rescore.bin"] = (self.shard / "rescore.bin", n * row_bytes(self.copy, d))
        return out

    def restart(self) -> None:
        """Start the shard over: nothing of a build before is kept (Ray's builds, which do not resume)."""
        self.close()
        for f in ("ids.jsonl", *SPARSE, multivector.CODEC, PROGRESS):
            (self.dir / f).unlink(missing_ok=True)
        shutil.rmtree(self.shard, ignore_errors=True)
        self.shard.mkdir(parents=True)
        self.state, self.buffer = dataclasses.replace(self.start), []
        self._open()

    def _resume(self, saved: BuildProgress) -> None:
        hint = f"delete {self.dir} to start over"
        changed = [k for k in sorted({*saved.what, *self.what}) if saved.what.get(k) != self.what.get(k)]
        if changed:
            raise ConfigError(f"--resume: the unfinished build in {self.dir} was for other "
                              f"{', '.join(changed)}",
                              f"resume with the same bundle, corpus and settings, or {hint}")
        self.state = saved
        if self.trains and saved.codec:
            self.codec = multivector.Codec.load(self.dir / multivector.CODEC, self.dims, hint)
        if self.complete:
            if not self.shard.is_dir() and not (self.dir.parent / self.name).is_dir():
                raise ConfigError(f"{self.dir}: a finished build whose shard {self.name} is gone", hint)
            return
        for path, size in self._paths().values():
            have = path.stat().st_size if path.is_file() else -1
            if have < size:
                raise ConfigError(f"{path} holds {max(have, 0):,} bytes; {self.dir / PROGRESS} says {size:,}",
                                  hint)
            os.truncate(path, size)  # what a killed window had begun to append
        self._open()

    def _open(self) -> None:
        for key, (path, _) in self._paths().items():
            self.files[key] = open(path, "ab")

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files = {}

    def __enter__(self) -> Pending:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- writing ----------------------------------------------------------------------------------
    def add(self, window: int, records: int, ids: list[str], x: Any) -> None:
        """Window ``window`` (``records`` records read) embedded: its ids, and its vectors ((n, dims)
        float32) or a sparse bundle's (lengths, terms, weights). On disk, and counted in progress.json,
        when this returns, except the windows a new int8 or binary index holds for its calibration."""
        if window != self.windows + len(self.buffer):
            raise AssertionError(f"window {window} after {self.windows + len(self.buffer)}")
        _check_finite(window, ids, x, sparse=self.sparse, multi=self.multi)
        if self.sparse:
            return self._write([(window, records, ids, x)])
        # a list of (tokens, dims) arrays, one a document (none for a document of skiplist tokens alone)
        if self.multi:
            arrays = [np.asarray(v, dtype=np.float32) for v in x]
            d = next((a.shape[-1] for a in arrays if a.size), self.dims)
            flat = np.concatenate([a.reshape(-1, d) for a in arrays]) if d else np.zeros((0, 0), np.float32)
            x = (np.asarray([len(a) for a in arrays], dtype=np.int32), normalized(flat))
        width = (x[1] if self.multi else x).shape[1]
        if self.dims == 0:
            self.state.dims = width
        elif width != self.dims:
            raise ConfigError(f"the bundle gives {width} dimensions; {self.dir.parent} holds {self.dims}")
        if not self.multi:
            x = normalized(np.asarray(x, dtype=np.float32))
        self.buffer.append((window, records, ids, x))
        if self.multi and self.codec is None:
            if sum(len(b[3][1]) for b in self.buffer) < multivector.SAMPLE_TOKENS:
                return
            self._calibrate()
        elif self.state.ranges is None and self.quantization in ("int8", "binary"):
            if sum(len(b[2]) for b in self.buffer) < CALIBRATION_ROWS:
                return
            self._calibrate()
        self._write(self.buffer)

    def _calibrate(self) -> None:
        """The int8 ranges from the first CALIBRATION_ROWS documents (all, if there are fewer); a new
        multi-vector index's codec from its first SAMPLE_TOKENS token vectors, saved in codec.npz."""
        if self.buffer and self.multi and self.codec is None:
            sample = np.concatenate([b[3][1] for b in self.buffer
                                     if b[3][1].size])[:multivector.SAMPLE_TOKENS]
            self.codec = multivector.Codec.train(sample, self.bits, self.centroids)
            self.codec.save(self.dir / multivector.CODEC)
            self.state.codec = True
        if self.buffer and self.state.ranges is None and self.quantization in ("int8", "binary"):
            sample = np.concatenate([b[3] for b in self.buffer])[:CALIBRATION_ROWS]
            self.state.ranges = calibrate(sample).tolist()

    def _write(self, ws: list[tuple[int, int, list[str], Any]]) -> None:
        for window, records, ids, x in ws:
            line = "".join(json.dumps(i) + "\n" for i in ids).encode("ascii")
            self.files["ids.jsonl"].write(line)
            if self.sparse:
                lengths, terms, weights = x
                self.files["lengths.bin"].write(np.asarray(lengths, dtype=np.int64).tobytes())
                self.files["terms.bin"].write(np.asarray(terms, dtype=np.int32).tobytes())
                self.files["weights.bin"].write(np.asarray(weights, dtype=np.float32).tobytes())
                self.state.nnz += len(terms)
            elif self.multi:
                assert self.codec is not None
                lengths, v = x
                codes, residuals = self.codec.encode(v)
                self.files["lengths.bin"].write(lengths.tobytes())
                self.files["codes.bin"].write(codes.tobytes())
                self.files["residuals.bin"].write(np.ascontiguousarray(residuals).tobytes())
                self.state.tokens += len(v)
            else:
                v, r = stored(x, self.quantization, self.ranges, self.copy)
                self.files["vectors.bin"].write(np.ascontiguousarray(v).tobytes())
                if r is not None:
                    self.files["rescore.bin"].write(np.ascontiguousarray(r).tobytes())
            self.state.windows, self.state.rows = window + 1, self.rows + len(ids)
            self.state.ids_bytes += len(line)
            self.state.records += records
        self.buffer = []
        for f in self.files.values():
            f.flush()
        write_json(self.dir / PROGRESS, to_json(self.state))

    def finish(self, corpus: Path) -> list[np.ndarray]:
        """Every document in: the windows still held written, ids.arrow (and a sparse shard's postings)
        written into the shard. Returns the ids' hashes (store.id_hashes), a chunk at a time."""
        import pyarrow as pa

        if self.multi and self.codec is None and self.buffer and not any(b[3][1].size for b in self.buffer):
            raise DataFormatError(corpus,
                                  "no document has a token vector (each was the skiplist's tokens alone)",
                                  hint="give documents with words")
        self._calibrate()
        if self.buffer:
            self._write(self.buffer)
        self.close()
        if self.rows == 0:
            raise DataFormatError(corpus, "no documents", hint="one document per line or record")
        hashes = []
        schema = pa.schema([("id", pa.string())])
        with open(self.dir / "ids.jsonl",
                  encoding="ascii") as f, pa.ipc.new_file(str(self.shard / "ids.arrow"), schema) as w:
            while chunk := [json.loads(line) for _, line in zip(range(CHUNK), f)]:
                w.write_table(pa.table({"id": pa.array(chunk, pa.string())}))
                hashes.append(id_hashes(chunk))
        if self.sparse:
            self._postings()
        if self.multi:
            self._centroid_postings()
        return hashes

    def _postings(self) -> None:
        """A sparse shard's postings from the terms on disk, CHUNK documents at a time."""
        lengths = np.fromfile(self.dir / "lengths.bin", dtype=np.int64)
        nnz = self.state.nnz
        terms = np.memmap(self.dir / "terms.bin", dtype=np.int32, mode="r",
                          shape=(nnz,)) if nnz else np.zeros(0, np.int32)
        weights = np.memmap(self.dir / "weights.bin", dtype=np.float32, mode="r",
                            shape=(nnz,)) if nnz else np.zeros(0, np.float32)
        with postings.Writer(self.shard, self.dims, int(self.block or postings.BLOCK)) as out:
            at = 0
            for a in range(0, len(lengths), CHUNK):
                starts = np.concatenate([[0], np.cumsum(lengths[a:a + CHUNK])])
                e = at + int(starts[-1])
                out.add(starts, np.asarray(terms[at:e]), np.asarray(weights[at:e]))
                at = e
            out.finish()

    def _centroid_postings(self) -> None:
        """A multi-vector shard's postings (the documents holding each centroid) from its codes on
        disk, CHUNK documents at a time."""
        assert self.codec is not None
        lengths = np.fromfile(self.shard / "lengths.bin", dtype=np.int32).astype(np.int64)
        t = self.state.tokens
        codes = np.memmap(self.shard / "codes.bin", dtype=np.uint16, mode="r",
                          shape=(t,)) if t else np.zeros(0, np.uint16)
        k = len(self.codec.centroids)
        with postings.Writer(self.shard, k, int(self.block or postings.BLOCK), forward=False) as out:
            at = 0
            for a in range(0, len(lengths), CHUNK):
                e = at + int(lengths[a:a + CHUNK].sum())
                out.add(*multivector.document_postings(lengths[a:a + CHUNK], np.asarray(codes[at:e]), k))
                at = e
            out.finish()

    def mark_complete(self) -> None:
        """Every document in and checked: a resume goes straight to the rename and the manifest."""
        self.state.complete = True
        write_json(self.dir / PROGRESS, to_json(self.state))


def _check_finite(window: int, ids: list[str], x: Any, *, sparse: bool, multi: bool) -> None:
    """A window's vectors (dense rows, a sparse bundle's (lengths, terms, weights), or a token vector
    array a document) refused when one holds NaN or an infinite value, naming the document: no index
    is written with vectors no search can rank."""
    if sparse:
        lengths, _, weights = x
        bad = ~np.isfinite(np.asarray(weights, dtype=np.float32))
        doc = int(np.searchsorted(np.cumsum(lengths), int(np.argmax(bad)), side="right")) if bad.any() else -1
    elif multi:
        doc = next((j for j, v in enumerate(x) if not np.isfinite(np.asarray(v, dtype=np.float32)).all()), -1)
    else:
        rows_bad = ~np.isfinite(np.asarray(x, dtype=np.float32)).all(axis=1)
        doc = int(np.argmax(rows_bad)) if rows_bad.any() else -1
    if doc >= 0:
        raise ConfigError(f"document {ids[doc]!r} (window {window + 1}): the bundle gave it a vector that is "
                          "not finite "
                          "(NaN or infinite), which no search could rank; nothing of this window was written",
                          "check the bundle's parity (mlmkit export RUN again), or leave that document out")
