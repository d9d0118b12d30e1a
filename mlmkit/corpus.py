"""Pretraining data: read a corpus, tokenize it once into cached, memory-mapped token shards, build NSP instances.

Corpus format (DESIGN.md): UTF-8 text (.txt or .txt.gz), one sentence per line, a blank line between
documents; or JSONL with a "text" field, one document per line (its text split on newlines, or on
sentence ends when it has none).

NSP instances follow the original BERT recipe (create_pretraining_data.py): a target length
(shorter with probability 0.1), segment A from consecutive sentences, B the true continuation half
of the time and a span of another document otherwise, the longer side truncated. Three deviations:
a chunk of a single sentence borrows the next sentence when there is one (the previous one at the end
of a document), so IsNext stays near 50% (the original forces a random B for such chunks); a random
B is as long as the true continuation would have been, not filled up to the target length, so
sequence length alone does not predict the label (with the original, short documents let a model
reach ~61% NSP accuracy from lengths alone); and the chunks are fixed (instance_units), each making
one instance per epoch, made when its batch is drawn: a short target takes a chunk's first
sentences, and the sentences a NotNext instance leaves unused wait for another epoch (the original
reads them again at once) — so nothing per epoch grows with the corpus.
"""

from __future__ import annotations

import ctypes
import errno
import gzip
import hashlib
import json
import logging
import os
import random
import re
import shutil
import sys
import time
import zlib
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from .errors import DataFormatError, MlmkitError
from .files import MAX_RECORD_BYTES, bounded_lines, exclusive, parse_json
from .masking import mask_tokens
from .records import matching_files
from .tokenizer import SpecialIds, continuation_flags, special_ids

log = logging.getLogger("mlmkit")
_SENT_END = re.compile(r"(?<=[.!?])\s+")


QUIET_LOG = 10.0  # seconds of blank lines (a .gz file of nothing but newlines) before the log says how far it is


def _open_lines(path: Path, max_bytes: int | None = MAX_RECORD_BYTES) -> Iterator[tuple[int, str]]:
    """(line number, text) for each line of a .txt/.txt.gz/.jsonl file, read (and inflated) a line at
    a time; bad UTF-8 names the line, a damaged .gz file the file and the line it broke at, and a
    line of more than ``max_bytes`` (the record ceiling; a small .gz file that inflates to one
    endless line) the line, as soon as the ceiling is passed: nothing is inflated whole. A long run
    of blank lines is not silent: every QUIET_LOG seconds the log says how far it is."""
    raw = gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
    size = path.stat().st_size
    n = blank = 0
    shown = time.monotonic()
    try:
        with raw as f:
            for n, b in enumerate(bounded_lines(f, max_bytes), start=1):
                if b is None:
                    raise DataFormatError(path, f"a line of more than {max_bytes:,} bytes (the record ceiling)", line=n,
                                          hint="one sentence per line (a blank line between documents), or one document per JSON line")
                end = len(b) - b.endswith(b"\n")
                if end and b[end - 1] == 13:  # \r
                    end -= 1
                try:  # from a view: the line end is not copied off a long line
                    line = str(memoryview(b)[:end], "utf-8")
                except UnicodeDecodeError as e:
                    raise DataFormatError(
                        path, f"bytes that are not UTF-8 at column {e.start + 1}", line=n, hint="re-encode the file as UTF-8"
                    ) from None
                del b
                if line and not line.isspace():
                    blank = 0
                else:
                    blank += 1
                    if blank & 0xFFFF == 0 and time.monotonic() - shown >= QUIET_LOG:
                        shown = time.monotonic()
                        at = (f.fileobj if isinstance(f, gzip.GzipFile) else f).tell()  # type: ignore[union-attr]
                        log.info("%s: line %s, the last %s of them blank (%.0f of %.0f MB read)", path, f"{n:,}",
                                 f"{blank:,}", at / 1e6, size / 1e6)
                yield n, line
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        what = "ends early: the file is truncated" if isinstance(e, EOFError) else f"is not valid gzip data ({e})"
        raise DataFormatError(path, f"the compressed stream {what}", line=n + 1 if n else None,
                              hint="re-create the .gz file, or give the uncompressed text") from None


class DocumentPart(list):
    """Sentences of a document that goes on in what iter_documents yields next (``parts``)."""


DOCUMENT_PART = 1 << 16  # sentences: a longer .txt document is yielded in parts (with ``parts``)


