"""Resuming a run (mlmkit/train/state.py): exact resume (dropout on, so the RNG restore matters), and
crash safety: a checkpoint killed mid-write, or incomplete, never displaces a complete one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import run_pretrain
from hostile import pretraining_inputs
from safetensors.torch import load_file

import mlmkit.rundir.checkpoint as ckpt
from mlmkit.errors import ConfigError
from mlmkit.models.core import BertForPreTraining
from mlmkit.rundir.checkpoint import load_state_dict
from mlmkit.rundir.config import load_config
from mlmkit.train.state import ResumeCheckpoints, latest_checkpoint

N = 4  # steps between checkpoints


class Killed(BaseException):
    """Stands for the process being killed."""


# bit-exact comparisons between runs: one thread (conftest.py's fixture)
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    """Two layers with dropout on, so that a resume must restore the RNG."""
    return pretraining_inputs(tmp_path_factory.mktemp("ck"), n_docs=60, sentences=(3, 6), num_hidden_layers=2,
                              hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)


def run(setup, out: Path, steps: int = 2 * N, **kw):
    kw = {"save_every": N, "eval_every": 1000, "batch_size": 8, "seq_len": 32, "lr": 1e-3, "seed": 3,
          "progress": False, **kw}
    return run_pretrain([setup["corpus"]], out, tokenizer=setup["tok"], config=setup["config"], steps=steps,
                        **kw)


def weights(d: Path) -> dict[str, torch.Tensor]:
    return load_file(str(d / "model.safetensors"))


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= atol, f"max abs diff {worst}"


@pytest.fixture(scope="module")
def straight(setup, tmp_path_factory) -> dict[str, torch.Tensor]:
    """2N steps in one go."""
    out = tmp_path_factory.mktemp("straight") / "run"
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    run(setup, out)
    torch.set_num_threads(n)
    return weights(out)


def run_until_killed(setup, out: Path, monkeypatch, step: int = N, **kw) -> None:
    """``run`` dies right after the checkpoint of ``step`` is complete (``monkeypatch`` is undone after)."""
    original = ResumeCheckpoints.save

    def save_then_die(self, model, opt, sched, position, meta):
        ck = original(self, model, opt, sched, position, meta)
        if position.step == step:
            raise Killed
        return ck

    monkeypatch.setattr(ResumeCheckpoints, "save", save_then_die)
    with pytest.raises(Killed):
        run(setup, out, **kw)
    monkeypatch.undo()


def test_same_seed_same_weights(setup, straight, tmp_path):
    run(setup, tmp_path / "again")
    assert_same_weights(weights(tmp_path / "again"), straight, atol=0.0)
    run(setup, tmp_path / "other", seed=4)
    other = weights(tmp_path / "other")
    assert max(float((other[k] - straight[k]).abs().max()) for k in other) > 1e-3


def test_resume_equals_straight_run(setup, straight, tmp_path, monkeypatch):
    out = tmp_path / "run"
    run_until_killed(setup, out, monkeypatch)
    assert latest_checkpoint(out).name == f"step-{N:07d}"
    assert not (out / "model.safetensors").exists()  # the run never finished
    result = run(setup, out, resume=True)
    assert result["step"] == 2 * N
    assert_same_weights(weights(out), straight)
    # without the RNG restore the dropout masks differ and so do the weights: the check has teeth
    assert max(float((weights(out / "checkpoints" / f"step-{N:07d}")[k] - straight[k]).abs().max())
               for k in straight) > 1e-4


def test_resume_takes_tokenizer_and_config_from_the_checkpoint(setup, straight, tmp_path, monkeypatch):
    # a run killed before its end has no tokenizer.json / config.json at its root yet
    out = tmp_path / "run"
    run_until_killed(setup, out, monkeypatch)
    assert not (out / "tokenizer.json").exists()
    run_pretrain([setup["corpus"]], out, steps=2 * N, save_every=N, eval_every=1000, batch_size=8, seq_len=32,
             lr=1e-3, seed=3, progress=False, resume=True)  # no --tokenizer, no --config
    assert_same_weights(weights(out), straight)


@pytest.mark.parametrize("fail_in", ["weights", "optimizer state"])
def test_checkpoint_killed_mid_write_leaves_the_previous_one(setup, straight, tmp_path, monkeypatch, fail_in):
    out = tmp_path / "run"

    def dies_mid_write(real):
        def write(obj, path, *args, **kwargs):
            if f"step-{2 * N:07d}" in str(path):  # the second checkpoint
                Path(path).write_bytes(b"\x00" * 100)  # a few bytes land, then the process dies
                raise Killed
            return real(obj, path, *args, **kwargs)

        return write

    if fail_in == "weights":
        monkeypatch.setattr(ckpt, "save_file", dies_mid_write(ckpt.save_file))
    else:
        monkeypatch.setattr(torch, "save", dies_mid_write(torch.save))
    with pytest.raises(Killed):
        run(setup, out)
    monkeypatch.undo()

    broken = out / "checkpoints" / f"step-{2 * N:07d}"
    assert broken.is_dir()  # half written
    first = latest_checkpoint(out)
    assert first.name == f"step-{N:07d}"
    sd = load_state_dict(first)
    model = BertForPreTraining(load_config(first))
    missing, unexpected = ckpt.load_weights(model, sd)
    assert not missing and not unexpected
    # --resume ignores the incomplete directory, restarts from step N and ends where a straight run does
    result = run(setup, out, resume=True)
    assert result["step"] == 2 * N
    assert_same_weights(weights(out), straight)


def test_incomplete_checkpoint_never_displaces_a_complete_one(setup, tmp_path, monkeypatch):
    out = tmp_path / "run"
    real_save_file = ckpt.save_file

    def dies_at_step_8(tensors, path, *args, **kwargs):
        if f"step-{2 * N:07d}" in str(path):
            raise Killed
        return real_save_file(tensors, path, *args, **kwargs)

    monkeypatch.setattr(ckpt, "save_file", dies_at_step_8)
    with pytest.raises(Killed):
        run(setup, out, keep_last=1)  # step 4 complete, step 8 incomplete
    monkeypatch.undo()
    # resumed with checkpoints every 2 steps and keep_last=1, then killed after step 6:
    # pruning must count complete checkpoints only, or the incomplete step 8 would be "kept"
    run_until_killed(setup, out, monkeypatch, 6, keep_last=1, save_every=2, resume=True)
    ck = latest_checkpoint(out)
    assert ck is not None and ck.name == "step-0000006"


def test_resume_without_checkpoint_is_a_clear_error(setup, tmp_path):
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        run(setup, tmp_path / "run", resume=True)


@pytest.mark.parametrize(("field", "value", "said"), [
    ("step", "4", "'step' is not a whole number of at least 0 ('4')"),
    ("micro", -1, "'micro' is not a whole number of at least 0 (-1)"),
    ("world", 0, "'world' is not a whole number of at least 1 (0)"),
    ("best_metrics", [1], "'best_metrics' is not an object ([1])"),
])
def test_a_wrong_field_in_trainer_json_is_named_in_one_line(tmp_path, field, value, said):
    import json

    from mlmkit.train.state import Position
    from mlmkit.typed import to_json

    p = tmp_path / "trainer.json"
    p.write_text(json.dumps({**to_json(Position(step=4, epoch=0, micro=4, total=8)), field: value}))
    with pytest.raises(ConfigError) as e:
        Position.read(p)
    assert e.value.message == f"{p}: {said}"


def test_trainer_json_round_trips_and_an_older_one_without_data_reads(tmp_path):
    import json

    from mlmkit.train.state import Position
    from mlmkit.typed import to_json

    pos = Position(step=4, epoch=1, micro=2, total=8, world=2, data={"batch_size": 4}, best=0.5,
                   bad_evals=1, best_metrics={"best_step": 2})
    p = tmp_path / "trainer.json"
    p.write_text(json.dumps(to_json(pos)))
    assert Position.read(p) == pos
    p.write_text(json.dumps({"step": 4, "epoch": 1, "micro": 2}))  # what an early checkpoint held
    assert Position.read(p) == Position(step=4, epoch=1, micro=2)
