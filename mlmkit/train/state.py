"""Resume state: the data cursor, and the complete checkpoints under OUT/checkpoints (model files,
optimizer, scheduler, RNG and step) that --resume restores.
"""

from __future__ import annotations

import logging
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import torch
from torch import nn

from mlmkit.errors import ConfigError, MlmkitError
from mlmkit.files import JSONObject, read_json, write_json
from mlmkit.registry import Metrics
from mlmkit.rundir.checkpoint import load_state_dict, load_weights
from mlmkit.rundir.meta import RunMeta
from mlmkit.train.data import DataSource, batch_seed
from mlmkit.train.devices import Dist
from mlmkit.typed import from_json, rule, to_json

log = logging.getLogger("mlmkit")


# ---- the parts of the loop -----------------------------------------------------------------------
SaveModel = Callable[[nn.Module, Path, RunMeta], None]
"""Writes the model files of a run directory (config, weights, tokenizer, mlmkit.json with the meta)."""


class TrackerState(TypedDict):
    """The best evaluation so far (loop.BestTracker), kept in each checkpoint's position."""

    best: float | None
    """The main metric's best value (None: no evaluation yet)."""
    bad_evals: int
    """Evaluations since the best one (early stopping)."""
    best_metrics: Metrics
    """The best evaluation's metrics (eval_ prefixed) and its step."""


def _at_least(n: int) -> dict[str, object]:
    return rule(lambda v: v >= n, f"a whole number of at least {n}")


@dataclass(frozen=True)
class Position:
    """A checkpoint's state/trainer.json, read through the one typed reader (mlmkit.typed): the loop's
    step and place in the data (epoch, micro-batch), the planned steps, the processes that wrote it,
    the settings that decide the data order (``data``: --resume compares them) and the tracker's state."""

    step: int = field(metadata=_at_least(0))
    epoch: int = field(metadata=_at_least(0))
    micro: int = field(metadata=_at_least(0))
    total: int | None = None
    world: int = field(default=1, metadata=_at_least(1))
    data: JSONObject | None = None
    """None in a checkpoint written before the data order was kept: --resume then trusts it."""
    best: float | None = None
    bad_evals: int = field(default=0, metadata=_at_least(0))
    best_metrics: JSONObject = field(default_factory=dict)

    def tracker(self) -> TrackerState:
        return {"best": self.best, "bad_evals": self.bad_evals, "best_metrics": self.best_metrics}

    @staticmethod
    def read(path: Path) -> Position:
        """The position in ``path``; one line naming the file and the field where it is not one."""
        return from_json(Position, read_json(path), path, fix=REWRITE)


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


class ResumeCheckpoints:
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

    def save(self, model: nn.Module, opt: torch.optim.Optimizer, sched: Any, position: Position,
             meta: RunMeta) -> Path:
        """A kill midway leaves an incomplete directory that ``latest`` ignores, and the previous
        checkpoint untouched."""
        ck = self.root / f"step-{position.step:07d}"
        if ck.exists():
            shutil.rmtree(ck)
        try:
            self._write(ck, model, opt, sched, position, meta)
        except Exception as e:  # (a kill leaves the directory incomplete, and ``complete`` ignores it)
            shutil.rmtree(ck, ignore_errors=True)
            if isinstance(e, OSError):
                raise MlmkitError(f"could not write the checkpoint {ck}: {e.strerror or e}",
                                  "free disk space or fix the permissions; the previous checkpoint is "
                                  "intact") from e
            raise
        # an incomplete checkpoint (a crashed write) must not count, or it could displace the last complete
        # one
        for old in self.complete()[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        return ck

    def _write(self, ck: Path, model: nn.Module, opt: torch.optim.Optimizer, sched: Any, position: Position,
               meta: RunMeta) -> None:
        self.save_model(model, ck, meta)
        st = ck / "state"
        st.mkdir(parents=True, exist_ok=True)
        torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}, st / "optimizer.pt")
        npst = np.random.get_state()
        assert isinstance(npst, tuple)  # the global generator is an MT19937: its state is the legacy tuple
        rng = {  # plain tensors and tuples only, so it loads with weights_only=True
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": (npst[0], torch.from_numpy(npst[1].astype(np.int64)), *npst[2:]),
        }
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        torch.save(rng, st / "rng.pt")
        write_json(st / "trainer.json", to_json(position))

    def restore(self, model: nn.Module, opt: torch.optim.Optimizer, sched: Any,
                device: torch.device) -> tuple[Path, Position]:
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
            for bad, why in passed:
                log.warning("--resume: passing over the checkpoint %s: %s", bad, why.message)
            if passed:
                log.warning("--resume: resuming from %s, the newest checkpoint that loads whole", ck)
            return ck, pos
        raise ConfigError(f"--resume: none of the {len(done)} checkpoints under {self.root} loads whole "
                          f"(the newest: {passed[0][1].message})",
                          "restore the checkpoint files, or start again in a new --out")

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

    def _read(self, ck: Path, device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any],
                                                             dict[str, Any], Position]:
        """(weights, optimizer + scheduler state, RNG states, position) of one checkpoint, each checked
        to be whole; MlmkitError (one line, naming the file) for any that is not."""
        sd = load_state_dict(ck)
        state = _load_state(ck / "state" / "optimizer.pt", device)
        if not isinstance(state.get("optimizer"), dict) or not isinstance(state.get("scheduler"), dict):
            raise ConfigError(f"{ck / 'state' / 'optimizer.pt'}: no optimizer and scheduler state in it",
                              REWRITE)
        rng = _load_state(ck / "state" / "rng.pt", torch.device("cpu"))
        numpy_state = rng.get("numpy")
        if (not isinstance(rng.get("torch"), torch.Tensor) or not isinstance(rng.get("python"), tuple)
                or not isinstance(numpy_state, tuple) or len(numpy_state) < 2
            or not isinstance(numpy_state[1], torch.Tensor)):
            raise ConfigError(f"{ck / 'state' / 'rng.pt'}: not the random number generators' state", REWRITE)
        pos = Position.read(ck / "state" / "trainer.json")
        return sd, state, rng, pos

    def _restore(self, ck: Path, model: nn.Module, opt: torch.optim.Optimizer, sched: Any,
                 device: torch.device) -> Position:
        sd, state, rng, pos = self._read(ck, device)
        load_weights(model, sd)
        # a state that unpickles but does not fit (a cut list, a missing key) fails here, before any is set
        try:
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
                              f"({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})",
                              REWRITE) from None
        return pos


REWRITE = "the file is damaged or was cut short; --resume passes over it to an older checkpoint"


def _load_state(p: Path, device: torch.device) -> dict[str, Any]:
    """A state file written by torch.save, loaded tensors-only; one line for a damaged or truncated
    file (torch's own message suggests weights_only=False, which must never be done here)."""
    try:
        state = torch.load(p, map_location=device, weights_only=True)
    except FileNotFoundError:
        raise ConfigError(f"{p}: missing", REWRITE) from None
    # an unpickling error, a truncated zip, a bad record: torch has no one type for them
    except Exception as e:
        why = ("it holds objects other than tensors" if "Unsupported global" in str(e)
               else "damaged or truncated")
        raise ConfigError(f"{p}: unreadable ({why})", REWRITE) from None
    if not isinstance(state, dict):
        raise ConfigError(f"{p}: not a state dictionary", REWRITE)
    return state


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run directory whose files all load (a damaged newer one is
    passed over with a warning), or None."""
    return ResumeCheckpoints(Path(out_dir), lambda *a: None, 1).loadable()
