"""`mlmkit sweep`: hyperparameter search over fine-tuning with Optuna (the ``sweep`` extra).

Each trial is one `mlmkit finetune` run, in OUT/trial-NNN, whose settings Optuna's sampler (TPE)
chooses from the ``--search`` spaces; its value is the best evaluation of the task's main metric.
Evaluations reach Optuna through the tracking interface (a reporter), so the median pruner stops a
trial that falls behind. The study lives in an Optuna storage (default OUT/sweep.db): processes on
several machines that share a storage URL and study name run trials of one study at once, and a
killed sweep resumes with the same command (a trial left running by a killed process is failed by
Optuna's heartbeat and retried once).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, TypedDict

from mlmkit.args import FinetuneArgs, SweepArgs, TrainArgs
from mlmkit.errors import ConfigError, Diverged, MlmkitError, redacted, scrubbed
from mlmkit.train.tracking import RunInfo, parse_report_to

log = logging.getLogger("mlmkit")

SEARCHABLE = {"lr": float, "weight_decay": float, "warmup_ratio": float, "warmup_steps": int, "epochs": float,
              "steps": int, "batch_size": int, "max_length": int, "grad_accum": int, "max_grad_norm": float,
              "seed": int}
"""Settings --search may vary, and their types."""
HEARTBEAT_S = 30


@dataclass(frozen=True)
class Space:
    """One setting's search space: a range (``low``..``high``, ``log``) or ``choices``."""

    name: str
    kind: type
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()

    def suggest(self, trial: Any) -> Any:
        if self.choices:
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.low is None or self.high is None:  # parse_search gives a range both ends
            raise ConfigError(f"--search {self.name}: a space is LOW:HIGH or choices A,B,C")
        if self.kind is int:
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.name, float(self.low), float(self.high), log=self.log)

    def describe(self) -> str:
        if self.choices:
            return ",".join(str(c) for c in self.choices)
        return f"{self.low}:{self.high}" + (":log" if self.log else "")


def parse_search(specs: list[str]) -> dict[str, Space]:
    """``--search`` values as spaces; a bad one is an error naming it and the accepted forms."""
    out: dict[str, Space] = {}
    for spec in specs:
        name, eq, body = spec.partition("=")
        name = name.strip().replace("-", "_")
        hint = f"NAME=LOW:HIGH, NAME=LOW:HIGH:log or NAME=A,B,C with NAME one of {', '.join(SEARCHABLE)}"
        if not eq or name not in SEARCHABLE or not body.strip():
            raise ConfigError(f"--search {spec!r}: "
                              + ("unknown setting " + repr(name) if eq and name else "no NAME=SPACE"), hint)
        if name in out:
            raise ConfigError(f"--search {spec!r}: {name} is searched twice", "give each setting once")
        kind = SEARCHABLE[name]
        try:
            if ":" in body:
                parts = body.split(":")
                scale = parts.pop() if len(parts) == 3 else "linear"
                if len(parts) != 2 or scale not in ("log", "linear"):
                    raise ValueError("a range is LOW:HIGH or LOW:HIGH:log")
                low, high = (_number(p, kind) for p in parts)
                if not low < high or (scale == "log" and low <= 0):
                    raise ValueError("LOW must be below HIGH (and above 0 on a log scale)")
                out[name] = Space(name, kind, low, high, scale == "log")
            else:
                choices = tuple(_number(c, kind) for c in body.split(","))
                out[name] = Space(name, kind, choices=tuple(dict.fromkeys(choices)))
        except ValueError as e:
            raise ConfigError(f"--search {spec!r}: {e}", hint) from None
    return out


def _number(text: str, kind: type) -> Any:
    """A --search value: a finite number, and for a whole-number setting a whole one (1.5 for
    batch_size was taken as 1)."""
    x = float(text)
    if not math.isfinite(x):
        raise ValueError(f"{text.strip()} is not a finite number")
    if kind is int and not x.is_integer():
        raise ValueError(f"{text.strip()} is not a whole number, which this setting takes")
    return int(text) if kind is int and text.strip().lstrip("+-").isdigit() else kind(x)


def check_spaces(args: SweepArgs, spaces: dict[str, Space]) -> None:
    """Every value a space can give (its choices, a range's ends) is one fine-tuning takes: a trial
    refused for its settings is refused here, before the study, naming the --search value."""
    for name, space in spaces.items():
        for value in space.choices or (space.low, space.high):
            try:
                finetune_args(args, args.out / "trial-000", {name: value})
            except ConfigError as e:
                raise ConfigError(f"--search {name}={space.describe()}: {value} is refused: {e.message}",
                                  e.hint) from None


