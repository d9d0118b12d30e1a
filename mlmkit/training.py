"""The one training loop, for pretraining and fine-tuning alike.

A data source hands out batch ``index`` of ``epoch`` directly (see ``DataSource``), so the loop's
position is just (epoch, micro-batch index): resuming seeks straight there, never replaying the
batches already seen. Checkpoints are run directories under RUN/checkpoints/step-N with a state/
folder (optimizer, scheduler, RNG, position); the last ``keep_last`` are kept. Under torchrun each
rank takes every world-size-th batch and only rank 0 writes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from .checkpoint import read_json, write_json
from .errors import ConfigError

log = logging.getLogger("mlmkit")


class DataSource(Protocol):
    def num_batches(self, epoch: int) -> int:
        """Micro-batches in ``epoch`` (across all ranks)."""

    def batch(self, epoch: int, index: int, seed: int) -> dict[str, torch.Tensor]:
        """Micro-batch ``index`` of ``epoch``; ``seed`` drives any per-batch randomness (masking)."""


@dataclass
class TrainArgs:
    steps: int | None = None
    """Optimizer steps in all; without it, ``epochs`` passes over the data."""
    epochs: float | None = None
    lr: float = 1e-4
    warmup_steps: int | None = None
    """Linear warmup steps; without it, ``warmup_ratio`` of the steps."""
    warmup_ratio: float = 0.06
    weight_decay: float = 0.01
    grad_accum: int = 1
    max_grad_norm: float = 1.0
    eval_every: int = 0
    """Evaluate every N steps (0: at each epoch end, and at the end)."""
    save_every: int = 0
    """Checkpoint every N steps (0: only at evaluations and the end)."""
    keep_last: int = 2
    log_every: int = 10
    seed: int = 0
    bf16: bool = False
    device: str = "cpu"
    metric_for_best: str | None = None
    """Keep the best model by this evaluation metric in the run root (fine-tuning)."""
    greater_is_better: bool = True
    early_stopping_patience: int | None = None
    """Stop after this many evaluations without improvement of ``metric_for_best``."""
    progress: bool = True

    def __post_init__(self) -> None:
        if self.steps is None and self.epochs is None:
            raise ConfigError("give --steps or --epochs")
        if self.steps is not None and self.steps < 1:
            raise ConfigError(f"--steps must be positive, got {self.steps}")
        if self.lr <= 0:
            raise ConfigError(f"--lr must be positive, got {self.lr}")
        if self.grad_accum < 1:
            raise ConfigError(f"--grad-accum must be at least 1, got {self.grad_accum}")


def resolve_device(name: str) -> torch.device:
    """``cuda`` when asked for and present; otherwise the CPU, saying so."""
    if name.startswith("cuda"):
        if torch.cuda.is_available():
            return torch.device(name)
        log.warning("--device cuda: no CUDA GPU is available to torch; running on the CPU")
        return torch.device("cpu")
    if name != "cpu":
        raise ConfigError(f"unknown device '{name}'", "use cpu or cuda")
    return torch.device("cpu")


def check_bf16(device: torch.device) -> None:
    """bf16 autocast only where the hardware has it: on a CPU without it a step is ~24x slower (PERF_NOTES)."""
    if device.type == "cuda":
        if not torch.cuda.is_bf16_supported():
            raise ConfigError("--bf16: this GPU has no bf16 support", "drop --bf16")
        return
    native = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)() or getattr(
        torch.cpu, "_is_amx_tile_supported", lambda: False
    )()
    if not native:
        raise ConfigError(
            "--bf16: this CPU has no native bf16 (torch falls back to a kernel ~24x slower than fp32)",
            "drop --bf16 on this machine, or train on a GPU",
        )


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    # matrices and embeddings decay; biases and LayerNorm weights (all 1-D) don't
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def linear_schedule(warmup: int, total: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))

    return f


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def batch_seed(seed: int, epoch: int, index: int) -> int:
    return (seed * 1_000_003 + epoch * 100_003 + index) % (2**63)


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device: torch.device) -> Dist:
    """Join the torchrun process group when WORLD_SIZE > 1 (gloo on CPU, nccl on GPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def _barrier(d: Dist) -> None:
    if d.world > 1:
        import torch.distributed as dist

        dist.barrier()


def _checkpoints(out_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first: state/trainer.json is written last, so its presence marks one."""
    done = [p for p in (Path(out_dir) / "checkpoints").glob("step-*") if (p / "state" / "trainer.json").exists()]
    return sorted(done, key=lambda p: int(p.name.split("-")[1]))


def latest_checkpoint(out_dir: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    done = _checkpoints(out_dir)
    return done[-1] if done else None


class Trainer:
    """Runs ``args`` over ``data`` on ``model`` (whose forward returns a dict with "loss").

    save_model(model, dir, meta) writes the model files of a run directory (config, weights,
    tokenizer, mlmkit.json); evaluate(model) returns a dict of metrics on held-out data.
    """

    def __init__(
        self,
        model: nn.Module,
        data: DataSource,
        args: TrainArgs,
        out_dir: str | Path,
        *,
        save_model: Callable[[nn.Module, Path, dict[str, Any]], None],
        evaluate: Callable[[nn.Module], dict[str, float]] | None = None,
    ) -> None:
        self.args, self.data, self.out = args, data, Path(out_dir)
        self.save_model, self.evaluate = save_model, evaluate
        self.device = resolve_device(args.device)
        if args.bf16:
            check_bf16(self.device)
        self.dist = init_distributed(self.device)
        if self.device.type == "cuda" and self.dist.world > 1:
            self.device = torch.device("cuda", self.dist.local_rank)
            torch.cuda.set_device(self.device)
        self.model = model.to(self.device)
        self.ddp: nn.Module = self.model
        if self.dist.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            self.ddp = DistributedDataParallel(self.model, device_ids=[self.device] if self.device.type == "cuda" else None)
        # fused: one kernel over all parameters instead of ~10 small ops per tensor, which cost as
        # much as a small BERT's forward and backward on 2 CPU cores (transformers' Trainer fuses too)
        self.opt = torch.optim.AdamW(
            param_groups(self.model, args.weight_decay), lr=args.lr, betas=(0.9, 0.999), eps=1e-6,
            fused=self.device.type in ("cpu", "cuda"),
        )
        if data.num_batches(0) // self.dist.world < 1:
            raise ConfigError(
                f"too little data for {self.dist.world} processes: {data.num_batches(0)} batch(es) per epoch",
                "lower --batch-size, add data, or use fewer processes",
            )
        per_epoch = max(1, data.num_batches(0) // self.dist.world // args.grad_accum)
        self.steps_per_epoch = per_epoch
        self.total = args.steps if args.steps is not None else max(1, math.ceil(args.epochs * per_epoch))
        warmup = args.warmup_steps if args.warmup_steps is not None else int(args.warmup_ratio * self.total)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, linear_schedule(warmup, self.total))
        self.step, self.epoch, self.micro = 0, 0, 0
        self.best: float | None = None
        self.best_metrics: dict[str, Any] = {}
        self._epoch_ended = False
        self.bad_evals = 0
        self.history: list[dict[str, Any]] = []

    # ---- state -------------------------------------------------------------------------------

    def _write_checkpoint(self, meta: dict[str, Any]) -> Path:
        """Model files, then state/, then trainer.json last: a kill midway leaves an incomplete dir
        that latest_checkpoint() ignores, and the previous checkpoint untouched."""
        ck = self.out / "checkpoints" / f"step-{self.step:07d}"
        if ck.exists():
            shutil.rmtree(ck)
        self.save_model(self.model, ck, meta)
        st = ck / "state"
        st.mkdir(parents=True, exist_ok=True)
        torch.save({"optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict()}, st / "optimizer.pt")
        npst = np.random.get_state()
        rng = {  # plain tensors and tuples only, so it loads with weights_only=True
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": (npst[0], torch.from_numpy(npst[1].astype(np.int64)), *npst[2:]),
        }
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        torch.save(rng, st / "rng.pt")
        write_json(
            st / "trainer.json",
            {"step": self.step, "epoch": self.epoch, "micro": self.micro, "best": self.best,
             "bad_evals": self.bad_evals, "total": self.total, "world": self.dist.world},
        )
        # keep the last keep_last complete checkpoints; an incomplete one (a crashed write) must not
        # count, or it could displace the last complete one
        for old in _checkpoints(self.out)[: -self.args.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        return ck

    def _resume(self) -> None:
        from .checkpoint import load_state_dict, load_weights

        ck = latest_checkpoint(self.out)
        if ck is None:
            raise ConfigError(f"--resume: no complete checkpoint under {self.out / 'checkpoints'}", "drop --resume")
        st = read_json(ck / "state" / "trainer.json")
        if st.get("world", 1) != self.dist.world:
            raise ConfigError(
                f"--resume: the checkpoint was written by {st['world']} processes, this run has {self.dist.world}",
                "resume with the same --nproc-per-node",
            )
        load_weights(self.model, load_state_dict(ck))
        opt = torch.load(ck / "state" / "optimizer.pt", map_location=self.device, weights_only=True)
        self.opt.load_state_dict(opt["optimizer"])
        self.sched.load_state_dict(opt["scheduler"])
        rng = torch.load(ck / "state" / "rng.pt", weights_only=True)
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        kind, keys, *rest = rng["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        self.step, self.epoch, self.micro = st["step"], st["epoch"], st["micro"]
        self.best, self.bad_evals = st.get("best"), st.get("bad_evals", 0)
        log.info("resumed from %s at step %d (epoch %d, batch %d)", ck, self.step, self.epoch, self.micro)

    # ---- the loop ----------------------------------------------------------------------------

    def _next_batch(self) -> dict[str, torch.Tensor]:
        w = self.dist.world
        while self.micro >= self.data.num_batches(self.epoch) // w:
            self.epoch, self.micro = self.epoch + 1, 0
            self._epoch_ended = True
        idx = self.micro * w + self.dist.rank
        b = self.data.batch(self.epoch, idx, batch_seed(self.args.seed, self.epoch, idx))
        self.micro += 1
        return {k: v.to(self.device, non_blocking=True) for k, v in b.items()}

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.args.bf16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _log(self, rec: dict[str, Any]) -> None:
        self.history.append(rec)
        if self.dist.main:
            with open(self.out / "metrics.jsonl", "a", encoding="utf-8") as f:
                import json

                f.write(json.dumps(rec) + "\n")

    def _run_eval(self, meta: dict[str, Any]) -> bool:
        """Evaluate, keep the best model, checkpoint. Returns True when early stopping says stop."""
        stop = False
        if self.dist.main:
            metrics: dict[str, float] = {}
            if self.evaluate is not None:
                self.model.eval()
                with torch.no_grad(), self._autocast():
                    metrics = self.evaluate(self.model)
                self.model.train()
                self._log({"step": self.step, "epoch": self.epoch, **{f"eval_{k}": v for k, v in metrics.items()}})
                key = self.args.metric_for_best
                if key is not None and key in metrics:
                    v = metrics[key]
                    better = self.best is None or (v > self.best if self.args.greater_is_better else v < self.best)
                    if better:
                        self.best, self.bad_evals = v, 0
                        self.best_metrics = {"best_step": self.step, **{f"eval_{k}": x for k, x in metrics.items()}}
                        self.save_model(self.model, self.out, {**meta, "best_step": self.step, "best_metrics": metrics})
                    else:
                        self.bad_evals += 1
                        p = self.args.early_stopping_patience
                        stop = p is not None and self.bad_evals >= p
            self._write_checkpoint(meta)
        _barrier(self.dist)
        if self.dist.world > 1:
            import torch.distributed as dist

            flag = [stop]
            dist.broadcast_object_list(flag, src=0)
            stop = flag[0]
        return stop

    def train(self, *, resume: bool = False, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """Train to ``total`` steps; returns the last logged and evaluation metrics."""
        meta = {**(meta or {}), "train_args": asdict(self.args)}
        if self.dist.main:
            self.out.mkdir(parents=True, exist_ok=True)
        if resume:
            self._resume()
        elif self.dist.main and latest_checkpoint(self.out) is not None:
            raise ConfigError(
                f"{self.out} already holds a run with checkpoints",
                "pass --resume to continue it, or choose a new --out",
            )
        else:
            set_seed(self.args.seed)
        a = self.args
        self.model.train()
        tokens, t0, logged = 0, time.perf_counter(), {}
        sums: dict[str, float] = {}
        n_sum, stopped = 0, False
        progress = _progress(a.progress and self.dist.main, self.total, self.step)
        with progress as bar:
            task = bar.add_task("train", total=self.total, completed=self.step, loss=float("nan"), tps=0.0)
            while self.step < self.total:
                self._epoch_ended = False
                for i in range(a.grad_accum):
                    b = self._next_batch()
                    tokens += int(b["attention_mask"].sum())
                    last = i == a.grad_accum - 1
                    # DDP all-reduces gradients only on the last micro-batch of an accumulation
                    sync = self.ddp.no_sync() if self.dist.world > 1 and not last else contextlib.nullcontext()
                    with sync, self._autocast():
                        out = self.ddp(**b)
                    (out["loss"] / a.grad_accum).backward()
                    for k, v in out.items():
                        if k.endswith("loss"):
                            sums[k] = sums.get(k, 0.0) + float(v.detach())
                    n_sum += 1
                if a.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), a.max_grad_norm)
                self.opt.step()
                self.sched.step()
                self.opt.zero_grad(set_to_none=True)
                self.step += 1
                if self.step % a.log_every == 0 or self.step == self.total:
                    dt = time.perf_counter() - t0
                    logged = {k: v / n_sum for k, v in sums.items()}
                    rec = {"step": self.step, "epoch": self.epoch, **logged, "lr": self.sched.get_last_lr()[0],
                           "tokens_per_s": tokens * self.dist.world / max(dt, 1e-9)}
                    self._log(rec)
                    bar.update(task, loss=logged.get("loss", float("nan")), tps=rec["tokens_per_s"])
                    tokens, t0, sums, n_sum = 0, time.perf_counter(), {}, 0
                bar.update(task, completed=self.step)
                if self.step == self.total:
                    break
                # an epoch ends when its batches are used up (the position moves to the next epoch at
                # once, so a checkpoint here resumes there), or when an accumulation spilled over
                if self.micro >= self.data.num_batches(self.epoch) // self.dist.world:
                    self.epoch, self.micro, self._epoch_ended = self.epoch + 1, 0, True
                epoch_end = self._epoch_ended
                if (a.eval_every and self.step % a.eval_every == 0) or (not a.eval_every and epoch_end):
                    if self._run_eval(meta):
                        log.info("early stopping at step %d: no gain in %s", self.step, a.metric_for_best)
                        stopped = True
                        break
                elif a.save_every and self.step % a.save_every == 0:
                    if self.dist.main:
                        self._write_checkpoint(meta)
                    _barrier(self.dist)
            if not stopped:
                self._run_eval(meta)
        last_eval = next((r for r in reversed(self.history) if any(k.startswith("eval_") for k in r)), {})
        result = {"step": self.step, **logged, **{k: v for k, v in last_eval.items() if k.startswith("eval_")}}
        if self.best_metrics:  # the run directory holds the best model: report its figures
            result = {"step": self.step, "last_step_metrics": result, **self.best_metrics}
        if self.dist.main:
            final = {**meta, "final_metrics": result}
            if a.metric_for_best is None or self.best is None:
                self.save_model(self.model, self.out, final)  # no selection: the final weights
            else:
                m = read_json(self.out / "mlmkit.json")
                m["final_metrics"] = result
                write_json(self.out / "mlmkit.json", m)
        _barrier(self.dist)
        if self.dist.world > 1:
            import torch.distributed as dist

            dist.destroy_process_group()
        return result


def _progress(enabled: bool, total: int, done: int):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.4f}"),
        TextColumn("{task.fields[tps]:,.0f} tok/s"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not enabled,
        transient=False,
    )
