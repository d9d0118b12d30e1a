"""Serving throughput: `mlmkit serve` (dynamic batching) vs the FastAPI app users write by hand around
the transformers pipeline, and vs mlmkit's own offline speed on the same sentences.

    python benchmarks/serve_throughput.py            # 3 rounds (about 6 minutes on 2 quiet cores)
    python benchmarks/serve_throughput.py --quick    # 1 round, 256 sentences

Model: the MiniLM-size classifier of benchmarks/inference_throughput.py (6 layers, hidden 384,
fine-tuned on a keyword task over standard-library docstrings), built by that script's setup
(reused when its work directory has it); its 1,024 sentences of 8-40 words. 2 threads everywhere.

Load: 64 concurrent clients in this process (asyncio, 64 keep-alive connections, a minimal HTTP/1.1
client: httpx cost about 10 ms of CPU per request here, a core taken from the server), each sending
one sentence per request and the next when its answer came, until all sentences are answered; a
pass is one such sweep. Requests/s is sentences over the pass's time; latency is each request's, client
side. Servers:

- mlmkit: `mlmkit serve BUNDLE --threads 2` (default batching settings);
- transformers-app: FastAPI on uvicorn, one endpoint calling
  ``pipeline("text-classification")(inputs, truncation=True)`` on the fine-tuning run, torch with 2
  threads, in two forms users write: an ``async def`` endpoint (one request at a time) and a plain
  ``def`` endpoint (FastAPI's thread pool, requests concurrently); the faster one is the reference;
- offline: the same bundle's pipeline called in one process on all sentences at once (what `mlmkit
  classify` does, without its start-up), texts/s.

Each server runs in its own process; every pass first waits (up to --patience seconds) for other
processes to leave the CPUs alone, and the CPU time other processes took during the pass (/proc/stat
less the server's and this load generator's) is measured: a pass where it exceeded 0.15 cores is
marked * and counts only when no pass was quiet. The sides alternate, direction reversed each round.

Last lines: ``target serve-vs-transformers-app: X.XX (goal >= 5.00)`` (requests/s) and
``target serve-vs-offline-batch: X.XX (goal >= 0.70)`` (mlmkit serve requests/s over offline texts/s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from inference_throughput import ENV, QUIET, busy_seconds, log, wait_for_quiet  # noqa: E402

CLIENTS = 64
THREADS = 2
SIDES = ("mlmkit", "transformers-app-async", "transformers-app-threads")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the hand-written app -------------------------------------------------------------------------
def transformers_app(model: Path, port: int, threaded: bool) -> None:
    import torch
    import uvicorn
    from fastapi import FastAPI
    from transformers import pipeline
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(THREADS)
    pipe = pipeline("text-classification", model=str(model), device="cpu")
    pipe(["warm up"] * 4)
    app = FastAPI()

    if threaded:
        @app.post("/predict")
        def predict(body: dict) -> dict:
            return {"results": pipe(body["inputs"], truncation=True)}
    else:
        @app.post("/predict")
        async def predict_async(body: dict) -> dict:
            return {"results": pipe(body["inputs"], truncation=True)}

    @app.get("/ready")
    async def ready() -> dict:
        return {"status": "ready"}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def offline(bundle: Path, texts: list[str], rounds: int) -> None:
    """mlmkit's pipeline on all the texts at once: one JSON line per pass, with the cores other
    processes kept busy during it."""
    from mlmkit.runtime import Pipeline

    pipe = Pipeline.load(bundle, threads=THREADS)
    pipe(texts[:64])
    for _ in range(rounds):
        b, t, c = busy_seconds(), time.perf_counter(), time.process_time()
        pipe(texts)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        print(json.dumps({"time": wall, "other": max(0.0, busy_seconds() - b - cpu) / wall}), flush=True)


# ---- load -----------------------------------------------------------------------------------------
def cpu_of(pid: int) -> float:
    """CPU seconds of process ``pid`` and its threads so far."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


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


async def sweep(port: int, path: str, texts: list[str]) -> tuple[float, list[float], list[Any]]:
    """``CLIENTS`` clients through all ``texts``, one per request: (seconds, latencies, labels in order)."""
    answers: list[Any] = [None] * len(texts)
    latencies: list[float] = []
    todo = iter(range(len(texts)))
    bodies = [json.dumps({"inputs": [t]}).encode() for t in texts]

    async def client() -> None:
        conn = Connection("127.0.0.1", port)
        try:
            for i in todo:
                t = time.perf_counter()
                status, body = await conn.post(path, bodies[i])
                latencies.append(time.perf_counter() - t)
                if status != 200:
                    raise SystemExit(f"HTTP {status}: {body[:500]!r}")
                answers[i] = json.loads(body)["results"][0]["label"]
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return time.perf_counter() - t0, latencies, answers


