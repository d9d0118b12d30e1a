"""Readers of every data format, streaming, with file/line errors: .txt (one text per non-blank line),
.jsonl (one JSON value per line), .csv (RFC 4180, a header first), .tsv (a header first, no quoting: a
quote is just a character, the GLUE convention), and tables (Parquet files and `datasets` directories,
text/tables.py), read with the fields of a JSON-lines file. Each record (text/record.py) knows its file
and first line (or row), so ``record.error("...", field="label")`` names both. Task plugins, batch
inputs, fine-tuning data and pretraining corpora all read through here. No torch.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal, overload

from mlmkit.errors import ConfigError, DataFormatError
from mlmkit.files import MAX_RECORD_BYTES, bounded_lines, parse_json
from mlmkit.text.record import Record
from mlmkit.text.tables import is_table, iter_table_rows

FORMATS = {".txt": "txt", ".jsonl": "jsonl", ".csv": "csv", ".tsv": "tsv"}
FIELD_LIMIT = 1 << 30  # characters in one CSV field (the csv module's 131,072 would reject a long text)


# ---- reading -----------------------------------------------------------------------------------
def numbered(fields: Iterable[str], prefix: str) -> list[str]:
    """The fields PREFIX_1, PREFIX_2 ... among ``fields``, by their number (negative_1, negative_2 ...
    of a mined row); PREFIX_ with no number after it is not one of them."""
    n = len(prefix) + 1
    return [k for _, k in sorted((int(k[n:]), k) for k in fields if k.startswith(prefix + "_")
                                 and k[n:].isdigit())]


def _checked(path: str | Path) -> Path:
    p = Path(path)
    if not p.is_file():
        what = "is a directory, not a data file" if p.is_dir() else "file not found"
        raise DataFormatError(p, what, hint="check the path")
    return p


def too_long(path: str | Path, n: int, max_bytes: int) -> DataFormatError:
    """The error of a line longer than the record ceiling."""
    return DataFormatError(path, f"a line of more than {max_bytes:,} bytes (the record ceiling)", line=n,
                           hint="split the record, or raise --max-record-bytes; --on-error skip steps over "
                                "it")


@overload
def _decoded(path: Path, keepends: bool = ..., skip: Literal[False] = ...,
             max_bytes: int | None = ...) -> Iterator[tuple[int, str]]: ...
@overload
def _decoded(path: Path, keepends: bool = ..., skip: bool = ...,
             max_bytes: int | None = ...) -> Iterator[tuple[int, str | DataFormatError]]: ...
def _decoded(path: Path, keepends: bool = False, skip: bool = False,
             max_bytes: int | None = MAX_RECORD_BYTES) -> Iterator[tuple[int, str | DataFormatError]]:
    """(number, line) of each line, split on \\n only (so numbers match an editor's; str.splitlines
    also splits on \\x1c, \\u2028 and friends, which may occur inside a text), decoded one at a time.
    ``skip``: a line that is not UTF-8, or longer than ``max_bytes`` (never read whole), comes as its
    DataFormatError instead of stopping the file."""
    with open(path, "rb") as f:
        for n, raw in enumerate(bounded_lines(f, max_bytes), start=1):
            if raw is None:
                err = too_long(path, n, max_bytes or 0)
                if not skip:
                    raise err
                yield n, err
                continue
            end = len(raw) if keepends else len(raw) - raw.endswith(b"\n")
            if not keepends and raw[end - 1 : end] == b"\r":
                end -= 1
            try:  # from a view: the line end is not copied off a long line
                # a spreadsheet's byte-order mark
                line = str(memoryview(raw)[:end], "utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as e:
                err = DataFormatError(path,
                                      f"not valid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})",
                                      line=n, hint="re-save the file as UTF-8")
                if not skip:
                    raise err from None
                yield n, err
                continue
            del raw
            yield n, line


def iter_lines(path: str | Path, max_bytes: int | None = MAX_RECORD_BYTES) -> Iterator[tuple[int, str]]:
    """(number, line) of every line of a UTF-8 text file, line ends removed; a line of more than
    ``max_bytes`` is a DataFormatError naming it."""
    return _decoded(_checked(path), max_bytes=max_bytes)


DOCUMENT_BYTES = 1 << 30
"""The ceiling on a file read whole as one document (SQuAD JSON: v2.0's training set is 40 MB):
parsed, a document takes several times its size in memory."""


def read_text(path: str | Path, max_bytes: int = DOCUMENT_BYTES) -> str:
    """A whole UTF-8 text file (for formats that are one document, such as SQuAD JSON), of at most
    ``max_bytes``: a larger one is a DataFormatError saying to give it as JSON lines, which are read
    a record at a time."""
    p = _checked(path)
    if p.stat().st_size > max_bytes:
        raise DataFormatError(p, f"more than {max_bytes:,} bytes in one document (what is read whole)",
                              hint="give the examples as JSON lines (.jsonl, one per line), which are read "
                                   "one at a time")
    return "".join(line for _, line in _decoded(p, keepends=True, max_bytes=max_bytes))


@overload
def iter_jsonl(path: str | Path, *, strings: bool = ..., skip: Literal[False] = ...,
               max_bytes: int | None = ...) -> Iterator[Record]: ...
@overload
def iter_jsonl(path: str | Path, *, strings: bool = ..., skip: bool = ...,
               max_bytes: int | None = ...) -> Iterator[Record | DataFormatError]: ...
def iter_jsonl(path: str | Path, *, strings: bool = False, skip: bool = False,
               max_bytes: int | None = MAX_RECORD_BYTES) -> Iterator[Record | DataFormatError]:
    """A record per non-blank line: a JSON object (or a JSON string when ``strings``). ``skip``: a bad
    line (malformed JSON, a lone surrogate, an integer of thousands of digits, a line of more than
    ``max_bytes``) comes as its DataFormatError (in its place) instead of stopping the file. A Parquet
    file or a `datasets` directory (``is_table``) gives a record per row, its columns as the fields."""
    if is_table(path):
        yield from iter_table_rows(path, skip=skip, max_bytes=max_bytes)
        return
    p = _checked(path)
    for n, line in _decoded(p, skip=skip, max_bytes=max_bytes):
        if isinstance(line, DataFormatError):
            yield line
            continue
        if not line or line.isspace():  # (no stripped copy of a long line)
            continue
        err = None
        try:
            value = parse_json(line)
        except json.JSONDecodeError as e:
            err = DataFormatError(p, f"malformed JSON ({e.msg} at column {e.colno})", line=n,
                                  hint="each line must be one JSON object")
        else:
            if not isinstance(value, dict) and not (strings and isinstance(value, str)):
                kind = "an object or a string" if strings else "a JSON object"
                err = DataFormatError(p, f"expected {kind}, got {type(value).__name__}", line=n,
                                      hint="one JSON object per line")
        del line  # the record is what is kept: a long line is not held twice
        if err is None:
            yield Record(str(p), n, value)
        elif skip:
            yield err
        else:
            raise err


@overload
def iter_table(path: str | Path, delimiter: str, *, skip: Literal[False] = ...,
               max_bytes: int | None = ...) -> Iterator[Record]: ...
@overload
def iter_table(path: str | Path, delimiter: str, *, skip: bool = ...,
               max_bytes: int | None = ...) -> Iterator[Record | DataFormatError]: ...
def iter_table(path: str | Path, delimiter: str, *, skip: bool = False,
               max_bytes: int | None = MAX_RECORD_BYTES) -> Iterator[Record | DataFormatError]:
    """A record {column: value} per non-blank row of a CSV (``delimiter`` ",") or TSV ("\\t") file
    whose first row is the header. A CSV text may span lines when quoted; TSV has no quoting.
    ``skip``: a row with too many fields, or a line of more than ``max_bytes`` (read past, an empty
    line in its place), comes as its DataFormatError instead of stopping the file (quoting that
    breaks the file's structure, or a quoted field longer than ``max_bytes``, always stops it)."""
    p = _checked(path)
    kind = "TSV" if delimiter == "\t" else "CSV"
    csv.field_size_limit(min(FIELD_LIMIT, max_bytes or FIELD_LIMIT))
    dropped: list[DataFormatError] = []  # lines over the ceiling, skipped: reported in their place

    def lines() -> Iterator[str]:
        for _, line in _decoded(p, keepends=True, skip=skip, max_bytes=max_bytes):
            if isinstance(line, DataFormatError):
                dropped.append(line)
                yield "\n"
            else:
                yield line

    reader = csv.reader(lines(), delimiter=delimiter,
                        quoting=csv.QUOTE_NONE if kind == "TSV" else csv.QUOTE_MINIMAL,
                        strict=True)
    header: tuple[str, ...] | None = None
    start = header_line = 1
    try:
        for row in reader:
            line, start = start, reader.line_num + 1  # the next record starts after this one's last line
            while dropped:
                yield dropped.pop(0)
            if not any(c.strip() for c in row):
                continue
            if header is None:
                header, header_line = tuple(c.strip() for c in row), line
                continue
            if len(row) > len(header):
                err = DataFormatError(p, f"{len(row)} fields but the header has {len(header)}", line=line,
                                      hint="quote texts that contain a comma" if kind == "CSV"
                                      else "a text contains a tab")
                if not skip:
                    raise err
                yield err
                continue
            yield Record(str(p), line, dict(zip(header, row)), header, header_line)
    except csv.Error as e:
        raise DataFormatError(p, f"malformed {kind}: {e}", line=reader.line_num) from None


def data_format(path: str | Path, formats: dict[str, str] = FORMATS) -> str:
    """The format of ``path`` by its suffix, or an error listing the known suffixes."""
    p = Path(path)
    if is_table(p) and "jsonl" in formats.values():  # read as JSON lines are: the same fields
        return "jsonl"
    fmt = formats.get(p.suffix.lower())
    if fmt is None:
        raise DataFormatError(p, f"unknown format '{p.suffix or p.name}'",
                              hint=f"use one of: {', '.join(formats)}")
    return fmt


@overload
def iter_records(path: str | Path, fmt: str | None = ..., *, skip: Literal[False] = ...,
                 max_bytes: int | None = ...) -> Iterator[Record]: ...
@overload
def iter_records(path: str | Path, fmt: str | None = ..., *, skip: bool = ...,
                 max_bytes: int | None = ...) -> Iterator[Record | DataFormatError]: ...
def iter_records(path: str | Path, fmt: str | None = None, *, skip: bool = False,
                 max_bytes: int | None = MAX_RECORD_BYTES) -> Iterator[Record | DataFormatError]:
    """Records of a .txt / .jsonl / .csv / .tsv file (``fmt`` overrides the suffix): text lines are
    str records, JSON lines objects or strings, CSV/TSV rows dicts. ``skip``: a bad record comes as
    its DataFormatError, in its place, and reading goes on. A line of more than ``max_bytes`` (the
    record ceiling, 64 MB by default) is a bad record, never read whole."""
    fmt = fmt or data_format(path)
    if fmt == "txt":
        p = _checked(path)
        return (line if isinstance(line, DataFormatError) else Record(str(p), n, line)
                for n, line in _decoded(p, skip=skip, max_bytes=max_bytes) if not isinstance(line, str)
                or (line and not line.isspace()))
    if fmt == "jsonl":
        return iter_jsonl(path, strings=True, skip=skip, max_bytes=max_bytes)
    if fmt in ("csv", "tsv"):
        return iter_table(path, "\t" if fmt == "tsv" else ",", skip=skip, max_bytes=max_bytes)
    raise ConfigError(f"unknown record format '{fmt}'", "use txt, jsonl, csv or tsv")
