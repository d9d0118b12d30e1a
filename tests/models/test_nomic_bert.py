"""NomicBERT parity with transformers: tiny random models of transformers' NomicBert classes load into
mlmkit's core with no missing or unexpected weights and give the same hidden states and MLM /
sequence / token logits on right-padded batches of mixed lengths and two token types (either
attention form on both sides), save back under transformers' names, and export; NomicBERT's own
config keys (the published checkpoints') make the rotary they say, and what mlmkit does not run
is refused with a clear line."""

from __future__ import annotations

import json

import pytest
import torch
from family_checkpoints import export, family_tokenizer
from family_parity import Backbone, load_ours
from rotary_families import (
    ATOL,
    SIZES,
    cls_only_diff,
    hf_dir,
    hf_model,
    inputs,
    parity,
    pretrain_loads_in_transformers,
    save_back,
)

from mlmkit.errors import ConfigError
from mlmkit.models import core, family_for
from mlmkit.models.config import ModelConfig
from mlmkit.models.rotary import Rope
from mlmkit.models.rotary_bert import GatedMLP

transformers = pytest.importorskip("transformers")

BASE = dict(SIZES, max_position_embeddings=16, pad_token_id=0,
            rope_parameters={"rope_type": "default", "rope_theta": 100.0})
# the keys of NomicBERT's own config.json (nomic-embed-text-v1.5's, at these sizes), beside transformers'
ORIGINAL = dict(n_embd=32, n_head=2, n_layer=2, n_inner=48, layer_norm_epsilon=1e-12,
                activation_function="swiglu",
                rotary_emb_base=100, rotary_emb_fraction=1.0, rotary_emb_interleaved=False,
                rotary_scaling_factor=None,
                prenorm=False, parallel_block=False, qkv_proj_bias=False, mlp_fc1_bias=False,
                mlp_fc2_bias=False,
                use_rms_norm=False, causal=False, max_trained_positions=16)


def config(**kw) -> dict:
    return {**BASE, **kw}


def nomic(**kw) -> ModelConfig:
    return ModelConfig.from_dict({"model_type": "nomic_bert", **SIZES, **kw})


@pytest.mark.parametrize("scaling", ["default", "dynamic"])
def test_backbone_matches_transformers(tmp_path, scaling):
    rope = {"rope_type": "dynamic", "factor": 2.0,
            "rope_theta": 100.0} if scaling == "dynamic" else BASE["rope_parameters"]
    d = hf_dir(tmp_path, "NomicBert", "Model", config(rope_parameters=rope))
    # 20 tokens: beyond the 16 positions
    diff, unexpected = parity(d, "NomicBert", "Model", inputs(pad=0, types=True))
    assert unexpected == [] and diff <= ATOL, diff


@pytest.mark.parametrize("head", ["ForMaskedLM", "ForSequenceClassification", "ForTokenClassification"])
def test_heads_match_transformers(tmp_path, head):
    d = hf_dir(tmp_path, "NomicBert", head, config(num_labels=3))
    x = inputs(pad=0, types=True)
    diff, unexpected = parity(d, "NomicBert", head, x)
    assert unexpected == [] and diff <= ATOL, diff
    if head == "ForSequenceClassification":
        assert cls_only_diff(d, x) <= ATOL


@pytest.mark.parametrize("head", ["ForMaskedLM", "ForTokenClassification"])
def test_saves_back_to_transformers(tmp_path, head):
    d = hf_dir(tmp_path, "NomicBert", head, config(num_labels=3))
    diff, info = save_back(d, "NomicBert", head, tmp_path / "ours", inputs(pad=0, types=True))
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert diff <= ATOL


def test_the_original_config_keys_read_as_transformers_reads_the_published_ones(tmp_path):
    """A config.json with NomicBERT's own keys at the published checkpoints' values (and no
    rope_parameters) gives what transformers gives; its rotary_scaling_factor is the dynamic NTK
    scaling of transformers' rope type "dynamic" past max_trained_positions."""
    d = hf_dir(tmp_path, "NomicBert", "Model",
               config(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 100.0}))
    x = inputs(pad=0, types=True)
    with torch.no_grad():
        ref = hf_model("NomicBert", "Model", d)(**x).last_hidden_state
    c = json.loads((d / "config.json").read_text())
    del c["rope_parameters"]
    for extra in ({}, {"rotary_scaling_factor": 2.0}):
        (d / "config.json").write_text(json.dumps({**c, **ORIGINAL, **extra}))
        cfg, ours, _ = load_ours(d, Backbone)
        assert family_for("nomic_bert").rope(cfg) == Rope(100.0, 16,
                                                          scaling="dynamic" if extra else "default",
                                                           factor=2.0 if extra else 1.0,
                                                          trained=16 if extra else 0)
        with torch.no_grad():
            diff = (ours(**x) - ref)[x["attention_mask"].bool()].abs().max().item()
        assert (diff <= ATOL) == bool(extra), diff  # without the scaling the 20-token batch differs


