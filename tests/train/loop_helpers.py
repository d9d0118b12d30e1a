"""The training loop driven on fixed rows (tests/train/test_loop.py, test_best.py): ``train`` runs a
Trainer on a tiny classifier and returns the model and what the run kept; ``_no_curves``, autouse where
imported, spares each run its curves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import tiny_config

from mlmkit.args import TrainArgs
from mlmkit.errors import ConfigError
from mlmkit.models.core import BertForLabels
from mlmkit.rundir.meta import RunMeta
from mlmkit.train.loop import Trainer


class Rows:
    """A data source over fixed rows of equal length: batch i of every epoch is rows [i*B, (i+1)*B)."""

    def __init__(self, n: int, batch_size: int, vocab: int = 50, length: int = 12, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(5, vocab, (n, length), generator=g)
        self.labels = (self.ids[:, 1] % 2).long()  # a learnable rule: the parity of the first word
        self.batch_size = batch_size

    def num_batches(self, epoch: int) -> int:
        return len(self.ids) // self.batch_size

    def batch(self, epoch: int, index: int, seed: int) -> dict[str, torch.Tensor]:
        s = slice(index * self.batch_size, (index + 1) * self.batch_size)
        return {"input_ids": self.ids[s], "attention_mask": torch.ones_like(self.ids[s]),
                "labels": self.labels[s]}


@pytest.fixture(autouse=True, name="_no_curves")
def no_curves_fixture(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test of a module that imports this reads a run's curves.png: each run ends as where
    matplotlib is not installed (drawing them costs about half a second a run;
    tests/train/test_plots.py and test_tracking.py check them)."""
    from mlmkit.train import plots

    def not_installed() -> Any:
        raise ConfigError("plotting needs matplotlib", "pip install 'mlmkit[plots]'")

    monkeypatch.setattr(plots, "_pyplot", not_installed)


def classifier(seed: int = 0) -> torch.nn.Module:
    cfg = tiny_config(50, hidden_size=32, intermediate_size=64)
    cfg.id2label = {0: "even", 1: "odd"}
    torch.manual_seed(seed)
    return BertForLabels(cfg, per_token=False)


def train(tmp: Path, data: Rows, evaluate: Any = None, **kw: Any) -> tuple[torch.nn.Module, dict[str, Any]]:
    model = classifier()
    saved: dict[str, Any] = {}

    def save_model(m: torch.nn.Module, d: Path, meta: RunMeta) -> None:
        d.mkdir(parents=True, exist_ok=True)
        if d == tmp:  # the run root: the model the run keeps
            saved.update(weights={k: v.clone() for k, v in m.state_dict().items()}, meta=meta)
            (d / "mlmkit.json").write_text(json.dumps(meta.to_json(), default=str))

    args = TrainArgs(**{"lr": 1e-3, "progress": False, "log_every": 1, **kw})
    Trainer(model, data, args, tmp, save_model=save_model,
            evaluate=evaluate).train(RunMeta(task="classification", max_length=16))
    return model, saved
