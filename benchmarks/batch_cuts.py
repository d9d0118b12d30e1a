"""Where a call's batches are cut: only when full (rows or padded tokens), or where padding costs more
than one more onnxruntime run (pipeline.CPU_RUN_TOKENS), on the same bundle and sentences.

    python benchmarks/batch_cuts.py            # about 5 minutes on 2 quiet cores
    python benchmarks/batch_cuts.py --quick    # the quick setup's 128 sentences, repeated to 1,024

The MiniLM-size classifier and the 1,024 sentences of 8-40 words of benchmarks/inference_throughput.py's
setup (made or reused). 2 threads.

Part 1, the cost of one run: the graph on batches of R rows x L tokens (R 1-64, L 8-64), ms per run;
a least-squares fit of ms = a + b x R x L over the batches of at most 512 tokens (what a call is
cut into) gives a run's fixed cost in tokens (a / b), what CPU_RUN_TOKENS stands for.

Part 2, calls: the sentences (shuffled, seed 0) in calls of 8, 32, 64 and all at once (a server
merges calls of what is queued: 8 to 64 at 8 to 64 clients; a batch job calls with thousands), each
call's batches cut (a) when full, (b) at least cost; texts/s, runs and padded tokens over the real
ones. The two rules alternate for --rounds rounds (the order reversed each round); a pass waits for
a quiet CPU and is marked * when other processes took more than 0.15 cores.

Last lines::

    target batch-cuts-call-32: X.XX (goal >= 1.05)    least cost / full, texts/s, calls of 32
"""

from __future__ import annotations

import json
import random
import statistics
import time
from typing import Any

import numpy as np
from common import (
    busy_seconds,
    inference_setup,
    noisy_note,
    other_cores,
    passes,
    print_machine,
    quiet_median,
    ratio,
    spread,
    target,
    wait_for_quiet,
)
from harness import parser

THREADS = 2
CALLS = (8, 32, 64, 0)  # 0: all the sentences in one call