def iter_documents(path: str | Path, text_column: str = "text", parts: bool = False) -> Iterator[list[str]]:
    """Yield each document of a corpus file as its list of sentences. A .jsonl line or a .parquet row
    is one document, its ``text_column`` split on newlines (or on sentence ends when it has none).
    ``parts``: a .txt document of more than DOCUMENT_PART sentences or PENDING_CHARS characters (a
    file without blank lines is one document) comes in parts, each but the last a DocumentPart (the
    last may be empty), so that memory never holds a whole long document."""
    p = Path(path)
    if not p.is_file():
        raise MlmkitError(f"corpus file not found: {p}", "check the path")
    if p.suffix.lower() == ".parquet":
        yield from _parquet_documents(p, text_column)
        return
    is_jsonl = p.name.endswith((".jsonl", ".jsonl.gz"))
    doc: list[str] = []
    chars, continued = 0, False
    for n, line in _open_lines(p):
        if is_jsonl:
            if not line or line.isspace():
                continue
            try:
                text = parse_json(line)[text_column]
            except json.JSONDecodeError as e:  # a lone surrogate and a 5,000-digit integer too
                raise DataFormatError(p, f"malformed JSON ({e.msg})", line=n, hint="one JSON object per line") from None
            except (KeyError, TypeError, IndexError):
                raise DataFormatError(p, "missing", line=n, field=text_column,
                                      hint=f'each line needs {{"{text_column}": ...}} (or pass --text-column)') from None
            del line  # a long document is held as its sentences only
            sentences = _text_sentences(text, p, n, text_column)
            del text
            if sentences:
                yield sentences
        elif line and not line.isspace():
            doc.append(line.strip())  # (the same string when there is nothing to strip)
            chars += len(line)
            if parts and (len(doc) >= DOCUMENT_PART or chars >= PENDING_CHARS):
                yield DocumentPart(doc)
                doc, chars, continued = [], 0, True
        elif doc or continued:
            yield doc
            doc, chars, continued = [], 0, False
    if doc or continued:
        yield doc


def _text_sentences(text: Any, p: Path, n: int, field: str) -> list[str]:
    if not isinstance(text, str):
        raise DataFormatError(p, "must be a string", line=n, field=field)
    parts = [s.strip() for s in (text.splitlines() if "\n" in text else _SENT_END.split(text))]
    return [s for s in parts if s]


