"""A live index: documents deleted by id (`mlmkit index INDEX --delete IDS`), replaced or added
(`--upsert CORPUS`), and the space of deleted ones reclaimed (`--compact`). No torch.

A shard never changes. A delete writes a bitmap of the deleted rows (``deleted-NNNNNN.bin``: a bit a
row, in row order; the rows after it are live) under a new name, then the manifest that names it; a
search scores deleted rows -inf in every stage (search.py), so they are never returned and never
push a live row out of the top k. An upsert is an append (building.py) whose manifest also marks the
old rows of the ids it adds deleted: one manifest, so the old documents and the new never show
together. A compaction writes each shard that holds deleted rows again without them (the stored
vectors, terms or codes copied, nothing embedded; postings inverted again from them), rebuilds the
ANN index under a new name, and writes the manifest that names the new shards and no bitmap.

Each writes its new files under names no manifest uses, then the manifest (atomically, last), then
removes what only the old manifest named: a kill at any point leaves the index as it was or as it
became, never a mix (tested with a kill at each step), and files that no manifest names, which the
next operation removes. A delete or compaction that fails before its manifest (a full disk) removes
what it wrote itself and is one line naming the index (undone_on_failure).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

import mlmkit.retrieval.index.multivector as multivector
from mlmkit.errors import ConfigError, DataFormatError, MlmkitError
from mlmkit.files import atomic_write, write_json
from mlmkit.locks import exclusive
from mlmkit.retrieval import postings
from mlmkit.retrieval.index.ann import build_ann, load_ann
from mlmkit.retrieval.index.disk import CHUNKS, read_chunks
from mlmkit.retrieval.index.filters import META, read_meta
from mlmkit.retrieval.index.manifest import MANIFEST, Deleted, Manifest, ShardEntry, read_manifest, shard_name
from mlmkit.retrieval.index.store import CHUNK, StoredIndex

DELETED = re.compile(r"deleted-(\d{6})\.bin")
OURS = re.compile(r"(shard-\d{6}|deleted-\d{6}\.bin|ann(-\d{6})?\.faiss)")
"""The names of an index's own files and shards: what a sweep may remove when no manifest names it."""


def delete(path: Path, wanted: dict[str, int], source: str | Path) -> Manifest:
    """Mark the documents ``wanted`` deleted (their ids, each with its line in ``source``: read_ids_file's,
    or ids_of's). An id the index does not hold (or holds deleted) is an error naming its line, and
    nothing is deleted. Returns the new manifest."""
    with exclusive(path):
        ix = StoredIndex.open(path)
        rows = live_rows(ix, set(wanted))
        missing = [(line, i) for i, line in wanted.items() if i not in rows]
        if missing:
            line, i = missing[0]
            more = f"; {len(missing) - 1:,} more ids are not either" if len(missing) > 1 else ""
            raise DataFormatError(source, f"the id {i!r} is not in {path}"
                                  f"{' (or was deleted)' if ix.deleted is not None else ''}{more}",
                                  line=line, unit="line" if isinstance(source, Path) else "id",
                                  hint="list ids the index holds; nothing was deleted")
        mask = ix.deleted.copy() if ix.deleted is not None else np.zeros(ix.count, dtype=np.bool_)
        mask[[r for found in rows.values() for r in found]] = True
        with undone_on_failure(path, ix.manifest, "the delete", f"mlmkit index {path} --delete IDS"):
            return commit(path, with_deleted(path, ix.manifest, mask))


def ids_of(ids: Iterable[str]) -> dict[str, int]:
    """Ids given as Python values, each with its place (from 1): what ``delete`` takes. A lone string is
    one id."""
    out: dict[str, int] = {}
    for n, i in enumerate([ids] if isinstance(ids, str) else ids, 1):
        if not isinstance(i, str) or not i:
            raise DataFormatError("the ids given", f"{i!r} is not an id (a non-empty string)", line=n,
                                  unit="id")
        out.setdefault(i, n)
    if not out:
        raise DataFormatError("the ids given", "no ids", hint="give the ids of the documents to delete")
    return out


def read_ids_file(path: Path) -> dict[str, int]:
    """The ids a file lists, each with the line it is on (its first)."""
    from mlmkit.text.records import iter_inputs

    out: dict[str, int] = {}
    for rec in iter_inputs(path):
        if isinstance(rec.data, str):
            value: Any = rec.data.strip()
        else:
            f = rec.fields()
            value = f.get("_id", f.get("id"))
        if value is None or isinstance(value, (dict, list, bool)) or str(value) == "":
            raise rec.error("no document id", "_id", hint="an id a line (.txt), or an _id or id field")
        out.setdefault(str(value), rec.line or 0)
    if not out:
        raise DataFormatError(path, "no ids", hint="an id a line (.txt), or an _id or id field")
    return out


