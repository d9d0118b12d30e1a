"""Readers of every data format, streaming, with file/line errors: .txt (one text per non-blank line),
.jsonl (one JSON value per line), .csv (RFC 4180, a header first), .tsv (a header first, no quoting: a
quote is just a character, the GLUE convention), and tables: Parquet files and `datasets` directories,
read a batch of rows at a time with the fields of a JSON-lines file. Each record knows its file and
first line (or row), so ``record.error("...", field="label")`` names both. Task plugins, batch inputs,
fine-tuning data and pretraining corpora all read through here. No torch.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload

from mlmkit.errors import ConfigError, DataFormatError
from mlmkit.files import MAX_RECORD_BYTES, bounded_lines, parse_json

FORMATS = {".txt": "txt", ".jsonl": "jsonl", ".csv": "csv", ".tsv": "tsv"}
FIELD_LIMIT = 1 << 30  # characters in one CSV field (the csv module's 131,072 would reject a long text)


@dataclass(frozen=True)
class Record:
    """One record of a data file: a dict (JSON object, CSV/TSV row) or a str (text line, JSON string)."""

    source: str
    line: int | None
    """The record's first line in its file, counting from 1 (None for an input that has no file)."""
    data: Any
    columns: tuple[str, ...] | None = None
    """The header of a CSV/TSV file."""
    header_line: int | None = None

    unit: str = "line"
    """What ``line`` counts: "line" in text files, "row" in Parquet files and `datasets` directories."""
    schema: Any = field(default=None, compare=False, repr=False)
    """The Arrow schema of the table a Parquet or `datasets` row comes from: the types of its values."""

    def error(self, message: str, field: str | None = None, hint: str | None = None) -> DataFormatError:
        return DataFormatError(self.source, message, line=self.line, field=field, hint=hint, unit=self.unit)

    def fields(self) -> dict[str, Any]:
        """The record as a dict; anything else (a JSON list, a bare text) is an error."""
        if not isinstance(self.data, dict):
            raise self.error(f"expected a JSON object, got {type(self.data).__name__}",
                             hint="one JSON object per line")
        return self.data

    @overload
    def text(self, key: str, *, required: Literal[True] = ..., flag: str | None = ...) -> str: ...
    @overload
    def text(self, key: str, *, required: bool = ..., flag: str | None = ...) -> str | None: ...
    def text(self, key: str, *, required: bool = True, flag: str | None = None) -> str | None:
        """The non-empty string field ``key``; None when it is absent (or null) and not ``required``.
        ``flag`` is the option that renames the field, named in the hint."""
        data = self.fields()
        value = data.get(key)
        if value is None:
            if not required:
                return None
            hint = f"name it with {flag}" if flag else None
            if key in data:  # there, and null (a Parquet or datasets row, JSON's null)
                raise self.error("its value is null", key, "give it a value, or leave the record out")
            if self.columns is None:
                raise self.error(f"no field '{key}'; the record has: {', '.join(data) or 'nothing'}", key,
                                 hint)
            if key in self.columns:
                raise self.error(f"the row has {len(data)} fields and ends before this column", key,
                                 "every row needs as many fields as the header")
            raise DataFormatError(self.source, f"no column '{key}'; the header has: "
                                               f"{', '.join(self.columns) or 'nothing'}",
                                  line=self.header_line, field=key, hint=hint)
        if not isinstance(value, str):
            raise self.error(f"must be a string, not {type(value).__name__}", key)
        if not value.strip():
            raise self.error("empty text", key, "remove the record or fill in its text")
        return value

    def line_text(self, key: str) -> str:
        """A text file's line as it is (one text a line), or a record's non-empty string field ``key``."""
        if isinstance(self.data, str):
            if not self.data.strip():
                raise self.error("empty text", hint="remove the line or fill in its text")
            return self.data
        return self.text(key)


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


# ---- tables: Parquet files and `datasets` directories, read as JSON lines are -------------------


def is_table(path: str | Path) -> bool:
    """Whether ``path`` is a Parquet file or a directory saved by `datasets` (``save_to_disk``): record
    sources with the fields of a JSON-lines file, which ``iter_jsonl`` reads as it reads JSON lines."""
    p = Path(path)
    if p.is_dir():
        return (p / "state.json").is_file() or (p / "dataset_dict.json").is_file()
    return p.suffix.lower() == ".parquet"


@overload
def iter_table_rows(path: str | Path, rows: int = ..., *, skip: Literal[False] = ...,
                    max_bytes: int | None = ...,
                    columns: Sequence[str] | None = ..., column_hint: str = ..., ceiling_hint: str = ...,
                    ) -> Iterator[Record]: ...
@overload
def iter_table_rows(path: str | Path, rows: int = ..., *, skip: bool = ..., max_bytes: int | None = ...,
                    columns: Sequence[str] | None = ..., column_hint: str = ..., ceiling_hint: str = ...,
                    ) -> Iterator[Record | DataFormatError]: ...
