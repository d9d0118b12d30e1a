"""Ownership of a directory: a run, a bundle, an index or a job directory is written by one process at
a time, which holds DIRECTORY/.mlmkit.lock (``exclusive``) while it writes there. No torch.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mlmkit.errors import ConfigError

log = logging.getLogger("mlmkit")

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
        except FileNotFoundError:  # the last holder removed the emptied directory this instant
            d.mkdir(parents=True, exist_ok=True)
            continue
        except FileExistsError:
            holder = _holder(lock)
            if holder is None and _age(lock) < 5.0:  # its owner is writing it this instant
                time.sleep(0.05)
                continue
            if holder is not None and not _gone(holder):
                raise ConfigError(
                    f"{d} is in use by process {holder.get('pid')} on {holder.get('host')} (since "
                    f"{holder.get('since')})",
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
        # a run that failed before writing anything leaves no trace
        if created and d.is_dir() and not any(d.iterdir()):
            try:
                d.rmdir()
            except OSError:  # another process took it over this instant
                pass


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
