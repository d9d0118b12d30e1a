"""Batch inputs and outputs, streamed: inputs are read a record at a time from .txt / .jsonl / .csv /
.tsv / .parquet files, directories or globs of them, or stdin; results go to JSON lines, CSV/TSV
(a job's output), a .npy matrix (one vector per result) or Parquet, by the output's suffix. Memory never holds a whole input.

No torch here. Parquet needs pyarrow (`pip install 'mlmkit[parquet]'`).
"""

from __future__ import annotations

import csv
import glob
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import numpy as np

from .errors import ConfigError, DataFormatError
from .files import atomic_open, atomic_write, json_line, parse_json
from .taskkit import Record, data_format, iter_records, iter_table_rows

Write = Callable[[Sequence[dict[str, Any]]], None]
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


def iter_inputs(spec: str | Path, *, skip: bool = False) -> Iterator[Item]:
    """The records of every file --input names, in order, read as they are needed."""
    for f in input_files(spec):
        if f.suffix.lower() == ".parquet":
            yield from iter_table_rows(f)
        else:
            yield from iter_records(f, data_format(f, {s: s.lstrip(".") for s in INPUTS if s != ".parquet"}), skip=skip)


def stdin_inputs(stream: IO[str] | None = None, *, skip: bool = False) -> Iterator[Item]:
    """Inputs piped on stdin, read line by line: JSON lines when the first non-blank line is a JSON
    object or string (then every line must be one: a bad line is an error naming it, never a reason
    to read them all as text), else text lines."""
    stream = stream or sys.stdin
    as_json = None
    for n, raw in enumerate(stream, start=1):
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        if as_json is None:
            as_json = _json_value(line)
        if not as_json:
            yield Record("<stdin>", n, line)
            continue
        try:
            value = parse_json(line)
            err = None if isinstance(value, (str, dict)) else f"expected an object or a string, got {type(value).__name__}"
        except json.JSONDecodeError as e:
            err = f"malformed JSON ({e.msg} at column {e.colno})"
        if err is None:
            yield Record("<stdin>", n, value)
            continue
        bad = DataFormatError("<stdin>", err, line=n, hint="the first line is JSON, so every line must be; or pipe plain text lines")
        if not skip:
            raise bad
        yield bad


def _json_value(line: str) -> bool:
    """Whether a line is a JSON object or string (a text that merely starts with a quote is not)."""
    try:
        return isinstance(parse_json(line), (str, dict))
    except json.JSONDecodeError:
        return False


def identity(files: Sequence[Path]) -> list[list[Any]]:
    """What a resumed job must find unchanged of its inputs: path, size, modification time."""
    return [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files]


# ---- outputs --------------------------------------------------------------------------------------

@contextmanager
def result_writer(path: Path) -> Iterator[Write]:
    """A function that writes one chunk of results at a time to ``path``; ``path`` is replaced when
    the block completes, never before (an error midway leaves what was there)."""
    suffix = path.suffix.lower()
    if suffix == ".npy":
        yield from _npy(path)
    elif suffix == ".parquet":
        yield from _parquet(path)
    else:
        with atomic_open(path) as f:
            yield lambda results: f.write("".join(map(json_line, results)))


def vector(result: dict[str, Any]) -> list[float]:
    """The one field of a result that is a list of numbers (an embedding): what a .npy row holds."""
    found = [v for v in result.values() if isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v)]
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


def _parquet(path: Path) -> Iterator[Write]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("--output .parquet needs pyarrow", "pip install 'mlmkit[parquet]'") from None
    state: dict[str, Any] = {}

    def write(results: Sequence[dict[str, Any]]) -> None:
        if not results:
            return
        if "writer" not in state:  # the schema of the first chunk: every field, in order
            state["fields"] = list(dict.fromkeys(k for r in results for k in r))
            state["tmp"] = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        table = pa.table({k: [parquet_value(r.get(k)) for r in results] for k in state["fields"]})
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


def parquet_value(v: Any) -> Any:
    """A Parquet cell: numbers, strings, booleans and lists of numbers as they are; anything nested as JSON text."""
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    if isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        return [float(x) for x in v]
    return json.dumps(v, ensure_ascii=False)