def live_rows(ix: StoredIndex, ids: set[str]) -> dict[str, list[int]]:
    """The live rows of the documents ``ids`` the index holds (a chunked index's: each chunk's), by id
    (the ids read a chunk at a time)."""
    out: dict[str, list[int]] = {}
    for a in range(0, ix.count, CHUNK):
        for r, i in enumerate(ix.ids(np.arange(a, min(a + CHUNK, ix.count))), a):
            if i in ids and (ix.deleted is None or not ix.deleted[r]):
                out.setdefault(i, []).append(r)
    return out


def with_deleted(path: Path, manifest: Manifest, mask: np.ndarray) -> Manifest:
    """``manifest`` with ``mask`` ((rows,) bool) as its deleted rows: the bitmap written under a new
    name (named by no manifest until the caller writes this one); none when no row is deleted."""
    if not mask.any():
        return replace(manifest, deleted=None)
    old = DELETED.fullmatch(manifest.deleted.file) if manifest.deleted is not None else None
    name = f"deleted-{(int(old.group(1)) + 1 if old else 0):06d}.bin"
    bits = np.packbits(mask, bitorder="little")
    atomic_write(path / name, lambda tmp: bits.tofile(tmp))
    return replace(manifest, deleted=Deleted(name, len(mask), int(mask.sum())))


def commit(path: Path, manifest: Manifest) -> Manifest:
    """The manifest written (atomically: the switch from the old index to the new), then the files and
    shards that it does not name removed."""
    write_json(path / MANIFEST, manifest.to_json())
    sweep(path, manifest)
    return manifest


def sweep(path: Path, manifest: Manifest) -> None:
    """Remove the index's files and shards that ``manifest`` does not name (an old bitmap, a compacted
    shard, a killed operation's leftovers); not while a build is unfinished (.pending/: its shard may
    be in the index already, named by the manifest its resume writes)."""
    if (path / ".pending").exists():
        return
    named: set[str | None] = {s.name for s in manifest.shards}
    named |= {manifest.deleted.file if manifest.deleted else None, manifest.ann_path}
    for p in path.iterdir():
        if OURS.fullmatch(p.name) and p.name not in named:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    shutil.rmtree(path / ".compact", ignore_errors=True)


@contextmanager
def undone_on_failure(path: Path, before: Manifest, what: str, again: str) -> Iterator[None]:
    """A change of the index ``path`` whose manifest is ``before``: where it fails before its manifest is
    switched, the files it wrote are removed (sweep: the index as it was, files and all), and a failed
    write (a full disk: numpy's, pyarrow's or faiss's OSError, write_faiss) is one line naming the index
    (ConfigError; ``what``: the change, ``again``: its command). A failure after the switch is left as
    it is (the change is made)."""
    try:
        yield
    except BaseException as e:
        try:
            unchanged = read_manifest(path) == before
        except (MlmkitError, OSError):
            unchanged = False  # no manifest that can be read: nothing is removed
        if unchanged:
            with suppress(OSError):
                sweep(path, before)
        if not unchanged or not isinstance(e, OSError):
            raise
        full = e.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(e)
        said = " ".join((e.strerror or str(e)).split())[:160] + (f": {e.filename}" if e.filename else "")
        raise ConfigError(f"{path}: {what} failed: {'the disk is full' if full else 'a write failed'} "
                          f"({said}); the index is as it was",
                          f"{'free space on its disk' if full else 'fix what failed'}, then run it again: "
                          f"{again}") from None


# ---- compaction ---------------------------------------------------------------------------------------
def compact(path: Path) -> Manifest:
    """Each shard with deleted rows written again without them (a shard left with none is dropped),
    the ANN index rebuilt, the manifest switched to them with no bitmap. Returns the new manifest."""
    with exclusive(path):
        ix = StoredIndex.open(path)
        if (path / ".pending").exists():
            raise ConfigError(f"an unfinished build is in {path / '.pending'}", "finish it first (the same "
                              "`mlmkit index` command with --resume), or delete that directory")
        sweep(path, ix.manifest)  # a killed compaction's shards, named by no manifest
        if ix.deleted is None and (ix.manifest.ann_path is None or _readable_ann(ix)):
            return ix.manifest
        with undone_on_failure(path, ix.manifest, "the compaction", f"mlmkit index {path} --compact"):
            if ix.deleted is None:  # a damaged ANN index, built again from the stored vectors
                return commit(path, _new_ann(path, ix.manifest))
            return _compacted(path, ix)


