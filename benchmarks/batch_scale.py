"""Batch inference at scale: `mlmkit classify` on 100,000 and 1,000,000 rows of Parquet, one or two
worker processes, the Ray Data path, and the transformers pipeline over a `datasets` Parquet dataset.

    python benchmarks/batch_scale.py            # 100k and 1M rows (about an hour on 2 quiet cores)
    python benchmarks/batch_scale.py --quick    # 10k and 100k rows, a 5k-row reference (about 10 minutes)

Model: the MiniLM-size classifier of benchmarks/inference_throughput.py (6 layers, hidden 384,
fine-tuned on a keyword task over the docstrings of Python's standard library, exported fp32),
built by that script's setup (reused when its work directory has it). Inputs: short texts as in the
quickstart, 4-24 words of standard-library docstring sentences, in Parquet shards of 100,000 rows
(columns id, text); a dataset of N rows is the first N rows of one seeded stream, so the smaller
ones are prefixes of the larger.

Every run is one command in its own process, timed from start to exit (interpreter start, imports,
loading the model, reading, writing all included): texts/s is rows over that time. Peak memory is
the sum over the command's processes (workers, Ray's daemons and actors) of each one's peak
resident set (VmHWM, sampled), an upper bound of what they held at once. Before each run the
script waits (up to --patience seconds) for other processes to leave the CPUs alone and measures
the CPU time they took during it (/proc/stat less the run's own); a run where that exceeded 0.15
cores is marked with *.

- mlmkit: `mlmkit classify BUNDLE --input DIR --output out.parquet --id-column id` (default
  workers and threads), on N and on 10 N rows; then `--workers 2` (one thread each) on N rows;
  then Ray Data: `mlmkit predict BUNDLE --input DIR --output out/ --engine ray --id-column id`
  (local Ray, one actor of two threads), on N rows.
- reference: ``datasets.load_dataset("parquet", ...)`` and
  ``pipeline("text-classification")(KeyDataset(ds, "text"), batch_size=32, truncation=True)``
  on the same model (the fine-tuning run), results written as JSON lines, torch with 2 threads;
  on the first --ref-rows rows (its Arrow cache is built beforehand, untimed), alternating with
  mlmkit on the same rows for --rounds rounds; the ratio is the median of the rounds' ratios.
  The two sides' labels are compared as a check. The int8 bundle runs once on the same rows, for
  information (another precision, so not the target).

The script ends with two lines: ``target batch-memory-growth-1m-vs-100k: X.XX (goal <= 1.10)``
(peak memory at 10 N rows over peak at N) and ``target batch-vs-transformers-datasets: X.XX
(goal >= 3.00)``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import (
    alternating,
    bench_env,
    inference_setup,
    log,
    mark,
    noisy_note,
    print_machine,
    run_watched,
    stdlib_sentences,
    target,
    transformers_pipeline,
)
from harness import parser

HERE = Path(__file__).resolve()

SHARD = 100_000
BATCH = 32
THREADS = 2


# ---- data -------------------------------------------------------------------------------------
def texts(seed: int = 0):
    """An endless seeded stream of short texts: 4-24 words of standard-library docstring sentences."""
    pool = [s.split() for s in stdlib_sentences()]
    rng = random.Random(seed)
    while True:
        words = rng.choice(pool)
        start = rng.randint(0, max(0, len(words) - 4))
        yield " ".join(words[start : start + rng.randint(4, 24)])


def dataset(work: Path, rows: int) -> Path:
    """A directory of Parquet shards with the first ``rows`` rows of the stream (made once)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = work / f"rows-{rows}"
    if (d / ".done").exists():
        return d
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    stream = texts()
    for k, at in enumerate(range(0, rows, SHARD)):
        n = min(SHARD, rows - at)
        ids = list(range(at, at + n))
        pq.write_table(pa.table({"id": ids, "text": [next(stream) for _ in ids]}),
                       d / f"part-{k:04d}.parquet")
    (d / ".done").write_text("")
    return d


