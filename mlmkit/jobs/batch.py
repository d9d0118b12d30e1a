"""Batch inference over inputs of any size: windows, worker processes, resumable output.

Inputs stream in and are cut into windows of ``window`` records (bad records, with ``--on-error
skip``, keep their place); each window is one call of the pipeline (length-bucketed inside), so
memory holds one window (a few per worker) however long the input is, and results keep input order.
A window and what it produced are mlmkit/jobs/windows.py's.

With an output file a job is resumable: its work lives in OUTPUT's job directory
(``.OUTPUT.job/``), a part file per finished window and progress.json (mlmkit/jobs/jobdir.py), and
the output appears, by a rename, only when every window is there. A job owns its output: it holds
the job directory's lock (locks.exclusive) from before it reads anything there until the output is
in place, so a second job writing the same output is refused, naming the first. An output that is
no regular file ("-" for stdout, a FIFO, /dev/stdout: see files.is_stream) is written through,
window by window, as JSON lines: no job directory, no resume.

The names of windows.py and jobdir.py that jobs are built from (``Window``, ``Done``, ``Job``,
``job_dir`` ...) are importable from here too.

No torch here.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import ExitStack
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlmkit.errors import ConfigError, MlmkitError
from mlmkit.files import JSONObject, is_stream, json_line, open_stream
from mlmkit.jobs.jobdir import Job, Progress, job_dir, owned_output, remove_empty
from mlmkit.jobs.windows import WINDOW, Done, Window, run_window, windows
from mlmkit.locks import exclusive
from mlmkit.runtime.engines import thread_budget
from mlmkit.text.records import Item, identity

if TYPE_CHECKING:
    from mlmkit.runtime.precision import GateRecord

__all__ = [
    # windows (mlmkit/jobs/windows.py) and the job directory (mlmkit/jobs/jobdir.py)
    "WINDOW", "Window", "windows", "Done", "run_window", "Progress", "Job", "job_dir", "owned_output",
    "remove_empty",
    # the job
    "run_windows", "batch", "steady_memory", "default_workers", "split_threads",
]


# ---- several processes ---------------------------------------------------------------------------
_pipe: Any = None


def _load(bundle: str, device: str, threads: int, batch_size: int, batch_tokens: int | None, precision: str,
          gate: GateRecord | None) -> None:
    global _pipe
    from mlmkit.runtime.pipeline import Pipeline

    steady_memory()
    _pipe = Pipeline.load(bundle, device=device, threads=threads, batch_size=batch_size,
                          batch_tokens=batch_tokens or 0,
                          # the parent's choice: its gate is not measured again
                          precision=precision, gate=gate)


def _work(w: Window[Item], options: Mapping[str, Any], skip: bool, id_column: str | None) -> Done:
    return run_window(_pipe, w, options, skip=skip, id_column=id_column)


def run_windows(
    ws: Iterable[Window[Item]], pipe: Any, *, workers: int, threads: int, options: Mapping[str, Any],
    skip: bool,
    id_column: str | None,
) -> Iterator[tuple[Window[Item], Done]]:
    """(window, what it produced), in input order: with ``pipe`` here (``workers`` 1), or in
    ``workers`` processes, each loading the same bundle with ``threads`` threads, at most two
    windows each in flight (so that reading never runs far ahead of the work)."""
    if workers <= 1:
        for w in ws:
            yield w, run_window(pipe, w, options, skip=skip, id_column=id_column)
        return
    pool = ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_load,
                               initargs=(str(pipe.path), pipe.device, threads, pipe.batch_size,
                                         pipe.batch_tokens,
                                         pipe.precision, pipe.choice.gate if pipe.choice else None))
    pending: deque[tuple[Window[Item], Future[Done]]] = deque()
    try:
        for w in ws:
            pending.append((w, pool.submit(_work, w, options, skip, id_column)))
            if len(pending) >= 2 * workers:
                w0, f = pending.popleft()
                yield w0, f.result()
        while pending:
            w0, f = pending.popleft()
            yield w0, f.result()
    finally:
        for _, f in pending:
            f.cancel()
        pool.shutdown(wait=True, cancel_futures=True)


def batch(
    pipe: Any, items: Iterable[Item], *, options: Mapping[str, Any], window: int = WINDOW, workers: int = 1,
    threads: int | None = None, skip: bool = False, id_column: str | None = None, output: Path | None = None,
    errors: Path | None = None, resume: bool = False, inputs: Sequence[Path] | None = None,
) -> Iterator[tuple[Window[Item], Done]]:
    """Run a loaded pipeline over a stream of inputs, window by window: (window, what it produced) in
    input order. With ``output`` the job is resumable (see the module docstring) and the output is
    written, complete, at the end; ``inputs`` are the files the items come from (None: stdin or
    arguments, which a job cannot resume from)."""
    with ExitStack() as stack:
        job, stream = None, None
        if output is not None and is_stream(output):
            stream = stack.enter_context(_stream(Path(output), resume))
        elif output is not None:
            if resume and inputs is None:
                raise ConfigError("--resume needs inputs read from files",
                                  "a job that reads stdin or arguments starts over")
            output = owned_output(Path(output))
            stack.callback(remove_empty, job_dir(output))  # last: once the lock is let go
            try:
                stack.enter_context(exclusive(job_dir(output)))
            except ConfigError as e:
                raise ConfigError(f"--output {output} is being written by another job: {e.message}",
                                  e.hint) from None
            what: JSONObject = {"bundle": pipe.identity(),
                                "inputs": identity(inputs) if inputs is not None else None,
                    "options": options, "window": window, "on_error": "skip" if skip else "stop",
                                "id_column": id_column}
            job = Job(output, what, resume=resume, errors=errors)
        ws = windows(items, window, skip=job.done if job else 0)
        try:
            for w, done in run_windows(ws, pipe, workers=workers, threads=split_threads(threads, workers),
                                       options=options, skip=skip, id_column=id_column):
                if job is not None:
                    done = job.add(w, done)
                elif stream is not None:
                    stream.write("".join(map(json_line, done.results)))
                    stream.flush()
                yield w, done
        except BaseException as e:
            if job is not None and job.done == 0:
                job.discard()  # a failed job that finished no window leaves nothing behind
            elif job is not None and isinstance(e, MlmkitError):
                e.hint = (f"{e.hint}; " if e.hint else "") + (
                    f"the {job.read} records before window {job.done + 1} are done: --resume continues after "
                    "them "
                    "if the inputs stay as they are (--on-error skip steps over bad records)")
            raise
        if job is not None:
            job.finish()


def _stream(output: Path, resume: bool) -> Any:
    """An output that is no regular file, written through as JSON lines (see is_stream)."""
    if resume:
        raise ConfigError(f"--resume: --output {output} is a stream (a FIFO, a device or stdout), which "
                          "cannot resume",
                          "write to a regular file to resume")
    if output.suffix.lower() in (".npy", ".parquet", ".csv", ".tsv"):
        raise ConfigError(f"--output {output} is a stream (a FIFO, a device or stdout): only JSON lines can "
                          "be written "
                          f"to it, not {output.suffix}", "give a regular file for this format")
    return open_stream(output)


def steady_memory() -> None:
    """Keep a long batch job's memory flat, for a process that runs one: glibc's malloc limited to one
    arena (each thread's own arena otherwise fragments, window after window) and pyarrow allocating
    with malloc too (its default pool keeps what it freed). Measured on 1,000,000 rows: the peak
    otherwise creeps up about 10% after the first 100,000; onnxruntime keeps its own arena either way."""
    import ctypes
    import ctypes.util
    import sys

    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt(-8, 1)  # M_ARENA_MAX
        except (OSError, AttributeError):  # not glibc
            pass
    try:
        import pyarrow as pa
    except ImportError:
        return
    pa.set_memory_pool(pa.system_memory_pool())


def default_workers() -> int:
    """Worker processes when --workers is not given: one, with every core's thread. Measured on the
    project's 2-core machines (MiniLM-size classifier, 20,000 short texts): one worker of two
    threads 436 texts/s, two workers of one thread 379; a larger machine may differ, so
    benchmarks/batch_scale.py prints both and --workers chooses."""
    return 1


def split_threads(threads: int | None, workers: int) -> int:
    """Threads per worker: --threads (else $OMP_NUM_THREADS, else the machine's cores) shared out, at
    least one each."""
    total = threads or thread_budget() or os.cpu_count() or 1
    return max(1, total // workers)
