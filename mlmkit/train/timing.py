"""Where a training run's time goes: wall-clock seconds by phase, summed over the run.

Fine-tuning times loading the model, reading the data and tokenizing it before the loop; the loop
times taking each batch, the forward and backward passes, the optimizer's step (clipping, the step,
the schedule), the evaluations and the saves (all but the last, which writes the figures). The run
logs the breakdown when it ends and keeps it in mlmkit.json (``timings``). On the CPU each phase is
its own time. On a GPU the phases are the host's: kernels run on asynchronously, so a forward pass
looks short and whatever waits for the GPU next (the loss read for the log, the optimizer) carries
its time. A loss that runs its own backward passes inside the forward (cached-mnrl) counts them as
forward.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

PHASES = ("load", "read", "tokenize", "batches", "forward", "backward", "optimizer", "evaluation", "saving")


class Timings:
    """Seconds by phase (PHASES), and the wall-clock time since it was made."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.started = time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - t0

    def total(self) -> float:
        return time.perf_counter() - self.started

    def as_json(self) -> dict[str, float]:
        """The phases that took time, and ``total`` (the rest: logging, the progress bar, the card)."""
        return {**{k: round(v, 4) for k, v in self.seconds.items() if v > 0}, "total": round(self.total(), 4)}

    def line(self) -> str:
        total = self.total()
        parts = ", ".join(f"{k} {_seconds(v)} ({v / total:.0%})" for k, v in self.seconds.items() if v > 0)
        return f"where the time went: {parts} (of {_seconds(total)})"


def _seconds(v: float) -> str:
    return f"{v:.1f} s" if v >= 1 else f"{v:.3f} s"
