"""The one training loop, for pretraining and fine-tuning alike, and its small parts.

- ``Cursor``: the loop's position in the data, (epoch, micro-batch). A data source hands out batch
  ``index`` of ``epoch`` directly (``DataSource``), so resuming seeks straight there and never
  replays the batches already seen. Epochs advance in one place, ``Cursor._next_epoch``.
- ``Checkpointer``: run directories under RUN/checkpoints/step-N with a state/ folder (optimizer,
  scheduler, RNG, position); state/trainer.json is written last and marks a checkpoint complete;
  the last ``keep_last`` complete ones are kept; --resume restores the newest that loads whole.
- ``BestTracker``: the best evaluation so far by the main metric, and early stopping.
- ``Trainer``: the loop (devices, DDP, AdamW, the linear schedule, metrics.jsonl, progress).

Under torchrun each rank takes every world-size-th batch and only rank 0 writes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from .args import TrainArgs
from .checkpoint import load_state_dict, load_weights
from .errors import ConfigError, MlmkitError
from .files import atomic_open, exclusive, read_json, write_json
from .tracking import Reporter, Reporters, RunInfo, flat_params, parse_report_to

log = logging.getLogger("mlmkit")

SaveModel = Callable[[nn.Module, Path, dict[str, Any]], None]
"""Writes the model files of a run directory (config, weights, tokenizer, mlmkit.json with the meta)."""
Evaluate = Callable[[nn.Module], dict[str, Any]]
"""Metrics of the model (in eval mode, under no_grad) on held-out data."""


class DataSource(Protocol):
    def num_batches(self, epoch: int) -> int:
        """Micro-batches in ``epoch`` (across all ranks)."""

    def batch(self, epoch: int, index: int, seed: int) -> dict[str, torch.Tensor]:
        """Micro-batch ``index`` of ``epoch``; ``seed`` drives any per-batch randomness (masking)."""


# ---- devices and processes -----------------------------------------------------------------------
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


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()


def init_distributed(device: torch.device) -> Dist:
    """Join the torchrun process group when WORLD_SIZE > 1 (gloo on CPU, nccl on GPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


# ---- optimisation ------------------------------------------------------------------------------
def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    # matrices and embeddings decay; biases and LayerNorm weights (all 1-D) don't
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def linear_schedule(warmup: int, total: int) -> Callable[[int], float]:
    """The learning-rate factor at each step: linear warmup over ``warmup`` steps, then linear decay to 0."""

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


# ---- the parts of the loop -----------------------------------------------------------------------
class Cursor:
    """This rank's position in the data: micro-batch ``micro`` of ``epoch``; rank r of w processes
    takes the batches r, r + w, r + 2w ... of each epoch."""

    def __init__(self, data: DataSource, dist: Dist) -> None:
        self.data, self.dist = data, dist
        self.epoch, self.micro = 0, 0
        self.epoch_ended = False
        """Set when the position moved to a new epoch; cleared by the loop at each step."""

    def per_epoch(self) -> int:
        return self.data.num_batches(self.epoch) // self.dist.world

    def _next_epoch(self) -> None:
        self.epoch, self.micro, self.epoch_ended = self.epoch + 1, 0, True

    def take(self, seed: int) -> dict[str, torch.Tensor]:
        """The next micro-batch of this rank."""
        while self.micro >= self.per_epoch():
            self._next_epoch()
        index = self.micro * self.dist.world + self.dist.rank
        self.micro += 1
        return self.data.batch(self.epoch, index, batch_seed(seed, self.epoch, index))

    def close_epoch(self) -> None:
        """After a step: an epoch whose batches are all used ends now, so a checkpoint taken here
        resumes at the next epoch."""
        if self.micro >= self.per_epoch():
            self._next_epoch()


class Checkpointer:
    """Complete checkpoints under OUT/checkpoints: write (model files, then state/, trainer.json last),
    find the latest, restore one, keep the last ``keep_last``."""

    def __init__(self, out: Path, save_model: SaveModel, keep_last: int) -> None:
        self.root, self.save_model, self.keep_last = Path(out) / "checkpoints", save_model, keep_last

    def complete(self) -> list[Path]:
        """Complete checkpoints, oldest first: state/trainer.json is written last, so it marks one."""
        done = [p for p in self.root.glob("step-*") if (p / "state" / "trainer.json").exists()]
        return sorted(done, key=lambda p: int(p.name.split("-")[1]))

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None

    def save(self, model: nn.Module, opt: torch.optim.Optimizer, sched: Any, position: dict[str, Any], meta: dict[str, Any]) -> Path:
        """A kill midway leaves an incomplete directory that ``latest`` ignores, and the previous
        checkpoint untouched."""
        ck = self.root / f"step-{position['step']:07d}"
        if ck.exists():
            shutil.rmtree(ck)
        try:
            self._write(ck, model, opt, sched, position, meta)
        except Exception as e:  # (a kill leaves the directory incomplete, and ``complete`` ignores it)
            shutil.rmtree(ck, ignore_errors=True)
            if isinstance(e, OSError):
                raise MlmkitError(f"could not write the checkpoint {ck}: {e.strerror or e}",
                                  "free disk space or fix the permissions; the previous checkpoint is intact") from e
            raise
        # an incomplete checkpoint (a crashed write) must not count, or it could displace the last complete one
        for old in self.complete()[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        return ck

    def _write(self, ck: Path, model: nn.Module, opt: torch.optim.Optimizer, sched: Any, position: dict[str, Any],
               meta: dict[str, Any]) -> None:
        self.save_model(model, ck, meta)
        st = ck / "state"
        st.mkdir(parents=True, exist_ok=True)
        torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}, st / "optimizer.pt")
        npst = np.random.get_state()
        rng = {  # plain tensors and tuples only, so it loads with weights_only=True
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": (npst[0], torch.from_numpy(npst[1].astype(np.int64)), *npst[2:]),
        }
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        torch.save(rng, st / "rng.pt")
        write_json(st / "trainer.json", position)

    def restore(self, model: nn.Module, opt: torch.optim.Optimizer, sched: Any, device: torch.device) -> tuple[Path, dict[str, Any]]:
        """Load the newest checkpoint that loads whole into the model, optimizer, scheduler and RNGs;
        (its path, its position). A damaged newer one is reported (a warning) and passed over."""
        done = self.complete()
        if not done:
            raise ConfigError(f"--resume: no complete checkpoint under {self.root}", "drop --resume")
        passed: list[tuple[Path, MlmkitError]] = []  # said once it is known whether any loads: else one line
        for ck in reversed(done):
            try:
                pos = self._restore(ck, model, opt, sched, device)
            except MlmkitError as e:
                passed.append((ck, e))
                continue
            for bad, e in passed:
                log.warning("--resume: passing over the checkpoint %s: %s", bad, e.message)
            if passed:
                log.warning("--resume: resuming from %s, the newest checkpoint that loads whole", ck)
            return ck, pos
        raise ConfigError(f"--resume: none of the {len(done)} checkpoints under {self.root} loads whole "
                          f"(the newest: {passed[0][1].message})", "restore the checkpoint files, or start again in a new --out")

    def loadable(self) -> Path | None:
        """The newest complete checkpoint whose files all load (read, not applied), or None."""
        for ck in reversed(self.complete()):
            try:
                self._read(ck, torch.device("cpu"))
            except MlmkitError as e:  # (restore, which reads it again, says so)
                log.debug("passing over the checkpoint %s: %s", ck, e.message)
                continue
            return ck
        return None

    def _read(self, ck: Path, device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any], dict[str, Any]]:
        """(weights, optimizer + scheduler state, RNG states, position) of one checkpoint, each checked
        to be whole; MlmkitError (one line, naming the file) for any that is not."""
        sd = load_state_dict(ck)
        state = _load_state(ck / "state" / "optimizer.pt", device)
        if not isinstance(state.get("optimizer"), dict) or not isinstance(state.get("scheduler"), dict):
            raise ConfigError(f"{ck / 'state' / 'optimizer.pt'}: no optimizer and scheduler state in it", REWRITE)
        rng = _load_state(ck / "state" / "rng.pt", torch.device("cpu"))
        numpy_state = rng.get("numpy")
        if (not isinstance(rng.get("torch"), torch.Tensor) or not isinstance(rng.get("python"), tuple)
                or not isinstance(numpy_state, tuple) or len(numpy_state) < 2 or not isinstance(numpy_state[1], torch.Tensor)):
            raise ConfigError(f"{ck / 'state' / 'rng.pt'}: not the random number generators' state", REWRITE)
        pos = read_json(ck / "state" / "trainer.json")
        if not isinstance(pos, dict) or not all(isinstance(pos.get(k), int) for k in ("step", "epoch", "micro")):
            raise ConfigError(f"{ck / 'state' / 'trainer.json'}: no step, epoch and batch position in it", REWRITE)
        return sd, state, rng, pos

    def _restore(self, ck: Path, model: nn.Module, opt: torch.optim.Optimizer, sched: Any, device: torch.device) -> dict[str, Any]:
        sd, state, rng, pos = self._read(ck, device)
        load_weights(model, sd)
        try:  # a state that unpickles but does not fit (a cut list, a missing key) fails here, before any is set
            opt.load_state_dict(state["optimizer"])
            sched.load_state_dict(state["scheduler"])
            torch.set_rng_state(rng["torch"])
            random.setstate(rng["python"])
            kind, keys, *rest = rng["numpy"]
            np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
            if "cuda" in rng and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(rng["cuda"])
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as e:
            raise ConfigError(f"{ck / 'state'}: its optimizer, scheduler or RNG state does not fit this run "
                              f"({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})", REWRITE) from None
        return pos


