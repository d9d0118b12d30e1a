"""Batch inputs and outputs, streamed: inputs are read a record at a time from .txt / .jsonl / .csv /
.tsv / .parquet files, directories or globs of them, or stdin; results go to JSON lines, CSV/TSV
(a job's output), a .npy matrix (one vector per result) or Parquet, by the output's suffix. Memory never holds
a whole input.

No torch here. Parquet needs pyarrow (`pip install 'mlmkit[parquet]'`).
"""

from __future__ import annotations

import csv
import datetime
import decimal
import glob
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Literal, TypedDict, overload

import numpy as np

from mlmkit.errors import ConfigError, DataFormatError
from mlmkit.files import (
    MAX_RECORD_BYTES,
    JSONDataError,
    JSONObject,
    atomic_open,
    atomic_write,
    bounded_lines,
    json_line,
    parse_json,
)
from mlmkit.text.readers import data_format, iter_records, too_long
from mlmkit.text.record import Record
from mlmkit.text.tables import iter_table_rows

Write = Callable[[Sequence[JSONObject]], None]
"""Writes one chunk of results (result_writer)."""
INPUTS = (".txt", ".jsonl", ".csv", ".tsv", ".parquet")
Item = Record | DataFormatError
"""An input record, or (with ``skip``) the error of a bad one, in its place."""


# ---- inputs ---------------------------------------------------------------------------------------
def input_files(spec: str | Path) -> list[Path]:
    """The files an --input names: a file, a directory (its files of a known kind, sorted), or a glob
    pattern ('shards/*.parquet', sorted)."""
    return matching_files(spec, INPUTS, kind="input", hint="check the --input path")


def matching_files(spec: str | Path, suffixes: Sequence[str], *, kind: str, hint: str) -> list[Path]:
    """The files ``spec`` names: a file; a directory (its files whose names end with one of
    ``suffixes``, not hidden, sorted); or a glob pattern (sorted). Nothing: a DataFormatError
    naming the ``kind`` of file wanted, with ``hint``."""
    p = Path(spec)
    if p.is_file():
        return [p]
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and f.name.lower().endswith(tuple(suffixes))
                       and not f.name.startswith("."))
        if not files:
            raise DataFormatError(p, f"a directory without {kind} files ({', '.join(suffixes)})", hint=hint)
        return files
    if any(c in str(spec) for c in "*?["):
        files = sorted(Path(x) for x in glob.glob(str(spec)) if Path(x).is_file())
        if not files:
            raise DataFormatError(str(spec), "no file matches this pattern", hint=hint)
        return files
    raise DataFormatError(p, "file not found", hint=hint)


@overload
def iter_inputs(spec: str | Path, *, skip: Literal[False] = ...,
                max_bytes: int | None = ...) -> Iterator[Record]: ...
@overload
def iter_inputs(spec: str | Path, *, skip: bool = ..., max_bytes: int | None = ...) -> Iterator[Item]: ...
def iter_inputs(spec: str | Path, *, skip: bool = False,
                max_bytes: int | None = MAX_RECORD_BYTES) -> Iterator[Item]:
    """The records of every file --input names, in order, read as they are needed; a record of more
    than ``max_bytes`` (the record ceiling) is a bad record."""
    for f in input_files(spec):
        if f.suffix.lower() == ".parquet":
            yield from iter_table_rows(f, skip=skip, max_bytes=max_bytes)
        else:
            yield from iter_records(f, data_format(f, {s: s.lstrip(".") for s in INPUTS if s != ".parquet"}),
                                    skip=skip,
                                    max_bytes=max_bytes)


# what a text stream decoded with errors="surrogateescape" makes of bad bytes
_SURROGATE = re.compile("[\ud800-\udfff]")


