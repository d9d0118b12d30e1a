"""Qwen3 parity with transformers: tiny random Qwen3Model / ForSequenceClassification /
ForTokenClassification / ForQuestionAnswering checkpoints load into mlmkit's core with no missing or
unexpected weights and give the same hidden states and logits with either attention, on right-padded
batches of mixed lengths; they save back under transformers' names; the graph exports to ONNX with
its RMSNorms fused.

The models have grouped-query attention (4 query heads over 2 key / value heads) with heads of 16
dimensions (hidden 32 / 4 heads would be 8), q / k norms, and in the "sliding" variant attention
biases, a linear rope scaling and causal sliding windows of 6 on layers past the first.
"""

from __future__ import annotations

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
    save_back,
    seq_head,
)
from prenorm_parity import (
    TEXTS,
    bundle_output,
    encode,
    fine_tunes_a_classifier,
    fused_graph_diff,
    qwen3_tokenizer,
)

from mlmkit.errors import ConfigError
from mlmkit.models import core, family_for
from mlmkit.models.config import ModelConfig
from mlmkit.models.prenorm import PrenormLayer

V = 100
BASE = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16, pad_token_id=0, max_position_embeddings=64,
            rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
VARIANTS = {
    "plain": {},
    "sliding": dict(use_sliding_window=True, sliding_window=6, max_window_layers=1, attention_bias=True,
                    rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0}),
}
# tokenizer=True: Qwen3's kind of tokenizer beside the model, its size and padding id in the config
FAMILY = HFFamily("Qwen3Config", BASE, VARIANTS, tokenizer=qwen3_tokenizer, token_ids=("pad",))
SEQ = "Qwen3ForSequenceClassification"
HEADS = {  # transformers' class, its config keywords
    "seq": (SEQ, dict(num_labels=3)),
    "token": ("Qwen3ForTokenClassification", dict(num_labels=5)),
    "qa": ("Qwen3ForQuestionAnswering", {}),
}
CONFIG = {"model_type": "qwen3", "vocab_size": V, "hidden_size": 32, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2, "intermediate_size": 48}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Checkpoints:
    return Checkpoints(FAMILY, tmp_path_factory.mktemp("qwen3"))


def inputs(T: int = 20, lengths: tuple[int, ...] = (20, 13, 5), seed: int = 1) -> dict[str, torch.Tensor]:
    return random_batch(V, T, lengths, seed)


# ---- the backbone and the heads against transformers -------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_backbone_matches_transformers_eager_and_sdpa(hf_dir, variant):
    d = hf_dir("Qwen3Model", variant)  # a bare backbone: keys without "model."
    cfg, ours, unexpected = load_ours(d, Backbone)
    assert unexpected == [] and isinstance(ours.bert.encoder.layer[0], PrenormLayer)
    spans = [layer.self_attn.spec.span for layer in ours.bert.encoder.layer]
    assert spans == ([(None, 0)] * 3 if variant == "plain" else [(None, 0), (5, 0), (5, 0)])
    backbone_matches(ours, d, "Qwen3Model", inputs())


def test_right_padding_leaves_the_real_tokens_states_alone(hf_dir):
    """Causal attention with right padding: each row's real tokens have the states they have alone."""
    _, ours, _ = load_ours(hf_dir("Qwen3Model", "sliding"), Backbone)
    x = inputs()
    with torch.no_grad():
        for impl in ("eager", "sdpa"):
            core.set_attention_impl(ours, impl)
            batch = ours(**x)
            for row, n in enumerate(x["attention_mask"].sum(1).tolist()):
                alone = ours(x["input_ids"][row:row + 1, :n], x["attention_mask"][row:row + 1, :n])
                assert (batch[row, :n] - alone[0]).abs().max().item() <= ATOL, (impl, row)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("head", HEADS)
def test_heads_match_transformers(hf_dir, head, variant):
    cls_name, kw = HEADS[head]
    d = hf_dir(cls_name, variant, **kw)
    cfg, ours, unexpected = load_ours(d, BUILDS[head_of(cls_name)])
    assert unexpected == []
    x = inputs()
    with torch.no_grad():
        ref = hf_model(cls_name, d)(**x)
    diffs = impl_diffs(ours, ref, head_of(cls_name), x)
    assert max(diffs.values()) <= ATOL, diffs