def _parquet_documents(p: Path, text_column: str, rows: int = 4096) -> Iterator[list[str]]:
    """A document per row of a Parquet file (a null text is no document); ``line`` is the row."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise MlmkitError(f"{p}: a Parquet corpus needs pyarrow", "pip install 'mlmkit[parquet]'") from None
    try:
        f = pq.ParquetFile(p)
        names = f.schema_arrow.names
        if text_column not in names:
            raise DataFormatError(p, f"no column '{text_column}' (the columns: {', '.join(names)})",
                                  hint="name the text column with --text-column")
        n = 0
        for batch in f.iter_batches(batch_size=rows, columns=[text_column]):
            for text in batch.column(0).to_pylist():
                n += 1
                parts = _text_sentences(text, p, n, text_column) if text is not None else []
                if parts:
                    yield parts
    except OSError as e:  # pyarrow's ArrowInvalid and friends are OSErrors too
        raise DataFormatError(p, f"not a readable Parquet file ({e})", hint="check the file") from None


CORPUS_SUFFIXES = (".txt", ".txt.gz", ".jsonl", ".jsonl.gz", ".parquet")


def corpus_files(specs: Sequence[str | Path]) -> list[Path]:
    """The files corpus arguments name, in order: a file; a directory (its corpus files, sorted:
    .txt, .txt.gz, .jsonl, .jsonl.gz, .parquet); or a glob pattern ('shards/*.parquet', sorted)."""
    return [f for spec in specs for f in matching_files(spec, CORPUS_SUFFIXES, kind="corpus", hint="check the corpus path")]


def iter_sentences(paths: Sequence[str | Path], text_column: str = "text") -> Iterator[str]:
    for p in corpus_files(paths):
        for doc in iter_documents(p, text_column):
            yield from doc


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
    return Path(os.environ.get("MLMKIT_CACHE", Path.home() / ".cache" / "mlmkit")) / "corpus"


SHARD_FORMAT = "mlmkit-token-shard"
SHARD_VERSION = 1


def tokenize_corpus(
    paths: Sequence[str | Path], tok: Tokenizer, cache_dir: str | Path | None = None, batch: int = 8192,
    text_column: str = "text",
) -> TokenizedCorpus:
    """Tokenize every sentence once into a token shard (see write_shard); reuse the cached shard when
    the files and the tokenizer are unchanged. The shard is memory-mapped, not read into memory.
    ``paths``: files, directories or globs (corpus_files)."""
    ps = corpus_files(paths)
    shard = Path(cache_dir or default_cache_dir()) / _cache_key(ps, tok, text_column)
    corpus = read_shard(shard)
    if corpus is None:
        write_shard(shard, ps, tok, batch, text_column=text_column)
        corpus = read_shard(shard)
    if corpus is None:
        raise MlmkitError(f"the token shard {shard} could not be read back", "check the disk, or remove the directory")
    return corpus


def write_shard(shard: Path, paths: Sequence[Path], tok: Tokenizer, batch: int = 8192, *, with_tokenizer: bool = False,
                text_column: str = "text", workers: int = 1, replace: bool = False) -> None:
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
    progress = _Progress(sum(p.stat().st_size for p in paths), compressed=any(p.suffix == ".gz" for p in paths))
    try:
        groups = _split_by_size(paths, workers)
        if len(groups) > 1:
            count = _tokenize_in_processes(tmp, groups, tok, dtype, batch, text_column)
            progress.bytes, progress.tokens, progress.sentences = progress.total, count["tokens"], count["sentences"]
        else:
            count = _tokenize_into(tmp, paths, tok, dtype, batch, text_column, progress)
        if count["tokens"] == 0:
            raise MlmkitError(f"the corpus {', '.join(map(str, paths))} is empty", "give text files with one sentence per line")
        manifest = {
            "format": SHARD_FORMAT, "version": SHARD_VERSION, "dtype": np.dtype(dtype).name, **count,
            "files": [{"path": str(p.resolve()), "size": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns} for p in paths],
            "text_column": text_column,
            "tokenizer_sha256": hashlib.sha256(tok.to_str().encode()).hexdigest(),
        }
        if with_tokenizer:
            (tmp / "tokenizer.json").write_text(tok.to_str(), encoding="utf-8")
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
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
        log.warning("%s: put back the token shard that a `mlmkit tokenize` killed while replacing it had moved aside", d)


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


def _tokenize_into(d: Path, paths: Sequence[Path], tok: Tokenizer, dtype: Any, batch: int, text_column: str,
                   progress: _Progress | None) -> dict[str, int]:
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
                np.asarray(flat, dtype=dtype).tofile(out)  # a very long line: encoded and written a piece at a time
                n_tokens += len(flat)
                flat.clear()
                n = 0
                for piece in _pieces(s):
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
            for doc in iter_documents(p, text_column, True):  # a long document in parts
                pending.extend(doc)
                if not isinstance(doc, DocumentPart):
                    doc_ends.append(count["sentences"] + len(pending))
                chars += sum(map(len, doc))
                if len(pending) >= batch or chars >= PENDING_CHARS:  # long lines: fewer of them at once
                    flush()
                    chars = 0
        flush()
    return count


def _split_by_size(paths: Sequence[Path], workers: int) -> list[list[Path]]:
    """``paths`` in at most ``workers`` consecutive runs of about equal bytes."""
    if workers <= 1 or len(paths) <= 1:
        return [list(paths)]
    sizes = [max(1, p.stat().st_size) for p in paths]
    target = sum(sizes) / workers
    groups: list[list[Path]] = [[]]
    done = 0.0
    for p, n in zip(paths, sizes):
        if groups[-1] and done >= target * len(groups) and len(groups) < workers:
            groups.append([])
        groups[-1].append(p)
        done += n
    return groups


def _tokenizer_threads(threads: int) -> None:
    # the tokenizers library's thread pool reads these when it first starts, after this runs
    os.environ["RAYON_NUM_THREADS"] = os.environ["RAYON_RS_NUM_CPUS"] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true"


def _tokenize_part(d: str, paths: list[str], tok_json: str, dtype: str, batch: int, text_column: str) -> dict[str, int]:
    Path(d).mkdir()
    return _tokenize_into(Path(d), [Path(p) for p in paths], Tokenizer.from_str(tok_json), np.dtype(dtype), batch,
                          text_column, None)


def _tokenize_in_processes(tmp: Path, groups: list[list[Path]], tok: Tokenizer, dtype: Any, batch: int,
                           text_column: str) -> dict[str, int]:
    """Each run of files tokenized by its own process into tmp/part-K, then joined in order: tokens
    copied, offsets shifted by what came before (a chunk at a time)."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    threads = max(1, (os.cpu_count() or 1) // len(groups))
    parts = [tmp / f"part-{k}" for k in range(len(groups))]
    with ProcessPoolExecutor(len(groups), mp_context=get_context("spawn"), initializer=_tokenizer_threads,
                             initargs=(threads,)) as pool:
        futures = [pool.submit(_tokenize_part, str(d), [str(p) for p in g], tok.to_str(), np.dtype(dtype).name, batch,
                               text_column) for d, g in zip(parts, groups)]
        counts = []
        for k, f in enumerate(futures):
            counts.append(f.result())
            log.info("tokenized part %d of %d (%s tokens)", k + 1, len(groups), f"{counts[-1]['tokens']:,}")
    total = {"tokens": 0, "sentences": 0, "documents": 0}
    with (open(tmp / "tokens.bin", "wb") as out, open(tmp / "sentences.bin", "wb") as sents,
          open(tmp / "documents.bin", "wb") as docs):
        np.zeros(1, np.int64).tofile(sents)
        np.zeros(1, np.int64).tofile(docs)
        for d, c in zip(parts, counts):
            with open(d / "tokens.bin", "rb") as f:
                shutil.copyfileobj(f, out, 1 << 24)
            for name, base, n, into in (("sentences.bin", total["tokens"], c["sentences"], sents),
                                        ("documents.bin", total["sentences"], c["documents"], docs)):
                offsets = np.memmap(d / name, dtype=np.int64, mode="r", shape=(n + 1,))
                for i in range(1, n + 1, 1 << 20):
                    (offsets[i : i + (1 << 20)] + base).tofile(into)
                del offsets
            for k in total:
                total[k] += c[k]
            shutil.rmtree(d)
    return total