class Pruner:
    """A reporter handing each evaluation of the main metric to the trial; raises TrialPruned when
    Optuna's pruner says the trial falls behind."""

    def __init__(self, trial: Any, metric: str) -> None:
        self.trial, self.key = trial, f"eval_{metric}"

    def start(self, run: RunInfo) -> None:
        pass

    def log(self, step: int, scalars: dict[str, float]) -> None:
        if self.key in scalars:
            import optuna

            self.trial.report(scalars[self.key], step)
            if self.trial.should_prune():
                raise optuna.TrialPruned(f"{self.key} {scalars[self.key]:.4f} at step {step} is behind the "
                                         "median")

    def finish(self, files: Any, status: str) -> None:
        pass


class TrialRecord(TypedDict):
    """One trial of the study, as the summary lists it."""

    number: int
    state: str
    value: float | None
    params: dict[str, float]
    run: str | None
    host: str | None


class SweepSummary(TypedDict):
    """What a sweep returns: the best trial (its run, settings, value and number) and every trial."""

    metric: str
    best_run: str | None
    best_params: dict[str, float]
    best_value: float
    trial: int
    trials: list[TrialRecord]


def finetune_args(args: SweepArgs, out: Path, params: Mapping[str, Any]) -> FinetuneArgs:
    """The FinetuneArgs of one trial: the sweep's settings, ``params`` over them, ``out`` its run."""
    own = {f.name: getattr(args, f.name) for f in fields(FinetuneArgs)}
    train_names = {f.name for f in fields(TrainArgs)}
    train = replace(args.train, **{k: v for k, v in params.items() if k in train_names})
    if "steps" in params:
        train = replace(train, epochs=None)
    return FinetuneArgs(**{**own, **{k: v for k, v in params.items() if k not in train_names}, "out": out,
                           "train": train})


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise ConfigError("mlmkit sweep needs optuna", "pip install 'mlmkit[sweep]'") from None
    return optuna


def _storage(optuna: Any, url: str, attempts: int = 5) -> Any:
    """An RDB storage with heartbeats: a trial whose process died is failed, then retried once.
    Processes that start together on a new database race to create its tables (one gets "UNIQUE
    constraint failed: alembic_version"): the loser tries again and finds them made. An in-memory
    SQLite URL is Optuna's in-memory storage: no other process can share it, and the heartbeat's
    thread, on a connection of its own, found another empty database (three tracebacks)."""
    import time

    if url in ("sqlite://", "sqlite:///:memory:"):
        return optuna.storages.InMemoryStorage()

    for attempt in range(attempts):
        try:
            return _rdb(optuna, url)
        except Exception:  # noqa: BLE001 - the last attempt's error is the caller's
            if attempt == attempts - 1:
                raise
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


def _rdb(optuna: Any, url: str) -> Any:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)  # Optuna >= 4.9
        if retry is not None:
            return optuna.storages.RDBStorage(url, heartbeat_interval=HEARTBEAT_S,
                                              grace_period=2 * HEARTBEAT_S,
                                              heartbeat_stale_trial_callback=retry(max_retry=1))
        return optuna.storages.RDBStorage(url, heartbeat_interval=HEARTBEAT_S, grace_period=2 * HEARTBEAT_S,
                                          failed_trial_callback=optuna.storages.RetryFailedTrialCallback(max_retry=1))


def _open_study(optuna: Any, args: SweepArgs, greater_is_better: bool, metric: str, spaces: dict[str, Space],
                url: str) -> Any:
    """The study ``args.study`` in the storage at ``url``: made, or loaded and checked to be for the same
    task, metric and search."""
    # processes sharing a study must not propose the same settings: only a sweep of its own is seeded
    # (optuna's samplers take 32-bit seeds; --seed may be up to 64 bits, folded as set_seed folds numpy's)
    how = {"sampler": optuna.samplers.TPESampler(seed=None if args.storage else args.train.seed % 2**32),
           "pruner": optuna.pruners.MedianPruner(n_startup_trials=2) if args.prune
           else optuna.pruners.NopPruner()}
    try:
        storage = _storage(optuna, url)
        try:  # a study that exists is only read: a finished one is reported from a read-only database too
            study = optuna.load_study(study_name=args.study, storage=storage, **how)
        except KeyError:
            study = optuna.create_study(study_name=args.study, storage=storage, load_if_exists=True,
                                        direction="maximize" if greater_is_better else "minimize", **how)
    except Exception as e:  # noqa: BLE001 - the storage's own errors, as one line
        raise _storage_error(e, url) from None
    key = {"task": args.task, "metric": metric,
           "search": {n: s.describe() for n, s in sorted(spaces.items())}}
    have = study.user_attrs.get("mlmkit")
    if have is None:
        with _writes(url):
            study.set_user_attr("mlmkit", key)
    elif have != key:
        raise ConfigError(f"study {args.study!r} in {redacted(url)} was made for {have}, not {key}",
                          "resume with the same task and --search, or choose another --study")
    return study


