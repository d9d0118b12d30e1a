"""The training loop's parts: gradient accumulation, the learning-rate schedule, the arguments and
their checks, divergence (best-model selection and early stopping: test_best.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from loop_helpers import Rows, no_curves_fixture, train  # noqa: F401  (the autouse fixture `_no_curves`)
from typer.testing import CliRunner

from mlmkit.args import FinetuneArgs, PretrainArgs, TrainArgs, cli_fields
from mlmkit.cli import app
from mlmkit.errors import ConfigError


def test_gradient_accumulation_equals_one_big_batch(tmp_path: Path) -> None:
    """Two micro-batches of 4 accumulated give the update of one batch of 8: same loss average, same
    gradient, so the same clipping and the same AdamW step."""
    fp32 = {"bf16": False}  # the equality is fp32's: bf16 rounds a batch of 8 and two of 4 apart (~1e-3)
    big, _ = train(tmp_path / "big", Rows(64, 8), steps=6, **fp32)
    acc, _ = train(tmp_path / "acc", Rows(64, 4), steps=6, grad_accum=2, **fp32)
    one, _ = train(tmp_path / "one", Rows(64, 4), steps=6, **fp32)  # half the data per step: it must differ
    a, b, c = big.state_dict(), acc.state_dict(), one.state_dict()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst < 1e-5, worst
    assert max(float((a[k] - c[k]).abs().max()) for k in a) > 1e-3  # the comparison has teeth
    logs = [json.loads(x) for x in (tmp_path / "acc" / "metrics.jsonl").read_text().splitlines()]
    big_logs = [json.loads(x) for x in (tmp_path / "big" / "metrics.jsonl").read_text().splitlines()]
    train_losses = [r["loss"] for r in logs if "loss" in r]
    assert train_losses == pytest.approx([r["loss"] for r in big_logs if "loss" in r], abs=1e-5)


def lrs(run: Path) -> list[float]:
    return [r["lr"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "lr" in r]


def test_warmup_steps_then_linear_decay(tmp_path: Path) -> None:
    """--warmup-steps 3 over 10 steps: the factor after step k is (k+1)/3 while warming up, then
    (10-k)/7 down to 0; it overrides --warmup-ratio."""
    train(tmp_path / "a", Rows(64, 8), steps=10, warmup_steps=3, warmup_ratio=0.5, lr=1e-3)
    want = [2 / 3, 1.0] + [(10 - k) / 7 for k in range(3, 11)]
    assert lrs(tmp_path / "a") == pytest.approx([1e-3 * w for w in want])
    train(tmp_path / "b", Rows(64, 8), steps=4, warmup_steps=0, lr=1e-3)  # no warmup: full rate at once
    assert lrs(tmp_path / "b") == pytest.approx([1e-3 * w for w in (3 / 4, 2 / 4, 1 / 4, 0.0)])
    # the ratio, when no steps are given
    train(tmp_path / "c", Rows(64, 8), steps=10, warmup_ratio=0.3, lr=1e-3)
    assert lrs(tmp_path / "c") == pytest.approx(lrs(tmp_path / "a"))


# ---- arguments -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, match", [
    ({"lr": float("nan")}, "--lr must be a positive number"),
    ({"lr": float("inf")}, "--lr must be a positive number"),
    ({"lr": 0.0}, "--lr must be a positive number"),
    ({"keep_last": 0}, "--keep-last must be at least 1"),
    ({"grad_accum": 0}, "--grad-accum must be at least 1"),
    ({"steps": 0}, "--steps must be at least 1"),
    ({"steps": None, "epochs": None}, "give --steps or --epochs"),
    ({"warmup_ratio": 1.5}, "--warmup-ratio must be between 0 and 1"),
    ({"warmup_steps": -1}, "--warmup-steps must not be negative"),
])
def test_train_args_are_checked_naming_the_flag(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        TrainArgs(**{"steps": 10, **kw})


def test_args_built_from_flat_names_start_from_the_commands_defaults() -> None:
    p = PretrainArgs.from_flat(corpus=[Path("c.txt")], out=Path("o"), lr=1e-3)
    assert (p.train.lr, p.train.steps, p.train.save_every, p.train.eval_every) == (1e-3, 1000, 500, 200)
    f = FinetuneArgs.from_flat(task="qa", model=Path("m"), train_file=Path("t"), out=Path("o"), steps=5)
    assert (f.train.steps, f.train.epochs, f.train.lr, f.train.keep_last) == (5, 3.0, 5e-5, 1)
    with pytest.raises(ConfigError, match="PretrainArgs has no setting nonsense"):
        PretrainArgs.from_flat(corpus=[Path("c.txt")], out=Path("o"), nonsense=1)
    with pytest.raises(ConfigError, match="--early-stopping needs --eval"):
        FinetuneArgs.from_flat(task="qa", model=Path("m"), train_file=Path("t"), out=Path("o"),
                               early_stopping=2)


@pytest.mark.parametrize("command, cls", [("pretrain", PretrainArgs), ("finetune", FinetuneArgs)])
def test_every_setting_is_an_option_of_its_command(command: str, cls: type) -> None:
    """The CLI's options are built from the dataclass: each field's flag and help are in --help."""
    res = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    for f in cli_fields(cls):
        if not f.positional:
            assert f.flags[0] in res.stdout, f.flags[0]
    hidden = {"epochs", "early_stopping"} if command == "pretrain" else set()
    assert all(f"--{h.replace('_', '-')} " not in res.stdout for h in hidden)


def test_divergence_stops_training_before_a_broken_model_is_saved(tmp_path: Path) -> None:
    data = Rows(32, 8)
    with pytest.raises(ConfigError, match=r"training loss became nan at step \d+: training diverged"):
        train(tmp_path, data, lr=1e30, steps=20, max_grad_norm=0.0)
    assert not (tmp_path / "mlmkit.json").exists()
