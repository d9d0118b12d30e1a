"""The one training loop, for pretraining and fine-tuning alike, and its small parts.

Its resume state is state.py's and its devices devices.py's:

- ``Cursor`` (state.py): the loop's position in the data, (epoch, micro-batch). A data source hands out batch
  ``index`` of ``epoch`` directly (``DataSource``), so resuming seeks straight there and never
  replays the batches already seen. Epochs advance in one place, ``Cursor._next_epoch``.
- ``ResumeCheckpoints`` (state.py): run directories under RUN/checkpoints/step-N with a state/ folder
  (optimizer, scheduler, RNG, position); state/trainer.json is written last and marks a checkpoint complete;
  the last ``keep_last`` complete ones are kept; --resume restores the newest that loads whole
  (a run directory itself is read and written by rundir/checkpoint.py).
- ``BestTracker`` (best.py): the best evaluation so far by the main metric, and early stopping;
  AdamW's parameter groups and the learning-rate schedule: optimizer.py.
- ``Trainer``: the loop (devices, DDP, AdamW, the linear schedule, metrics.jsonl, progress).

Under torchrun each rank takes every world-size-th batch and only rank 0 writes; an evaluation that
spreads (finetune.py's TaskEvaluator) runs its batches across the ranks, and a model that runs its
own backward passes (cached-mnrl) goes without DDP, its gradients averaged once a step (devices.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from mlmkit.args import TrainArgs
from mlmkit.errors import ConfigError, Diverged
from mlmkit.files import JSONObject, atomic_open
from mlmkit.locks import exclusive
from mlmkit.registry import Metrics
from mlmkit.rundir.meta import RunMeta, read_meta, write_meta
from mlmkit.train.best import BestTracker, scalars
from mlmkit.train.data import DataSource
from mlmkit.train.devices import (
    average_gradients,
    broadcast_parameters,
    init_distributed,
    keep_freed_memory,
    resolve_device,
    syncs_own_gradients,
    use_bf16,
)
from mlmkit.train.optimizer import linear_schedule, param_groups, set_seed
from mlmkit.train.state import Cursor, Position, ResumeCheckpoints, SaveModel
from mlmkit.train.timing import Timings
from mlmkit.train.tracking import Params, Reporter, Reporters, RunInfo, flat_params, parse_report_to

if TYPE_CHECKING:
    from rich.progress import Progress

log = logging.getLogger("mlmkit")

Evaluate = Callable[[nn.Module], Metrics]
"""Metrics of the model (in eval mode, under no_grad) on held-out data."""
LogLine = dict[str, float]
"""One line of metrics.jsonl (and of ``Trainer.history``): step, epoch, and either the training
figures (the losses averaged since the last line, lr, tokens_per_s) or an evaluation's numbers (eval_*)."""


