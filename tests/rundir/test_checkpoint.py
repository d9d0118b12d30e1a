"""Checkpoints: exact resume (dropout on, so the RNG restore matters), crash safety, atomic writes."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from conftest import run_pretrain
from safetensors.torch import load_file

import mlmkit.rundir.checkpoint as ckpt
from mlmkit.errors import ConfigError
from mlmkit.models.config import ModelConfig
from mlmkit.models.core import BertForPreTraining
from mlmkit.rundir.checkpoint import load_state_dict, save_weights
from mlmkit.rundir.config import load_config, save_config
from mlmkit.text.tokenizer import save_tokenizer, train_tokenizer
from mlmkit.train.state import ResumeCheckpoints, latest_checkpoint

N = 4  # steps between checkpoints


class Killed(BaseException):
    """Stands for the process being killed."""


@pytest.fixture(autouse=True)
def one_thread():
    # bit-exact comparisons between runs; and tiny models gain nothing from a second thread
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("ck")
    rng = random.Random(0)
    words = [f"w{i}" for i in range(40)]
    docs = ["\n".join(" ".join(rng.choices(words, k=rng.randint(5, 12))) for _ in range(rng.randint(3, 6)))
            for _ in range(60)]
    (d / "corpus.txt").write_text("\n\n".join(docs) + "\n")
    tok = train_tokenizer((d / "corpus.txt").read_text().split("\n"), vocab_size=120, min_frequency=1)
    save_tokenizer(tok, d / "tok")
    save_config(ModelConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=64,
                            hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1), d / "config.json")
    return {"corpus": d / "corpus.txt", "tok": d / "tok" / "tokenizer.json", "config": d / "config.json"}


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


def kill_after_checkpoint(monkeypatch, step: int) -> None:
    """The process dies right after the checkpoint of ``step`` is complete."""
    original = ResumeCheckpoints.save

    def save_then_die(self, model, opt, sched, position, meta):
        ck = original(self, model, opt, sched, position, meta)
        if position["step"] == step:
            raise Killed
        return ck

    monkeypatch.setattr(ResumeCheckpoints, "save", save_then_die)


def test_same_seed_same_weights(setup, straight, tmp_path):
    run(setup, tmp_path / "again")
    assert_same_weights(weights(tmp_path / "again"), straight, atol=0.0)
    run(setup, tmp_path / "other", seed=4)
    other = weights(tmp_path / "other")
    assert max(float((other[k] - straight[k]).abs().max()) for k in other) > 1e-3


def test_resume_equals_straight_run(setup, straight, tmp_path, monkeypatch):
    out = tmp_path / "run"
    kill_after_checkpoint(monkeypatch, N)
    with pytest.raises(Killed):
        run(setup, out)
    monkeypatch.undo()
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
    kill_after_checkpoint(monkeypatch, N)
    with pytest.raises(Killed):
        run(setup, out)
    monkeypatch.undo()
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
    kill_after_checkpoint(monkeypatch, 6)
    with pytest.raises(Killed):
        run(setup, out, keep_last=1, save_every=2, resume=True)
    monkeypatch.undo()
    ck = latest_checkpoint(out)
    assert ck is not None and ck.name == "step-0000006"


def test_resume_without_checkpoint_is_a_clear_error(setup, tmp_path):
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        run(setup, tmp_path / "run", resume=True)


def test_weights_file_survives_a_failed_overwrite(tmp_path, monkeypatch):
    cfg = ModelConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=32)
    model = BertForPreTraining(cfg)
    save_weights(model, tmp_path / "model.safetensors")
    before = load_file(str(tmp_path / "model.safetensors"))
    assert "cls.predictions.decoder.weight" not in before  # tied: stored once, as transformers
    with torch.no_grad():
        model.bert.pooler.dense.weight.add_(1.0)

    def half(tensors, path, metadata=None):
        Path(path).write_bytes(b"\x01" * 64)
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "save_file", half)
    with pytest.raises(OSError):
        save_weights(model, tmp_path / "model.safetensors")
    assert_same_weights(load_file(str(tmp_path / "model.safetensors")), before, atol=0.0)


def test_corrupted_weights_are_a_clear_error(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\x05\x00garbage")
    with pytest.raises(ConfigError, match="unreadable weights"):
        load_state_dict(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match="no weights"):
        load_state_dict(tmp_path)


def test_pickled_code_in_a_bin_checkpoint_is_not_run(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (Path.touch, (marker,))

    torch.save({"bert.pooler.dense.weight": Evil()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ConfigError):
        load_state_dict(tmp_path)
    assert not marker.exists()