class _Progress:
    """Tokenization progress in the log every few seconds: MB read, MB/s, tokens/s, time left."""

    def __init__(self, total_bytes: int, compressed: bool, every: float = 10.0) -> None:
        self.total, self.compressed, self.every = total_bytes, compressed, every
        self.bytes = self.sentences = self.tokens = 0
        self.start = self.shown = time.monotonic()

    def update(self, n_bytes: int, n_sentences: int) -> None:
        self.bytes += n_bytes
        self.sentences += n_sentences
        now = time.monotonic()
        if now - self.shown >= self.every:
            self.shown = now
            log.info("tokenizing: %s", self.line(now))

    def line(self, now: float, eta: bool = True) -> str:
        dt = max(now - self.start, 1e-9)
        text = f"{self.bytes / 1e6:,.0f} MB, {self.bytes / 1e6 / dt:.1f} MB/s, {self.tokens / dt:,.0f} tokens/s"
        if eta and not self.compressed and self.bytes:  # text read against file sizes (a .gz file's is not comparable)
            text += f", about {max(0.0, (self.total - self.bytes) / (self.bytes / dt)):.0f} s left"
        return text

    def done(self) -> None:
        if time.monotonic() - self.start >= self.every:
            log.info("tokenized: %s; %d sentences", self.line(time.monotonic(), eta=False), self.sentences)


def tokenize_to(paths: Sequence[str | Path], tok: Tokenizer, out: str | Path, text_column: str = "text",
                workers: int = 1) -> TokenizedCorpus:
    """`mlmkit tokenize`: the corpus as a token shard in directory ``out``, with its tokenizer, for
    `mlmkit pretrain --data` here or on other machines. A previous shard there is replaced once the
    new one is complete (replace_shard: killed at any instant, a whole shard is at ``out``, or is put
    back there by the next tokenize or load); any other non-empty directory is refused. Two
    tokenizations to the same ``out`` at once: the second is refused, naming the first."""
    ps, d = corpus_files(paths), Path(out)
    lock = d.absolute().with_name(f".{d.absolute().name}.lock")
    with exclusive(lock):
        restore_shard(d)
        _remove_stale(d)
        if d.exists() and (not d.is_dir() or (any(d.iterdir()) and not (d / "manifest.json").is_file())):
            raise MlmkitError(f"{d} exists and is not a token shard", "give a new or empty directory with --out")
        write_shard(d, ps, tok, with_tokenizer=True, text_column=text_column, workers=workers, replace=True)
    try:
        lock.rmdir()  # (one a killed tokenize left, taken over)
    except OSError:
        pass
    return open_shard(d, tok)