def test_the_sequence_head_reads_the_last_token_that_is_not_padding(hf_dir):
    """Qwen3's tokenizer appends <|endoftext|>, its padding token too: transformers' head reads the
    token before it (the last one whose id is not pad_token_id), and so does mlmkit's, on the texts
    as the tokenizer frames them, right-padded; without a pad_token_id, the last real token."""
    fast = FAMILY.fast()
    d = hf_dir(SEQ, num_labels=3, tokenizer=True)
    cfg, ours, _ = load_ours(d, seq_head)
    x = encode(fast, TEXTS)
    # one appended each
    assert (x["input_ids"][x["attention_mask"].bool()] == fast.pad_token_id).sum() == len(TEXTS)
    with torch.no_grad():
        ref = hf_model(SEQ, d)(**x).logits
        assert (ours(**x)["logits"] - ref).abs().max().item() <= ATOL
        seq, pooled = ours.bert(**x)
        before_eos = x["attention_mask"].sum(1) - 2
        assert torch.equal(pooled, seq[torch.arange(len(TEXTS)), before_eos])
        none = ModelConfig.from_dict({**cfg.to_dict(), "pad_token_id": None})
        ours_none = core.BertForLabels(none, per_token=False).eval()
        ours_none.load_state_dict(ours.state_dict())
        seq, pooled = ours_none.bert(**x)
        assert torch.equal(pooled, seq[torch.arange(len(TEXTS)), before_eos + 1])  # the <|endoftext|> itself


# ---- back to transformers ----------------------------------------------------------------------
@pytest.mark.parametrize("head", HEADS)
def test_saves_back_to_transformers(hf_dir, tmp_path, head):
    cls_name, kw = HEADS[head]
    cfg, ours, _ = load_ours(hf_dir(cls_name, "sliding", **kw), BUILDS[head_of(cls_name)])
    theirs = save_back(cfg, ours, cls_name, tmp_path / "ours")
    assert theirs.config.sliding_window == 6 and theirs.config.layer_types[1] == "sliding_attention"
    assert head_diff(ours, theirs, head_of(cls_name), inputs()) <= ATOL


# ---- config.json -------------------------------------------------------------------------------
def test_config_fields_and_names():
    cfg = ModelConfig.from_dict({**CONFIG, "rms_norm_eps": 1e-5, "attention_dropout": 0.1,
                                 "hidden_act": "silu", "architectures": ["Qwen3ForSequenceClassification"],
                                 "id2label": {"0": "a", "1": "b"}})
    assert (cfg.layer_norm_eps, cfg.attention_probs_dropout_prob, cfg.pad_token_id) == (1e-5, 0.1, None)
    assert (cfg.type_vocab_size, cfg.max_position_embeddings,
            cfg.architectures) == (0, 32768, ["BertForSequenceClassification"])
    d = cfg.to_dict()
    assert {"rms_norm_eps", "attention_dropout", "num_key_value_heads", "head_dim"} <= set(d)
    assert not {"layer_norm_eps", "attention_probs_dropout_prob", "type_vocab_size"} & set(d)
    assert d["architectures"] == ["Qwen3ForSequenceClassification"]
    model = core.BertForLabels(cfg, per_token=False)
    attn = model.bert.encoder.layer[0].self_attn
    assert (attn.q_proj.out_features, attn.k_proj.out_features, attn.q_norm.weight.shape[0]) == (64, 32, 16)
    assert (model.bert.pooler.pool == "last" and model.bert.pooler.dense is None
            and model.classifier.bias is None)
    assert core.BertForLabels(cfg, per_token=True).classifier.bias is not None
    assert not core.reads_cls_only(model.bert)
    assert not hasattr(model.bert.embeddings, "position_embeddings") and not hasattr(model.bert.embeddings,
                                                                                     "LayerNorm")
    fam = family_for("qwen3")
    assert fam.architecture("BertForQuestionAnswering", "qwen3") == "Qwen3ForQuestionAnswering"
    keys = set(fam.to_family(core.BertForLabels(cfg, per_token=False).state_dict()))
    assert ("score.weight" in keys and "model.layers.1.self_attn.q_norm.weight" in keys
            and "model.norm.weight" in keys)