def sweep(args: SweepArgs) -> SweepSummary:
    """Run trials until the study holds ``args.trials`` finished ones; returns the best trial:
    {"best_run", "best_params", "best_value", "metric", "trials": [...]}."""
    optuna = _optuna()
    from mlmkit.registry import TaskContext, get_task
    from mlmkit.train.finetune import finetune

    parse_report_to(args.train.report_to)
    spaces = parse_search(args.search)
    check_spaces(args, spaces)
    task = get_task(args.task)
    opts = task.resolve_options(args.options)
    metric = task.best_metric(TaskContext(max_length=args.max_length or task.default_max_length,
                                          options=opts))
    args.out.mkdir(parents=True, exist_ok=True)
    url = args.storage or f"sqlite:///{(args.out / 'sweep.db').resolve()}"
    study = _open_study(optuna, args, task.greater_is_better, metric, spaces, url)

    def objective(trial: Any) -> float:
        params = {n: s.suggest(trial) for n, s in spaces.items()}
        run = args.out / f"trial-{trial.number:03d}"
        trial.set_user_attr("run", str(run))
        trial.set_user_attr("host", f"{socket.gethostname()}:{os.getpid()}")
        log.info("trial %d: %s -> %s", trial.number, ", ".join(f"{k}={v}" for k, v in params.items()), run)
        try:
            result = finetune(finetune_args(args, run, params), reporters=[Pruner(trial, metric)])
        except Diverged as e:  # these settings' outcome, not the sweep's: recorded, and the sweep goes on
            log.warning("trial %d failed: %s", trial.number, e.message)
            trial.set_user_attr("error", e.message)
            return float("nan")  # Optuna's failed trial
        except MlmkitError as e:  # the data, the model, the machine: every trial would meet it
            stopped.append(e)
            trial.study.stop()
            return float("nan")
        value = result.get(f"eval_{metric}", result.get(metric))
        if not isinstance(value, (int, float)):
            stopped.append(ConfigError(f"trial {trial.number}: the run reported no {metric}",
                                       "check the --eval data"))
            trial.study.stop()
            return float("nan")
        log.info("trial %d: %s %.4f", trial.number, metric, value)
        return float(value)

    def enough_failed(study: Any, trial: Any) -> None:
        if len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,))) >= args.trials:
            log.warning("%d trials failed: the sweep stops", args.trials)
            study.stop()

    stopped: list[MlmkitError] = []
    finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    if len(study.get_trials(states=finished)) < args.trials:
        quiet = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.ERROR)  # mlmkit says what each trial did, once
        try:
            with _writes(url):
                study.optimize(objective,
                               callbacks=[optuna.study.MaxTrialsCallback(args.trials, states=finished),
                                          enough_failed], catch=(), gc_after_trial=True)
        finally:
            optuna.logging.set_verbosity(quiet)
    if stopped:
        raise stopped[0]
    return summary(study, metric)


def _storage_error(e: BaseException, url: str) -> ConfigError:
    """The storage's own error (SQLAlchemy's, the driver's) as one line, without the URL's password."""
    first = str(e).splitlines()[0][:300] if str(e) else ""
    hint = "check the URL (sqlite:///PATH, postgresql://..., mysql://...) and that the database is reachable"
    if "readonly" in first.replace("-", "").replace(" ", "").lower():
        hint = ("the study can be read, not written: make the database (and its directory) writable, or give "
                "another --storage")
    return ConfigError(scrubbed(f"--storage {url}: {type(e).__name__}: {first}", url), hint)


@contextlib.contextmanager
def _writes(url: str) -> Iterator[None]:
    """Errors of the storage while the study is written (a read-only database, a server gone) as one line;
    the trials' own errors pass through."""
    from optuna.exceptions import StorageInternalError

    try:
        yield
    except Exception as e:
        # optuna wraps a failed commit in its StorageInternalError, with the driver's error as the cause
        cause = e.__cause__ if isinstance(e, StorageInternalError) and e.__cause__ is not None else e
        if type(cause).__module__.split(".")[0] not in ("sqlalchemy", "sqlite3", "psycopg2", "pymysql",
                                                        "MySQLdb"):
            raise
        raise _storage_error(cause, url) from None


def summary(study: Any, metric: str) -> SweepSummary:
    import optuna

    trials: list[TrialRecord] = [{"number": t.number, "state": t.state.name, "value": t.value,
                                  "params": t.params,
                                  "run": t.user_attrs.get("run"), "host": t.user_attrs.get("host")}
                                 for t in study.get_trials(deepcopy=False)]
    done = [t for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))]
    if not done:
        raise ConfigError("the sweep has no complete trial",
                          "see the trials' errors above; every trial failed or was pruned")
    best = study.best_trial
    return {"metric": metric, "best_run": best.user_attrs.get("run"), "best_params": best.params,
            "best_value": best.value, "trial": best.number, "trials": trials}