def open_shard(d: str | Path, tok: Tokenizer) -> TokenizedCorpus:
    """A shard written by `mlmkit tokenize`, checked against the tokenizer training will use."""
    corpus = read_shard(Path(d), repair=False)
    assert corpus is not None
    m = parse_json((Path(d) / "manifest.json").read_text(encoding="utf-8"))
    if m["tokenizer_sha256"] != hashlib.sha256(tok.to_str().encode()).hexdigest():
        raise MlmkitError(f"{d} was tokenized with another tokenizer than the one given",
                          f"leave out --tokenizer to use the shard's own ({Path(d) / 'tokenizer.json'}), or tokenize again")
    return corpus


def shard_files(d: str | Path) -> list[dict[str, Any]]:
    """The source files a shard was made from: {"path", "size", "mtime_ns"} each."""
    return list(parse_json((Path(d) / "manifest.json").read_text(encoding="utf-8"))["files"])


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
        m = parse_json((shard / "manifest.json").read_text(encoding="utf-8"))
        if m.get("format") != SHARD_FORMAT or m.get("version") != SHARD_VERSION:
            raise ValueError("another format")
        tokens = np.memmap(shard / "tokens.bin", dtype=np.dtype(m["dtype"]), mode="r", shape=(int(m["tokens"]),))
        sents = np.memmap(shard / "sentences.bin", dtype=np.int64, mode="r", shape=(int(m["sentences"]) + 1,))
        docs = np.memmap(shard / "documents.bin", dtype=np.int64, mode="r", shape=(int(m["documents"]) + 1,))
        sizes = [(shard / f).stat().st_size for f in ("tokens.bin", "sentences.bin", "documents.bin")]
        if (int(sents[-1]) != len(tokens) or int(docs[-1]) != len(sents) - 1
                or sizes != [tokens.nbytes, sents.nbytes, docs.nbytes]):
            raise ValueError("counts do not match")
        return TokenizedCorpus(tokens, sents, docs, cache=shard)
    except Exception as e:
        if not repair:
            raise MlmkitError(f"the token shard {shard} is damaged ({e})", "write it again with `mlmkit tokenize`") from None
        log.warning("the token cache %s is damaged (%s): tokenizing again", shard, e)
        shutil.rmtree(shard, ignore_errors=True)
        return None


LONG_LINE = 100_000  # characters: a longer line is tokenized in pieces
PENDING_CHARS = 1 << 22  # characters of sentences tokenized together (with the batch's count): 4M, ~100 MB of encodings


