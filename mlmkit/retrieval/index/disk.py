"""The files of an index directory beside its manifest, each read and checked against it: ids, the
deleted rows' bitmap, a chunked shard's spans, what the index takes on disk. No torch.

What the directory holds: store.py's docstring.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import mlmkit.retrieval.index.multivector as multivector
from mlmkit.errors import ConfigError
from mlmkit.retrieval.index.manifest import MANIFEST, Deleted, Manifest

CHUNKS = "chunks.arrow"
"""A chunked index's shard's chunk numbers and spans (building.write_spans)."""


def footprint(path: Path, manifest: Manifest) -> dict[str, int | float]:
    """What an index takes on disk: its bytes (the files its manifest names), a document's on average,
    and for a multi-vector index a token vector's (its codes and residuals alone) and the whole
    index's a token."""
    files = [f for s in manifest.shards for f in (path / s.name).iterdir()]
    deleted = manifest.deleted.file if manifest.deleted is not None else None
    files += [path / n for n in (manifest.ann_path, multivector.CODEC, MANIFEST, deleted)
              if n and (path / n).is_file()]
    total = sum(f.stat().st_size for f in files)
    out: dict[str, int | float] = {"bytes": total,
                                   "bytes_per_document": round(total / max(1, manifest.count), 1)}
    if manifest.kind == "multivector":
        tokens = max(1, manifest.tokens or 0)
        coded = sum(f.stat().st_size for f in files if f.name in ("codes.bin", "residuals.bin"))
        out.update(tokens=manifest.tokens or 0, bytes_per_token_vector=round(coded / tokens, 1),
                   bytes_per_token=round(total / tokens, 1))
    return out


def read_deleted(d: Path, deleted: Deleted, count: int, hint: str) -> np.ndarray:
    """The manifest's ``deleted`` (a bitmap of the first ``rows`` rows, the rows after them live) as a
    (count,) bool array, checked against the file and the count."""
    f = d / deleted.file
    raw = np.fromfile(f, dtype=np.uint8) if f.is_file() else None
    want = -(-deleted.rows // 8)
    if raw is None or len(raw) != want:
        what = "is missing" if raw is None else f"holds {len(raw):,} bytes"
        raise ConfigError(f"{f} {what}; the manifest says a bitmap of {deleted.rows:,} rows ({want:,} "
                          "bytes): a truncated or replaced file", hint)
    out = np.zeros(count, dtype=np.bool_)
    out[:deleted.rows] = np.unpackbits(raw, count=deleted.rows, bitorder="little").astype(np.bool_)
    if int(out.sum()) != deleted.count:
        raise ConfigError(f"{f} marks {int(out.sum()):,} rows deleted; the manifest says {deleted.count:,}",
                          hint)
    return out


def read_chunks(shard: Path, n: int) -> Any:
    """A chunked shard's chunks.arrow (memory-mapped): chunk, start, end a row."""
    import pyarrow as pa

    f = shard / CHUNKS
    try:
        table = pa.ipc.open_file(pa.memory_map(str(f))).read_all()
    except (OSError, pa.ArrowInvalid) as e:
        raise ConfigError(f"{f}: not a readable chunks file ({str(e).splitlines()[0]})",
                          "rebuild the index") from None
    if table.num_rows != n or table.column_names != ["chunk", "start", "end"]:
        raise ConfigError(f"{f} holds {table.num_rows:,} chunks; the manifest says {n:,}",
                          "rebuild the index")
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
    def one(i: str) -> int:
        digest = hashlib.blake2b(i.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        return int.from_bytes(digest, "little")

    return np.asarray([one(i) for i in ids], dtype=np.uint64)