def _stdin_lines(stream: IO[str], max_bytes: int | None) -> Iterator[tuple[int, str | DataFormatError]]:
    """(number, line without its end) of each line of ``stream``, read from its bytes where it has
    them (sys.stdin): a line that is not UTF-8, or longer than ``max_bytes`` (never read whole),
    comes as its DataFormatError."""
    raw = getattr(stream, "buffer", None)
    if raw is not None:
        for n, b in enumerate(bounded_lines(raw, max_bytes), start=1):
            if b is None:
                yield n, too_long("<stdin>", n, max_bytes or 0)
                continue
            try:
                yield n, b.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                yield n, DataFormatError("<stdin>",
                                         f"not valid UTF-8 (byte 0x{b[e.start]:02x} at column {e.start + 1})",
                                         line=n, hint="pipe UTF-8 text")
        return
    n = 0
    while True:  # a text stream: the ceiling in characters
        line = stream.readline(max_bytes + 1) if max_bytes is not None else stream.readline()
        if not line:
            return
        n += 1
        if max_bytes is not None and len(line) > max_bytes and not line.endswith("\n"):
            while line and not line.endswith("\n"):
                line = stream.readline(1 << 20)
            yield n, too_long("<stdin>", n, max_bytes)
            continue
        line = line.rstrip("\r\n")
        if not line.isascii() and _SURROGATE.search(line):
            yield n, DataFormatError("<stdin>", "not valid UTF-8", line=n, hint="pipe UTF-8 text")
            continue
        yield n, line


@overload
def stdin_inputs(stream: IO[str] | None = ..., *, skip: Literal[False] = ...,
                 max_bytes: int | None = ...) -> Iterator[Record]: ...
@overload
def stdin_inputs(stream: IO[str] | None = ..., *, skip: bool = ...,
                 max_bytes: int | None = ...) -> Iterator[Item]: ...
def stdin_inputs(stream: IO[str] | None = None, *, skip: bool = False,
                 max_bytes: int | None = MAX_RECORD_BYTES) -> Iterator[Item]:
    """Inputs piped on stdin, read line by line: JSON lines when the first non-blank line is a JSON
    object or string (then every line must be one: a bad line is an error naming it, never a reason
    to read them all as text), else text lines. A line that is not UTF-8 or is longer than
    ``max_bytes`` is a bad record (``skip``: its error, in its place)."""
    stream = stream or sys.stdin
    as_json = None
    for n, line in _stdin_lines(stream, max_bytes):
        if isinstance(line, DataFormatError):
            if not skip:
                raise line
            yield line
            continue
        if not line or line.isspace():
            continue
        if as_json is None:
            as_json = _json_value(line)
        if not as_json:
            yield Record("<stdin>", n, line)
            continue
        try:
            value = parse_json(line)
            err = (None if isinstance(value, (str, dict))
                   else f"expected an object or a string, got {type(value).__name__}")
        except json.JSONDecodeError as e:
            err = f"malformed JSON ({e.msg} at column {e.colno})"
        if err is None:
            yield Record("<stdin>", n, value)
            continue
        bad = DataFormatError("<stdin>", err, line=n,
                              hint="the first line is JSON, so every line must be; or pipe plain text lines")
        if not skip:
            raise bad
        yield bad


def _json_value(line: str) -> bool:
    """Whether a line is a JSON object or string (a text that merely starts with a quote is not)."""
    try:
        return isinstance(parse_json(line), (str, dict))
    except JSONDataError:  # JSON, holding a lone surrogate or a huge integer: a bad record, not a text
        return line.lstrip().startswith(("{", '"'))
    except json.JSONDecodeError:
        return False


def identity(files: Sequence[Path]) -> list[list[Any]]:
    """What a resumed job must find unchanged of its inputs: path, size, modification time."""
    return [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files]


# ---- outputs --------------------------------------------------------------------------------------

@contextmanager
def result_writer(path: Path, types: Mapping[str, Any] | None = None) -> Iterator[Write]:
    """A function that writes one chunk of results at a time to ``path``; ``path`` is replaced when
    the block completes, never before (an error midway leaves what was there). ``types``: fields
    carried as they are (an id column) into Parquet, with their Arrow type (None: inferred)."""
    suffix = path.suffix.lower()
    if suffix == ".npy":
        yield from _npy(path)
    elif suffix == ".parquet":
        yield from _parquet(path, types or {})
    else:
        with atomic_open(path) as f:
            def write(results: Sequence[JSONObject]) -> None:
                f.write("".join(map(json_line, results)))

            yield write


def vector(result: Mapping[str, Any]) -> list[float]:
    """The one field of a result that is a list of numbers (an embedding): what a .npy row holds."""
    found = [v for v in result.values() if isinstance(v, list) and v
             and all(isinstance(x, (int, float)) for x in v)]
    if len(found) != 1:
        raise ConfigError("--output .npy needs results with exactly one vector (an embedding bundle's)",
                          "write .jsonl or .parquet for these results")
    return found[0]


