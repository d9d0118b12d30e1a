"""The training loop's parts: gradient accumulation, the learning-rate schedule, best-model selection
and early stopping, the arguments and their checks, divergence."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import tiny_config
from typer.testing import CliRunner

from mlmkit.args import FinetuneArgs, PretrainArgs, TrainArgs, cli_fields
from mlmkit.cli import app
from mlmkit.errors import ConfigError
from mlmkit.files import read_json
from mlmkit.models.core import BertForLabels
from mlmkit.rundir.meta import RunMeta
from mlmkit.train.loop import BestTracker, Trainer


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


@pytest.fixture(autouse=True)
def _no_curves(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test here reads a run's curves.png: each run ends as where matplotlib is not installed (drawing
    them costs about half a second a run; tests/train/test_tracking.py checks them)."""
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



_STEP_FAULTS = """
import json, os, resource, torch
from mlmkit.models.config import ModelConfig
from mlmkit.models.core import BertForLabels
from mlmkit.train.devices import keep_freed_memory

cfg = ModelConfig.from_dict({"vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 1,
                             "num_attention_heads": 4, "intermediate_size": 128,
                             "max_position_embeddings": 512, "model_type": "bert",
                             "id2label": {0: "a", 1: "b"}})
m = BertForLabels(cfg, per_token=False).train()
ids = torch.randint(5, 100, (16, 384))  # attention's (16, 4, 384, 384) blocks: 38 MB, over glibc's 32 MB


def later_step_faults():
    faults = []
    for _ in range(4):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        labels = torch.zeros(16, dtype=torch.long)
        m(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)["loss"].backward()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return min(faults[1:])  # a step after the first: what every later step of a run costs


# glibc's defaults first, as nothing asked to keep; then asking with MLMKIT_KEEP_FREED_MEMORY=0 (nothing
# may change); keeping last, as it applies to the whole process from then on
got = {"default": [False, later_step_faults()]}
os.environ["MLMKIT_KEEP_FREED_MEMORY"] = "0"
got["opted-out"] = [keep_freed_memory(), later_step_faults()]
os.environ["MLMKIT_KEEP_FREED_MEMORY"] = "1"
got["kept"] = [keep_freed_memory(), later_step_faults()]
print(json.dumps(got))
"""


@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc", reason="glibc's allocator")
def test_kept_freed_memory_spares_every_later_step_its_page_faults() -> None:
    """What the Trainer sets on the CPU (keep_freed_memory): a training step whose attention blocks
    are over 32 MB reuses the previous step's memory (next to no page faults); glibc's default maps
    and zeroes those blocks afresh each step (tens of thousands of faults), and so does a process
    that opted out with MLMKIT_KEEP_FREED_MEMORY=0 though it asked to keep. One process measures the
    three in turn (a process each cost two more torch imports)."""
    import json
    import os
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _STEP_FAULTS], capture_output=True, text=True, check=True,
                       env={**os.environ, "MLMKIT_KEEP_FREED_MEMORY": "1"})
    modes = json.loads(r.stdout)
    assert {mode: kept for mode, (kept, _) in modes.items()} == {"default": False, "opted-out": False,
                                                                 "kept": True}, modes
    got = {mode: faults for mode, (_, faults) in modes.items()}
    assert got["default"] > 20_000, got  # 4 KB pages of the blocks freed and re-allocated
    assert got["opted-out"] > 20_000, got
    assert got["kept"] < got["default"] / 10, got  # ~0 on a quiet machine; a few thousand seen under load
