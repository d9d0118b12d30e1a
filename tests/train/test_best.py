"""The best evaluation of a run and early stopping (mlmkit/train/best.py): BestTracker alone, and the
model a Trainer keeps by it."""

from __future__ import annotations

from pathlib import Path

import torch
from loop_helpers import Rows, no_curves_fixture, train  # noqa: F401  (the autouse fixture `_no_curves`)

from mlmkit.files import read_json
from mlmkit.train.loop import BestTracker


class Scripted:
    """An evaluation whose main metric follows a script, remembering the weights it was shown."""

    def __init__(self, scores: list[float]) -> None:
        self.scores, self.seen = scores, []

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        self.seen.append({k: v.clone() for k, v in model.state_dict().items()})
        return {"score": self.scores[len(self.seen) - 1], "other": -1.0}


def test_best_model_is_kept_and_early_stopping_stops(tmp_path: Path) -> None:
    data = Rows(32, 8)  # 4 steps an epoch; an evaluation at each epoch end
    ev = Scripted([0.5, 0.8, 0.6, 0.7, 0.9, 0.95])
    model, saved = train(tmp_path, data, ev, epochs=6, metric_for_best="score", early_stopping=2)
    # evaluations 1..4: the best is the second (0.8); the third and fourth do not beat it: stop there
    assert len(ev.seen) == 4
    meta = saved["meta"]
    assert meta.best_step == 8 and meta.best_metrics["score"] == 0.8
    for k, v in saved["weights"].items():  # the run root holds the weights the best evaluation saw
        assert torch.equal(v, ev.seen[1][k]), k
    # training went on past it
    assert any(not torch.equal(model.state_dict()[k], ev.seen[1][k]) for k in ev.seen[1])
    final = read_json(tmp_path / "mlmkit.json")["final_metrics"]
    assert final["best_step"] == 8 and final["eval_score"] == 0.8 and final["last_step_metrics"]["step"] == 16
    checkpoints = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert checkpoints == ["step-0000012", "step-0000016"]  # the last two: nothing after the stop
    state = read_json(tmp_path / "checkpoints" / "step-0000016" / "state" / "trainer.json")
    assert (state["best"], state["bad_evals"]) == (0.8, 2)


def test_without_patience_training_runs_to_the_end_and_keeps_the_best(tmp_path: Path) -> None:
    ev = Scripted([0.5, 0.8, 0.6, 0.7])
    _, saved = train(tmp_path, Rows(32, 8), ev, epochs=4, metric_for_best="score")
    assert len(ev.seen) == 4 and saved["meta"].best_step == 8


def test_best_tracker_lower_is_better_and_patience() -> None:
    t = BestTracker("loss", greater_is_better=False, patience=2)
    assert t.update(1, {"loss": 3.0}) and t.update(2, {"loss": 2.0})
    assert not t.update(3, {"loss": 2.5}) and not t.should_stop
    assert not t.update(4, {"loss": 2.0}) and t.should_stop  # equal is no gain
    assert t.best == 2.0 and t.best_metrics["best_step"] == 2
    t2 = BestTracker("loss", False, 2)
    t2.load(t.state())
    assert (t2.best, t2.bad_evals, t2.should_stop) == (2.0, 2, True)
    assert not BestTracker(None, True, None).update(1, {"loss": 1.0})  # no metric: no selection