class Side:
    def __init__(self, name: str, work: Path) -> None:
        import httpx

        self.name, self.port = name, free_port()
        bundle = work / "bundles" / "classify"
        if name == "mlmkit":
            cmd = [sys.executable, "-m", "mlmkit", "-q", "serve", str(bundle), "--port", str(self.port), "--threads", str(THREADS)]
            self.path = "/v1/models/classify/predict"
        else:
            cmd = [sys.executable, str(HERE), "--role", name, "--work", str(work.parent), "--port", str(self.port)]
            if work.name == "quick":
                cmd.append("--quick")
            self.path = "/predict"
        self.proc = subprocess.Popen(cmd, env={**os.environ, **ENV})
        deadline = time.monotonic() + 300
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"{name} exited with {self.proc.returncode}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{name} did not get ready")
            time.sleep(0.2)

    def run(self, texts: list[str], patience: float) -> dict[str, Any]:
        wait_for_quiet(patience)
        b, mine, theirs = busy_seconds(), time.process_time(), cpu_of(self.proc.pid)
        seconds, lat, answers = asyncio.run(sweep(self.port, self.path, texts))
        own = time.process_time() - mine + cpu_of(self.proc.pid) - theirs
        other = max(0.0, busy_seconds() - b - own) / seconds
        lat.sort()
        return {"rps": len(texts) / seconds, "p50": lat[len(lat) // 2] * 1000, "p99": lat[int(len(lat) * 0.99)] * 1000,
                "other": other, "answers": answers}

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: 256 sentences, one round")
    ap.add_argument("--rounds", type=int, default=None, help="passes per side, alternating (default 3, --quick 1)")
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("MLMKIT_BENCH_DIR", "runs/bench-inference")),
                    help="the work directory of inference_throughput.py (its setup is reused)")
    ap.add_argument("--patience", type=float, default=180.0,
                    help="seconds to wait before each pass for other processes to leave the CPUs alone")
    ap.add_argument("--role", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    work = a.work / ("quick" if a.quick else "full")
    if a.role in ("transformers-app-async", "transformers-app-threads"):
        transformers_app(work / "clf-run", a.port, a.role.endswith("threads"))
        return
    rounds = a.rounds or (1 if a.quick else 3)
    setup = [sys.executable, str(HERE.parent / "inference_throughput.py"), "--role", "setup", "--work", str(a.work)]
    if subprocess.run(setup + (["--quick"] if a.quick else []), env={**os.environ, **ENV}).returncode:
        raise SystemExit("setup failed")
    texts = json.loads((work / "sentences.json").read_text())["plain"]
    texts = texts[:256] if a.quick else texts

    wait_for_quiet(a.patience)
    code = (f"import sys, json; sys.path.insert(0, {str(HERE.parent)!r}); from serve_throughput import offline; "
            f"offline(__import__('pathlib').Path({str(work / 'bundles' / 'classify')!r}), json.load(sys.stdin), {rounds})")
    r = subprocess.run([sys.executable, "-c", code], input=json.dumps(texts), capture_output=True, text=True,
                       env={**os.environ, **ENV}, check=True)
    passes = [json.loads(x) for x in r.stdout.splitlines()]
    offline_other = min(p["other"] for p in passes)
    offline_speed = statistics.median(len(texts) / p["time"] for p in [p for p in passes if p["other"] <= QUIET] or passes)
    log(f"offline: {offline_speed:.1f} texts/s")

    log(f"starting {len(SIDES)} servers")
    sides = {name: Side(name, work) for name in SIDES}
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in SIDES}
    try:
        for side in sides.values():  # a warm-up sweep each (connections, caches, first batches)
            side.run(texts[: CLIENTS * 2], 0)
        for r_ in range(rounds):
            for name in SIDES if r_ % 2 == 0 else SIDES[::-1]:
                res = sides[name].run(texts, a.patience)
                results[name].append(res)
                log(f"round {r_ + 1}/{rounds} {name:26s} {res['rps']:8.1f} requests/s  p50 {res['p50']:7.1f} ms  "
                    f"p99 {res['p99']:7.1f} ms  (other processes busy: {res['other']:.2f} cores)")
    finally:
        for side in sides.values():
            side.close()

    def quiet(name: str) -> list[dict[str, Any]]:
        ok = [x for x in results[name] if x["other"] <= QUIET]
        return ok or results[name]

    med = {k: {m: statistics.median(x[m] for x in quiet(k)) for m in ("rps", "p50", "p99")} for k in SIDES}
    print(f"\n{len(texts)} sentences of 8-40 words, {CLIENTS} concurrent clients sending one each per request, "
          f"{THREADS} threads, {rounds} passes per side; medians over the quiet passes:")
    print(f"  {'side':28s} {'requests/s':>10s} {'p50 ms':>8s} {'p99 ms':>8s}   passes")
    for k in SIDES:
        marks = ", ".join(f"{x['rps']:.0f}" + ("" if x["other"] <= QUIET else "*") for x in results[k])
        print(f"  {k:28s} {med[k]['rps']:10.1f} {med[k]['p50']:8.1f} {med[k]['p99']:8.1f}   ({marks})")
    print(f"  {'offline mlmkit pipeline':28s} {offline_speed:10.1f} texts/s"
          + ("" if offline_other <= QUIET else "   * other processes were busy"))
    print(f"  * other processes used more than {QUIET} cores during that pass")
    ref = max(SIDES[1:], key=lambda k: med[k]["rps"])
    same = sum(x == y for x, y in zip(results["mlmkit"][0]["answers"], results[ref][0]["answers"])) / len(texts)
    print(f"labels: mlmkit serve vs {ref}: {same:.4f} agree")
    print()
    print(f"target serve-vs-transformers-app: {med['mlmkit']['rps'] / med[ref]['rps']:.2f} (goal >= 5.00)")
    print(f"target serve-vs-offline-batch: {med['mlmkit']['rps'] / offline_speed:.2f} (goal >= 0.70)")


if __name__ == "__main__":
    main()
