"""Experiment tracking: the training loop's parameters, scalars and files, sent to TensorBoard or MLflow.

The loop talks to one small interface, ``Reporter``: ``start`` once (with the run's parameters and,
on --resume, the step it continues from), ``log`` for every metrics.jsonl record (training loss,
learning rate and throughput by logging step; ``eval_*`` by evaluation), ``finish`` once with the
run's files. Backends are registered in REPORTERS by the name ``--report-to`` uses; each imports its
library only when asked for, and a missing one is one line naming the ``tracking`` extra. Only rank 0
reports (the Trainer builds reporters there alone).

A resumed run continues the same series: TensorBoard's writer purges the steps after the checkpoint
(``purge_step``), and MLflow attaches to the run recorded in RUN/tracking.json and skips the steps it
already holds, so no step appears twice in either.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from mlmkit.errors import ConfigError, redacted, scrubbed
from mlmkit.files import JSONObject, read_json, write_json
from mlmkit.typed import from_json, to_json

log = logging.getLogger("mlmkit")

EXTRA_HINT = "pip install 'mlmkit[tracking]'"
STATE = "tracking.json"
"""In the run directory: what a resumed run needs to continue the same tracking runs (MLflow's run id)."""


@dataclass(frozen=True)
class TrackingState:
    """tracking.json, typed (mlmkit.typed): the MLflow run a resumed run continues and the store it is
    in (its password redacted); keys this version does not know are kept in ``other``."""

    mlflow_run_id: str | None = None
    mlflow_tracking_uri: str | None = None
    other: JSONObject = field(default_factory=dict)

    @classmethod
    def read(cls, out: Path) -> TrackingState:
        p = out / STATE
        if not p.exists():
            return cls()
        return from_json(cls, read_json(p), p, rest="other",
                         fix="delete it to start new tracking runs (or set MLFLOW_RUN_ID)")


Param = bool | int | float | str
Params = dict[str, Param]
"""A command's arguments as tracking parameters, flat (``flat_params``)."""


@dataclass
class RunInfo:
    """What a reporter learns of the run when it starts."""

    out: Path
    params: Params
    """The command's arguments, flattened (``train.lr`` -> ``lr``), as strings, numbers or booleans."""
    resumed_from: int | None = None
    """The checkpoint step a --resume continues from (None for a fresh run)."""
    log_model: bool = False
    """Send the weights with the files at the end."""
    tags: dict[str, str] = field(default_factory=dict)


class Reporter(Protocol):
    def start(self, run: RunInfo) -> None:
        """The run begins (or resumes): open the backend's run and log the parameters."""

    def log(self, step: int, scalars: dict[str, float]) -> None:
        """Scalars at ``step``: training loss / lr / tokens_per_s, or eval_* metrics."""

    def finish(self, files: Sequence[Path], status: str) -> None:
        """The run ended (``status``: FINISHED, FAILED or KILLED); ``files``: what to keep as artifacts."""


def _require(module: str, what: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"--report-to {what} needs the {module.split('.')[0]} package",
                          EXTRA_HINT) from None


class TensorBoard:
    """Event files under RUN/tensorboard, one scalar series per metric."""

    def start(self, run: RunInfo) -> None:
        _require("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        purge = run.resumed_from + 1 if run.resumed_from is not None else None
        self.dir = run.out / "tensorboard"
        try:  # a directory it cannot write: one line now, not a traceback from the writer's thread later
            self.dir.mkdir(parents=True, exist_ok=True)
            probe = self.dir / f".probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise self._error(e) from None
        self.writer = SummaryWriter(log_dir=str(self.dir), purge_step=purge)
        if run.resumed_from is None:
            rows = "\n".join(f"| {k} | {v} |" for k, v in sorted(run.params.items()))
            self.writer.add_text("params", "| parameter | value |\n|---|---|\n" + rows, 0)

    def _error(self, e: OSError) -> ConfigError:
        return ConfigError(f"--report-to tensorboard: cannot write {self.dir}: {e.strerror or e}",
                           "give --out on a disk that can be written, or leave tensorboard out of "
                           "--report-to")

    def log(self, step: int, scalars: dict[str, float]) -> None:
        try:
            for k, v in scalars.items():
                self.writer.add_scalar(k.replace("eval_", "eval/", 1) if k.startswith("eval_")
                                       else f"train/{k}", v, step)
            self.writer.flush()
        except OSError as e:
            raise self._error(e) from None

    def finish(self, files: Sequence[Path], status: str) -> None:
        try:
            self.writer.close()
        except OSError as e:  # the run's own error, if it failed, is the one to see
            log.warning("%s", self._error(e))


class MLflow:
    """A run in MLflow's tracking store, as MLflow's environment says: MLFLOW_TRACKING_URI (default: its
    local ./mlruns), MLFLOW_EXPERIMENT_NAME, MLFLOW_RUN_ID to attach to an existing run. Failures of
    the tracking server after the start are warned about once and do not stop training."""

    RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
    """MLflow's HTTP retries while mlmkit trains, unless the environment sets them: a server answering 500
    costs seconds (1 + 2 of back-off) before the warning, not MLflow's default 7 retries at a back-off
    factor of 2 (258 s of a stalled run, measured)."""

    def start(self, run: RunInfo) -> None:
        mlflow = _require("mlflow", "mlflow")
        from mlflow.tracking import MlflowClient

        for k, v in self.RETRIES.items():
            os.environ.setdefault(k, v)

        uri = mlflow.get_tracking_uri()
        self.run_info, self.failed = run, False
        state = TrackingState.read(run.out)
        run_id = os.environ.get("MLFLOW_RUN_ID") or (state.mlflow_run_id if run.resumed_from is not None
                                                     else None)
        try:
            _reachable(uri)  # in seconds, before MLflow's own retries (minutes by default)
            self.client = MlflowClient()
            if run_id:
                self.run_id = self.client.get_run(run_id).info.run_id
                self.client.update_run(self.run_id, status="RUNNING")
            else:
                name = os.environ.get("MLFLOW_EXPERIMENT_NAME")
                exp = mlflow.set_experiment(name) if name else None
                experiment_id = exp.experiment_id if exp else "0"
                self.run_id = self.client.create_run(experiment_id, run_name=run.out.name,
                                                     tags={"mlflow.source.name": "mlmkit",
                                                           **run.tags}).info.run_id
            self.done = self._logged_steps()
            params = {k: str(v)[:6000] for k, v in run.params.items()}
            known = self.client.get_run(self.run_id).data.params
            new = [mlflow.entities.Param(k, v) for k, v in params.items() if k not in known]
            if new:
                self.client.log_batch(self.run_id, params=new)
        except Exception as e:  # noqa: BLE001 - any failure of the store, as one line, without its password
            first = str(e).splitlines()[0][:300] if str(e) else ""
            raise ConfigError(scrubbed(f"--report-to mlflow: cannot use the tracking store {uri}: "
                                       f"{type(e).__name__}: "
                                       f"{first}", uri),
                              "check MLFLOW_TRACKING_URI (and MLFLOW_RUN_ID), or drop --report-to mlflow",
                              ) from None
        write_json(run.out / STATE, to_json(replace(state, mlflow_run_id=self.run_id,
                                                    mlflow_tracking_uri=redacted(uri)), rest="other"))

    def _logged_steps(self) -> dict[str, int]:
        """The last step the run holds for each metric (a resumed run does not log those again)."""
        metrics = self.client.get_run(self.run_id).data.metrics
        return {k: max((m.step for m in self.client.get_metric_history(self.run_id, k)), default=-1)
                for k in metrics}

    def _guard(self, what: str, fn: Callable[[], Any]) -> None:
        if self.failed:
            return
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - the run goes on without MLflow
            import mlflow

            self.failed = True
            first = str(e).splitlines()[0][:200] if str(e) else ""
            log.warning("%s", scrubbed(f"--report-to mlflow: {what} failed ({type(e).__name__}: {first}); no "
                                       "more MLflow "
                                       "logging for this run", mlflow.get_tracking_uri()))

    def log(self, step: int, scalars: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        todo = [Metric(k, float(v), now, step) for k, v in scalars.items() if step > self.done.get(k, -1)]
        if todo:
            self._guard("logging metrics", lambda: self.client.log_batch(self.run_id, metrics=todo))
            self.done.update({m.key: step for m in todo})

    def finish(self, files: Sequence[Path], status: str) -> None:
        for f in files:
            if f.is_dir():
                self._guard(f"sending {f.name}",
                            partial(self.client.log_artifacts, self.run_id, str(f), f.name))
            elif f.exists():
                self._guard(f"sending {f.name}", partial(self.client.log_artifact, self.run_id, str(f)))
        self._guard("ending the run", lambda: self.client.set_terminated(self.run_id, status=status))


def _reachable(uri: str, seconds: float = 5.0) -> None:
    """An http(s) tracking server answers a TCP connection within ``seconds`` (else OSError)."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(uri)
    if parts.scheme in ("http", "https") and parts.hostname:
        socket.create_connection((parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)),
                                 timeout=seconds).close()


REPORTERS: dict[str, Callable[[], Reporter]] = {"tensorboard": TensorBoard, "mlflow": MLflow}
"""--report-to names and their backends; a new backend is a class with start / log / finish and a line
here."""


def parse_report_to(value: str | Sequence[str] | None) -> list[str]:
    """``tensorboard,mlflow`` (or ``none``) as a list of known backend names; an unknown one is an error."""
    names = value.split(",") if isinstance(value, str) else list(value or [])
    names = [n.strip().lower() for n in names if n.strip()]
    if names in ([], ["none"]):
        return []
    unknown = [n for n in names if n not in REPORTERS]
    if unknown or "none" in names:
        raise ConfigError(f"--report-to: unknown backend {', '.join(unknown) or 'none (with others)'}",
                          f"use none or a comma-separated list of: {', '.join(REPORTERS)}")
    return list(dict.fromkeys(names))


class Reporters:
    """All the backends a run reports to, called as one; an extra reporter (a sweep's pruner) may be added."""

    def __init__(self, names: Sequence[str], extra: Sequence[Reporter] = ()) -> None:
        self.all: list[Reporter] = [REPORTERS[n]() for n in names] + list(extra)

    def start(self, run: RunInfo) -> None:
        for r in self.all:
            r.start(run)

    def log(self, rec: Mapping[str, float]) -> None:
        scalars = {k: float(v) for k, v in rec.items() if k not in ("step", "epoch")
                   and isinstance(v, (int, float))
                   and not isinstance(v, bool) and math.isfinite(v)}
        if self.all and scalars:
            for r in self.all:
                r.log(int(rec["step"]), scalars)

    def finish(self, files: Sequence[Path], status: str) -> None:
        for r in self.all:
            r.finish(files, status)


def flat_params(args: Any) -> Params:
    """A command's argument dataclass as flat parameters: nested dataclasses merged, paths as strings,
    lists joined, None left out."""
    from dataclasses import fields, is_dataclass

    out: Params = {}
    for f in fields(args):
        v = getattr(args, f.name)
        if is_dataclass(v):
            out.update(flat_params(v))
        elif isinstance(v, dict):
            out.update({f"{f.name}.{k}": _param(x) for k, x in v.items()})
        elif v is not None:
            out[f.name] = _param(v)
    return out


def _param(v: Any) -> Param:
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    return v if isinstance(v, (bool, int, float, str)) else str(v)
