"""Where training time goes: one training step of mlmkit and of its peer on the same batch, their
useful FLOP/s as a share of the GEMM ceiling measured in the same run, and (--profile) the top
frames of mlmkit's step by self CPU time (torch.profiler).

The recipes, each at the size of all-MiniLM-L6-v2 (L6 / H384 / A12 / I1536, vocabulary 30522; random
weights: the speed of a step does not depend on them), every text filling --length tokens (the long
documents of a retrieval set, truncated: no padding for length grouping to remove), fp32 unless
--bf16, dropout as the checkpoint has it (0.1), AdamW (fused on both sides), gradient clipping at 1:

- ``embedding``: mnrl (scale 20) over 16 (anchor, positive) pairs, mean pooling, normalised:
  mlmkit's ``embedding`` task model against transformers' BertModel with sentence-transformers'
  pooling and the same loss written out (what SentenceTransformerTrainer runs);
- ``classification``: 32 texts, 2 labels, cross-entropy: mlmkit's BertForLabels against
  transformers' BertForSequenceClassification (what its Trainer runs);
- ``pretrain``: MLM over 32 texts, 15% of the positions labelled: mlmkit's BertForPreTraining (its
  MLM head at the labelled positions only) against transformers' BertForMaskedLM;
- ``rerank``: 32 (query, document) pairs, 8 queries of 4 candidates, one relevance logit, binary
  cross-entropy: mlmkit's ``rerank`` task model against transformers' one-label
  BertForSequenceClassification with BCEWithLogitsLoss (what CrossEncoderTrainer runs);
- ``splade``: 16 pairs, the MLM head at every token, max pooling of log(1 + relu), sparse mnrl (dot
  products) plus the FLOPS regulariser: mlmkit's ``sparse-embedding`` task model against transformers'
  BertForMaskedLM with sentence-transformers' SpladePooling and SpladeLoss written out.

``--lever memory`` adds a third side, mlmkit without the process setting its Trainer makes on the
CPU (``keep_freed_memory``: glibc keeps freed memory for the next step), in the same alternating
rounds, so the lever's gain is measured in the run that reports it.

Useful FLOPs of a step: 3 x the forward's (2 x the weight matrices x the tokens, plus attention's
4 x layers x hidden x length^2 a text; the MLM head at the labelled positions only), the same count
for both sides (SPLADE's vocabulary projection at every token), so a side that does more work than
the recipe needs has a lower share. Each pass is
its own process on 2 threads, after a quiet CPU; the sides alternate over --rounds rounds and the
ratio is the median of each round's, noisy passes marked.

    python benchmarks/train_profile.py [--recipes embedding,classification,pretrain,rerank,splade]
        [--length 256] [--steps 3] [--rounds 3] [--profile] [--bf16] [--lever memory]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import (
    alternating,
    bench_env,
    busy_seconds,
    log,
    mark,
    noisy_note,
    other_cores,
    print_machine,
    share,
    target,
    thread_env,
    wait_for_quiet,
)
from harness import parser

HERE = Path(__file__).resolve()
THREADS = 2
SIDES = ("mlmkit", "peer")
PLAIN = "mlmkit-plain"  # --lever: mlmkit without that lever
LEVERS = {"memory": "mlmkit, freed memory given back"}
PEERS = {"embedding": "sentence-transformers' step", "classification": "transformers' Trainer step",
         "pretrain": "transformers' BertForMaskedLM step", "rerank": "CrossEncoderTrainer's step",
         "splade": "SparseEncoderTrainer's step"}
MINILM = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
              intermediate_size=1536,
              max_position_embeddings=512, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
              model_type="bert")
TEXTS = 32  # texts a step: 16 pairs for mnrl and SPLADE, 32 (query, document) pairs or texts otherwise
CANDIDATES = 4  # rerank: a query's candidates (1 relevant)
TOP = 12  # profile frames printed


# ---- one side's steps (a process of its own) ---------------------------------------------------------
def useful_flops(recipe: str, length: int, labelled: int) -> float:
    """The FLOPs a training step of ``recipe`` must do (forward x 3), padding-free by construction."""
    c = MINILM
    H, F, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    per_token = 2 * L * (4 * H * H + 2 * H * F)
    fwd = TEXTS * (length * per_token + 4 * L * H * length * length)
    # the MLM head's transform and vocabulary-wide decoder, at the labelled positions
    if recipe == "pretrain":
        fwd += labelled * 2 * (H * H + H * c["vocab_size"])
    if recipe == "splade":  # ... at every token
        fwd += TEXTS * length * 2 * (H * H + H * c["vocab_size"])
    return 3.0 * fwd


def batch(recipe: str, length: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, MINILM["vocab_size"], (TEXTS, length), generator=g)
    ids[:, 0], ids[:, -1] = 101, 102
    b: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                         "token_type_ids": torch.zeros_like(ids)}
    if recipe == "classification":
        b["labels"] = torch.randint(0, 2, (TEXTS,), generator=g)
    elif recipe == "rerank":
        b["labels"] = (torch.arange(TEXTS) % CANDIDATES == 0).float()
    elif recipe == "pretrain":
        labels = torch.full_like(ids, -100)
        where = torch.rand(ids.shape, generator=g) < 0.15
        where[:, 0] = where[:, -1] = False
        labels[where] = ids[where]
        b["labels"] = labels
    return b


def mlmkit_model(recipe: str) -> tuple[Any, Any]:
    """(the model, its step's forward on a batch -> loss)."""
    import torch

    from mlmkit.models.config import ModelConfig
    from mlmkit.models.core import BertForLabels, BertForPreTraining
    from mlmkit.registry import TaskContext, get_task

    labels = {"classification": {"id2label": {0: "LABEL_0", 1: "LABEL_1"}},
              "rerank": {"id2label": {0: "score"}}}.get(recipe, {})
    cfg = ModelConfig.from_dict({**MINILM, **labels})
    pairs = {"part": torch.tensor([0, 1] * (TEXTS // 2)), "text_id": torch.arange(TEXTS),
             "score": torch.zeros(TEXTS)}  # as featurize gives rows without scores
    if recipe in ("embedding", "splade", "rerank"):
        name, options, extra = {"embedding": ("embedding", {"loss": "mnrl"}, pairs),
                                "splade": ("sparse-embedding", {}, pairs),
                                "rerank": ("rerank", {"loss": "bce"},
                                           {"example": torch.arange(TEXTS) // CANDIDATES})}[recipe]
        task = get_task(name)
        m = task.build_model(cfg, TaskContext(max_length=512, options=task.resolve_options(options)))
        return m, lambda b: m(**b, **extra)["loss"]
    if recipe == "classification":
        m = BertForLabels(cfg, per_token=False)
        return m, lambda b: m(**b)["loss"]
    m = BertForPreTraining(cfg)
    return m, lambda b: m(**b)["loss"]


def peer_model(recipe: str) -> tuple[Any, Any]:
    import torch
    import torch.nn.functional as F
    import transformers

    cfg = transformers.BertConfig(**{k: v for k, v in MINILM.items() if k != "model_type"},
                                  num_labels={"classification": 2, "rerank": 1}.get(recipe, 2))
    if recipe == "embedding":  # sentence-transformers' Transformer + Pooling(mean) + Normalize, and its MNRL
        m = transformers.BertModel(cfg, add_pooling_layer=False)

        def loss(b: dict[str, Any]) -> Any:
            seq = m(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                    token_type_ids=b["token_type_ids"]).last_hidden_state
            mask = b["attention_mask"].unsqueeze(-1).to(seq.dtype)
            e = F.normalize((seq * mask).sum(1) / mask.sum(1).clamp(min=1e-9), dim=-1)
            a, p = e[0::2], e[1::2]
            return F.cross_entropy(a @ p.T * 20.0, torch.arange(len(a)))

        return m, loss
    if recipe == "rerank":  # CrossEncoder's one-label model and BinaryCrossEntropyLoss
        m = transformers.BertForSequenceClassification(cfg)
        return m, lambda b: F.binary_cross_entropy_with_logits(
            m(**{k: v for k, v in b.items() if k != "labels"}).logits.squeeze(-1), b["labels"])
    if recipe == "splade":  # MLMTransformer + SpladePooling(max), SparseMultipleNegativesRankingLoss + FLOPS
        m = transformers.BertForMaskedLM(cfg)

        def splade_loss(b: dict[str, Any]) -> Any:
            logits = m(**b).logits
            w = (torch.log1p(torch.relu(logits)) * b["attention_mask"].unsqueeze(-1)).max(dim=1).values
            q, d = w[0::2], w[1::2]
            return (F.cross_entropy(q @ d.T, torch.arange(len(q)))
                    + 5e-5 * (q.mean(0) ** 2).sum() + 3e-5 * (d.mean(0) ** 2).sum())

        return m, splade_loss
    if recipe == "classification":
        m = transformers.BertForSequenceClassification(cfg)
    else:
        m = transformers.BertForMaskedLM(cfg)
    return m, lambda b: m(**b).loss


def run_side(a: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    if a.side == "mlmkit":  # what mlmkit's Trainer does on the CPU before it builds anything
        from mlmkit.train.devices import keep_freed_memory

        keep_freed_memory()
    model, loss_of = (peer_model if a.side == "peer" else mlmkit_model)(a.recipe)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, fused=True)
    b = batch(a.recipe, a.length)

    def step() -> float:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            loss = loss_of(b)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    step()  # the first step allocates and plans
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    seconds = (time.perf_counter() - t0) / a.steps
    out: dict[str, Any] = {"seconds": seconds,
                           "labelled": int((b.get("labels", torch.zeros(1)) != -100).sum())
                           if a.recipe == "pretrain" else 0}
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in events) or 1
        out["top"] = [(e.key, e.self_cpu_time_total / total, e.count) for e in events[:TOP]]
    print(json.dumps(out))


# ---- the driver -----------------------------------------------------------------------------------------
def one_pass(recipe: str, side: str, a: argparse.Namespace, profile: bool) -> tuple[dict[str, Any], float]:
    wait_for_quiet(a.patience)
    cmd = [sys.executable, str(HERE), "--role", "side", "--side", side, "--recipe", recipe, "--length",
           str(a.length),
           "--steps",
           str(a.steps)] + (["--profile"] if profile else []) + (["--bf16"] if a.bf16
                                                                 else []) + (["--lever", a.lever] if a.lever
                                                                             else [])
    busy, t0 = busy_seconds(), time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=bench_env(**thread_env(THREADS)))
    took = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"{recipe} / {side} failed:\n{r.stderr[-3000:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    return res, other_cores(busy, THREADS * took, took)  # the pass's own process counted as busy throughout


def main() -> None:
    ap = parser(__doc__, rounds=3)
    ap.add_argument("--role", default="driver", choices=["driver", "side"])
    ap.add_argument("--side", choices=(*SIDES, PLAIN))
    ap.add_argument("--recipe", default="embedding")
    ap.add_argument("--recipes", default="embedding,classification,pretrain,rerank,splade")
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--profile", action="store_true",
                    help="print mlmkit's top frames (one more profiled step per recipe)")
    ap.add_argument("--bf16", action="store_true",
                    help="bf16 autocast on both sides (a CPU with native bf16)")
    ap.add_argument("--lever", choices=tuple(LEVERS), default=None,
                    help="a third side: mlmkit without this lever")
    a = ap.parse_args()
    if a.role == "side":
        run_side(a)
        return
    ceiling = print_machine(THREADS)
    kind = "bf16" if a.bf16 else "fp32"
    print(f"training steps, MiniLM size, {TEXTS} texts of {a.length} tokens, {kind} and {THREADS} threads on "
          "every side, "
          f"{a.steps} timed steps a pass, "
          f"{a.rounds} rounds, sides alternating; useful FLOP/s over the {kind} GEMM ceiling above")
    print(f"  {'recipe':15s} {'side':36s} {'s/step':>7s} {'GFLOP/s':>8s} {'of ceiling':>12s}   passes "
          "(s/step)")
    shares = {}
    sides = (*SIDES, PLAIN) if a.lever else SIDES
    names = {"mlmkit": "mlmkit", PLAIN: LEVERS.get(a.lever or "", "")}
    for recipe in a.recipes.split(","):
        secs: dict[str, list[float]] = {s: [] for s in sides}
        others: dict[str, list[float]] = {s: [] for s in sides}
        labelled, top = 0, None
        for r, side in alternating(sides, a.rounds):
            res, other = one_pass(recipe, side, a, a.profile and side == "mlmkit" and top is None)
            secs[side].append(res["seconds"])
            others[side].append(other)
            labelled = res["labelled"] or labelled
            top = res.get("top", top)
            log(f"{recipe} round {r + 1}/{a.rounds} {side:12s} {res['seconds']:.3f} s/step (other processes: "
                f"{other:.2f} cores)")
        flops = useful_flops(recipe, a.length, labelled)
        quiet_rounds = [r for r in range(a.rounds)
                        if all(others[s][r] <= 0.15 for s in sides)] or list(range(a.rounds))
        for side in sides:
            med = statistics.median(secs[side][r] for r in quiet_rounds)
            passes_ = ", ".join(f"{x:.3f}{mark(o)}" for x, o in zip(secs[side], others[side]))
            print(f"  {recipe:15s} {names.get(side, PEERS[recipe]):36s} {med:7.3f} {flops / med / 1e9:8.0f} "
                  f"{share(flops / med, ceiling, kind):>12s}   {passes_}")
            if side == "mlmkit" and isinstance(ceiling.get(kind), float):
                shares[recipe] = flops / med / ceiling[kind]
        for slow, label in (("peer", "step speed, mlmkit / peer"), (PLAIN, f"the {a.lever} lever's gain")):
            if slow not in sides:
                continue
            ratios = [secs[slow][r] / secs["mlmkit"][r] for r in quiet_rounds]
            spread = f" (rounds {min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
            print(f"  {recipe:15s} {label:36s} {statistics.median(ratios):.2f}x{spread}")
        if top:
            print("    mlmkit's top frames by self CPU time (one profiled step): "
                  + "; ".join(f"{k} {s:.0%}" for k, s, _ in top))
    print(noisy_note())
    for recipe, value in shares.items():
        print(target(f"train-share-of-ceiling ({recipe}, length {a.length}, {kind})", value, ">=", 0.65))


if __name__ == "__main__":
    main()
