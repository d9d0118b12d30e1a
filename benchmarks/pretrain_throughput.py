"""Pretraining throughput: mlmkit BertForPreTraining vs transformers.BertForPreTraining.

The same config (L4 / H256 / A4 / I1024, vocabulary 30522), sequence length 128, batch 32, fp32,
2 threads, AdamW training steps (forward, MLM + NSP loss, backward, clipping, optimizer step) on the
same masked batches (random token ids masked with mlmkit.train.masking.mask_tokens). Each run of each side
is its own process (torch keeps idle threads spinning between runs; docs/performance.md), and the sides
alternate so that machine noise hits both alike. Each run first waits (up to --patience seconds) for
other processes to leave the CPUs alone; the CPU time they took during its timed steps is measured
(/proc/stat), and runs where it exceeded 0.15 cores are marked * and left out of the medians whenever
quiet ones exist. Reports training tokens/s of each side (the median of the runs) and each round's
back-to-back
ratio; the last line is the target line: the median of the quiet rounds' ratios, with their spread.

    python benchmarks/pretrain_throughput.py [--steps 5] [--rounds 3] [--warmup 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from common import (
    QUIET,
    alternating,
    busy_seconds,
    mark,
    noisy_note,
    other_cores,
    passes,
    print_machine,
    quiet_median,
    target,
    thread_env,
    wait_for_quiet,
)
from harness import parser

CONFIG = dict(vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
              intermediate_size=1024, max_position_embeddings=512)
SIDES = ("mlmkit", "transformers")


def batches(n: int, batch_size: int, seq_len: int, seed: int = 0) -> list[dict]:
    """``n`` masked pretraining batches: [CLS] A [SEP] B [SEP], random ordinary token ids."""
    import torch

    from mlmkit.train.masking import mask_tokens

    g = torch.Generator().manual_seed(seed)
    V, (pad, unk, cls, sep, mask) = CONFIG["vocab_size"], range(5)
    out = []
    for _ in range(n):
        ids = torch.randint(5, V, (batch_size, seq_len), generator=g)
        half = seq_len // 2
        ids[:, 0], ids[:, half - 1], ids[:, -1] = cls, sep, sep
        types = torch.zeros_like(ids)
        types[:, half:] = 1
        masked, labels = mask_tokens(ids, mask_id=mask, special_ids=torch.tensor([pad, unk, cls, sep, mask]),
                                     vocab_size=V, generator=g)
        out.append({"input_ids": masked, "attention_mask": torch.ones_like(ids), "token_type_ids": types,
                    "labels": labels, "next_sentence_label": torch.randint(0, 2, (batch_size,), generator=g)})
    return out


def worker(side: str, steps: int, warmup: int, batch_size: int, seq_len: int, threads: int) -> dict:
    """Train ``warmup`` + ``steps`` steps of one side; return its timed tokens/s."""
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    from mlmkit.train.loop import param_groups

    if side == "mlmkit":
        from mlmkit.models.config import ModelConfig
        from mlmkit.models.core import BertForPreTraining

        model = BertForPreTraining(ModelConfig(**CONFIG))
    else:
        import transformers

        model = transformers.BertForPreTraining(transformers.BertConfig(**CONFIG))
    model.train()
    # the optimizer each side trains with by default: mlmkit's Trainer and transformers' Trainer
    # (optim "adamw_torch_fused" with torch >= 2.8) both use the fused AdamW kernel
    opt = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-4, eps=1e-6, fused=True)
    data = batches(warmup + steps, batch_size, seq_len)

    def step(b: dict) -> float:
        out = model(**b)
        loss = out["loss"] if isinstance(out, dict) else out.loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss)

    losses = [step(b) for b in data[:warmup]]
    busy, cpu, t0 = busy_seconds(), time.process_time(), time.perf_counter()
    losses += [step(b) for b in data[warmup:]]
    dt = time.perf_counter() - t0
    # first_loss: both sides start from the same task (about ln V + ln 2 = 11.0 before training)
    return {"side": side, "tokens_per_s": steps * batch_size * seq_len / dt, "step_s": dt / steps,
            "first_loss": losses[0], "other": other_cores(busy, time.process_time() - cpu, dt)}


def main() -> None:
    ap = parser(__doc__, rounds=3, rounds_help="runs of each side, alternating", patience=60.0,
                before="each run",
                threads=2, batch_size=32)
    # --rounds' name until 2026-12
    ap.add_argument("--repeats", dest="rounds", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=5, help="timed training steps per run")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps before timing")
    ap.add_argument("--seq-len", type=int, default=128, help="tokens a sequence (default 128)")
    ap.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.steps < 1 or a.rounds < 1 or a.warmup < 0:
        ap.error("--steps and --rounds must be at least 1, --warmup at least 0")
    if a.worker:
        print(json.dumps(worker(a.worker, a.steps, a.warmup, a.batch_size, a.seq_len, a.threads)))
        return

    import torch
    import transformers

    print_machine(a.threads)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {a.threads} threads; "
          f"L{CONFIG['num_hidden_layers']}/H{CONFIG['hidden_size']}/A{CONFIG['num_attention_heads']}/"
          f"I{CONFIG['intermediate_size']} V{CONFIG['vocab_size']}, batch {a.batch_size} x {a.seq_len}, "
          "fp32, "
          f"AdamW; {a.warmup} warm-up + {a.steps} timed steps per run, {a.rounds} runs per side")
    env = {**os.environ, **thread_env(a.threads)}
    results: dict[str, list[float]] = {s: [] for s in SIDES}
    others: dict[str, list[float]] = {s: [] for s in SIDES}  # cores used by other processes during each run
    for r, side in alternating(SIDES, a.rounds):
        cmd = [sys.executable, __file__, "--worker", side, "--steps", str(a.steps), "--warmup", str(a.warmup),
               "--batch-size", str(a.batch_size), "--seq-len", str(a.seq_len), "--threads", str(a.threads)]
        wait_for_quiet(a.patience)  # also lets the previous run's threads go
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            sys.exit(f"{side} run failed:\n{proc.stderr[-2000:]}")
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        results[side].append(res["tokens_per_s"])
        others[side].append(res["other"])
        print(f"run {r + 1} {side:>12}: {res['tokens_per_s']:8.1f} tokens/s ({res['step_s']:.2f} s/step, "
              f"first loss {res['first_loss']:.3f}){mark(res['other'])}", flush=True)
    med = {s: quiet_median(v, others[s]) for s, v in results.items()}
    for s in SIDES:
        print(f"{s:>12}: median {med[s]:8.1f} tokens/s  (runs: {passes(results[s], others[s], 1)})")
    # back-to-back runs see similar machine load: their ratios show how much of the spread is noise
    pairs = [m / t for m, t in zip(results["mlmkit"], results["transformers"])]
    quiet = [x for x, om, ot in zip(pairs, others["mlmkit"], others["transformers"]) if om <= QUIET
             and ot <= QUIET] or pairs
    print(f"ratio per round: {', '.join(f'{x:.2f}' for x in pairs)}; the sides' medians: "
          f"{med['mlmkit'] / med['transformers']:.2f}x")
    print(noisy_note("run"))
    print(target("pretrain-vs-transformers", statistics.median(quiet), ">=", 2.0)
          + f"   (the median of the quiet rounds' ratios; rounds {min(quiet):.2f}-{max(quiet):.2f} over "
            f"{len(quiet)})")


if __name__ == "__main__":
    main()