# ---- measuring one command ----------------------------------------------------------------------
def measure(name: str, cmd: list[str], rows: int, patience: float,
            env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``cmd`` once: texts/s, peak memory (MB, summed over its processes), other processes' load."""
    res = run_watched(name, cmd, patience, env)
    seconds, other = res["seconds"], res["other"]
    res.update(name=name, rows=rows, speed=rows / seconds)
    log(f"{name:40s} {rows:>9,} rows {seconds:8.1f} s {res['speed']:8.1f} texts/s  peak "
        f"{res['peak_mb']:7.0f} MB "
        f"in {res['processes']} processes  (other processes busy: {other:.2f} cores)")
    return res


# ---- the transformers side ----------------------------------------------------------------------
def transformers_side(data: Path, model: Path, out: Path, cache: Path, prepare: bool) -> None:
    import datasets
    import torch
    from transformers.pipelines.pt_utils import KeyDataset

    datasets.disable_progress_bars()
    ds = datasets.load_dataset("parquet", data_files=sorted(glob.glob(str(data / "*.parquet"))),
                               split="train",
                               cache_dir=str(cache))
    if prepare:
        return
    pipe = transformers_pipeline("text-classification", model, THREADS)
    with torch.inference_mode(), open(out, "w", encoding="utf-8") as f:
        for i, r in zip(ds["id"], pipe(KeyDataset(ds, "text"), batch_size=BATCH, truncation=True)):
            f.write(json.dumps({"id": i, "label": r["label"], "score": r["score"]}) + "\n")


def labels_agree(parquet: Path, other: Path) -> float:
    """The share of rows of ``other`` (JSON lines or Parquet, with id and label) labelled as in ``parquet``.
    """
    import pyarrow.parquet as pq

    ours = {r["id"]: r["label"] for r in pq.read_table(parquet, columns=["id", "label"]).to_pylist()}
    theirs = (pq.read_table(other, columns=["id", "label"]).to_pylist() if other.suffix == ".parquet"
              else [json.loads(x) for x in other.read_text().splitlines()])
    return sum(ours[t["id"]] == t["label"] for t in theirs) / max(1, len(theirs))


# ---- the driver ---------------------------------------------------------------------------------
def main() -> None:
    ap = parser(__doc__, work="runs/bench-inference",
                quick="10k and 100k rows, a 5k-row reference, one round",
                work_help="the work directory of inference_throughput.py (its setup is reused)",
                rounds=(3, 1), rounds_help="alternating rounds of the reference pair", before="each run",
                role=True)
    ap.add_argument("--rows", type=int, default=None,
                    help="the smaller row count N (default 100,000; --quick 10,000); the larger is 10 N")
    ap.add_argument("--ref-rows", type=int, default=None,
                    help="rows for the transformers reference (default 20,000; --quick 5,000)")
    ap.add_argument("--no-ray", action="store_true", help="leave out the Ray Data run")
    ap.add_argument("--data", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    models = a.work / ("quick" if a.quick else "full")
    batch = a.work / "batch"
    if a.role in ("transformers", "prepare"):
        transformers_side(a.data, models / "clf-run", a.out, batch / "hf-cache", a.role == "prepare")
        return

    n = a.rows or (10_000 if a.quick else 100_000)
    ref_rows = a.ref_rows or (5_000 if a.quick else 20_000)
    rounds = a.rounds
    print_machine(2)
    inference_setup(a.work, a.quick)
    bundle = models / "bundles" / "classify"
    t0 = time.perf_counter()
    small, large, ref = dataset(batch, n), dataset(batch, 10 * n), dataset(batch, ref_rows)
    log(f"data: {n:,}, {10 * n:,} and {ref_rows:,} rows in Parquet shards of {SHARD:,} "
        f"({time.perf_counter() - t0:.0f}s)")
    me = [sys.executable, str(HERE), "--work", str(a.work), *(["--quick"] if a.quick else [])]
    subprocess.run([*me, "--role", "prepare", "--data", str(ref)], check=True, env=bench_env())
    out = batch / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    mlmkit = [sys.executable, "-m", "mlmkit"]

    def classify(data: Path, dest: Path, *extra: str, model: Path = bundle) -> list[str]:
        return [*mlmkit, "classify", str(model), "--input", str(data), "--output", str(dest), "--id-column",
                "id", *extra]

    runs: dict[str, dict[str, Any]] = {}
    runs["small"] = measure(f"mlmkit classify ({n:,} rows)", classify(small, out / "small.parquet"), n,
                            a.patience)
    runs["large"] = measure(f"mlmkit classify ({10 * n:,} rows)", classify(large, out / "large.parquet"),
                            10 * n, a.patience)
    runs["workers2"] = measure("mlmkit classify --workers 2",
                               classify(small, out / "w2.parquet", "--workers", "2"), n, a.patience)
    if not a.no_ray:
        cmd = [*mlmkit, "predict", str(bundle), "--input", str(small), "--output", str(out / "ray"),
               "--engine", "ray",
               "--id-column", "id"]
        runs["ray"] = measure("mlmkit predict --engine ray", cmd, n, a.patience,
                              env={"RAY_USAGE_STATS_ENABLED": "0"})
    sides = {"mlmkit": classify(ref, out / "ref.parquet"),
             "transformers": [*me, "--role", "transformers", "--data", str(ref), "--out",
                              str(out / "ref-hf.jsonl")]}
    got: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    for r, name in alternating(list(sides), rounds):
        got[name].append(measure(f"{name} ({ref_rows:,} rows, round {r + 1})", sides[name], ref_rows,
                                 a.patience))
    pair = list(zip(got["mlmkit"], got["transformers"]))
    int8 = measure(f"mlmkit int8 ({ref_rows:,} rows)",
                   classify(ref, out / "ref-int8.parquet", model=bundle.with_name("classify-int8")),
                   ref_rows, a.patience)

    report(runs, pair, int8, out, n)


def report(runs: dict[str, dict[str, Any]], pair: list[tuple[dict[str, Any], dict[str, Any]]],
           int8: dict[str, Any],
           out: Path, n: int) -> None:
    """The table of every run, what each side got, the checks and the target lines."""
    import pyarrow.parquet as pq

    same = pq.read_table(out / "small.parquet").equals(pq.read_table(out / "w2.parquet"))
    agree = labels_agree(out / "ref.parquet", out / "ref-hf.jsonl")
    print(f"\nMiniLM-size classifier, short texts (4-24 words), {os.cpu_count()} cores; each run a command "
          "timed from start "
          "to exit. What each side got: fp32 (the int8 run aside), max length 128, batch "
          f"{BATCH}; mlmkit: its defaults (one process, a thread a core; --workers 2: a thread each), "
          "batches on mlmkit's "
          f"cuts; transformers: the pipeline over a datasets Parquet dataset, {THREADS} torch threads, its "
          "batches in row "
          f"order; the reference pair {len(pair)} alternating rounds, every other run once")
    for r in [*runs.values(), *(x for p in pair for x in p), int8]:
        print(f"  {r['name']:40s} {r['rows']:>9,} rows {r['speed']:8.1f} texts/s   peak {r['peak_mb']:7.0f} "
              "MB "
              f"({r['processes']} processes){mark(r['other']) or ' '}")
    print(noisy_note("run", counted=False))
    print(f"--workers 2 vs 1 ({n:,} rows, one run each): "
          f"{runs['workers2']['speed'] / runs['small']['speed']:.2f}x; "
          f"output identical: {same}")
    if "ray" in runs:
        ray_rows = pq.read_table(out / "ray").num_rows
        print(f"Ray Data (one actor of two threads) vs local ({n:,} rows, one run each): "
              f"{runs['ray']['speed'] / runs['small']['speed']:.2f}x; rows written: {ray_rows:,}")
    print(f"labels: mlmkit vs transformers pipeline on the reference rows: {agree:.4f} agree")
    ratios = [m["speed"] / t["speed"] for m, t in pair]
    print(f"mlmkit vs transformers + datasets, per round: {', '.join(f'{x:.2f}' for x in ratios)}; "
          f"the int8 bundle (one run; information only: another precision): "
          f"{int8['speed'] / statistics.median(t['speed'] for _, t in pair):.2f}x, labels agree with fp32 "
          f"{labels_agree(out / 'ref.parquet', out / 'ref-int8.parquet'):.4f}")
    print()
    print(target("batch-memory-growth-1m-vs-100k", runs["large"]["peak_mb"] / runs["small"]["peak_mb"], "<=",
                 1.1))
    print(target("batch-vs-transformers-datasets", statistics.median(ratios), ">=", 3.0)
          + f"   (rounds {min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)})")


if __name__ == "__main__":
    main()