REWRITE = "the file is damaged or was cut short; --resume passes over it to an older checkpoint"


def _load_state(p: Path, device: torch.device) -> dict[str, Any]:
    """A state file written by torch.save, loaded tensors-only; one line for a damaged or truncated
    file (torch's own message suggests weights_only=False, which must never be done here)."""
    try:
        state = torch.load(p, map_location=device, weights_only=True)
    except FileNotFoundError:
        raise ConfigError(f"{p}: missing", REWRITE) from None
    except Exception as e:  # an unpickling error, a truncated zip, a bad record: torch has no one type for them
        why = "it holds objects other than tensors" if "Unsupported global" in str(e) else "damaged or truncated"
        raise ConfigError(f"{p}: unreadable ({why})", REWRITE) from None
    if not isinstance(state, dict):
        raise ConfigError(f"{p}: not a state dictionary", REWRITE)
    return state


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run directory whose files all load (a damaged newer one is
    passed over with a warning), or None."""
    return Checkpointer(Path(out_dir), lambda *a: None, 1).loadable()


class BestTracker:
    """The best evaluation so far by ``metric`` and the evaluations since it (early stopping)."""

    def __init__(self, metric: str | None, greater_is_better: bool, patience: int | None) -> None:
        self.metric, self.greater, self.patience = metric, greater_is_better, patience
        self.best: float | None = None
        self.bad_evals = 0
        self.best_metrics: dict[str, Any] = {}

    def update(self, step: int, metrics: dict[str, Any]) -> bool:
        """Record an evaluation; True when it is the best so far (the caller keeps that model)."""
        if self.metric is None or self.metric not in metrics:
            return False
        v = float(metrics[self.metric])
        if self.best is None or (v > self.best if self.greater else v < self.best):
            self.best, self.bad_evals = v, 0
            self.best_metrics = {"best_step": step, **{f"eval_{k}": x for k, x in metrics.items()}}
            return True
        self.bad_evals += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.patience is not None and self.bad_evals >= self.patience

    def state(self) -> dict[str, Any]:
        return {"best": self.best, "bad_evals": self.bad_evals, "best_metrics": self.best_metrics}

    def load(self, state: dict[str, Any]) -> None:
        self.best, self.bad_evals = state.get("best"), state.get("bad_evals", 0)
        self.best_metrics = state.get("best_metrics") or {}


# ---- the loop ----------------------------------------------------------------------------------
class Trainer:
    """Runs ``args`` over ``data`` on ``model`` (whose forward returns a dict with "loss")."""

    def __init__(
        self, model: nn.Module, data: DataSource, args: TrainArgs, out_dir: str | Path, *,
        save_model: SaveModel, evaluate: Evaluate | None = None, data_key: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None, reporters: Sequence[Reporter] = (),
    ) -> None:
        """``data_key``: the settings that decide which batch comes at which step (batch size, files,
        lengths ...): a checkpoint records them and --resume refuses to continue when they changed.
        ``params``: the command's arguments, flat, for the tracking backends (--report-to);
        ``reporters``: more reporters beside those (a sweep's pruner)."""
        self.args, self.data, self.out, self.evaluate = args, data, Path(out_dir), evaluate
        self.params, self.extra_reporters = params or flat_params(args), tuple(reporters)
        self.reporters = Reporters([])
        self.save_model = save_model
        self.data_key = {**(data_key or {}), "seed": args.seed, "grad_accum": args.grad_accum}
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
        self.cursor = Cursor(data, self.dist)
        per_epoch = self.cursor.per_epoch()
        if per_epoch < 1:
            raise ConfigError(
                f"too little data for {self.dist.world} processes: {data.num_batches(0)} batch(es) per epoch",
                "lower --batch-size, add data, or use fewer processes",
            )
        self.steps_per_epoch = max(1, per_epoch // args.grad_accum)
        self.total = args.steps if args.steps is not None else max(1, math.ceil(args.epochs * self.steps_per_epoch))
        warmup = args.warmup_steps if args.warmup_steps is not None else int(args.warmup_ratio * self.total)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, linear_schedule(warmup, self.total))
        self.checkpoints = Checkpointer(self.out, save_model, args.keep_last)
        self.tracker = BestTracker(args.metric_for_best, args.greater_is_better, args.early_stopping)
        self.step = 0
        self.history: list[dict[str, Any]] = []

    # ---- state -------------------------------------------------------------------------------
    def _position(self) -> dict[str, Any]:
        return {"step": self.step, "epoch": self.cursor.epoch, "micro": self.cursor.micro, "total": self.total,
                "world": self.dist.world, "data": self.data_key, **self.tracker.state()}

    def _checkpoint(self, meta: dict[str, Any]) -> None:
        if self.dist.main:
            self.checkpoints.save(self.model, self.opt, self.sched, self._position(), meta)
        self.dist.barrier()

    def _start(self) -> int | None:
        """A fresh run (refusing a directory that holds one), or the latest checkpoint's state; returns
        the step resumed from (None for a fresh run)."""
        if not self.args.resume:
            if self.dist.main and self.checkpoints.latest() is not None:
                raise ConfigError(f"{self.out} already holds a run with checkpoints",
                                  "pass --resume to continue it, or choose a new --out")
            set_seed(self.args.seed)
            return None
        ck, pos = self.checkpoints.restore(self.model, self.opt, self.sched, self.device)
        if pos.get("world", 1) != self.dist.world:
            raise ConfigError(
                f"--resume: the checkpoint was written by {pos['world']} processes, this run has {self.dist.world}",
                "resume with the same --nproc-per-node",
            )
        saved = json.loads(json.dumps(pos.get("data", self.data_key)))  # as JSON has it (tuples are lists)
        changed = [k for k in sorted({*saved, *self.data_key}) if saved.get(k) != json.loads(json.dumps(self.data_key.get(k)))]
        if changed:
            what = "; ".join(f"{k}: {saved.get(k)!r} then, {self.data_key.get(k)!r} now" for k in changed)
            if not self.args.resume_force:
                raise ConfigError(f"--resume: settings that decide the data order changed since the checkpoint ({what})",
                                  "resume with the run's settings, or pass --resume-force to continue regardless")
            log.warning("--resume-force: continuing although %s", what)
        self.step, self.cursor.epoch, self.cursor.micro = pos["step"], pos["epoch"], pos["micro"]
        self.tracker.load(pos)
        log.info("resumed from %s at step %d (epoch %d, batch %d)", ck, self.step, self.cursor.epoch, self.cursor.micro)
        if self.dist.main:  # what was logged after the checkpoint is about to happen again
            self._trim_log(self.step)
        return self.step

    def _trim_log(self, step: int) -> None:
        path = self.out / "metrics.jsonl"
        if path.exists():
            kept = [line for line in path.read_text(encoding="utf-8").splitlines(keepends=True) if _logged_by(line, step)]
            with atomic_open(path) as f:
                f.writelines(kept)

    def _log(self, rec: dict[str, Any]) -> None:
        self.history.append(rec)
        if self.dist.main:
            with open(self.out / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
            self.reporters.log(rec)

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.args.bf16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # ---- evaluation --------------------------------------------------------------------------
    def _evaluate(self, meta: dict[str, Any]) -> bool:
        """Evaluate, keep the best model, checkpoint. Returns True when early stopping says stop."""
        if self.dist.main and self.evaluate is not None:
            self.model.eval()
            with torch.no_grad(), self._autocast():
                metrics = self.evaluate(self.model)
            self.model.train()
            self._log({"step": self.step, "epoch": self.cursor.epoch, **{f"eval_{k}": v for k, v in metrics.items()
                                                                         if isinstance(v, (int, float))}})
            if self.tracker.update(self.step, metrics):
                self.save_model(self.model, self.out, {**meta, "best_step": self.step, "best_metrics": metrics})
        self._checkpoint(meta)
        stop = [self.tracker.should_stop]
        if self.dist.world > 1:
            torch.distributed.broadcast_object_list(stop, src=0)
        return bool(stop[0])

    # ---- training ----------------------------------------------------------------------------
    def _step(self, sums: dict[str, float]) -> int:
        """One optimizer step over grad_accum micro-batches; returns the real tokens it saw."""
        a, tokens = self.args, 0
        for i in range(a.grad_accum):
            b = {k: v.to(self.device, non_blocking=True) for k, v in self.cursor.take(a.seed).items()}
            tokens += int(b["attention_mask"].sum())
            # DDP all-reduces gradients only on the last micro-batch of an accumulation
            last = i == a.grad_accum - 1
            sync = self.ddp.no_sync() if self.dist.world > 1 and not last else contextlib.nullcontext()
            with sync, self._autocast():
                out = self.ddp(**b)
            (out["loss"] / a.grad_accum).backward()
            for k, v in out.items():
                if k.endswith("loss"):
                    sums[k] = sums.get(k, 0.0) + float(v.detach())
        self._stop_if_diverged(sums["loss"])
        if a.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), a.max_grad_norm)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        return tokens

    def _stop_if_diverged(self, loss: float) -> None:
        """A NaN or infinite loss: the weights are gone; stop (every rank) before they are saved."""
        bad = torch.tensor(float(not math.isfinite(loss)), device=self.device)
        if self.dist.world > 1:  # decided together, or a rank that stops alone leaves the others waiting
            torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
        if bad.item():
            raise ConfigError(
                f"the training loss became {loss} at step {self.step + 1}: training diverged",
                "lower --lr (and check the data); the last checkpoint, if any, is intact",
            )

    def train(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """Train to ``total`` steps; returns the last logged and evaluation metrics."""
        with exclusive(self.out) if self.dist.main else contextlib.nullcontext():
            return self._train({**(meta or {}), "train_args": asdict(self.args)})

    def _train(self, meta: dict[str, Any]) -> dict[str, Any]:
        resumed = self._start()
        if self.dist.main:
            self.reporters = Reporters(parse_report_to(self.args.report_to), self.extra_reporters)
            self.reporters.start(RunInfo(self.out, self.params, resumed, self.args.log_model))
        try:
            result = self._loop(meta)
        except BaseException as e:
            self.reporters.finish([self.out / "metrics.jsonl"], "KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
            raise
        self.reporters.finish(self._artifacts(), "FINISHED")
        return result

    def _artifacts(self) -> list[Path]:
        """The run's files for the tracking backends: its description, metrics, card and curves (the
        weights too with --log-model)."""
        names = ["mlmkit.json", "config.json", "metrics.jsonl", "README.md", "curves.png"]
        if self.args.log_model:
            names += [p.name for p in sorted(self.out.iterdir()) if p.is_file() and p.name not in names
                      and p.name not in ("tracking.json", ".lock")]
        return [self.out / n for n in names if (self.out / n).is_file()]

    def _loop(self, meta: dict[str, Any]) -> dict[str, Any]:
        a = self.args
        self.model.train()
        tokens, t0, logged, sums, n_sum, stopped = 0, time.perf_counter(), {}, {}, 0, False
        with _progress(a.progress and self.dist.main) as bar:
            task = bar.add_task("train", total=self.total, completed=self.step, loss=float("nan"), tps=0.0)
            while self.step < self.total:
                self.cursor.epoch_ended = False
                tokens += self._step(sums)
                n_sum += a.grad_accum
                if self.step % a.log_every == 0 or self.step == self.total:
                    dt = time.perf_counter() - t0
                    logged = {k: v / n_sum for k, v in sums.items()}
                    rec = {"step": self.step, "epoch": self.cursor.epoch, **logged, "lr": self.sched.get_last_lr()[0],
                           "tokens_per_s": tokens * self.dist.world / max(dt, 1e-9)}
                    self._log(rec)
                    bar.update(task, loss=logged.get("loss", float("nan")), tps=rec["tokens_per_s"])
                    tokens, t0, sums, n_sum = 0, time.perf_counter(), {}, 0
                bar.update(task, completed=self.step)
                if self.step == self.total:
                    break
                self.cursor.close_epoch()
                if (a.eval_every and self.step % a.eval_every == 0) or (not a.eval_every and self.cursor.epoch_ended):
                    if self._evaluate(meta):
                        log.info("early stopping at step %d: no gain in %s for %d evaluations",
                                 self.step, a.metric_for_best, a.early_stopping)
                        stopped = True
                        break
                elif a.save_every and self.step % a.save_every == 0:
                    self._checkpoint(meta)
            if not stopped:
                self._evaluate(meta)
        return self._finish(meta, logged)

    def _finish(self, meta: dict[str, Any], logged: dict[str, float]) -> dict[str, Any]:
        last_eval = next((r for r in reversed(self.history) if any(k.startswith("eval_") for k in r)), {})
        result = {"step": self.step, **logged, **{k: v for k, v in last_eval.items() if k.startswith("eval_")}}
        best = self.tracker.best_metrics
        if best:  # the run directory holds the best model: report its figures
            result = {"step": self.step, "last_step_metrics": result,
                      **{k: v for k, v in best.items() if not isinstance(v, (list, dict))}}
        if self.dist.main:
            if self.tracker.best is None:
                self.save_model(self.model, self.out, {**meta, "final_metrics": result})  # no selection: the final weights
            else:
                m = read_json(self.out / "mlmkit.json")
                write_json(self.out / "mlmkit.json", {**m, "final_metrics": result})
            from . import cards, plots

            plots.write_run_curves(self.out)
            cards.write_card(self.out)
        self.dist.barrier()
        if self.dist.world > 1:
            torch.distributed.destroy_process_group()
        return result


def _logged_by(line: str, step: int) -> bool:
    """Whether a metrics.jsonl line was logged at or before ``step`` (a line cut short by a kill was not)."""
    try:
        return int(json.loads(line).get("step", 0)) <= step
    except (AttributeError, TypeError, ValueError, RecursionError):
        return False


def _progress(enabled: bool):
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
