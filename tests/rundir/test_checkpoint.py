"""Weights files (mlmkit/rundir/checkpoint.py): atomic writes, corrupted or pickled weights refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import mlmkit.rundir.checkpoint as ckpt
from mlmkit.errors import ConfigError
from mlmkit.models.config import ModelConfig
from mlmkit.models.core import BertForPreTraining
from mlmkit.rundir.checkpoint import load_state_dict, save_weights


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= atol, f"max abs diff {worst}"


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
