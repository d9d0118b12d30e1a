"""GTE parity with transformers: tiny random models of transformers' Gte classes load into mlmkit's
core with no missing or unexpected weights and give the same hidden states and MLM / sequence /
token logits on right-padded batches of mixed lengths (either attention form on both sides), save
back under transformers' names, and export through `mlmkit export`'s parity gate, with each rotary
scaling the configs allow; what mlmkit does not run is refused with a clear line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from family_checkpoints import export, family_tokenizer
from family_parity import Backbone, load_ours, real_diff
from rotary_families import (
    ATOL,
    SIZES,
    cls_only_diff,
    hf_dir,
    inputs,
    parity,
    pretrain_loads_in_transformers,
    save_back,
)
from safetensors.torch import load_file, save_file

from mlmkit.errors import ConfigError
from mlmkit.models import core, family_for
from mlmkit.models.config import ModelConfig
from mlmkit.models.rotary_bert import GatedMLP, RotaryBertLayer

transformers = pytest.importorskip("transformers")

BASE = dict(SIZES, max_position_embeddings=16, pad_token_id=1, bos_token_id=0, eos_token_id=2,
            rope_parameters={"rope_type": "default", "rope_theta": 100.0})
VARIANTS = {
    "plain": {},  # gte-multilingual-base's layout: one token type, its row added everywhere
    "no_types": dict(type_vocab_size=0),  # gte-base-en-v1.5's: no token-type table
    "pairs": dict(type_vocab_size=2),  # two token types, taken as an input
    # transformers' scalings; the batch (20 tokens) is longer than the 16 positions, so "dynamic" grows the
    # base
    "linear": dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 100.0}),
    "dynamic": dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 100.0}),
}


def config(variant: str = "plain", **kw) -> dict:
    return {**BASE, **VARIANTS[variant], **kw}


@pytest.mark.parametrize("variant", VARIANTS)
def test_backbone_matches_transformers(tmp_path, variant):
    d = hf_dir(tmp_path, "Gte", "Model", config(variant))
    x = inputs(types=variant == "pairs")
    diff, unexpected = parity(d, "Gte", "Model", x)
    assert unexpected == [] and diff <= ATOL, diff


@pytest.mark.parametrize("head", ["ForMaskedLM", "ForSequenceClassification", "ForTokenClassification"])
def test_heads_match_transformers(tmp_path, head):
    d = hf_dir(tmp_path, "Gte", head, config("dynamic", num_labels=3))
    x = inputs()
    diff, unexpected = parity(d, "Gte", head, x)
    assert unexpected == [] and diff <= ATOL, diff
    if head == "ForSequenceClassification":  # the [CLS]-only last layer of the export's classification graph
        assert cls_only_diff(d, x) <= ATOL


def test_dynamic_scaling_counts_only_beyond_the_trained_positions(tmp_path):
    """The dynamic base changes the outputs of an input longer than max_position_embeddings (16),
    not of a shorter one; linear scaling changes both."""
    x_long, x_short = inputs(), inputs(T=12, lengths=(12, 7, 3))
    out = {}
    for variant in ("plain", "linear", "dynamic"):
        cfg = ModelConfig.from_dict({"model_type": "gte", **config(variant)})
        torch.manual_seed(0)
        model = core.BertModel(cfg, add_pooling_layer=False).eval()
        with torch.no_grad():
            out[variant] = [model(**x)[0] for x in (x_long, x_short)]
    assert (out["dynamic"][0] - out["plain"][0]).abs().max() > 1e-3
    assert (out["dynamic"][1] - out["plain"][1]).abs().max() <= 1e-6
    assert all((a - b).abs().max() > 1e-3 for a, b in zip(out["linear"], out["plain"]))


@pytest.mark.parametrize("head", ["ForMaskedLM", "ForSequenceClassification"])
def test_saves_back_to_transformers(tmp_path, head):
    d = hf_dir(tmp_path, "Gte", head, config("pairs", num_labels=3))
    diff, info = save_back(d, "Gte", head, tmp_path / "ours", inputs(types=True))
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert diff <= ATOL


def test_config_fields_and_names(tmp_path):
    d = hf_dir(tmp_path, "Gte", "ForMaskedLM", config())
    saved = json.loads((d / "config.json").read_text())
    cfg = ModelConfig.from_dict(saved)
    assert (cfg.type_vocab_size, cfg.pad_token_id, cfg.architectures) == (1, 1, ["BertForMaskedLM"])
    assert (cfg.to_dict()["architectures"] == ["GteForMaskedLM"] and cfg.to_dict()["rope_parameters"]
            == BASE["rope_parameters"])
    defaults = ModelConfig.from_dict({"model_type": "gte"})  # GteConfig's defaults
    assert (defaults.vocab_size, defaults.max_position_embeddings,
            defaults.attention_probs_dropout_prob) == (250048, 8192, 0.0)
    fam = family_for("gte")
    assert fam.rope(defaults).theta == 160_000.0 and not fam.uses_token_types(cfg)
    model = core.BertForPreTraining(cfg)
    layer = model.bert.encoder.layer[0]
    assert isinstance(layer, RotaryBertLayer) and isinstance(layer.mlp, GatedMLP) and layer.mlp.fused
    assert not hasattr(model.bert.embeddings, "position_embeddings")


@pytest.mark.parametrize("change, words", [
    ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}},
     "rope type 'yarn' is not supported for gte"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 2.0}}, "rope type 'llama3'"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor 0.5"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4}}, "factor"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 0.5, "rope_theta": 1e4}}, "at least 1"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": -1.0}}, "rope_theta"),
    ({"head_dim": 8}, "head_dim 8"),
])
def test_configs_it_cannot_run_are_refused(change, words):
    with pytest.raises(ConfigError, match=words):
        ModelConfig.from_dict({"model_type": "gte", **SIZES, **change})


def test_export_passes_the_parity_gate(tmp_path):
    """`mlmkit export` of a dynamic-NTK classifier: the parity gate (PyTorch against onnxruntime on a
    mixed batch) holds, and the graph has GTE's fusions; onnxruntime on inputs shorter and longer than
    the trained positions (the base is a graph op on the length) gives transformers' logits."""
    ort = pytest.importorskip("onnxruntime")
    fast = family_tokenizer("unigram")
    src = hf_dir(tmp_path, "Gte", "ForSequenceClassification",
                 config("dynamic", vocab_size=len(fast), pad_token_id=fast.pad_token_id, num_labels=3))
    fast.save_pretrained(src)
    meta = export(src, tmp_path / "b")
    assert all(v <= 1e-4 for v in meta["parity"]["max_abs_diff"].values()), meta["parity"]
    assert meta["fused_operators"].get("SkipLayerNormalization",
                                       0) >= 2 and meta["inputs"] == ["input_ids", "attention_mask"]
    sess = ort.InferenceSession(str(tmp_path / "b" / "model.onnx"), providers=["CPUExecutionProvider"])
    theirs = transformers.GteForSequenceClassification.from_pretrained(src,
                                                                       attn_implementation="eager").eval()
    for T, lengths in ((9, (9, 4)), (30, (30, 17, 2))):
        x = inputs(T, lengths, pad=fast.pad_token_id, seed=T)
        x["input_ids"] = x["input_ids"] % len(fast)
        got = dict(zip([o.name for o in sess.get_outputs()],
                       sess.run(None, {k: v.numpy() for k, v in x.items()})))
        with torch.no_grad():
            ref = theirs(**x).logits.numpy()
        assert abs(got["logits"] - ref).max() <= 1e-4, T


def test_pretraining_makes_a_model_transformers_loads(tmp_path):
    saved, diff = pretrain_loads_in_transformers(tmp_path, "gte", "Gte")
    assert saved["architectures"] == ["GteForMaskedLM"] and saved["max_position_embeddings"] == 8192
    assert saved["rope_parameters"] == {"rope_type": "default",
                                        "rope_theta": 160_000.0} and saved["type_vocab_size"] == 1
    assert diff <= ATOL


def test_the_original_new_prefix_reads_as_the_bare_model(tmp_path):
    """The hub's original GTE checkpoints hold the backbone under ``new.`` (NewModel's)."""
    d = hf_dir(tmp_path, "Gte", "Model", config())
    new = tmp_path / "new"
    shutil.copytree(d, new)
    save_file({f"new.{k}": v for k, v in load_file(d / "model.safetensors").items()},
              str(new / "model.safetensors"))
    _, ours, unexpected = load_ours(new, Backbone)
    x = inputs()
    with torch.no_grad():
        ref = transformers.GteModel.from_pretrained(d,
                                                    attn_implementation="eager").eval()(**x).last_hidden_state
        assert unexpected == [] and real_diff(ours(**x), ref, x["attention_mask"]) <= ATOL
