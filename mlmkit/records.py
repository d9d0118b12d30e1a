"""Where results go: JSON lines, a .npy matrix (one vector per result) or Parquet, by the output's
suffix; written as chunks of results come, and put in place only when the job completes.

No torch here. Parquet needs pyarrow (`pip install 'mlmkit[parquet]'`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ConfigError
from .files import atomic_open, atomic_write, json_line

Write = Callable[[Sequence[dict[str, Any]]], None]
WRITERS = (".jsonl", ".json", ".npy", ".parquet")


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
        table = pa.table({k: [_cell(r.get(k)) for r in results] for k in state["fields"]})
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


def _cell(v: Any) -> Any:
    """A Parquet cell: numbers, strings, booleans and lists of numbers as they are; anything nested as JSON text."""
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    if isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        return [float(x) for x in v]
    return json.dumps(v, ensure_ascii=False)
