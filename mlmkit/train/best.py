"""The best evaluation of a run so far, by its main metric, and early stopping."""

from __future__ import annotations

from mlmkit.registry import Metrics
from mlmkit.train.state import TrackerState


class BestTracker:
    """The best evaluation so far by ``metric`` and the evaluations since it (early stopping)."""

    def __init__(self, metric: str | None, greater_is_better: bool, patience: int | None) -> None:
        self.metric, self.greater, self.patience = metric, greater_is_better, patience
        self.best: float | None = None
        self.bad_evals = 0
        self.best_metrics: Metrics = {}

    def update(self, step: int, metrics: Metrics) -> bool:
        """Record an evaluation; True when it is the best so far (the caller keeps that model)."""
        if self.metric is None or self.metric not in metrics:
            return False
        v = float(metrics[self.metric])
        if self.best is None or (v > self.best if self.greater else v < self.best):
            self.best, self.bad_evals = v, 0
            self.best_metrics = {"best_step": step, **{f"eval_{k}": x for k, x in metrics.items()},
                                 **scalars(metrics, "eval_")}
            return True
        self.bad_evals += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.patience is not None and self.bad_evals >= self.patience

    def state(self) -> TrackerState:
        return {"best": self.best, "bad_evals": self.bad_evals, "best_metrics": self.best_metrics}

    def load(self, state: TrackerState) -> None:
        self.best, self.bad_evals = state["best"], state["bad_evals"]
        self.best_metrics = state["best_metrics"]


def scalars(metrics: Metrics, prefix: str) -> dict[str, float]:
    """The numbers of a task's metrics, flat: a group of them (a reranker's "first_stage") as
    PREFIX + group + "_" + name; lists and texts (a confusion matrix, label names) left out."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        if isinstance(v, dict):
            out.update(scalars(v, f"{prefix}{k}_"))
        elif isinstance(v, (int, float)):
            out[f"{prefix}{k}"] = v
    return out
