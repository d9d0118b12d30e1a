"""EuroBERT parity with transformers: tiny random EuroBertModel / ForMaskedLM / ForSequenceClassification
(each classifier_pooling) / ForTokenClassification checkpoints load into mlmkit's core with no missing
or unexpected weights and give the same hidden states and logits with either attention, on
right-padded batches of mixed lengths; they save back under transformers' names, the MLM decoder
tied or not; the graphs export to ONNX with their RMSNorms fused, and `mlmkit export` gives
transformers' predictions.

The models have grouped-query attention (4 query heads over 2 key / value heads) and, in the
"biased" variant, attention and MLP biases, heads of 16 dimensions (hidden 32 / 4 heads would be 8),
a linear rope scaling and the decoder tied to the embeddings.
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
    backbone_matches,
    head_diff,
    head_graphs,
    head_of,
    hf_model,
    impl_diffs,
    load_ours,
    mlm_diffs,
    random_batch,
    save_back,
    seq_head,
    token_head,
)
from prenorm_parity import (
    TEXTS,
    bundle_output,
    encode,
    eurobert_tokenizer,
    fine_tunes_a_classifier,
    fused_graph_diff,
)

from mlmkit.errors import ConfigError
from mlmkit.models import core, family_for
from mlmkit.models.config import ModelConfig
from mlmkit.runtime.pipeline import Pipeline

V = 100
BASE = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2,
            pad_token_id=0, bos_token_id=2, eos_token_id=0, mask_token_id=3, max_position_embeddings=64,
            rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
VARIANTS = {
    "plain": {},  # EuroBertConfig's defaults: no biases, an untied decoder, late pooling
    "biased": dict(attention_bias=True, mlp_bias=True, head_dim=16, tie_word_embeddings=True,
                   rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0}),
}
# tokenizer=True: EuroBERT's kind of tokenizer beside the model, its size and ids in the config
FAMILY = HFFamily("EuroBertConfig", BASE, VARIANTS, tokenizer=eurobert_tokenizer,
                  token_ids=("pad", "bos", "eos", "mask"))
SEQ = "EuroBertForSequenceClassification"
CONFIG = {"model_type": "eurobert", "vocab_size": V, "hidden_size": 32, "num_attention_heads": 4,
          "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 48}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Checkpoints:
    return Checkpoints(FAMILY, tmp_path_factory.mktemp("eurobert"))


def inputs(T: int = 20, lengths: tuple[int, ...] = (20, 13, 5), seed: int = 1) -> dict[str, torch.Tensor]:
    return random_batch(V, T, lengths, seed, first=2)  # <|begin_of_text|>, the token "bos" pooling reads


# ---- the backbone and the heads against transformers -------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_backbone_matches_transformers_eager_and_sdpa(hf_dir, variant):
    d = hf_dir("EuroBertModel", variant)  # a bare backbone: keys without "model."
    cfg, ours, unexpected = load_ours(d, Backbone)
    assert unexpected == [] and all(layer.self_attn.spec.span is None for layer in ours.bert.encoder.layer)
    backbone_matches(ours, d, "EuroBertModel", inputs())


@pytest.mark.parametrize("variant", VARIANTS)
def test_mlm_logits_match(hf_dir, variant):
    d = hf_dir("EuroBertForMaskedLM", variant)
    cfg, ours, unexpected = load_ours(d, core.BertForPreTraining)
    assert unexpected == []
    head = ours.cls.predictions
    tied = head.decoder.weight is ours.bert.embeddings.word_embeddings.weight
    assert tied == (variant == "biased") and (head.bias is not None) == (variant == "biased")
    x = inputs()
    with torch.no_grad():
        ref = hf_model("EuroBertForMaskedLM", d)(**x).logits
    for impl in ("eager", "sdpa"):
        core.set_attention_impl(ours, impl)
        # every token, and the head at the labelled positions only
        assert max(mlm_diffs(ours, ref, x)) <= ATOL, impl


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("pooling", ["late", "bos", "mean"])
def test_sequence_classification_matches(hf_dir, variant, pooling):
    d = hf_dir(SEQ, variant, classifier_pooling=pooling, num_labels=3)
    cfg, ours, unexpected = load_ours(d, seq_head)
    assert unexpected == []
    x = inputs()
    with torch.no_grad():
        ref = hf_model(SEQ, d)(**x)
    diffs = impl_diffs(ours, ref, "ForSequenceClassification", x)
    assert max(diffs.values()) <= ATOL, diffs
    assert core.reads_cls_only(ours.bert) == (pooling == "bos")
    if pooling == "bos":  # the last layer computed for the first token alone gives the same vector
        with torch.no_grad():
            fast = core.encode_cls(ours.bert, x["input_ids"], x["attention_mask"])
            assert (ours.classifier(fast) - ref.logits).abs().max().item() <= ATOL


@pytest.mark.parametrize("variant", VARIANTS)
def test_token_classification_matches(hf_dir, variant):
    d = hf_dir("EuroBertForTokenClassification", variant, num_labels=5)
    cfg, ours, unexpected = load_ours(d, token_head)
    assert unexpected == []
    x = inputs()
    with torch.no_grad():
        ref = hf_model("EuroBertForTokenClassification", d)(**x)
    diffs = impl_diffs(ours, ref, "ForTokenClassification", x)
    assert max(diffs.values()) <= ATOL, diffs


# ---- back to transformers ----------------------------------------------------------------------
@pytest.mark.parametrize("head, variant", [("mlm", "plain"), ("mlm", "biased"), ("seq", "plain")])
def test_saves_back_to_transformers(hf_dir, tmp_path, head, variant):
    """An untied decoder (EuroBertConfig's default) is stored as lm_head.weight, a tied one is not:
    transformers loads either with nothing missing or unexpected."""
    cls_name = "EuroBertForMaskedLM" if head == "mlm" else SEQ
    cfg, ours, _ = load_ours(hf_dir(cls_name, variant, num_labels=3), BUILDS[head_of(cls_name)])
    theirs = save_back(cfg, ours, cls_name, tmp_path / "ours")
    assert head_diff(ours, theirs, head_of(cls_name), inputs()) <= ATOL


# ---- config.json -------------------------------------------------------------------------------
def test_config_fields_and_names():
    cfg = ModelConfig.from_dict({**CONFIG, "rms_norm_eps": 1e-5, "rope_theta": 250000, "head_dim": None,
                                 "pad_token_id": 0, "architectures": ["EuroBertForMaskedLM"]})
    assert (cfg.layer_norm_eps, cfg.architectures) == (1e-5, ["BertForMaskedLM"])
    # EuroBertConfig's default
    assert ModelConfig.from_dict({"model_type": "eurobert"}).pad_token_id == 128001
    model = core.BertForPreTraining(cfg)
    attn = model.bert.encoder.layer[0].self_attn
    assert (attn.head_dim, attn.k_proj.out_features, attn.q_norm, attn.spec.rope.theta) == (8, 16, None,
                                                                                            250000.0)
    assert isinstance(model.cls.predictions.transform,
                      torch.nn.Identity) and model.cls.predictions.bias is None
    # untied by default
    assert model.cls.predictions.decoder.weight is not model.bert.embeddings.word_embeddings.weight
    seq = seq_head(ModelConfig.from_dict({**cfg.to_dict(), "id2label": {"0": "a", "1": "b"}}))
    assert seq.bert.pooler.pool == "late" and seq.classifier.bias is not None
    fam = family_for("eurobert")
    keys = set(fam.to_family(seq.state_dict())) | set(fam.to_family(model.state_dict()))
    assert {"dense.weight", "classifier.weight", "lm_head.weight", "model.embed_tokens.weight",
            "model.norm.weight",
            "model.layers.1.mlp.gate_proj.weight"} <= keys
    assert fam.architecture("BertForPreTraining", "eurobert") == "EuroBertForMaskedLM"


@pytest.mark.parametrize("change, words", [
    ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads"),
    ({"classifier_pooling": "max"}, "classifier_pooling"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}}, "rope type 'yarn'"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 0}}, "rope_theta"),
    ({"hidden_act": "swish7"}, "hidden_act"),
])
def test_configs_it_cannot_run_are_refused(change, words):
    with pytest.raises(ConfigError, match=words):
        ModelConfig.from_dict({**CONFIG, "pad_token_id": 0, **change})


# ---- ONNX --------------------------------------------------------------------------------------
def test_exported_graphs_fuse_and_match_transformers(hf_dir, tmp_path):
    """As `mlmkit export` exports them: the MLM logits and the "bos" classifier with its last layer
    computed for the first token alone, fused (the RMSNorms with the residual adds before them) and,
    on a batch of another size and length than the export's, transformers' outputs."""
    mlm_dir = hf_dir("EuroBertForMaskedLM")
    cfg, mlm, _ = load_ours(mlm_dir, core.BertForPreTraining)
    seq_dir = hf_dir(SEQ, num_labels=3, classifier_pooling="bos")
    _, seq, _ = load_ours(seq_dir, seq_head)
    x = inputs(T=23, lengths=(23, 9, 17, 2))
    dummy = inputs(T=11, lengths=(11, 6))
    # 3 layers: the residual adds with the norms after them (two a layer), the first layer's input
    # norm alone; the [CLS]-only last layer's norm of its query alone, and the pooler's GELU
    fused = {"mlm": {"SkipSimplifiedLayerNormalization": 6, "SimplifiedLayerNormalization": 1},
             "cls": {"SkipSimplifiedLayerNormalization": 6, "SimplifiedLayerNormalization": 2, "Gelu": 1}}
    graphs = head_graphs(mlm, seq)
    for name, (cls_name, d) in {"mlm": ("EuroBertForMaskedLM", mlm_dir), "cls": (SEQ, seq_dir)}.items():
        counts, diff = fused_graph_diff(tmp_path / name, graphs[name], cfg, dummy, x, cls_name, d)
        assert counts == fused[name], counts
        assert diff <= 1e-4, name


@pytest.mark.parametrize("head", ["ForMaskedLM", "ForSequenceClassification"])
def test_mlmkit_export_gives_transformers_predictions(hf_dir, tmp_path, head):
    """`mlmkit export` of a checkpoint with EuroBERT's kind of tokenizer: fill-mask's top token at each
    <|mask|> is transformers' argmax, and the classifier's logits are transformers' on the texts as the
    tokenizer frames them."""
    fast = FAMILY.fast()
    src = hf_dir("EuroBert" + head, num_labels=3, tokenizer=True)
    meta = export(src, tmp_path / "b")
    assert meta["fused_operators"].get("SkipSimplifiedLayerNormalization", 0) >= 6, meta["fused_operators"]
    ref_model = hf_model("EuroBert" + head, src)
    if head == "ForMaskedLM":
        texts = ["the film was <|mask|> and good", "john went to <|mask|>", "<|mask|> plot"]
        got = Pipeline.load(tmp_path / "b")(texts, top_k=1)
        x = encode(fast, texts)
        with torch.no_grad():
            logits = ref_model(**x).logits.numpy()
        want = [logits[r, p].argmax()
                for r, p in zip(*np.nonzero(x["input_ids"].numpy() == fast.mask_token_id))]
        assert [m["candidates"][0]["id"] for r in got for m in r["masks"]] == want and len(want) == 3
        # "[MASK]" is <|mask|>, spans in the text as given
        given = ["the film was [MASK] and [MASK] good", "[MASK] plot"]
        for r, text in zip(Pipeline.load(tmp_path / "b")(given, top_k=1), given):
            assert len(r["masks"]) == text.count("[MASK]") and all(text[m["start"]:m["end"]].strip()
                                                                   == "[MASK]" for m in r["masks"]), r
            assert "[MASK]" not in r["sequence"] and "<|mask|>" not in r["sequence"]
        return
    x = encode(fast, TEXTS)
    with torch.no_grad():
        np.testing.assert_allclose(bundle_output(tmp_path / "b", "logits", x), ref_model(**x).logits.numpy(),
                                   atol=1e-4)


def test_fine_tunes_a_classifier_from_a_masked_lm(hf_dir, tmp_path):
    """A EuroBertForMaskedLM (the released checkpoints' head) fine-tuned as a classifier: the late-pooled
    head learns, and the run is a EuroBertForSequenceClassification transformers loads."""
    fine_tunes_a_classifier(tmp_path, hf_dir("EuroBertForMaskedLM", tokenizer=True), FAMILY.fast())


def test_pretraining_makes_a_model_transformers_loads(tmp_path):
    """`mlmkit pretrain --arch eurobert` (the tiny preset): a EuroBertForMaskedLM transformers loads with
    no missing or unexpected weight and the same logits."""
    from rotary_families import pretrain_loads_in_transformers

    saved, diff = pretrain_loads_in_transformers(tmp_path, "eurobert", "EuroBert")
    assert saved["architectures"] == ["EuroBertForMaskedLM"] and saved["max_position_embeddings"] == 8192
    assert (saved["intermediate_size"], saved["mask_token_id"], saved["tie_word_embeddings"]) == (341, 4,
                                                                                                  False)
    assert diff <= 1e-4


def test_a_sentence_transformers_directory_embeds_as_sentence_transformers_does(hf_dir, tmp_path):
    """A EuroBertModel with mean pooling and normalisation in a sentence-transformers directory: the
    exported bundle's embeddings are sentence-transformers' own on mixed-length texts."""
    st, bundle = sentence_transformers_bundle(tmp_path, hf_dir("EuroBertModel", tokenizer=True), "mean")
    np.testing.assert_allclose(bundle_embeddings(bundle, TEXTS), st.encode(TEXTS), atol=1e-5)