def _compacted(path: Path, ix: StoredIndex) -> Manifest:
    """``ix`` (with deleted rows) compacted: its new shards written under .compact/, moved in under names
    no manifest uses, the ANN index built again, the manifest that names them written."""
    assert ix.deleted is not None
    work = path / ".compact"
    work.mkdir()
    shards: list[ShardEntry] = []
    start = 0
    name = shard_name(ix.manifest.shards)
    for k, s in enumerate(ix.manifest.shards):
        keep = np.flatnonzero(~ix.deleted[start:start + s.count])
        if len(keep) == s.count:
            shards.append(s)
        elif len(keep):
            (work / name).mkdir()
            _write_shard(ix, k, keep, work / name)
            shards.append(ShardEntry(name, len(keep)))
            name = shard_name(shards, after=int(name.removeprefix("shard-")) + 1)
        start += s.count
    for s in shards:
        if (work / s.name).is_dir():
            os.replace(work / s.name, path / s.name)  # named by no manifest yet: harmless if killed here
    m = replace(ix.manifest, deleted=None, shards=tuple(shards), count=sum(s.count for s in shards))
    if ix.kind == "multivector":
        m = replace(m, tokens=int(sum(np.fromfile(path / s.name / "lengths.bin", dtype=np.int32).sum()
                                      for s in shards)))
    return commit(path, _new_ann(path, m) if m.ann_path is not None else m)


def _new_ann(path: Path, m: Manifest) -> Manifest:
    """``m`` with its ANN index built again over its shards, under the next unused name."""
    old = re.fullmatch(r"ann-(\d{6})\.faiss", m.ann_file or "")
    m = replace(m, ann_file=f"ann-{(int(old.group(1)) + 1 if old else 0):06d}.faiss")
    build_ann(path, m)
    return m


def _readable_ann(ix: StoredIndex) -> bool:
    try:
        load_ann(ix)
    except ConfigError:
        return False
    return True


def _write_shard(ix: StoredIndex, k: int, keep: np.ndarray, out: Path) -> None:
    """Shard ``k``'s rows ``keep`` (local, ascending) written into the new shard directory ``out``."""
    import pyarrow as pa

    vectors, ids, copy = ix.shards[k]
    with pa.ipc.new_file(str(out / "ids.arrow"), pa.schema([("id", pa.string())])) as w:
        for a in range(0, len(keep), CHUNK):
            w.write_table(pa.table({"id": ids.take(pa.array(keep[a:a + CHUNK]))}))
    shard = ix.path / ix.manifest.shards[k].name
    chunks = read_chunks(shard, len(vectors)) if ix.chunked else None
    for name, table in ((META, read_meta(shard, len(vectors))), (CHUNKS, chunks)):
        if table is not None:
            with pa.ipc.new_file(str(out / name), table.schema) as w:
                for a in range(0, len(keep), CHUNK):
                    w.write_table(table.take(pa.array(keep[a:a + CHUNK])))
    if ix.kind == "sparse":
        p = ix.sparse[k]
        with postings.Writer(out, p.width, p.block) as writer:
            for starts, spans in _documents(p.starts, keep):
                writer.add(starts, np.asarray(p.terms[spans]), np.asarray(p.values[spans]))
            writer.finish()
    elif ix.kind == "multivector":
        s = ix.multi[k]
        assert ix.codec is not None
        with open(out / "lengths.bin", "wb") as lf, open(out / "codes.bin", "wb") as cf, \
                open(out / "residuals.bin", "wb") as rf, \
                postings.Writer(out, len(ix.codec.centroids), s.postings.block, forward=False) as writer:
            for starts, spans in _documents(s.starts, keep):
                codes = np.asarray(s.codes[spans])
                lf.write(np.diff(starts).astype(np.int32).tobytes())
                cf.write(codes.tobytes())
                rf.write(np.asarray(s.residuals[spans]).tobytes())
                writer.add(*multivector.document_postings(np.diff(starts), codes, len(ix.codec.centroids)))
            writer.finish()
    else:
        for name, source in (("vectors.bin", vectors), ("rescore.bin", copy)):
            if source is not None:
                with open(out / name, "wb") as f:
                    for a in range(0, len(keep), CHUNK):
                        f.write(np.ascontiguousarray(source[keep[a:a + CHUNK]]).tobytes())


def _documents(starts: np.ndarray, keep: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """CHUNK of the kept documents at a time: (their CSR starts from 0, the positions of their items
    (terms, tokens) in the shard's files), for documents whose items are ``starts[r]:starts[r + 1]``."""
    for a in range(0, len(keep), CHUNK):
        rows = keep[a:a + CHUNK]
        lengths = (np.asarray(starts[rows + 1]) - np.asarray(starts[rows])).astype(np.int64)
        yield np.concatenate([[0], np.cumsum(lengths)]), multivector.spans(np.asarray(starts[rows]), lengths)
