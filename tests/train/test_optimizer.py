"""The optimizer's parameter groups and the learning-rate schedule (mlmkit/train/optimizer.py)."""

from __future__ import annotations

import pytest

from mlmkit.models.config import ModelConfig
from mlmkit.models.core import BertForPreTraining
from mlmkit.train.optimizer import linear_schedule, param_groups


def test_no_weight_decay_on_biases_and_layernorm():
    model = BertForPreTraining(ModelConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, intermediate_size=64))
    decay, no_decay = param_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    nd = {names[id(p)] for p in no_decay["params"]}
    assert nd == {n for n, _ in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n}
    assert "bert.embeddings.word_embeddings.weight" in {names[id(p)] for p in decay["params"]}


def test_linear_warmup_then_linear_decay():
    f = linear_schedule(warmup=10, total=110)
    assert [round(f(s), 3) for s in (0, 4, 9)] == [0.1, 0.5, 1.0]
    assert f(10) == 1.0 and f(60) == pytest.approx(0.5) and f(110) == 0.0
