"""Gemma 3 (gemma3_text) parity with transformers: tiny random Gemma3TextModel and
Gemma3TextForSequenceClassification checkpoints load into mlmkit's core with no missing or
unexpected weights and give the same hidden states and logits with either attention, on
right-padded batches of mixed lengths; they save back under transformers' names; older config keys
read the same; the graph exports to ONNX with its RMSNorms and GELU fused.

The models have local and global layers (a window of 8: 4 positions each side under
use_bidirectional_attention, EmbeddingGemma's, 7 before each query when causal) on sequences of up to
20 tokens, both rotary bases, query_pre_attn_scalar unlike head_dim, and grouped-query attention
(4 query heads over 2 key / value heads of 16 dimensions); the weights are perturbed well beyond
their init so that every parameter matters.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from family_checkpoints import bundle_embeddings, export, sentence_transformers_bundle
from family_parity import (
    ATOL,
    BUILDS,
    Backbone,
    Checkpoints,
    HFFamily,
    Logits,
    backbone_matches,
    head_diff,
    head_of,
    hf_model,
    impl_diffs,
    load_ours,
    random_batch,
    real_diff,
    save_back,
    seq_head,
)
from prenorm_parity import (
    TEXTS,
    bundle_output,
    encode,
    fine_tunes_a_classifier,
    fused_graph_diff,
    gemma_tokenizer,
)

from mlmkit.errors import ConfigError
from mlmkit.models import core, family_for
from mlmkit.models.config import ModelConfig
from mlmkit.models.prenorm import FULL, SLIDING, RMSNorm

V = 100
ROPE = {FULL: {"rope_type": "default", "rope_theta": 1000.0},
        SLIDING: {"rope_type": "default", "rope_theta": 100.0}}
BASE = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16, pad_token_id=0, bos_token_id=2, eos_token_id=1, max_position_embeddings=128,
            query_pre_attn_scalar=24,
            sliding_window=8, layer_types=[SLIDING, FULL, SLIDING, SLIDING], rope_parameters=ROPE,
            use_bidirectional_attention=True)
VARIANTS = {
    "bidirectional": {},  # EmbeddingGemma's
    "causal": dict(use_bidirectional_attention=False),
    # a linear rope scaling on the global layers (Gemma 3 4B's), an odd window, the silu MLP
    "scaled": dict(rope_parameters={FULL: {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000.0},
                                    SLIDING: ROPE[SLIDING]},
                   sliding_window=7, hidden_activation="silu"),
}
# tokenizer=True: Gemma's kind of tokenizer beside the model (its special tokens' ids are BASE's), its
# size in the config
FAMILY = HFFamily("Gemma3TextConfig", BASE, VARIANTS, tokenizer=gemma_tokenizer)
SEQ = "Gemma3TextForSequenceClassification"


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Checkpoints:
    return Checkpoints(FAMILY, tmp_path_factory.mktemp("gemma3"))


def inputs(T: int = 20, lengths: tuple[int, ...] = (20, 13, 5), seed: int = 1) -> dict[str, torch.Tensor]:
    return random_batch(V, T, lengths, seed)


# ---- the backbone and the head against transformers --------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_backbone_matches_transformers_eager_and_sdpa(hf_dir, variant):
    d = hf_dir("Gemma3TextModel", variant)  # a bare backbone: keys without "model."
    cfg, ours, unexpected = load_ours(d, Backbone)
    assert unexpected == []
    spans = [layer.self_attn.spec.span for layer in ours.bert.encoder.layer]
    window = {"bidirectional": (4, 4), "causal": (7, 0), "scaled": (3, 3)}[variant]
    assert spans == [window, None if variant != "causal" else (None, 0), window, window]
    backbone_matches(ours, d, "Gemma3TextModel", inputs())


@pytest.mark.parametrize("variant", ["bidirectional", "causal"])
def test_sequence_head_matches_transformers(hf_dir, variant):
    """transformers' generic head: ``score`` without bias on the last token that is not <pad>
    (EmbeddingGemma's tokenizer frames a text <bos> A <eos>: the <eos>), on the texts as the tokenizer
    frames them, right-padded, and on random ids with either attention."""
    fast = FAMILY.fast()
    d = hf_dir(SEQ, variant, num_labels=3, tokenizer=True)
    cfg, ours, unexpected = load_ours(d, seq_head)
    assert unexpected == [] and ours.classifier.bias is None
    ref_model = hf_model(SEQ, d)
    for x in (encode(fast, TEXTS), random_batch(len(fast), 20, (20, 13, 5), low=5)):
        with torch.no_grad():
            diffs = impl_diffs(ours, ref_model(**x), "ForSequenceClassification", x)
        assert max(diffs.values()) <= ATOL, diffs
    x = encode(fast, TEXTS)
    seq, pooled = ours.bert(**x)
    assert torch.equal(pooled, seq[torch.arange(len(TEXTS)), x["attention_mask"].sum(1) - 1])  # the <eos>


def test_long_inputs_match_transformers(hf_dir):
    """Many windows long (a window of 16, 8 positions each side, over 100 tokens): hidden states as
    transformers computes them, and the window counts (another one gives other states)."""
    d = hf_dir("Gemma3TextModel", sliding_window=16)
    cfg, ours, _ = load_ours(d, Backbone)
    x = inputs(T=100, lengths=(100, 61, 7))
    with torch.no_grad():
        ref = hf_model("Gemma3TextModel", d)(**x).last_hidden_state
        assert real_diff(ours(**x), ref, x["attention_mask"]) <= ATOL
        other = Backbone(ModelConfig.from_dict({**cfg.to_dict(), "sliding_window": 20}))
        other.load_state_dict(ours.state_dict())
        assert real_diff(other.eval()(**x), ref, x["attention_mask"]) > 1e-3


# ---- back to transformers ----------------------------------------------------------------------
@pytest.mark.parametrize("cls_name", ["Gemma3TextModel", SEQ])
def test_saves_back_to_transformers(hf_dir, tmp_path, cls_name):
    cfg, ours, _ = load_ours(hf_dir(cls_name, "scaled", num_labels=2), BUILDS[head_of(cls_name)])
    theirs = save_back(cfg, ours, cls_name, tmp_path / "ours")
    assert theirs.config.sliding_window == 7 // 2 + 1  # transformers halves the bidirectional window it reads
    assert head_diff(ours, theirs, head_of(cls_name), inputs()) <= ATOL


# ---- config.json -------------------------------------------------------------------------------
def test_older_config_keys_read_the_same(hf_dir, tmp_path):
    """Configs written before transformers 5 state the bases as rope_theta and rope_local_base_freq
    and the pattern as sliding_window_pattern, without rope_parameters or layer_types."""
    d = hf_dir("Gemma3TextModel", layer_types=[SLIDING, FULL, SLIDING, FULL])
    old = tmp_path / "old"
    old.mkdir()
    (old / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes())
    c = json.loads((d / "config.json").read_text())
    del c["layer_types"], c["rope_parameters"]
    c.update(rope_theta=1000.0, rope_local_base_freq=100.0, sliding_window_pattern=2)
    (old / "config.json").write_text(json.dumps(c))
    cfg, ours, _ = load_ours(old, Backbone)
    x = inputs()
    with torch.no_grad():
        assert real_diff(ours(**x), hf_model("Gemma3TextModel", d)(**x).last_hidden_state,
                         x["attention_mask"]) <= ATOL


def test_config_fields_and_names():
    cfg = ModelConfig.from_dict({"model_type": "gemma3_text", "vocab_size": V, "hidden_size": 32,
                                 "num_attention_heads": 2,
                                 "num_key_value_heads": 1, "head_dim": 64, "num_hidden_layers": 7,
                                 "intermediate_size": 48,
                                 "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-5,
                                 "sliding_window": 512,
                                 "use_bidirectional_attention": True, "architectures": ["Gemma3TextModel"]})
    assert (cfg.hidden_act, cfg.layer_norm_eps, cfg.pad_token_id,
            cfg.architectures) == ("gelu_pytorch_tanh", 1e-5, 0, ["BertModel"])
    d = cfg.to_dict()
    assert {"hidden_activation", "rms_norm_eps", "num_key_value_heads",
            "head_dim"} <= set(d) and "hidden_act" not in d
    model = core.BertModel(cfg, add_pooling_layer=False)
    layers = model.encoder.layer
    # EmbeddingGemma's window of 512: 256 each side; every sixth layer global; query_pre_attn_scalar 256
    assert [x.self_attn.spec.span for x in layers] == [(256, 256)] * 5 + [None, (256, 256)]
    assert layers[0].self_attn.scale == 256 ** -0.5 and layers[0].self_attn.spec.rope.theta == 10_000.0
    assert layers[5].self_attn.spec.rope.theta == 1_000_000.0
    assert isinstance(model.encoder.final_norm, RMSNorm) and model.encoder.final_norm.offset
    assert float(model.embeddings.scale) == pytest.approx(32 ** 0.5)
    fam = family_for("gemma3_text")
    assert fam.architecture("BertForSequenceClassification", "gemma3_text") == SEQ
    # under the heads' "bert."
    keys = set(fam.to_family({f"bert.{k}": v for k, v in model.state_dict().items()}))
    assert {"model.layers.0.pre_feedforward_layernorm.weight",
            "model.layers.6.post_feedforward_layernorm.weight",
            "model.embed_tokens.weight", "model.norm.weight"} <= keys


@pytest.mark.parametrize("change, words", [
    ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads"),
    ({"rope_parameters": {FULL: {"rope_type": "yarn", "factor": 2.0}}, "layer_types": [FULL, SLIDING]},
     "rope type 'yarn'"),
    ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}, "layer_types": [SLIDING, FULL]},
     "rope type 'longrope'"),
    ({"layer_types": [FULL, "chunked_attention"]}, "layer_types"),
    ({"sliding_window": 0}, "sliding_window"),
    ({"query_pre_attn_scalar": -1}, "query_pre_attn_scalar"),
    ({"hidden_activation": "gelu_fast"}, "hidden_activation"),
])
def test_configs_it_cannot_run_are_refused(change, words):
    with pytest.raises(ConfigError, match=words):
        ModelConfig.from_dict({"model_type": "gemma3_text", "vocab_size": V, "hidden_size": 32,
                               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                               "num_hidden_layers": 2, "intermediate_size": 48, **change})


# ---- ONNX --------------------------------------------------------------------------------------
def test_exported_graphs_fuse_and_match_transformers(hf_dir, tmp_path):
    """As `mlmkit export` exports them: the hidden states and the sequence head, fused (the RMSNorms,
    the residual adds with those after them, the tanh GELU) and, on a batch of another size and length
    than the export's, beyond the window, transformers' outputs."""
    model_dir = hf_dir("Gemma3TextModel")
    cfg, backbone, _ = load_ours(model_dir, Backbone)
    seq_dir = hf_dir(SEQ, num_labels=3)
    _, seq, _ = load_ours(seq_dir, seq_head)
    x = inputs(T=23, lengths=(23, 9, 17, 2))
    dummy = inputs(T=11, lengths=(11, 6))
    graphs = {"model": (Logits(backbone, lambda m, i, a: m(i, a)), "Gemma3TextModel", model_dir),
              "seq": (Logits(seq, lambda m, i, a: m(i, a)["logits"]), SEQ, seq_dir)}
    for name, (graph, cls_name, d) in graphs.items():
        counts, diff = fused_graph_diff(tmp_path / name, graph, cfg, dummy, x, cls_name, d)
        # 4 layers: two skip norms a layer; the block outputs' and q / k head norms, the first input norm
        assert counts == {"SkipSimplifiedLayerNormalization": 8, "SimplifiedLayerNormalization": 17,
                          "FastGelu": 4}, counts
        assert diff <= 1e-4, name


def test_mlmkit_export_of_an_embeddinggemma_style_checkpoint(hf_dir, tmp_path):
    """`mlmkit export` of a bidirectional Gemma3TextModel directory with Gemma's kind of tokenizer (the
    embedding task, mean pooling): the fusion and parity gates pass, and the bundle gives the mean
    of transformers' hidden states over the real tokens of mixed-length texts."""
    src = hf_dir("Gemma3TextModel", tokenizer=True)
    meta = export(src, tmp_path / "b")
    assert meta["task"] == "embedding" and meta["inputs"] == ["input_ids", "attention_mask"]
    assert meta["fused_operators"].get("SkipSimplifiedLayerNormalization", 0) >= 8, meta["fused_operators"]
    x = encode(FAMILY.fast(), TEXTS)
    got = bundle_output(tmp_path / "b", "embedding", x)
    with torch.no_grad():
        h = hf_model("Gemma3TextModel", src)(**x).last_hidden_state.numpy()
    m = x["attention_mask"].numpy()[..., None]
    np.testing.assert_allclose(got, (h * m).sum(1) / m.sum(1), atol=1e-4)


def test_fine_tunes_a_classifier_from_an_embedding_model(hf_dir, tmp_path):
    """A bidirectional Gemma3TextModel (EmbeddingGemma's layout) fine-tuned as a classifier: the
    last-token head learns, and the run is a Gemma3TextForSequenceClassification transformers loads."""
    fine_tunes_a_classifier(tmp_path, hf_dir("Gemma3TextModel", tokenizer=True), FAMILY.fast())


def test_an_embeddinggemma_style_directory_embeds_as_sentence_transformers_does(hf_dir, tmp_path):
    """EmbeddingGemma's layout: a bidirectional Gemma3TextModel, mean pooling, two Dense layers without
    bias (out to 3 x hidden and back) and normalisation in a sentence-transformers directory; the
    exported bundle's embeddings are sentence-transformers' own on mixed-length texts."""
    hf = hf_dir("Gemma3TextModel", tokenizer=True)
    st, bundle = sentence_transformers_bundle(tmp_path, hf, "mean", dense=(96,))
    np.testing.assert_allclose(bundle_embeddings(bundle, TEXTS), st.encode(TEXTS), atol=1e-5)