def test_partial_and_interleaved_rotary_keys():
    """rotary_emb_fraction turns the first part of each head (the rest passes through),
    rotary_emb_interleaved pairs dimensions 2i, 2i + 1; each changes the outputs."""
    assert family_for("nomic_bert").rope(nomic(rotary_emb_fraction=0.5,
                                               rotary_emb_interleaved=True)) == Rope(1000.0, 8, True)
    x = inputs(pad=0)
    out = {}
    for name, kw in {"plain": {}, "partial": dict(rotary_emb_fraction=0.5),
                     "interleaved": dict(rotary_emb_interleaved=True)}.items():
        torch.manual_seed(0)
        model = core.BertModel(nomic(**kw), add_pooling_layer=False).eval()
        with torch.no_grad():
            out[name] = model(**x)[0]
    assert (out["partial"] - out["plain"]).abs().max() > 1e-3 and (out["interleaved"]
                                                                   - out["plain"]).abs().max() > 1e-3


def test_config_fields_and_names(tmp_path):
    d = hf_dir(tmp_path, "NomicBert", "ForMaskedLM", config())
    cfg = ModelConfig.from_dict(json.loads((d / "config.json").read_text()))
    fam = family_for("nomic_bert")
    assert (cfg.hidden_act, cfg.type_vocab_size,
            cfg.architectures) == ("silu", 2, ["BertForMaskedLM"]) and fam.uses_token_types(cfg)
    assert ModelConfig.from_dict({"model_type": "nomic_bert"}).vocab_size == 30528
    assert fam.rope(ModelConfig.from_dict({"model_type": "nomic_bert"})).theta == 1000.0
    layer = core.BertModel(cfg).encoder.layer[0]
    assert isinstance(layer.mlp, GatedMLP) and not layer.mlp.fused and layer.attention.qkv.bias is None


@pytest.mark.parametrize("change, words", [
    ({"n_embd": 64}, "n_embd 64"),
    ({"prenorm": True}, "pre-LN"),
    ({"qkv_proj_bias": True}, "biases in Wqkv"),
    ({"activation_function": "gelu"}, "activation_function 'gelu'"),
    ({"rotary_emb_fraction": 0.1}, "rotary_emb_fraction"),
    ({"rotary_emb_fraction": "half"}, "rotary_emb_fraction"),
    ({"rotary_emb_interleaved": "yes"}, "rotary_emb_interleaved"),
    ({"rotary_scaling_factor": 0.5}, "rotary_scaling_factor"),
    ({"rotary_scaling_factor": 2.0, "rope_parameters": {"rope_type": "linear", "factor": 2.0}}, "both scale"),
    ({"rope_parameters": {"rope_type": "longrope", "factor": 2.0}}, "rope type 'longrope'"),
])
def test_configs_it_cannot_run_are_refused(change, words):
    with pytest.raises(ConfigError, match=words):
        nomic(**change)


def test_export_takes_token_types_and_passes_the_parity_gate(tmp_path):
    """With NomicBERT's partial, interleaved and NTK-scaled rotary (its own keys, which transformers
    ignores): PyTorch and onnxruntime agree on a mixed batch longer than max_trained_positions."""
    fast = family_tokenizer("wordpiece")
    src = hf_dir(tmp_path, "NomicBert", "ForTokenClassification", config(vocab_size=len(fast), num_labels=3))
    c = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**c, "rotary_emb_fraction": 0.5,
                                                 "rotary_emb_interleaved": True,
                                                 "rotary_scaling_factor": 2.0, "max_trained_positions": 4}))
    fast.save_pretrained(src)
    meta = export(src, tmp_path / "b")
    assert meta["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
    assert all(v <= 1e-4 for v in meta["parity"]["max_abs_diff"].values()), meta["parity"]
    assert meta["fused_operators"].get("SkipLayerNormalization", 0) >= 4


def test_pretraining_makes_a_model_transformers_loads(tmp_path):
    saved, diff = pretrain_loads_in_transformers(tmp_path, "nomic_bert", "NomicBert")
    assert saved["architectures"] == ["NomicBertForMaskedLM"] and saved["max_position_embeddings"] == 2048
    assert saved["rope_parameters"] == {"rope_type": "default",
                                        "rope_theta": 1000.0} and saved["hidden_act"] == "silu"
    assert diff <= ATOL
