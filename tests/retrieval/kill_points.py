"""A live-index operation SIGKILLed at each of its file operations, for tests/retrieval/test_live.py.

    python kill_points.py INDEX WORK OP=ARG ...

Each OP is delete (ARG: an ids file), upsert (ARG: a corpus) or compact (ARG: unused). For k = 1,
2, ... INDEX is copied to WORK/OP/k and a forked child runs OP on the copy; the child SIGKILLs
itself just before its k-th call of os.replace, os.rename, os.unlink, os.remove or os.rmdir
(shutil.rmtree's too): no finally block, no atexit, no lock released. The first k the operation
finishes before is its "after" (WORK/OP/k stays as it ended). Prints {"op", "points": the kill
points, the copies killed} a line an OP.

One process imports mlmkit once and forks a child per point: no onnxruntime session exists before
a fork (an upsert's child loads the bundle itself).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import traceback
from pathlib import Path

from mlmkit.retrieval.index import Index

MUTATIONS = ("replace", "rename", "unlink", "remove", "rmdir")


def run(op: str, index: Path, arg: Path) -> None:
    if op == "delete":
        Index.open(index).delete(arg)
    elif op == "compact":
        Index.open(index).compact()
    else:
        Index.open(index).upsert(arg, window=8, threads=1)


def killed_at(k: int) -> None:
    """From now on, this process SIGKILLs itself just before its k-th file operation."""
    calls = [0]
    for name in MUTATIONS:
        real = getattr(os, name)

        def wrapped(*a, _real=real, **kw):
            calls[0] += 1
            if calls[0] == k:
                os.kill(os.getpid(), signal.SIGKILL)
            return _real(*a, **kw)

        setattr(os, name, wrapped)


def main(index: str, work: str, *ops: str) -> None:
    # imported once, here (an import starts no thread); each upsert child makes its own session
    import onnxruntime  # noqa: F401

    import mlmkit.runtime.pipeline  # noqa: F401
    for spec in ops:
        op, _, arg = spec.partition("=")
        print(json.dumps({"op": op, "points": points(op, Path(index), Path(arg), Path(work) / op)}),
              flush=True)


def points(op: str, index: Path, arg: Path, work: Path) -> int:
    """The kill points of ``op`` on a copy of ``index``: a copy of each killed run, and the finished one, in
    ``work``."""
    for k in range(1, 1000):
        copy = work / str(k)
        shutil.copytree(index, copy)
        pid = os.fork()
        if pid == 0:
            killed_at(k)
            try:
                run(op, copy, arg)
            except BaseException:
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        if os.WIFEXITED(status):
            if os.WEXITSTATUS(status) != 0:
                raise SystemExit(f"{op} failed at kill point {k} without being killed")
            return k - 1
        assert os.WTERMSIG(status) == signal.SIGKILL, status
    raise SystemExit(f"{op}: more than 1,000 file operations")


if __name__ == "__main__":
    main(*sys.argv[1:])