def _npy(path: Path) -> Iterator[Write]:
    rows: list[np.ndarray] = []
    yield lambda results: rows.extend(np.asarray(vector(r), dtype=np.float32) for r in results)
    matrix = np.stack(rows) if rows else np.zeros((0, 0), dtype=np.float32)  # (inputs, dims) in input order

    def save(tmp: str) -> None:
        with open(tmp, "wb") as f:  # a file object: np.save would add ".npy" to a name
            np.save(f, matrix)

    atomic_write(path, save)


class _ParquetState(TypedDict, total=False):
    """A Parquet output being written: its fields (the first chunk's), the temporary file, the writer."""

    fields: list[str]
    tmp: Path
    writer: Any  # pyarrow.parquet.ParquetWriter


def _parquet(path: Path, types: Mapping[str, Any]) -> Iterator[Write]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("--output .parquet needs pyarrow", "pip install 'mlmkit[parquet]'") from None
    state: _ParquetState = {}

    def write(results: Sequence[JSONObject]) -> None:
        if not results:
            return
        if "writer" not in state:  # the schema of the first chunk: every field, in order
            state["fields"] = list(dict.fromkeys(k for r in results for k in r))
            state["tmp"] = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        table = pa.table({k: carried_array([r.get(k) for r in results], types[k]) if k in types
                          else [parquet_value(r.get(k)) for r in results] for k in state["fields"]})
        if "writer" not in state:
            state["writer"] = pq.ParquetWriter(str(state["tmp"]), table.schema)
        state["writer"].write_table(table.cast(state["writer"].schema))

    try:
        yield write
        if "writer" in state:
            state.pop("writer").close()
            atomic_write(path, lambda tmp: os.replace(state["tmp"], tmp))
        else:
            atomic_write(path, lambda tmp: pq.write_table(pa.table({}), tmp))
    finally:
        if "writer" in state:  # an error midway: the partial file goes
            state.pop("writer").close()
        if "tmp" in state:
            Path(state["tmp"]).unlink(missing_ok=True)


def write_table_text(parts: Sequence[Path], path: str | Path, delimiter: str) -> None:
    """JSON-lines part files as one CSV (or TSV) file: a header of every field met, in order of first
    appearance (a first pass over the parts), then a row per result; nested values as JSON text."""
    fields: dict[str, None] = {}
    for p in parts:
        with open(p, encoding="utf-8") as f:
            for line in f:
                fields.update(dict.fromkeys(json.loads(line)))
    with open(path, "w", encoding="utf-8", newline="") as out:
        w = csv.writer(out, delimiter=delimiter)
        w.writerow(fields)
        for p in parts:
            with open(p, encoding="utf-8") as f:
                for line in f:
                    r = json.loads(line)
                    w.writerow("" if r.get(k) is None else _cell(r[k]) for k in fields)


def _cell(v: Any) -> Any:
    return v if isinstance(v, (str, int, float, bool)) else json.dumps(v, ensure_ascii=False)


def carried_array(values: Sequence[Any], arrow_type: Any) -> Any:
    """The Arrow array of a carried column (an id): with ``arrow_type`` (the input's), else the type
    its values have (nested ones included). Raises ArrowInvalid, ArrowTypeError or OverflowError
    for values that have none in common, or that are not of ``arrow_type``."""
    import pyarrow as pa

    if arrow_type is None:
        return pa.array(values)
    if pa.types.is_float16(arrow_type):  # Python floats do not convert to it directly
        return pa.array(values, type=pa.float32()).cast(arrow_type)
    return pa.array(values, type=arrow_type)


_PARQUET_SCALARS = (str, int, float, bool, bytes, datetime.date, datetime.time, datetime.timedelta,
                    decimal.Decimal)


def parquet_value(v: Any) -> Any:
    """A Parquet cell: numbers, strings, booleans, binary, temporal values, decimals, lists of
    numbers (an embedding), lists of such lists (token vectors) and lists of records of numbers and
    lists of numbers (embed --chunk-tokens's chunks: their spans and vectors) as they are; anything
    else nested as JSON text."""
    if v is None or isinstance(v, _PARQUET_SCALARS):
        return v
    if _numbers(v):
        return [float(x) for x in v]
    if isinstance(v, list) and v and all(_numbers(x) for x in v):
        return [[float(x) for x in row] for row in v]
    if isinstance(v, list) and v and all(isinstance(x, dict) and x
                                         and all(_numbers(y) or _numbers([y]) for y in x.values())
                                         for x in v):
        return [{k: [float(z) for z in y] if isinstance(y, list) else y for k, y in x.items()} for x in v]
    return json.dumps(v, ensure_ascii=False)


def _numbers(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
