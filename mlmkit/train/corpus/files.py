"""Reading corpora: .txt / .txt.gz (a sentence per line, a blank line between documents), JSONL and
Parquet text columns, as documents of sentences with file/line errors.

Corpus format (docs/cli.md): UTF-8 text (.txt or .txt.gz), one sentence per line, a blank line between
documents; or JSONL with a "text" field, one document per line (its text split on newlines, or on
sentence ends when it has none).
"""

from __future__ import annotations

import gzip
import json
import logging
import re
import time
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from mlmkit.errors import DataFormatError, MlmkitError
from mlmkit.files import MAX_RECORD_BYTES, bounded_lines, parse_json
from mlmkit.text.records import matching_files
from mlmkit.text.tables import iter_table_rows

log = logging.getLogger("mlmkit")

_SENT_END = re.compile(r"(?<=[.!?])\s+")
# seconds of blank lines (a .gz file of nothing but newlines) before the log says how far it is
QUIET_LOG = 10.0


def _open_lines(path: Path, max_bytes: int | None = MAX_RECORD_BYTES) -> Iterator[tuple[int, str]]:
    """(line number, text) for each line of a .txt/.txt.gz/.jsonl file, read (and inflated) a line at
    a time; bad UTF-8 names the line, a damaged .gz file the file and the line it broke at, and a
    line of more than ``max_bytes`` (the record ceiling; a small .gz file that inflates to one
    endless line) the line, as soon as the ceiling is passed: nothing is inflated whole. A run of
    empty lines comes as its first alone (a blank line ends a document: more say nothing more), read
    past a buffer at a time (gigabytes of newlines inflated from a small .gz file: ~110k lines/s
    read a line at a time); the line numbers count them all. A long run is not silent: every QUIET_LOG
    seconds the log says how far it is, in lines, in text inflated and in the file read."""
    raw = gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
    size = path.stat().st_size
    n = blank = text = 0
    shown = time.monotonic()
    try:
        with raw as f:
            lines = bounded_lines(f, max_bytes)
            while (b := next(lines, b"")) != b"":
                n += 1
                if b is None:
                    raise DataFormatError(path, f"a line of more than {max_bytes:,} bytes (the record "
                                                "ceiling)", line=n,
                                          hint="one sentence per line (a blank line between documents), or "
                                               "one document per JSON line")
                text += len(b)
                end = len(b) - b.endswith(b"\n")
                if end and b[end - 1] == 13:  # \r
                    end -= 1
                try:  # from a view: the line end is not copied off a long line
                    line = str(memoryview(b)[:end], "utf-8")
                except UnicodeDecodeError as e:
                    raise DataFormatError(
                        path, f"bytes that are not UTF-8 at column {e.start + 1}", line=n,
                        hint="re-encode the file as UTF-8"
                    ) from None
                del b
                if line and not line.isspace():
                    blank = 0
                    yield n, line
                    continue
                blank += 1
                yield n, line
                while True:  # the empty lines after it, a buffer at a time
                    head = f.peek(1 << 16)[: 1 << 16]
                    run = head[: len(head) - len(head.lstrip(b"\r\n"))]
                    run = run[: run.rfind(b"\n") + 1]  # whole lines only
                    if not run:
                        break
                    f.read(len(run))
                    k = run.count(b"\n")
                    n, blank, text = n + k, blank + k, text + len(run)
                    if time.monotonic() - shown >= QUIET_LOG:
                        shown = time.monotonic()
                        # typeshed types a GzipFile's fileobj as protocols without tell(); gzip.open(path)
                        # holds a file
                        at = (f.fileobj if isinstance(f, gzip.GzipFile) else f).tell()  # type: ignore[union-attr]
                        log.info("%s: line %s, the last %s of them blank (%.0f MB of text; %.0f of the "
                                 "file's %.0f MB read)",
                                 path, f"{n:,}", f"{blank:,}", text / 1e6, at / 1e6, size / 1e6)
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        what = ("ends early: the file is truncated" if isinstance(e, EOFError)
                else f"is not valid gzip data ({e})")
        raise DataFormatError(path, f"the compressed stream {what}", line=n + 1 if n else None,
                              hint="re-create the .gz file, or give the uncompressed text") from None


