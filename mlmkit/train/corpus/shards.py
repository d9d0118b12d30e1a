"""Token shards: a corpus tokenized once into cached, memory-mapped, crash-safe shards, by a pool of
tokenizing processes (workers.py); read back as a TokenizedCorpus.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import logging
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from mlmkit.errors import MlmkitError
from mlmkit.files import MAX_RECORD_BYTES, cache_root
from mlmkit.locks import exclusive
from mlmkit.train.corpus.files import PENDING_CHARS, DocumentPart, corpus_files, iter_documents
from mlmkit.train.corpus.manifest import (
    SHARD_FORMAT,
    SHARD_VERSION,
    ShardManifest,
    SourceFile,
    read_manifest,
    write_manifest,
)
from mlmkit.train.corpus.pieces import token_cut
from mlmkit.train.corpus.workers import Progress, split_by_size, tokenize_in_processes

log = logging.getLogger("mlmkit")


@dataclass
class TokenizedCorpus:
    """All sentences' token ids concatenated; offsets delimit sentences and documents. Read from a
    token shard, the arrays are memory-mapped (pages are read as they are used)."""

    tokens: np.ndarray  # (N,) uint16 / uint32 (int32 when built in memory)
    sent_offsets: np.ndarray  # (S+1,) int64 into tokens
    doc_offsets: np.ndarray  # (D+1,) int64 into sentences
    cache: Path | None = None  # the shard directory it was read from: instance units are cached there
    part: str = "all"  # which part of the shard (split_heldout): names the cached units

    @property
    def num_docs(self) -> int:
        return len(self.doc_offsets) - 1

    def document(self, d: int) -> list[np.ndarray]:
        s0, s1 = self.doc_offsets[d], self.doc_offsets[d + 1]
        return [self.tokens[self.sent_offsets[s] : self.sent_offsets[s + 1]] for s in range(s0, s1)]


def file_identity(paths: Sequence[str | Path]) -> list[list[Any]]:
    """[absolute path, size] of each file: what a resumed run must find unchanged (a directory or a
    glob: of each file it names)."""
    if any(not Path(p).is_file() and (Path(p).is_dir() or any(c in str(p) for c in "*?[")) for p in paths):
        paths = corpus_files(paths)
    return [[str(Path(p).resolve()), Path(p).stat().st_size if Path(p).is_file() else None] for p in paths]


def _cache_key(paths: Sequence[Path], tok: Tokenizer, text_column: str) -> str:
    h = hashlib.sha256(tok.to_str().encode())
    if text_column != "text":  # the default keeps the keys of shards made before the option existed
        h.update(f"column|{text_column}".encode())
    for p in paths:
        st = p.stat()
        h.update(f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:20]


def default_cache_dir() -> Path:
    return cache_root() / "corpus"




def tokenize_corpus(
    paths: Sequence[str | Path], tok: Tokenizer, cache_dir: str | Path | None = None, batch: int = 8192,
    text_column: str = "text", max_bytes: int | None = MAX_RECORD_BYTES,
) -> TokenizedCorpus:
    """Tokenize every sentence once into a token shard (see write_shard); reuse the cached shard when
    the files and the tokenizer are unchanged. The shard is memory-mapped, not read into memory.
    ``paths``: files, directories or globs (corpus_files); a line (a value) of more than ``max_bytes``
    is a bad record (the record ceiling, --max-record-bytes)."""
    ps = corpus_files(paths)
    shard = Path(cache_dir or default_cache_dir()) / _cache_key(ps, tok, text_column)
    corpus = read_shard(shard)
    if corpus is None:
        write_shard(shard, ps, tok, batch, text_column=text_column, max_bytes=max_bytes)
        corpus = read_shard(shard)
    if corpus is None:
        raise MlmkitError(f"the token shard {shard} could not be read back",
                          "check the disk, or remove the directory")
    return corpus


def write_shard(shard: Path, paths: Sequence[Path], tok: Tokenizer, batch: int = 8192, *,
                with_tokenizer: bool = False,
                text_column: str = "text", workers: int = 1, replace: bool = False,
                max_bytes: int | None = MAX_RECORD_BYTES) -> None:
    """Tokenize ``paths`` into the directory ``shard``: tokens.bin (every sentence's ids, concatenated:
    uint16 when the vocabulary fits, else uint32), sentences.bin (S+1 int64 offsets into the tokens),
    documents.bin (D+1 int64 offsets into the sentences) and manifest.json (format, counts, source
    files, tokenizer hash), written last. Everything goes to disk as it is made, so memory holds one
    batch of sentences whatever the corpus size; the directory is built under a temporary name and renamed
    into place (another process that finished the same shard first wins, and this one's is dropped).
    ``with_tokenizer``: a copy of the tokenizer goes in too (a shard to train from elsewhere).
    ``workers``: processes, each tokenizing a run of the files (split by size) with its share of the
    cores; their parts are joined in file order, so the shard is the same as with one.
    ``replace``: the finished shard replaces one at ``shard`` (replace_shard), instead of yielding
    to it."""
    dtype = np.uint16 if tok.get_vocab_size() <= 1 << 16 else np.uint32
    shard.parent.mkdir(parents=True, exist_ok=True)
    tmp = shard.parent / f".{shard.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    progress = Progress(sum(p.stat().st_size for p in paths),
                        compressed=any(p.suffix == ".gz" for p in paths))
    try:
        groups = split_by_size(paths, workers)
        if len(groups) > 1:
            count = tokenize_in_processes(tokenize_into, tmp, groups, tok, dtype, batch, text_column,
                                          max_bytes)
            progress.bytes, progress.tokens = progress.total, count["tokens"]
            progress.sentences = count["sentences"]
        else:
            count = tokenize_into(tmp, paths, tok, dtype, batch, text_column, progress, max_bytes)
        if count["tokens"] == 0:
            raise MlmkitError(f"the corpus {', '.join(map(str, paths))} is empty",
                              "give text files with one sentence per line")
        manifest = ShardManifest(
            SHARD_FORMAT, SHARD_VERSION, np.dtype(dtype).name, **count,
            files=tuple(SourceFile(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in paths),
            tokenizer_sha256=hashlib.sha256(tok.to_str().encode()).hexdigest(), text_column=text_column)
        if with_tokenizer:
            (tmp / "tokenizer.json").write_text(tok.to_str(), encoding="utf-8")
        write_manifest(tmp, manifest)
        progress.done()
        if replace:
            replace_shard(tmp, shard)
            return
        try:
            tmp.rename(shard)
        except OSError:
            if read_shard(shard) is None:  # not a finished shard of another process: this one's replaces it
                shutil.rmtree(shard, ignore_errors=True)
                tmp.rename(shard)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---- replacing a shard: the old one stays until the new one is in place ----------------------------
def _aside(d: Path) -> Path:
    """Where replace_shard keeps the old shard while the new one moves in (where it cannot swap)."""
    return d.with_name(f".{d.name}.old")


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one step (Linux renameat2 with RENAME_EXCHANGE); False where the system
    or the file system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # not glibc 2.28+
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(code, os.strerror(code), str(b))


def replace_shard(new: Path, d: Path) -> None:
    """Put the finished shard directory ``new`` at ``d``, replacing what is there, so that a process
    killed at any instant leaves a whole shard at ``d`` or one restore_shard puts back: the two are
    swapped in one step where the system can (the old one then removed from ``new``'s place); else
    the old one is moved aside (``.NAME.old``), the new one moved in, and the old one removed."""
    if not d.exists() or (d.is_dir() and not any(d.iterdir())):
        os.replace(new, d)  # a new path, or an empty directory: one rename
        return
    if _exchange(new, d):
        shutil.rmtree(new, ignore_errors=True)  # the old shard, in the new one's place
        return
    old = _aside(d)
    shutil.rmtree(old, ignore_errors=True)
    os.rename(d, old)
    os.rename(new, d)
    shutil.rmtree(old, ignore_errors=True)


def restore_shard(d: Path) -> None:
    """After a process killed while replacing the shard at ``d`` (replace_shard): the old shard put
    back when no shard is at ``d``, removed when the new one is in place; nothing to do otherwise."""
    old = _aside(d)
    if not (old / "manifest.json").is_file():
        return
    if (d / "manifest.json").is_file():
        shutil.rmtree(old, ignore_errors=True)
        return
    if d.is_dir() and not any(d.iterdir()):
        d.rmdir()
    if not d.exists():
        os.rename(old, d)
        log.warning("%s: put back the token shard that a `mlmkit tokenize` killed while replacing it had "
                    "moved aside", d)


def _remove_stale(d: Path) -> None:
    """Temporary shards beside ``d`` (``.NAME.PID.tmp``) of processes that no longer run."""
    for t in d.parent.glob(f".{d.name}.*.tmp"):
        pid = t.name[len(d.name) + 2 : -len(".tmp")]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(t, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def tokenize_into(d: Path, paths: Sequence[Path], tok: Tokenizer, dtype: Any, batch: int, text_column: str,
                   progress: Progress | None, max_bytes: int | None) -> dict[str, int]:
    """tokens.bin, sentences.bin and documents.bin of ``paths`` in directory ``d``; their counts."""
    count = {"tokens": 0, "sentences": 0, "documents": 0}
    with (open(d / "tokens.bin", "wb") as out, open(d / "sentences.bin", "wb") as sents,
          open(d / "documents.bin", "wb") as docs):
        np.zeros(1, np.int64).tofile(sents)
        np.zeros(1, np.int64).tofile(docs)
        pending: list[str] = []
        doc_ends: list[int] = []  # the sentence index each document in ``pending`` ends at (one may go on)
        chars = 0

        def flush() -> None:
            if progress is not None:
                progress.update(sum(len(s) + 1 for s in pending), len(pending))
            short = [s for s in pending if len(s) <= LONG_LINE]
            encoded = iter(tok.encode_batch(short, add_special_tokens=False))
            flat: list[int] = []
            lengths: list[int] = []
            n_tokens = 0
            for s in pending:
                if len(s) <= LONG_LINE:
                    ids = next(encoded).ids
                    flat.extend(ids)
                    lengths.append(len(ids))
                    continue
                # a very long line: encoded and written a piece at a time
                np.asarray(flat, dtype=dtype).tofile(out)
                n_tokens += len(flat)
                flat.clear()
                n = 0
                for piece in _pieces(s, tok=tok):
                    ids = tok.encode(piece, add_special_tokens=False).ids
                    np.asarray(ids, dtype=dtype).tofile(out)
                    n += len(ids)
                lengths.append(n)
                n_tokens += n
            np.asarray(flat, dtype=dtype).tofile(out)
            n_tokens += len(flat)
            (count["tokens"] + np.cumsum(lengths, dtype=np.int64)).tofile(sents)
            np.asarray(doc_ends, dtype=np.int64).tofile(docs)
            count["tokens"] += n_tokens
            count["sentences"] += len(pending)
            count["documents"] += len(doc_ends)
            if progress is not None:
                progress.tokens += n_tokens
            pending.clear()
            doc_ends.clear()

        for p in paths:
            for doc in iter_documents(p, text_column, True, max_bytes):  # a long document in parts
                pending.extend(doc)
                if not isinstance(doc, DocumentPart):
                    doc_ends.append(count["sentences"] + len(pending))
                chars += sum(map(len, doc))
                if len(pending) >= batch or chars >= PENDING_CHARS:  # long lines: fewer of them at once
                    flush()
                    chars = 0
        flush()
    return count


def tokenize_to(paths: Sequence[str | Path], tok: Tokenizer, out: str | Path, text_column: str = "text",
                workers: int = 1, max_bytes: int | None = MAX_RECORD_BYTES) -> TokenizedCorpus:
    """`mlmkit tokenize`: the corpus as a token shard in directory ``out``, with its tokenizer, for
    `mlmkit pretrain --shard` here or on other machines. A previous shard there is replaced once the
    new one is complete (replace_shard: killed at any instant, a whole shard is at ``out``, or is put
    back there by the next tokenize or load); any other non-empty directory is refused. Two
    tokenizations to the same ``out`` at once: the second is refused, naming the first."""
    ps, d = corpus_files(paths), Path(out)
    lock = d.absolute().with_name(f".{d.absolute().name}.lock")
    with exclusive(lock):
        restore_shard(d)
        _remove_stale(d)
        if d.exists() and (not d.is_dir() or (any(d.iterdir()) and not (d / "manifest.json").is_file())):
            raise MlmkitError(f"{d} exists and is not a token shard",
                              "give a new or empty directory with --out")
        write_shard(d, ps, tok, with_tokenizer=True, text_column=text_column, workers=workers, replace=True,
                    max_bytes=max_bytes)
    try:
        lock.rmdir()  # (one a killed tokenize left, taken over)
    except OSError:
        pass
    return open_shard(d, tok)


def open_shard(d: str | Path, tok: Tokenizer) -> TokenizedCorpus:
    """A shard written by `mlmkit tokenize`, checked against the tokenizer training will use."""
    corpus = read_shard(Path(d), repair=False)
    assert corpus is not None
    if read_manifest(Path(d)).tokenizer_sha256 != hashlib.sha256(tok.to_str().encode()).hexdigest():
        raise MlmkitError(f"{d} was tokenized with another tokenizer than the one given",
                          f"leave out --tokenizer to use the shard's own ({Path(d) / 'tokenizer.json'}), or "
                          "tokenize again")
    return corpus


def shard_files(d: str | Path) -> tuple[SourceFile, ...]:
    """The source files a shard was made from."""
    return read_manifest(Path(d)).files


def read_shard(shard: Path, *, repair: bool = True) -> TokenizedCorpus | None:
    """The token shard in directory ``shard``, memory-mapped; None when there is none, or when it is
    damaged: then, with ``repair`` (a cache entry), it is removed, to be rebuilt (a damaged cache is
    never trusted); without, an error says what is wrong."""
    if not (shard / "manifest.json").is_file() and not repair:
        restore_shard(shard)  # a tokenize killed while replacing it: the old shard, back in place
    if not (shard / "manifest.json").is_file():
        if not repair:
            raise MlmkitError(f"{shard} is not a token shard (no manifest.json)",
                              "write one with `mlmkit tokenize CORPUS --tokenizer T --out DIR`")
        if shard.is_file():  # a cache entry of an older mlmkit, or not ours
            shard.unlink(missing_ok=True)
        return None
    try:
        m = read_manifest(shard)
        tokens = np.memmap(shard / "tokens.bin", dtype=np.dtype(m.dtype), mode="r", shape=(m.tokens,))
        sents = np.memmap(shard / "sentences.bin", dtype=np.int64, mode="r", shape=(m.sentences + 1,))
        docs = np.memmap(shard / "documents.bin", dtype=np.int64, mode="r", shape=(m.documents + 1,))
        sizes = [(shard / f).stat().st_size for f in ("tokens.bin", "sentences.bin", "documents.bin")]
        if (int(sents[-1]) != len(tokens) or int(docs[-1]) != len(sents) - 1
                or sizes != [tokens.nbytes, sents.nbytes, docs.nbytes]):
            raise ValueError("counts do not match")
        return TokenizedCorpus(tokens, sents, docs, cache=shard)
    except Exception as e:
        if not repair:
            raise MlmkitError(f"the token shard {shard} is damaged ({e})",
                              "write it again with `mlmkit tokenize`") from None
        log.warning("the token cache %s is damaged (%s): tokenizing again", shard, e)
        shutil.rmtree(shard, ignore_errors=True)
        return None


LONG_LINE = 100_000  # characters: a longer line is tokenized in pieces


def _pieces(text: str, size: int = LONG_LINE, tok: Any = None) -> Iterator[str]:
    """``text`` in pieces of about ``size`` characters, each encoded on its own, cut where the tokens
    stay the whole's (pieces.token_cut, with ``tok``); without a tokenizer, after the last whitespace (or
    where it must be, in a run without)."""
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text) and tok is not None:
            end = token_cut(text, start + size // 2, end, tok)
        elif end < len(text):
            cut = text.rfind(" ", start + size // 2, end)
            end = cut + 1 if cut > 0 else end
        yield text[start:end]
        start = end
