"""Atomic, umask-respecting file writes and JSON / JSON-lines I/O. No torch: everything uses these.

Every write goes to a temporary name in the target's directory and is renamed over the target, so
a process killed mid-write leaves the previous file intact and a reader never sees half a file.
``tempfile.mkstemp`` creates its file with mode 0600 whatever the umask; the file gets the mode an
ordinary ``open(path, "w")`` would have given it (0666 minus the umask) before it is renamed into
place, so an exported bundle is as readable as any other file the user writes.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from .errors import ConfigError

log = logging.getLogger("mlmkit")

_WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO}  # a write that failed, whatever the file object


def _umask() -> int:
    mask = os.umask(0)  # the only portable way to read the umask is to set it; put it straight back
    os.umask(mask)
    return mask


@contextmanager
def _replacing(path: Path) -> Iterator[str]:
    """A temporary path beside ``path`` that replaces it when the block completes (never on an error).
    An OS error (a full disk, no permission) names ``path``, never the temporary file."""
    if path.is_dir():
        raise ConfigError(f"{path} is a directory", "give a file name to write to")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(path)) from e
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and (e.filename == tmp or (e.filename is None and e.errno in _WRITE_ERRORS)):
            raise OSError(e.errno, e.strerror, str(path)) from e
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


def parse_json(text: str) -> Any:
    """json.loads, where a document nested too deeply for Python's parser ("[[[[...") is malformed JSON
    like any other (json.JSONDecodeError), not a RecursionError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text[:100], 0) from None


def read_json(path: str | Path) -> dict[str, Any]:
    """A JSON object from ``path``; a missing, unreadable or non-object file is a ConfigError naming it."""
    p = Path(path)
    try:
        obj = parse_json(p.read_text(encoding="utf-8"))
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


# ---- ownership of a directory ----------------------------------------------------------------------
LOCK = ".mlmkit.lock"


@contextmanager
def exclusive(directory: str | Path) -> Iterator[None]:
    """Hold DIRECTORY/.mlmkit.lock while the block runs: a second process writing the same run or
    bundle gets a clear error naming the holder instead of interleaving its files with the first's.
    A lock left by a process that no longer runs (on this host) is taken over, with a notice; a
    process that holds the lock already may enter it again (pretraining holds it, then its Trainer)."""
    d = Path(directory)
    created = not d.exists()
    d.mkdir(parents=True, exist_ok=True)
    lock = d / LOCK
    me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    held = _holder(lock)
    if held is not None and (held.get("pid"), held.get("host")) == (me["pid"], me["host"]):
        yield  # this process holds it: the outer block releases it
        return
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        except FileExistsError:
            holder = _holder(lock)
            if holder is None and _age(lock) < 5.0:  # its owner is writing it this instant
                time.sleep(0.05)
                continue
            if holder is not None and not _gone(holder):
                raise ConfigError(
                    f"{d} is in use by process {holder.get('pid')} on {holder.get('host')} (since {holder.get('since')})",
                    f"wait for it to end or write elsewhere; if that process is gone, delete {lock}",
                ) from None
            log.warning("%s: taking over the lock of process %s, which no longer runs",
                        d, holder.get("pid") if holder else "(unknown)")
            lock.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(me, f)
        break
    try:
        yield
    finally:
        if _holder(lock) == me:
            lock.unlink(missing_ok=True)
        if created and not any(d.iterdir()):  # a run that failed before writing anything leaves no trace
            d.rmdir()


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _holder(lock: Path) -> dict[str, Any] | None:
    """The lock's content; None when it cannot be read (being written this instant, or damaged)."""
    try:
        h = json.loads(lock.read_text(encoding="utf-8"))
        return h if isinstance(h, dict) else None
    except (OSError, ValueError):
        return None


def _gone(holder: dict[str, Any]) -> bool:
    """Whether the process that holds a lock has ended."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int):
        return False  # another machine's process: cannot tell, so it holds
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False