class DocumentPart(list):
    """Sentences of a document that goes on in what iter_documents yields next (``parts``)."""


# characters of sentences tokenized together (with the batch's count): 4M, ~100 MB of encodings
PENDING_CHARS = 1 << 22
DOCUMENT_PART = 1 << 16  # sentences: a longer .txt document is yielded in parts (with ``parts``)


def iter_documents(path: str | Path, text_column: str = "text", parts: bool = False,
                   max_bytes: int | None = MAX_RECORD_BYTES) -> Iterator[list[str]]:
    """Yield each document of a corpus file as its list of sentences. A .jsonl line or a .parquet row
    is one document, its ``text_column`` split on newlines (or on sentence ends when it has none).
    ``parts``: a .txt document of more than DOCUMENT_PART sentences or PENDING_CHARS characters (a
    file without blank lines is one document) comes in parts, each but the last a DocumentPart (the
    last may be empty), so that memory never holds a whole long document."""
    p = Path(path)
    if not p.is_file():
        raise MlmkitError(f"corpus file not found: {p}", "check the path")
    if p.suffix.lower() == ".parquet":
        yield from _parquet_documents(p, text_column, max_bytes=max_bytes)
        return
    is_jsonl = p.name.endswith((".jsonl", ".jsonl.gz"))
    doc: list[str] = []
    chars, continued = 0, False
    for n, line in _open_lines(p, max_bytes):
        if is_jsonl:
            if not line or line.isspace():
                continue
            try:
                text = parse_json(line)[text_column]
            except json.JSONDecodeError as e:  # a lone surrogate and a 5,000-digit integer too
                raise DataFormatError(p, f"malformed JSON ({e.msg})", line=n,
                                      hint="one JSON object per line") from None
            except (KeyError, TypeError, IndexError):
                raise DataFormatError(p, "missing", line=n, field=text_column,
                                      hint=f'each line needs {{"{text_column}": ...}} (or pass '
                                           '--text-column)') from None
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


def _text_sentences(text: Any, p: Path, n: int | None, field: str, unit: str = "line") -> list[str]:
    """The sentences of a document's text; a value that is no string is an error naming its ``line``
    (a table's row: ``unit``)."""
    if not isinstance(text, str):
        raise DataFormatError(p, "must be a string", line=n, field=field, unit=unit)
    parts = [s.strip() for s in (text.splitlines() if "\n" in text else _SENT_END.split(text))]
    return [s for s in parts if s]


def _parquet_documents(p: Path, text_column: str, rows: int = 4096, *,
                       max_bytes: int | None = MAX_RECORD_BYTES) -> Iterator[list[str]]:
    """A document per row of a Parquet file (a null text is no document); ``line`` is the row. Read
    through the one table reader (text/tables.py): only the text column, a batch of rows at a time,
    and a value over the record ceiling is an error naming its row, never read whole."""
    for r in iter_table_rows(p, rows, max_bytes=max_bytes, columns=[text_column],
                             column_hint="name the text column with --text-column",
                             ceiling_hint="one document per row: split a longer one over several rows"):
        text = r.data[text_column]
        parts = _text_sentences(text, p, r.line, text_column, r.unit) if text is not None else []
        if parts:
            yield parts


CORPUS_SUFFIXES = (".txt", ".txt.gz", ".jsonl", ".jsonl.gz", ".parquet")


def corpus_files(specs: Sequence[str | Path]) -> list[Path]:
    """The files corpus arguments name, in order: a file; a directory (its corpus files, sorted:
    .txt, .txt.gz, .jsonl, .jsonl.gz, .parquet); or a glob pattern ('shards/*.parquet', sorted)."""
    return [f for spec in specs
            for f in matching_files(spec, CORPUS_SUFFIXES, kind="corpus", hint="check the corpus path")]


def iter_sentences(paths: Sequence[str | Path], text_column: str = "text",
                   max_bytes: int | None = MAX_RECORD_BYTES) -> Iterator[str]:
    for p in corpus_files(paths):
        for doc in iter_documents(p, text_column, max_bytes=max_bytes):
            yield from doc