@pytest.mark.parametrize("change, words", [
    ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads"),
    ({"head_dim": 7}, "head_dim must be even"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}}, "rope type 'yarn'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope type 'llama3'"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "use_sliding_window is not set"),
    ({"layer_types": ["full_attention"]}, "layer_types"),
    ({"use_sliding_window": True, "sliding_window": 0}, "sliding_window"),
    ({"head_dim": 1 << 20}, "head_dim must be a positive integer"),
])
def test_configs_it_cannot_run_are_refused(change, words):
    with pytest.raises(ConfigError, match=words):
        ModelConfig.from_dict({**CONFIG, **change})


# ---- ONNX --------------------------------------------------------------------------------------
def test_exported_graphs_fuse_and_match_transformers(hf_dir, tmp_path):
    """As `mlmkit export` exports them: the sequence head (last token) and the hidden states, fused
    (the RMSNorms, the residual adds with them) and, on a batch of another size and length than the
    export's, transformers' outputs."""
    seq_dir = hf_dir(SEQ, "sliding", num_labels=3)
    cfg, seq, _ = load_ours(seq_dir, seq_head)
    model_dir = hf_dir("Qwen3Model", "sliding")
    _, backbone, _ = load_ours(model_dir, Backbone)
    x = inputs(T=23, lengths=(23, 9, 17, 2))
    dummy = inputs(T=11, lengths=(11, 6))
    graphs = {"seq": (Logits(seq, lambda m, i, a: m(i, a)["logits"]), SEQ, seq_dir),
              "model": (Logits(backbone, lambda m, i, a: m(i, a)), "Qwen3Model", model_dir)}
    for name, (graph, cls_name, d) in graphs.items():
        counts, diff = fused_graph_diff(tmp_path / name, graph, cfg, dummy, x, cls_name, d)
        # 3 layers: the residual adds + norms (two a layer), the q / k head norms, the first layer's input
        # norm
        assert counts == {"SkipSimplifiedLayerNormalization": 6, "SimplifiedLayerNormalization": 7}, counts
        assert diff <= 1e-4, name


def test_mlmkit_export_of_a_released_style_checkpoint(hf_dir, tmp_path):
    """`mlmkit export` of a Qwen3ForSequenceClassification directory with Qwen3's kind of tokenizer:
    the fusion gate and the parity gate pass, and the bundle gives transformers' logits on the
    tokenizer's own framing of mixed-length texts."""
    src = hf_dir(SEQ, num_labels=3, tokenizer=True)
    meta = export(src, tmp_path / "b")
    assert meta["inputs"] == ["input_ids", "attention_mask"]
    assert meta["fused_operators"].get("SkipSimplifiedLayerNormalization", 0) >= 6, meta["fused_operators"]
    assert meta["parity"]["max_abs_diff"]["logits"] <= 1e-4
    x = encode(FAMILY.fast(), TEXTS)
    got = bundle_output(tmp_path / "b", "logits", x)
    with torch.no_grad():
        ref = hf_model(SEQ, src)(**x).logits.numpy()
    np.testing.assert_allclose(got, ref, atol=1e-4)


def test_fine_tunes_a_classifier_from_an_embedding_model(hf_dir, tmp_path):
    """A Qwen3Model (Qwen3-Embedding's layout) fine-tuned as a classifier: the last-token head learns,
    and the run is a Qwen3ForSequenceClassification transformers loads."""
    fine_tunes_a_classifier(tmp_path, hf_dir("Qwen3Model", tokenizer=True), FAMILY.fast())


def test_a_qwen3_embedding_style_directory_embeds_as_sentence_transformers_does(hf_dir, tmp_path):
    """Qwen3-Embedding's layout: a Qwen3Model with last-token pooling (the appended <|endoftext|>) and
    normalisation in a sentence-transformers directory; the exported bundle's embeddings are
    sentence-transformers' own on mixed-length texts."""
    hf = hf_dir("Qwen3Model", "sliding", tokenizer=True)
    st, bundle = sentence_transformers_bundle(tmp_path, hf, "lasttoken")
    np.testing.assert_allclose(bundle_embeddings(bundle, TEXTS), st.encode(TEXTS), atol=1e-5)
