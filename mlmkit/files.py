"""Atomic, umask-respecting file writes and JSON / JSON-lines I/O. No torch: everything uses these.

Every write goes to a temporary name in the target's directory and is renamed over the target, so
a process killed mid-write leaves the previous file intact and a reader never sees half a file.
``tempfile.mkstemp`` creates its file with mode 0600 whatever the umask; the file gets the mode an
ordinary ``open(path, "w")`` would have given it (0666 minus the umask) before it is renamed into
place, so an exported bundle is as readable as any other file the user writes.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from .errors import ConfigError


def _umask() -> int:
    mask = os.umask(0)  # the only portable way to read the umask is to set it; put it straight back
    os.umask(mask)
    return mask


@contextmanager
def _replacing(path: Path) -> Iterator[str]:
    """A temporary path beside ``path`` that replaces it when the block completes (never on an error)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write(path: str | Path, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)``, then rename tmp_path over ``path``; on any failure ``path`` is untouched
    and the temporary file is removed."""
    with _replacing(Path(path)) as tmp:
        write(tmp)


@contextmanager
def atomic_open(path: str | Path) -> Iterator[IO[str]]:
    """A UTF-8 text stream that replaces ``path`` when the block completes: output can be written as it
    is produced, yet an error midway leaves the previous file as it was."""
    with _replacing(Path(path)) as tmp, open(tmp, "w", encoding="utf-8") as f:
        yield f


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_open(path) as f:
        f.write(text)


def write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: str | Path) -> dict[str, Any]:
    """A JSON object from ``path``; a missing, unreadable or non-object file is a ConfigError naming it."""
    p = Path(path)
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{p} not found", "is this a run directory or bundle written by mlmkit?") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: corrupted JSON ({e})", "re-create it with mlmkit") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{p}: expected a JSON object, found {type(obj).__name__}", "re-create it with mlmkit")
    return obj


def json_line(record: dict[str, Any]) -> str:
    """One JSON-lines row: UTF-8 kept as is (no \\u escapes), newline-terminated."""
    return json.dumps(record, ensure_ascii=False) + "\n"


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    """JSON lines, written atomically: the file appears complete or not at all."""
    with atomic_open(path) as f:
        for r in rows:
            f.write(json_line(r))
