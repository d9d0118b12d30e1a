"""The rotary BERT-style blocks GTE, NomicBERT and jina-embeddings-v3 share (models/rotary_bert.py):
the attention's queries path (the first positions only, core.encode_cls's) gives the whole
forward's rows with either form and any rotary; the two forms agree with padding; the fused and
split gated MLPs compute the same; the layer renames. Each family's parity with transformers is in
its own test module (test_gte.py, test_nomic_bert.py, test_jina.py)."""

from __future__ import annotations

import pytest
import torch

from mlmkit.models import core
from mlmkit.models.config import ModelConfig
from mlmkit.models.rotary import Rope
from mlmkit.models.rotary_bert import GatedMLP, RotaryAttention, RotaryBertLayer, layer_renames

CFG = ModelConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                  intermediate_size=24,
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, model_type="gte",
                  type_vocab_size=1)
ROPES = [Rope(100.0, 8), Rope(100.0, 4, interleaved=True),
         Rope(100.0, 8, scaling="dynamic", factor=2.0, trained=6)]


def batch(T: int = 13) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(T)
    x = torch.randn(2, T, 32, generator=g)
    mask = torch.zeros(2, 1, 1, T)
    mask[1, ..., 9:] = -10000.0  # as core.extended_mask: the second row is 9 tokens
    return x, mask


@pytest.mark.parametrize("rope", ROPES, ids=["plain", "partial-interleaved", "dynamic"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_the_queries_path_gives_the_first_rows(rope, impl):
    torch.manual_seed(0)
    layer = RotaryBertLayer(CFG, rope, attention_bias=True,
                            mlp=GatedMLP(CFG, fused=True, down_bias=True)).eval()
    core.set_attention_impl(layer, impl)
    x, mask = batch()
    with torch.no_grad():
        whole = layer(x, mask)
        for Tq in (1, 3):
            assert (layer(x, mask, queries=x[:, :Tq]) - whole[:, :Tq]).abs().max() <= 1e-5


def test_both_forms_agree_at_real_tokens():
    torch.manual_seed(0)
    attn = RotaryAttention(CFG, ROPES[0], bias=False).eval()
    x, mask = batch()
    with torch.no_grad():
        out = {}
        for impl in ("eager", "sdpa"):
            attn.set_impl(impl)
            out[impl] = attn(x, mask)
    assert ((out["eager"][0] - out["sdpa"][0]).abs().max() <= 1e-5
            and (out["eager"][1, :9] - out["sdpa"][1, :9]).abs().max() <= 1e-5)


def test_the_fused_gated_mlp_is_the_split_one():
    torch.manual_seed(0)
    fused, split = GatedMLP(CFG, fused=True, down_bias=False), GatedMLP(CFG, fused=False, down_bias=False)
    with torch.no_grad():
        split.up.weight.copy_(fused.up_gate.weight[:24])  # the up rows first, as GTE's up_gate_proj
        split.gate.weight.copy_(fused.up_gate.weight[24:])
        split.down.weight.copy_(fused.down.weight)
        x = torch.randn(2, 5, 32)
        assert torch.allclose(fused(x), split(x), atol=1e-6)


def test_layer_renames_pair_each_block():
    assert layer_renames("nomic_bert.encoder.layers.{n}", {"attention.qkv": "attn.Wqkv"}) == (
        ("bert.encoder.layer.{n}.attention.qkv", "nomic_bert.encoder.layers.{n}.attn.Wqkv"),)