def run_cost(pipe: Any) -> tuple[float, float, list[str]]:
    """(a ms, b ms a token, table rows) of one run on R x L batches."""
    rows, xs, ys = [], [], []
    for length in (8, 16, 32, 64):
        cells = []
        for r in (1, 2, 4, 8, 16, 32, 64):
            if r * length > 2048:
                continue
            feed = {n: np.zeros((r, length), dtype=np.int64) for n in pipe.input_names}
            feed["input_ids"][:] = 1000
            feed["attention_mask"][:] = 1
            pipe.run_batch(feed)
            n = max(3, 2000 // (r * length))
            t = time.perf_counter()
            for _ in range(n):
                pipe.run_batch(feed)
            ms = (time.perf_counter() - t) / n * 1000
            cells.append(f"{r}x{length} {ms:6.2f}")
            xs.append(r * length)
            ys.append(ms)
        rows.append("   ".join(cells))
    # the batches a call is cut into (--batch-tokens' 512)
    small = [(x, y) for x, y in zip(xs, ys) if x <= 512]
    b, a = np.polyfit([x for x, _ in small], [y for _, y in small], 1)
    return float(a), float(b), rows


def calls(pipe: Any, texts: list[str], size: int) -> dict[str, float]:
    """One pass over ``texts`` in calls of ``size``: texts/s, runs and padded tokens, other processes' cores.
    """
    runs, padded = 0, 0
    real = pipe.session.run

    def counted(names, feed):  # noqa: ANN001, ANN202
        nonlocal runs, padded
        runs += 1
        padded += feed["input_ids"].size
        return real(names, feed)

    pipe.session.run = counted
    try:
        b, cpu, t = busy_seconds(), time.process_time(), time.perf_counter()
        step = size or len(texts)
        for i in range(0, len(texts), step):
            pipe(texts[i : i + step])
        wall = time.perf_counter() - t
        return {"speed": len(texts) / wall, "runs": runs, "padded": padded,
                "other": other_cores(b, time.process_time() - cpu, wall)}
    finally:
        pipe.session.run = real


def main() -> None:
    ap = parser(__doc__, work="runs/bench-inference",
                quick="the quick setup's sentences, repeated to 1,024; 2 rounds",
                work_help="inference_throughput.py's work directory (its setup is made there when missing)",
                rounds=(5, 2), rounds_help="rounds of both rules", patience=60.0)
    ap.add_argument("--also", type=int, action="append", default=[],
                    help="a run's cost in tokens to try beside pipeline.CPU_RUN_TOKENS (repeatable): "
                         "another rule, 'least-cost@N'")
    a = ap.parse_args()
    from mlmkit.runtime.pipeline import CPU_RUN_TOKENS, Pipeline
    from mlmkit.runtime.prediction import truncations_counted

    print_machine(THREADS)
    inference_setup(a.work, a.quick)
    work = a.work / ("quick" if a.quick else "full")
    texts = json.loads((work / "sentences.json").read_text())["plain"]
    texts = (texts * (1024 // len(texts) + 1))[:1024]
    random.Random(0).shuffle(texts)
    rounds = a.rounds
    pipe = Pipeline.load(work / "bundles" / "classify", threads=THREADS)
    real_tokens = sum(len(e.ids) for e in pipe.tokenizer.encode_batch(texts))
    pipe(texts[:64])

    wait_for_quiet(a.patience)
    fixed, per_token, table = run_cost(pipe)
    print(f"\none run of the MiniLM-size classifier, R rows x L tokens, ms ({THREADS} threads):")
    for row in table:
        print(f"  {row}")
    print(f"  fit over the batches of 512 tokens or fewer: {fixed:.2f} ms + {per_token:.3f} ms a token: a "
          "run costs "
          f"what {fixed / per_token:.0f} tokens do "
          f"(pipeline.CPU_RUN_TOKENS = {CPU_RUN_TOKENS})")

    costs = {"full": None, "least-cost": CPU_RUN_TOKENS, **{f"least-cost@{n}": n for n in a.also}}
    rules = list(costs)
    got: dict[tuple[str, int], list[dict[str, float]]] = {}
    for r in range(rounds):
        for rule in rules if r % 2 == 0 else rules[::-1]:
            pipe.run_tokens = costs[rule]
            for size in CALLS:
                wait_for_quiet(a.patience)
                with truncations_counted():  # one sentence is over the bundle's 128 tokens: said once below
                    got.setdefault((rule, size), []).append(calls(pipe, texts, size))
    print(f"\n{len(texts)} sentences ({real_tokens} real tokens), calls of N; {rounds} alternating rounds, "
          "medians of the "
          "quiet passes; padding: padded tokens / real tokens")
    print(f"  what each rule got: the same fp32 bundle and session, {THREADS} threads, max length 128, "
          "batches of at most "
          f"{pipe.batch_size} rows and {pipe.batch_tokens} padded tokens; the rules differ only in where a "
          "call is cut")
    print(f"  {'call':>6s} {'rule':>14s} {'texts/s':>8s} {'runs':>5s} {'padding':>8s}   passes")
    speed: dict[tuple[str, int], float] = {}
    # each call size's passes in race()'s shape, for common.ratio and spread: the median of the rounds' ratios
    by_round = {size: {"rounds": rounds,
                       "speeds": {rule: [x["speed"] for x in got[(rule, size)]] for rule in rules},
                       "others": {rule: [x["other"] for x in got[(rule, size)]] for rule in rules}}
                for size in CALLS}
    for size in CALLS:
        for rule in rules:
            res = got[(rule, size)]
            speed[(rule, size)] = quiet_median([x["speed"] for x in res], [x["other"] for x in res])
            print(f"  {size or len(texts):6d} {rule:>14s} {speed[(rule, size)]:8.1f} {res[0]['runs']:5d} "
                  f"{res[0]['padded'] / real_tokens:7.2f}x   "
                  f"({passes([x['speed'] for x in res], [x['other'] for x in res])})")
        for rule in rules[1:]:
            print(f"  {'':6s} {'ratio':>14s} {ratio(by_round[size], rule, 'full'):7.2f}x  {rule} / full "
                  f"({spread(by_round[size], rule, 'full')})")
    print(noisy_note())
    print()
    print(target("batch-cuts-call-32", ratio(by_round[32], "least-cost", "full"), ">=", 1.05)
          + f"   ({spread(by_round[32], 'least-cost', 'full')})")
    print("(for information, medians of the rounds' ratios: calls of 8 "
          f"{ratio(by_round[8], 'least-cost', 'full'):.2f}x, "
          f"of 64 {ratio(by_round[64], 'least-cost', 'full'):.2f}x, all at once "
          f"{ratio(by_round[0], 'least-cost', 'full'):.2f}x; "
          "median over the call sizes "
          f"{statistics.median(ratio(by_round[s], 'least-cost', 'full') for s in CALLS):.2f})")


if __name__ == "__main__":
    main()
