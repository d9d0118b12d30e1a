"""A tiny classification set and a base model to fine-tune on it, for the tests of tracking, plots,
sweeps (tests/train/) and tables (tests/text/test_tables.py): ``clf_rows`` (texts whose label is their
word's), the module-scoped fixture ``clf`` (a base model, train and eval files), and ``no_curves``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import make_base_model

from mlmkit.errors import ConfigError

WORDS = "good bad fine poor great awful nice grim".split()
POSITIVE = {"good", "fine", "great", "nice"}


def clf_rows(n: int, seed: int = 0) -> list[dict]:
    import random

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        w = rng.choice(WORDS)
        rows.append({"text": f"the {w} thing number {i % 7}", "label": "pos" if w in POSITIVE else "neg"})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module", name="clf")
def clf_fixture(tmp_path_factory):
    d = tmp_path_factory.mktemp("clf")
    rows = clf_rows(96)
    base = make_base_model(d / "base", [r["text"] for r in rows] * 2)
    return {"base": base, "train": write_jsonl(d / "train.jsonl", rows),
            "eval": write_jsonl(d / "eval.jsonl", clf_rows(32, 1)),
            "dir": d}


@pytest.fixture(name="no_curves")
def no_curves_fixture(monkeypatch):
    """For runs whose curves no assertion reads (sweeps' trials, the Parquet runs): training ends as where
    matplotlib is not installed, with no curves.png, which costs about half a second a run. The curves
    are checked by tests of their own (tests/train/test_plots.py, test_tracking.py) and by the MLflow
    test (its artifacts)."""
    from mlmkit.train import plots

    def not_installed():
        raise ConfigError("plotting needs matplotlib", "pip install 'mlmkit[plots]'")

    monkeypatch.setattr(plots, "_pyplot", not_installed)