def _pieces(text: str, size: int = LONG_LINE) -> Iterator[str]:
    """``text`` in pieces of about ``size`` characters cut at whitespace (where tokenization splits
    anyway, so the pieces' tokens are the whole's); a run without whitespace is cut where it must be."""
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            cut = text.rfind(" ", start + size // 2, end)
            end = cut + 1 if cut > 0 else end
        yield text[start:end]
        start = end


@dataclass
class Instance:
    a: np.ndarray
    b: np.ndarray | None
    is_next: int  # 0 = IsNext (B follows A), 1 = NotNext, as transformers' next_sentence_label


def _truncate_pair(a: list[int], b: list[int], max_tokens: int, rng: random.Random) -> None:
    """Trim the longer side one token at a time, from the front or the back at random (BERT
    truncate_seq_pair). The draws are made first and the cuts once, so a pair of n tokens costs O(n),
    not O(n^2) of deleting from the front of a list."""
    la, lb = len(a), len(b)
    cut = {"a": [0, 0], "b": [0, 0]}  # tokens to drop from the front, from the back
    while la + lb > max_tokens:
        side = "a" if la > lb else "b"
        cut[side][0 if rng.random() < 0.5 else 1] += 1
        if side == "a":
            la -= 1
        else:
            lb -= 1
    for seq, (front, back) in ((a, cut["a"]), (b, cut["b"])):
        del seq[len(seq) - back :]
        del seq[:front]


def _random_b(corpus: TokenizedCorpus, d: int, want: int, rng: random.Random, tries: int = 4) -> list[int]:
    """Consecutive sentences of document ``d`` about ``want`` tokens long: the span nearest that
    length among a few random starts, so the length of a random B tells nothing about IsNext. Read
    from the offsets: a long document costs what its span does, not what the whole does."""
    so = corpus.sent_offsets
    s0, s1 = int(corpus.doc_offsets[d]), int(corpus.doc_offsets[d + 1])
    best: tuple[int, int, int] | None = None  # first sentence, end, tokens
    for _ in range(tries):
        start = s0 + rng.randrange(s1 - s0)
        end, n = start, 0
        while end < s1:
            k = int(so[end + 1] - so[end])
            if n and abs(n + k - want) >= abs(n - want):
                break
            n, end = n + k, end + 1
        if best is None or best[2] == 0 or abs(n - want) < abs(best[2] - want):
            best = (start, end, n)
    assert best is not None
    return corpus.tokens[so[best[0]] : so[best[1]]].tolist()


SHORT_SEQ_PROB = 0.1


def instance_units(corpus: TokenizedCorpus, max_len: int, nsp: bool) -> np.ndarray:
    """The units an epoch's instances are drawn from, as U+1 boundaries (cached in the corpus's shard
    directory, so a large corpus computes them once).

    NSP: runs of consecutive sentences of one document, each growing until it holds max_len - 3
    tokens or the document ends (BERT's chunks at the full target length); boundaries are sentence
    indices. --no-nsp: the packed windows of max_len - 2 tokens (whole sentences while they fit,
    a longer sentence in pieces, never across documents); boundaries are token indices."""
    kind = "nsp" if nsp else "packed"
    cached = corpus.cache / f"units-{kind}-{max_len}-{corpus.part}.npy" if corpus.cache is not None else None
    if cached is not None and cached.is_file():
        try:
            units = np.load(cached, mmap_mode="r")
            last = len(corpus.sent_offsets) - 1 if nsp else len(corpus.tokens)
            if units.ndim == 1 and len(units) >= 1 and int(units[0]) == 0 and int(units[-1]) == last:
                return units
        except (OSError, ValueError):
            pass
    cap = max_len - 3 if nsp else max_len - 2
    ends = array("q")
    sent = 0  # index of the next sentence
    pos = 0  # token offset of the next sentence
    for d0, d1 in _blocks(corpus.doc_offsets):
        lengths = np.diff(np.asarray(corpus.sent_offsets[d0[0] : d1[-1] + 1])).tolist()
        k = 0
        for n_sents in (np.asarray(d1) - np.asarray(d0)).tolist():
            length = cur = 0
            for j in range(n_sents):
                n = lengths[k]
                k += 1
                if nsp:
                    length += n
                    if length >= cap or j == n_sents - 1:
                        ends.append(sent + j + 1)
                        length = 0
                    continue
                if cur and cur + n > cap:  # packing: this sentence starts the next window
                    ends.append(pos)
                    cur = 0
                if n > cap:  # a sentence longer than the window is split
                    whole = n - n % cap
                    ends.extend(range(pos + cap, pos + whole + 1, cap))
                    cur = n - whole
                else:
                    cur += n
                pos += n
            if not nsp and cur:
                ends.append(pos)
            sent += n_sents
    units = np.concatenate([[0], np.frombuffer(ends, dtype=np.int64)]).astype(np.int64)
    if cached is not None:
        try:
            tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
            with open(tmp, "wb") as f:
                np.save(f, units)
            tmp.replace(cached)
        except OSError as e:  # a read-only cache still trains, computing the units each time
            log.warning("could not cache %s (%s)", cached, e)
    return units


def _blocks(doc_offsets: np.ndarray, size: int = 1 << 16) -> Iterator[tuple[list[int], list[int]]]:
    """(first sentences, ends) of the documents, ``size`` documents at a time (bounded memory)."""
    for i in range(0, len(doc_offsets) - 1, size):
        chunk = np.asarray(doc_offsets[i : i + size + 1]).tolist()
        yield chunk[:-1], chunk[1:]


def nsp_instance(
    corpus: TokenizedCorpus, units: np.ndarray, u: int, max_tokens: int, rng: random.Random,
    short_seq_prob: float = SHORT_SEQ_PROB,
) -> Instance | None:
    """The NSP instance of unit ``u`` (see instance_units), as BERT's create_instances_from_document
    makes one from a chunk: with probability ``short_seq_prob`` a shorter target length (the unit's
    first sentences that reach it); A its first 1..n-1 sentences; B the rest (IsNext) or, half the
    time, a span of another document as long as the rest would have been (NotNext); the longer side
    truncated. None when A or B came out empty."""
    so = corpus.sent_offsets
    s0, s1 = int(units[u]), int(units[u + 1])
    d = int(np.searchsorted(corpus.doc_offsets, s0, side="right")) - 1
    ds0, ds1 = int(corpus.doc_offsets[d]), int(corpus.doc_offsets[d + 1])
    target = rng.randint(2, max_tokens) if rng.random() < short_seq_prob else max_tokens
    first, end, length = s0, s0, 0
    while end < s1 and (end == s0 or length < target):
        length += int(so[end + 1] - so[end])
        end += 1
    if end - first == 1:  # a single sentence borrows the next one, or the previous one (see module doc)
        if end < ds1:
            end += 1
        elif first > ds0:
            first -= 1
    n = end - first
    a_end = first + (rng.randint(1, n - 1) if n >= 2 else 1)
    a = corpus.tokens[so[first] : so[a_end]].tolist()
    if n == 1 or rng.random() < 0.5:
        is_next, want = 1, int(so[end] - so[a_end]) or target - len(a)
        b = _random_b(corpus, _other_document(corpus, d, want, rng), want, rng)
    else:
        is_next, b = 0, corpus.tokens[so[a_end] : so[end]].tolist()
    _truncate_pair(a, b, max_tokens, rng)
    return Instance(np.asarray(a, np.int32), np.asarray(b, np.int32), is_next) if a and b else None
def _other_document(corpus: TokenizedCorpus, d: int, want: int, rng: random.Random, tries: int = 10) -> int:
    """A random document other than ``d``: the first of a few draws long enough to give ``want``
    tokens, else the longest drawn (so a random B is rarely shorter than the continuation it stands
    for, on corpora of short documents too)."""
    best, best_len = (d + 1) % corpus.num_docs, -1
    for _ in range(tries):
        other = rng.randrange(corpus.num_docs)
        if other == d:
            continue
        so, do = corpus.sent_offsets, corpus.doc_offsets
        n = int(so[do[other + 1]] - so[do[other]])
        if n >= want:
            return other
        if n > best_len:
            best, best_len = other, n
    return best


def packed_instance(corpus: TokenizedCorpus, units: np.ndarray, u: int) -> Instance:
    """--no-nsp: the packed window ``u`` (see instance_units)."""
    return Instance(np.asarray(corpus.tokens[int(units[u]) : int(units[u + 1])], np.int32), None, 0)


def nsp_instances(
    corpus: TokenizedCorpus, max_len: int, rng: random.Random, short_seq_prob: float = SHORT_SEQ_PROB
) -> list[Instance]:
    """One instance per unit, in corpus order, each from its own generator seeded from ``rng``: what
    an epoch of PretrainData draws (in another order), all at once. For tests and inspection."""
    _check_nsp(corpus)
    units, seed = instance_units(corpus, max_len, nsp=True), rng.getrandbits(64)
    made = (nsp_instance(corpus, units, u, max_len - 3, random.Random(f"{seed}/{u}"), short_seq_prob)
            for u in range(len(units) - 1))
    return [x for x in made if x is not None]


def packed_instances(corpus: TokenizedCorpus, max_len: int) -> list[Instance]:
    """--no-nsp: every packed window, in corpus order."""
    units = instance_units(corpus, max_len, nsp=False)
    return [packed_instance(corpus, units, u) for u in range(len(units) - 1)]


def _check_nsp(corpus: TokenizedCorpus) -> None:
    if corpus.num_docs < 2:
        raise MlmkitError(
            "next-sentence prediction needs at least 2 documents (blank lines separate them)",
            "add blank lines between documents, or pass --no-nsp",
        )


class PretrainData:
    """The training loop's data source for pretraining: deterministic per (seed, epoch, batch).

    Nothing is built per epoch but a permutation of the units (instance_units): batch k of an epoch
    takes units k*B .. k*B+B-1 of that permutation and makes their instances then, each from a
    generator seeded with (seed, epoch, unit), so every epoch has new NSP pairings and short targets.
    Masks are drawn per step from a generator seeded with (seed, step, rank). Memory does not grow
    with the corpus (a memory-mapped shard, 12 bytes per unit), and resuming at batch k needs no
    saved data state and no replay: the loop asks for batch k directly.
    """

    def __init__(
        self,
        corpus: TokenizedCorpus,
        tok: Tokenizer,
        *,
        max_len: int = 128,
        batch_size: int = 32,
        nsp: bool = True,
        mask_prob: float = 0.15,
        whole_word: bool = False,
        seed: int = 0,
        held_out: bool = False,
    ) -> None:
        """``held_out``: evaluation data (a few fixed batches): a batch size over its sequences is no news."""
        if max_len < 8:
            raise MlmkitError(f"--seq-len {max_len} is too short", "use at least 8")
        self.corpus, self.max_len, self.batch_size, self.nsp = corpus, max_len, batch_size, nsp
        self.mask_prob, self.whole_word, self.seed = mask_prob, whole_word, seed
        self.ids: SpecialIds = special_ids(tok)
        self.vocab_size = tok.get_vocab_size()
        self.special = torch.tensor(self.ids.all, dtype=torch.long)
        self.continuation = torch.tensor(continuation_flags(tok), dtype=torch.bool)
        if nsp:
            _check_nsp(corpus)
        self.units = instance_units(corpus, max_len, nsp)
        self.num_units = len(self.units) - 1
        if self.num_units < 1:
            raise MlmkitError("the corpus yields no training sequences", "give it more text")
        if batch_size > self.num_units and not held_out:
            log.warning("--batch-size %d is more than the %d sequences of the corpus: each batch holds %d",
                        batch_size, self.num_units, self.num_units)
        self._epoch: int | None = None
        self._order = np.zeros(0, np.int64)

    def order(self, epoch: int) -> np.ndarray:
        """The units in the order ``epoch`` visits them."""
        if self._epoch != epoch:
            self._order = np.arange(self.num_units, dtype=np.int32 if self.num_units < 1 << 31 else np.int64)
            np.random.default_rng([self.seed % (1 << 32), epoch]).shuffle(self._order)  # in place: one array
            self._epoch = epoch
        return self._order

    def instance(self, epoch: int, u: int) -> Instance | None:
        if not self.nsp:
            return packed_instance(self.corpus, self.units, u)
        rng = random.Random(f"{self.seed}/{epoch}/{u}")
        return nsp_instance(self.corpus, self.units, u, self.max_len - 3, rng)

    def num_batches(self, epoch: int) -> int:
        return max(1, self.num_units // self.batch_size)

    def batch(self, epoch: int, index: int, seed: int) -> dict[str, torch.Tensor]:
        order, U = self.order(epoch), self.num_units
        n, start = min(self.batch_size, U), (index * self.batch_size) % U
        chosen: list[Instance] = []
        j = 0
        while len(chosen) < n and j < U:  # a unit whose A or B came out empty: the next one instead
            x = self.instance(epoch, int(order[(start + j) % U]))
            j += 1
            if x is not None:
                chosen.append(x)
        if not chosen:
            raise MlmkitError("the corpus yields no training sequences", "give it more text")
        return self.collate(chosen, torch.Generator().manual_seed(seed))

    def collate(self, chosen: Sequence[Instance], gen: torch.Generator) -> dict[str, torch.Tensor]:
        """[CLS] A [SEP] (B [SEP]), padded to the longest in the batch, then masked."""
        rows, segs = [], []
        for x in chosen:
            ids = [self.ids.cls, *x.a.tolist(), self.ids.sep]
            seg = [0] * len(ids)
            if x.b is not None:
                ids += [*x.b.tolist(), self.ids.sep]
                seg += [1] * (len(x.b) + 1)
            rows.append(ids)
            segs.append(seg)
        T = max(map(len, rows))
        input_ids = torch.full((len(rows), T), self.ids.pad, dtype=torch.long)
        token_type_ids = torch.zeros_like(input_ids)
        attention_mask = torch.zeros_like(input_ids)
        for r, (ids, seg) in enumerate(zip(rows, segs)):
            input_ids[r, : len(ids)] = torch.tensor(ids)
            token_type_ids[r, : len(ids)] = torch.tensor(seg)
            attention_mask[r, : len(ids)] = 1
        masked, labels = mask_tokens(
            input_ids,
            mask_id=self.ids.mask,
            special_ids=self.special,
            vocab_size=self.vocab_size,
            mask_prob=self.mask_prob,
            generator=gen,
            continuation=self.continuation,
            whole_word=self.whole_word,
        )
        out = {"input_ids": masked, "attention_mask": attention_mask, "token_type_ids": token_type_ids, "labels": labels}
        if self.nsp:
            out["next_sentence_label"] = torch.tensor([x.is_next for x in chosen], dtype=torch.long)
        return out
