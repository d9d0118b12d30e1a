"""jina-embeddings-v3 parity with transformers: tiny random models of transformers' JinaEmbeddingsV3
classes load into mlmkit's core with no missing or unexpected weights and give the same hidden
states and MLM / sequence / token / span logits on right-padded batches of mixed lengths (either
attention form on both sides), save back under transformers' names, and export; a checkpoint in
jina's own layout with its task LoRA adapters loads with the adapter of config.json's ``lora_task``
merged (transformers' model of the weights merged by hand gives the same outputs), or the base
weights without one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from family_checkpoints import export, family_tokenizer
from family_parity import Backbone, load_ours, real_diff
from rotary_families import ATOL, SIZES, cls_only_diff, hf_dir, hf_model, inputs, parity, save_back
from safetensors.torch import load_file, save_file

from mlmkit.errors import ConfigError
from mlmkit.models import core, family_for
from mlmkit.models.config import ModelConfig
from mlmkit.models.rotary_bert import PlainMLP
from mlmkit.rundir.checkpoint import load_state_dict
from mlmkit.rundir.config import load_config

transformers = pytest.importorskip("transformers")

BASE = dict(SIZES, max_position_embeddings=16, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2, rope_parameters={"rope_type": "default", "rope_theta": 100.0})
HEADS = ["ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering"]
TASKS = ["retrieval.query", "retrieval.passage", "separation", "classification", "text-matching"]
ADAPTED = ("word_embeddings", "token_type_embeddings", "mixer.Wqkv", "mixer.out_proj", "mlp.fc1", "mlp.fc2")
RANK, ALPHA = 4, 8
# the bare model's (add_pooling_layer defaults to true)
POOLER = ["bert.pooler.dense.bias", "bert.pooler.dense.weight"]


def config(**kw) -> dict:
    return {**BASE, **kw}


@pytest.mark.parametrize("scaling", ["default", "linear"])
def test_backbone_matches_transformers(tmp_path, scaling):
    rope = {"rope_type": "linear", "factor": 2.0,
            "rope_theta": 100.0} if scaling == "linear" else BASE["rope_parameters"]
    d = hf_dir(tmp_path, "JinaEmbeddingsV3", "Model", config(rope_parameters=rope))
    diff, unexpected = parity(d, "JinaEmbeddingsV3", "Model", inputs())
    # the bare model saves its pooler, which an encoder has no use for
    assert sorted(unexpected) == POOLER and diff <= ATOL, diff


@pytest.mark.parametrize("head", HEADS)
def test_heads_match_transformers(tmp_path, head):
    d = hf_dir(tmp_path, "JinaEmbeddingsV3", head,
               config(**({} if head == "ForQuestionAnswering" else {"num_labels": 3})))
    x = inputs()
    diff, unexpected = parity(d, "JinaEmbeddingsV3", head, x)
    assert unexpected == [] and diff <= ATOL, diff
    if head == "ForSequenceClassification":
        assert cls_only_diff(d, x) <= ATOL


@pytest.mark.parametrize("head", ["ForSequenceClassification", "ForQuestionAnswering"])
def test_saves_back_to_transformers(tmp_path, head):
    d = hf_dir(tmp_path, "JinaEmbeddingsV3", head,
               config(**({} if head == "ForQuestionAnswering" else {"num_labels": 3})))
    diff, info = save_back(d, "JinaEmbeddingsV3", head, tmp_path / "ours", inputs())
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert diff <= ATOL


# ---- the task adapters ------------------------------------------------------------------------
def jina_layout(tmp_path: Path, task: str | None) -> tuple[Path, dict[str | None, Path]]:
    """A checkpoint in jina's own layout (roberta.*, every adapted layer's weight as
    parametrizations.weight.original beside its stacked lora_A / lora_B, config.json with
    lora_adaptations, lora_rank, lora_alpha and ``lora_task``), and for each task (None: none) the
    transformers checkpoint of its weights merged by hand."""
    base = hf_dir(tmp_path, "JinaEmbeddingsV3", "Model", config(), name="base")
    sd = {f"roberta.{k}": v for k, v in load_file(base / "model.safetensors").items()}
    g = torch.Generator().manual_seed(3)
    layout, merged = {}, {t: dict(sd) for t in (None, *TASKS)}
    for k, w in sd.items():
        if not k.endswith(".weight") or not any(f".{a}." in k for a in ADAPTED):
            layout[k] = w
            continue
        layer = k[: -len(".weight")]
        rows, cols = w.shape
        embedding = ".embeddings." in k
        a = torch.randn((len(TASKS), rows, RANK) if embedding else (len(TASKS), RANK, cols),
                        generator=g) * 0.1
        b = torch.randn((len(TASKS), RANK, cols) if embedding else (len(TASKS), rows, RANK),
                        generator=g) * 0.1
        layout.update({f"{layer}.parametrizations.weight.original": w,
                       f"{layer}.parametrizations.weight.0.lora_A": a,
                       f"{layer}.parametrizations.weight.0.lora_B": b})
        for i, t in enumerate(TASKS):
            merged[t][k] = w + ALPHA / RANK * (a[i] @ b[i] if embedding else b[i] @ a[i])
    c = json.loads((base / "config.json").read_text())
    src = tmp_path / "jina"
    src.mkdir()
    save_file(layout, str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps({**c, "lora_adaptations": TASKS, "lora_rank": RANK,
                                                 "lora_alpha": ALPHA,
                                                 "lora_dropout_p": 0.0,
                                                 **({"lora_task": task} if task else {})}))
    refs = {}
    for t, weights in merged.items():
        refs[t] = tmp_path / f"merged-{t}"
        refs[t].mkdir()
        save_file({k[len("roberta."):]: v.contiguous() for k, v in weights.items()},
                  str(refs[t] / "model.safetensors"))
        (refs[t] / "config.json").write_text(json.dumps(c))
    return src, refs


@pytest.mark.parametrize("task", [None, "retrieval.query", "text-matching"])
def test_the_tasks_adapter_is_merged_at_load(tmp_path, task):
    src, refs = jina_layout(tmp_path, task)
    _, ours, unexpected = load_ours(src, Backbone)
    assert sorted(unexpected) == POOLER  # the adapters are folded in (or left out), not left over
    x = inputs()
    with torch.no_grad():
        got = ours(**x)
        want = {t: hf_model("JinaEmbeddingsV3", "Model", d)(**x).last_hidden_state for t, d in refs.items()}
    assert real_diff(got, want[task], x["attention_mask"]) <= ATOL
    # each adapter counts
    assert all(real_diff(got, w, x["attention_mask"]) > 1e-3 for t, w in want.items() if t != task)
    # saved by mlmkit: the merged weights under transformers' names, which transformers loads as they are
    out = tmp_path / "run"
    diff, info = save_back(src, "JinaEmbeddingsV3", "Model", out, x)
    # (mlmkit's encoder has no pooler to save: transformers' bare model makes one, which nothing here reads)
    assert (set(info["missing_keys"]) == {k[len("bert."):] for k in POOLER} and not info["unexpected_keys"]
            and diff <= ATOL), info
    assert not any("lora" in k for k in load_file(out / "model.safetensors"))
    # loading the run merges nothing again
    assert load_state_dict(out).keys() == {k for k in ours.state_dict()}


@pytest.mark.parametrize("change, words", [
    ({"lora_task": "summarization"}, "lora_task 'summarization' is not one of lora_adaptations"),
    ({"lora_adaptations": "retrieval.query"}, "lora_adaptations must be a list"),
    ({"lora_rank": 0}, "lora_rank must be a positive number"),
])
def test_adapter_settings_it_cannot_use_are_refused(change, words):
    with pytest.raises(ConfigError, match=words):
        ModelConfig.from_dict({"model_type": "jina_embeddings_v3", **SIZES, "lora_adaptations": TASKS,
                               **change})


def test_adapters_of_another_layout_are_refused(tmp_path):
    src, _ = jina_layout(tmp_path, "separation")
    c = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**c, "lora_adaptations": TASKS[:3],
                                                 "lora_task": "separation"}))
    with pytest.raises(ConfigError, match="not one a task of lora_adaptations"):
        load_state_dict(src)


def test_config_fields_and_names(tmp_path):
    d = hf_dir(tmp_path, "JinaEmbeddingsV3", "ForMaskedLM", config())
    cfg = ModelConfig.from_dict(json.loads((d / "config.json").read_text()))
    fam = family_for("jina_embeddings_v3")
    assert (cfg.layer_norm_eps, cfg.type_vocab_size, cfg.architectures) == (1e-5, 1, ["BertForMaskedLM"])
    assert (not fam.uses_token_types(cfg)
            and fam.rope(ModelConfig.from_dict({"model_type": "jina_embeddings_v3"})).theta == 20_000.0)
    assert fam.rope(ModelConfig.from_dict({"model_type": "jina_embeddings_v3",
                                           "rotary_emb_base": 10_000.0})).theta == 10_000.0
    assert isinstance(core.BertModel(cfg).encoder.layer[0].mlp, PlainMLP)


def test_export_passes_the_parity_gate(tmp_path):
    fast = family_tokenizer("unigram")
    src = hf_dir(tmp_path, "JinaEmbeddingsV3", "ForQuestionAnswering",
                 config(vocab_size=len(fast), pad_token_id=fast.pad_token_id))
    fast.save_pretrained(src)
    meta = export(src, tmp_path / "b")
    assert meta["inputs"] == ["input_ids", "attention_mask"]
    assert all(v <= 1e-4 for v in meta["parity"]["max_abs_diff"].values()), meta["parity"]
    assert meta["fused_operators"].get("SkipLayerNormalization", 0) >= 4


def test_the_published_xlm_roberta_config_is_claimed_by_this_family(tmp_path):
    """jinaai/jina-embeddings-v3's config.json says model_type "xlm-roberta" (XLMRobertaModel, with
    jina's own keys): its lora_adaptations claim it for this family, which loads it with the task's
    adapter merged and writes a run transformers loads as JinaEmbeddingsV3Model."""
    src, refs = jina_layout(tmp_path, "retrieval.query")
    c = json.loads((src / "config.json").read_text())
    c.update(model_type="xlm-roberta", architectures=["XLMRobertaModel"], position_embedding_type="rotary",
             rotary_emb_base=c.get("rope_parameters", {}).get("rope_theta", 20000.0), use_flash_attn=True)
    (src / "config.json").write_text(json.dumps(c))
    cfg = load_config(src)
    assert (cfg.model_type, cfg.architectures) == ("jina_embeddings_v3", ["BertModel"])
    assert cfg.to_dict()["architectures"] == ["JinaEmbeddingsV3Model"]
    _, ours, _ = load_ours(src, Backbone)
    x = inputs()
    with torch.no_grad():
        want = hf_model("JinaEmbeddingsV3", "Model", refs["retrieval.query"])(**x).last_hidden_state
        assert real_diff(ours(**x), want, x["attention_mask"]) <= ATOL