# ---- the loop ----------------------------------------------------------------------------------
class Trainer:
    """Runs ``args`` over ``data`` on ``model`` (whose forward returns a dict with "loss")."""

    def __init__(
        self, model: nn.Module, data: DataSource, args: TrainArgs, out_dir: str | Path, *,
        save_model: SaveModel, evaluate: Evaluate | None = None, data_key: Mapping[str, Any] | None = None,
        params: Params | None = None, reporters: Sequence[Reporter] = (), timings: Timings | None = None,
    ) -> None:
        """``data_key``: the settings that decide which batch comes at which step (batch size, files,
        lengths ...): a checkpoint records them and --resume refuses to continue when they changed.
        ``params``: the command's arguments, flat, for the tracking backends (--report-to);
        ``reporters``: more reporters beside those (a sweep's pruner); ``timings``: the phases timed before
        the loop (fine-tuning's loading, reading and tokenizing), which the loop's add to."""
        self.args, self.data, self.out, self.evaluate = args, data, Path(out_dir), evaluate
        self.params, self.extra_reporters = params or flat_params(args), tuple(reporters)
        self.reporters = Reporters([])
        self.timings = timings or Timings()
        self.save_model = self._timed_save(save_model)
        self.data_key: JSONObject = {**(data_key or {}), "seed": args.seed, "grad_accum": args.grad_accum}
        self.device = resolve_device(args.device)
        if self.device.type == "cpu":  # a step's large blocks reused, not mapped and zeroed anew each step
            keep_freed_memory()
        self.bf16 = use_bf16(args.bf16, self.device, model)
        self.dist = init_distributed(self.device)
        if self.device.type == "cuda" and self.dist.world > 1:
            self.device = torch.device("cuda", self.dist.local_rank)
            torch.cuda.set_device(self.device)
        self.model = model.to(self.device)
        self.ddp: nn.Module = self.model
        # a model that runs backward passes of its own (cached-mnrl) goes without DDP's reducer, which
        # allows one backward per forward: the Trainer averages its gradients once a step instead
        self.own_sync = self.dist.world > 1 and syncs_own_gradients(self.model)
        if self.own_sync:
            broadcast_parameters(self.model)
        elif self.dist.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device] if self.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(self.model, device_ids=ids)
        # fused: one kernel over all parameters instead of ~10 small ops per tensor, which cost as
        # much as a small BERT's forward and backward on 2 CPU cores (transformers' Trainer fuses too)
        self.opt = torch.optim.AdamW(
            param_groups(self.model, args.weight_decay, args.head_lr), lr=args.lr, betas=(0.9, 0.999),
            eps=1e-6,
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
        if args.steps is not None:
            self.total = args.steps
        elif args.epochs is not None:
            self.total = max(1, math.ceil(args.epochs * self.steps_per_epoch))
        else:  # TrainArgs refuses this when it is made
            raise ConfigError("give --steps or --epochs")
        warmup = args.warmup_steps if args.warmup_steps is not None else int(args.warmup_ratio * self.total)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, linear_schedule(warmup, self.total))
        self.checkpoints = ResumeCheckpoints(self.out, save_model, args.keep_last)
        self.tracker = BestTracker(args.metric_for_best, args.greater_is_better, args.early_stopping)
        self.step = 0
        self.history: list[LogLine] = []

    def _timed_save(self, save: SaveModel) -> SaveModel:
        def timed(model: nn.Module, d: Path, meta: RunMeta) -> None:
            with self.timings.phase("saving"):
                save(model, d, meta)
        return timed

    # ---- state -------------------------------------------------------------------------------
    def _position(self) -> Position:
        return Position(step=self.step, epoch=self.cursor.epoch, micro=self.cursor.micro, total=self.total,
                        world=self.dist.world, data=self.data_key, **self.tracker.state())

    def _checkpoint(self, meta: RunMeta) -> None:
        if self.dist.main:
            with self.timings.phase("saving"):
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
        if pos.world != self.dist.world:
            raise ConfigError(
                f"--resume: the checkpoint was written by {pos.world} processes, this run has "
                f"{self.dist.world}",
                "resume with the same --nproc-per-node",
            )
        saved = json.loads(json.dumps(self.data_key if pos.data is None else pos.data))  # as JSON has it
        changed = [k for k in sorted({*saved, *self.data_key})
                   if saved.get(k) != json.loads(json.dumps(self.data_key.get(k)))]
        if changed:
            what = "; ".join(f"{k}: {saved.get(k)!r} then, {self.data_key.get(k)!r} now" for k in changed)
            if not self.args.resume_force:
                raise ConfigError("--resume: settings that decide the data order changed since the "
                                  f"checkpoint ({what})", "resume with the run's settings, or pass "
                                  "--resume-force to continue regardless")
            log.warning("--resume-force: continuing although %s", what)
        self.step, self.cursor.epoch, self.cursor.micro = pos.step, pos.epoch, pos.micro
        self.tracker.load(pos.tracker())
        log.info("resumed from %s at step %d (epoch %d, batch %d)", ck, self.step, self.cursor.epoch,
                 self.cursor.micro)
        if self.dist.main:  # what was logged after the checkpoint is about to happen again
            self._trim_log(self.step)
        return self.step

    def _trim_log(self, step: int) -> None:
        path = self.out / "metrics.jsonl"
        if path.exists():
            kept = [line for line in path.read_text(encoding="utf-8").splitlines(keepends=True)
                    if _logged_by(line, step)]
            with atomic_open(path) as f:
                f.writelines(kept)

    def _log(self, rec: LogLine) -> None:
        self.history.append(rec)
        if self.dist.main:
            with open(self.out / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
            self.reporters.log(rec)

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.bf16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # ---- evaluation --------------------------------------------------------------------------
    def _evaluate(self, meta: RunMeta) -> bool:
        """Evaluate, keep the best model, checkpoint. Returns True when early stopping says stop."""
        # an evaluation that spreads (TaskEvaluator) runs on every rank, each taking a share of the batches
        every_rank = bool(getattr(self.evaluate, "spreads", False))
        if self.evaluate is not None and (self.dist.main or every_rank):
            self.model.eval()
            with torch.no_grad(), self._autocast(), self.timings.phase("evaluation"):
                metrics = self.evaluate(self.model)
            self.model.train()
            if self.dist.main:
                self._log({"step": self.step, "epoch": self.cursor.epoch, **scalars(metrics, "eval_")})
                if self.tracker.update(self.step, metrics):
                    self.save_model(self.model, self.out,
                                    replace(meta, best_step=self.step, best_metrics=metrics))
        self._checkpoint(meta)
        stop = [self.tracker.should_stop]
        if self.dist.world > 1:
            torch.distributed.broadcast_object_list(stop, src=0)
        return bool(stop[0])

    # ---- training ----------------------------------------------------------------------------
    def _step(self, sums: dict[str, float]) -> int:
        """One optimizer step over grad_accum micro-batches; returns the real tokens it saw."""
        a, tokens = self.args, 0
        phase = self.timings.phase
        for i in range(a.grad_accum):
            with phase("batches"):
                b = {k: v.to(self.device, non_blocking=True) for k, v in self.cursor.take(a.seed).items()}
            tokens += int(b["attention_mask"].sum())
            # DDP all-reduces gradients only on the last micro-batch of an accumulation
            last = i == a.grad_accum - 1
            separate = self.dist.world > 1 and not last and not self.own_sync
            sync = self.ddp.no_sync() if separate else contextlib.nullcontext()
            with sync, self._autocast(), phase("forward"):
                out = self.ddp(**b)
            with phase("backward"):
                (out["loss"] / a.grad_accum).backward()
            for k, v in out.items():  # the losses, and figures a model reports as log_NAME (logged as NAME)
                if k.endswith("loss") or k.startswith("log_"):
                    name = k.removeprefix("log_")
                    sums[name] = sums.get(name, 0.0) + float(v.detach())
        self._stop_if_diverged(sums["loss"])
        with phase("optimizer"):
            if self.own_sync:
                average_gradients(self.model)
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
            raise Diverged(
                f"the training loss became {loss} at step {self.step + 1}: training diverged",
                "lower --lr (and check the data); the last checkpoint, if any, is intact",
            )

    def train(self, meta: RunMeta) -> Metrics:
        """Train to ``total`` steps; returns the last logged and evaluation metrics. ``meta``: the run's
        description, which every save of the model writes with the training's arguments and figures."""
        with exclusive(self.out) if self.dist.main else contextlib.nullcontext():
            return self._train(replace(meta, train_args=asdict(self.args)))

    def _train(self, meta: RunMeta) -> Metrics:
        resumed = self._start()
        # after the checks: an error stays one line
        if self.bf16 and self.args.bf16 is None and self.dist.main:
            log.info("bf16 autocast: on (this CPU has native bf16; --no-bf16 keeps fp32)")
        if self.dist.main:
            self.reporters = Reporters(parse_report_to(self.args.report_to), self.extra_reporters)
            self.reporters.start(RunInfo(self.out, self.params, resumed, self.args.log_model))
        try:
            result = self._loop(meta)
        except BaseException as e:
            self.reporters.finish([self.out / "metrics.jsonl"],
                                  "KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
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

    def _loop(self, meta: RunMeta) -> Metrics:
        a = self.args
        self.model.train()
        logged: dict[str, float] = {}
        sums: dict[str, float] = {}
        tokens, t0, n_sum, stopped = 0, time.perf_counter(), 0, False
        with _progress(a.progress and self.dist.main) as bar:
            task = bar.add_task("train", total=self.total, completed=self.step, loss=float("nan"), tps=0.0)
            while self.step < self.total:
                self.cursor.epoch_ended = False
                tokens += self._step(sums)
                n_sum += a.grad_accum
                if self.step % a.log_every == 0 or self.step == self.total:
                    dt = time.perf_counter() - t0
                    logged = {k: v / n_sum for k, v in sums.items()}
                    rec: LogLine = {"step": self.step, "epoch": self.cursor.epoch, **logged,
                                    "lr": self.sched.get_last_lr()[0],
                                    "tokens_per_s": tokens * self.dist.world / max(dt, 1e-9)}
                    self._log(rec)
                    bar.update(task, loss=logged.get("loss", float("nan")), tps=rec["tokens_per_s"])
                    tokens, t0, sums, n_sum = 0, time.perf_counter(), {}, 0
                bar.update(task, completed=self.step)
                if self.step == self.total:
                    break
                self.cursor.close_epoch()
                if ((a.eval_every and self.step % a.eval_every == 0)
                        or (not a.eval_every and self.cursor.epoch_ended)):
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

    def _finish(self, meta: RunMeta, logged: dict[str, float]) -> Metrics:
        evals = (r for r in reversed(self.history) if any(k.startswith("eval_") for k in r))
        last_eval: LogLine = next(evals, {})
        result: Metrics = {"step": self.step, **logged,
                           **{k: v for k, v in last_eval.items() if k.startswith("eval_")}}
        best = self.tracker.best_metrics
        if best:  # the run directory holds the best model: report its figures
            result = {"step": self.step, "last_step_metrics": result,
                      **{k: v for k, v in best.items() if not isinstance(v, (list, dict))}}
        if self.dist.main:
            log.info(self.timings.line())  # the final save's time is not in it: it writes the figures
            if self.tracker.best is None:  # no selection: the final weights
                self.save_model(self.model, self.out, replace(meta, final_metrics=result,
                                                              timings=self.timings.as_json()))
            else:
                write_meta(self.out, replace(read_meta(self.out), final_metrics=result,
                                             timings=self.timings.as_json()))
            from mlmkit.rundir import cards
            from mlmkit.train import plots

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


def _progress(enabled: bool) -> Progress:
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