def iter_table_rows(path: str | Path, rows: int = 1024, *, skip: bool = False,
                    max_bytes: int | None = MAX_RECORD_BYTES,
                    columns: Sequence[str] | None = None, column_hint: str = "check the column names",
                    ceiling_hint: str = "raise --max-record-bytes; --on-error skip steps over it",
                    ) -> Iterator[Record | DataFormatError]:
    """A record {column: value} per row of a Parquet file or `datasets` directory, read a batch of
    ``rows`` at a time (never the whole table); ``line`` is the row number, from 1, and ``schema``
    the table's Arrow schema. A row with a text or binary value of more than ``max_bytes`` is a bad
    record (with ``skip``: its DataFormatError, in its place). ``columns``: read only these (a
    pretraining corpus reads its text column alone); one the table lacks is an error naming the
    columns it has, with ``column_hint``; ``ceiling_hint`` says what to do about a value over the ceiling."""
    p = Path(path)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(f"{p}: reading Parquet and datasets directories needs pyarrow",
                          "pip install 'mlmkit[parquet]'") from None
    if p.is_dir():
        sources = _dataset_files(p)
    elif p.is_file():
        sources = [p]
    else:
        raise DataFormatError(p, "file not found", hint="check the path")
    n = 0
    for src in sources:
        try:
            if src.suffix.lower() == ".parquet":
                # pre-buffering kept every row group read, not one at a time
                pf = pq.ParquetFile(src, pre_buffer=False)
                _has_columns(p, pf.schema_arrow.names, columns, column_hint)
                batches = pf.iter_batches(batch_size=rows,
                                          columns=list(columns) if columns is not None else None)
            else:
                batches = _arrow_batches(pa, src)
            for batch in batches:
                if columns is not None and src.suffix.lower() != ".parquet":
                    _has_columns(p, batch.schema.names, columns, column_hint)
                    batch = batch.select(list(columns))
                big = _oversized(pa, batch, max_bytes)
                for i, row in enumerate(batch.to_pylist() if not big else _rows_but(batch, big)):
                    n += 1
                    if i in big:
                        err = DataFormatError(p, f"a value of more than {max_bytes:,} bytes (the record "
                                                 "ceiling)", line=n,
                                              field=big[i], unit="row", hint=ceiling_hint)
                        if not skip:
                            raise err
                        yield err
                        continue
                    yield Record(str(p), n, row, unit="row", schema=batch.schema)
        except (OSError, ValueError, pa.ArrowException) as e:  # ArrowInvalid is a ValueError, not an OSError
            detail = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
            raise DataFormatError(src, "not a readable "
                                       f"{'Parquet' if src.suffix.lower() == '.parquet' else 'Arrow'} "
                                       f"file ({detail})", hint="check the file, or write it again") from None


def _has_columns(p: Path, names: Sequence[str], wanted: Sequence[str] | None, hint: str) -> None:
    for c in wanted or ():
        if c not in names:
            raise DataFormatError(p, f"no column '{c}' (the columns: {', '.join(names)})", hint=hint)


def _oversized(pa: Any, batch: Any, max_bytes: int | None) -> dict[int, str]:
    """{row in the batch: its first column} for rows whose text or binary value exceeds ``max_bytes``
    (found from the Arrow offsets, before any value becomes a Python object)."""
    import pyarrow.compute as pc

    found: dict[int, str] = {}
    if max_bytes is None:
        return found
    for name, col in zip(batch.schema.names, batch.columns):
        t = col.type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t)):
            continue
        if col.nbytes <= max_bytes:
            continue
        lengths = pc.binary_length(col).to_numpy(zero_copy_only=False)
        for i in (lengths > max_bytes).nonzero()[0].tolist():
            found.setdefault(i, name)
    return found


def _rows_but(batch: Any, left_out: dict[int, str]) -> Iterator[dict[str, Any] | None]:
    """The rows of a batch as dicts, one at a time, None for those ``left_out`` (never made Python
    objects)."""
    for i in range(batch.num_rows):
        yield None if i in left_out else batch.slice(i, 1).to_pylist()[0]


def _arrow_batches(pa: Any, path: Path) -> Iterator[Any]:
    """The record batches of an Arrow file as `datasets` writes them (the IPC stream format; the file
    format too), memory-mapped."""
    source = pa.memory_map(str(path))
    try:
        reader = pa.ipc.open_stream(source)
    except pa.ArrowInvalid:
        file_reader = pa.ipc.open_file(source)
        yield from (file_reader.get_batch(i) for i in range(file_reader.num_record_batches))
        return
    yield from reader


def _dataset_files(d: Path) -> list[Path]:
    """The Arrow files of a directory saved by ``datasets.Dataset.save_to_disk``, in order."""
    if (d / "dataset_dict.json").is_file() and not (d / "state.json").is_file():
        try:
            splits = parse_json((d / "dataset_dict.json").read_text(encoding="utf-8")).get("splits", [])
        except (OSError, ValueError, AttributeError):
            splits = []
        raise DataFormatError(d, f"a DatasetDict directory ({', '.join(map(str, splits)) or 'no splits'}), "
                                 "not one split",
                              hint="pass the split's directory, e.g. "
                              + " or ".join(str(d / s) for s in splits[:2]) if splits
                              else "pass a split's directory")
    try:
        state = parse_json((d / "state.json").read_text(encoding="utf-8"))
        files = [d / f["filename"] for f in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataFormatError(d / "state.json", f"not a datasets state file ({type(e).__name__}: {e})",
                              hint="save the dataset again with save_to_disk") from None
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise DataFormatError(missing[0], "missing: state.json lists it",
                              hint="save the dataset again with save_to_disk")
    return files


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
