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

from pathlib import Path

import numpy as np
import pytest
import torch
from family_parity import Backbone, load_ours, mlm_diffs, real_diff
from prenorm_parity import (
    TEXTS,
    Graph,
    bundle_embeddings,
    cli_export,
    encode,
    eurobert_tokenizer,
    fine_tunes_a_classifier,
    fused_graph,
    hf_model,
    random_batch,
    run,
    save_hf,
    sentence_transformers_bundle,
    transformers,
)

from mlmkit.errors import ConfigError
from mlmkit.models import core, family_for
from mlmkit.models.config import ModelConfig
from mlmkit.rundir.checkpoint import save_weights
from mlmkit.rundir.config import save_config
from mlmkit.runtime.pipeline import Pipeline

V = 100
ATOL = 1e-5
BASE = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2,
            pad_token_id=0, bos_token_id=2, eos_token_id=0, mask_token_id=3, max_position_embeddings=64,
            rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
VARIANTS = {
    "plain": {},  # EuroBertConfig's defaults: no biases, an untied decoder, late pooling
    "biased": dict(attention_bias=True, mlp_bias=True, head_dim=16, tie_word_embeddings=True,
                   rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0}),
}
SEQ = "EuroBertForSequenceClassification"


def hf_dir(tmp_path: Path, cls_name: str, variant: str = "plain", name: str = "hf", tokenizer=None,
           **kw) -> Path:
    d = tmp_path / name
    save_hf(d, cls_name, transformers.EuroBertConfig(**{**BASE, **VARIANTS[variant], **kw}),
            tokenizer=tokenizer)
    return d


def inputs(T: int = 20, lengths: tuple[int, ...] = (20, 13, 5), seed: int = 1) -> dict[str, torch.Tensor]:
    x = random_batch(V, T, lengths, seed)
    x["input_ids"][:, 0] = 2  # <|begin_of_text|>, the token "bos" pooling reads
    return x


def seq_head(c: ModelConfig) -> core.BertForLabels:
    return core.BertForLabels(c, per_token=False)


# ---- the backbone and the heads against transformers -------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_backbone_matches_transformers_eager_and_sdpa(tmp_path, variant):
    d = hf_dir(tmp_path, "EuroBertModel", variant)  # a bare backbone: keys without "model."
    cfg, ours, unexpected = load_ours(d, Backbone)
    assert unexpected == [] and all(layer.self_attn.spec.span is None for layer in ours.bert.encoder.layer)
    x = inputs()
    with torch.no_grad():
        mine = {}
        for impl in ("eager", "sdpa"):
            core.set_attention_impl(ours, impl)
            mine[impl] = ours(**x)
        for impl in ("eager", "sdpa"):
            ref = hf_model("EuroBertModel", d, impl)(**x).last_hidden_state
            for ours_impl, h in mine.items():
                assert real_diff(h, ref, x["attention_mask"]) <= ATOL, (impl, ours_impl)
    assert ref.abs().max() > 1.0


@pytest.mark.parametrize("variant", VARIANTS)
def test_mlm_logits_match(tmp_path, variant):
    d = hf_dir(tmp_path, "EuroBertForMaskedLM", variant)
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
def test_sequence_classification_matches(tmp_path, variant, pooling):
    d = hf_dir(tmp_path, SEQ, variant, classifier_pooling=pooling, num_labels=3)
    cfg, ours, unexpected = load_ours(d, seq_head)
    assert unexpected == []
    x = inputs()
    with torch.no_grad():
        ref = hf_model(SEQ, d)(**x).logits
        for impl in ("eager", "sdpa"):
            core.set_attention_impl(ours, impl)
            assert (ours(**x)["logits"] - ref).abs().max().item() <= ATOL, impl
        assert core.reads_cls_only(ours.bert) == (pooling == "bos")
        if pooling == "bos":  # the last layer computed for the first token alone gives the same vector
            fast = core.encode_cls(ours.bert, x["input_ids"], x["attention_mask"])
            assert (ours.classifier(fast) - ref).abs().max().item() <= ATOL


@pytest.mark.parametrize("variant", VARIANTS)
def test_token_classification_matches(tmp_path, variant):
    d = hf_dir(tmp_path, "EuroBertForTokenClassification", variant, num_labels=5)
    cfg, ours, unexpected = load_ours(d, lambda c: core.BertForLabels(c, per_token=True))
    assert unexpected == []
    x = inputs()
    with torch.no_grad():
        ref = hf_model("EuroBertForTokenClassification", d)(**x).logits
        for impl in ("eager", "sdpa"):
            core.set_attention_impl(ours, impl)
            assert real_diff(ours(**x)["logits"], ref, x["attention_mask"]) <= ATOL, impl


# ---- back to transformers ----------------------------------------------------------------------
@pytest.mark.parametrize("head, variant", [("mlm", "plain"), ("mlm", "biased"), ("seq", "plain")])
def test_saves_back_to_transformers(tmp_path, head, variant):
    """An untied decoder (EuroBertConfig's default) is stored as lm_head.weight, a tied one is not:
    transformers loads either with nothing missing or unexpected."""
    cls_name, build = ("EuroBertForMaskedLM", core.BertForPreTraining) if head == "mlm" else (SEQ, seq_head)
    cfg, ours, _ = load_ours(hf_dir(tmp_path, cls_name, variant, num_labels=3), build)
    out = tmp_path / "ours"
    out.mkdir()
    save_weights(ours, out / "model.safetensors", cfg)
    save_config(cfg, out / "config.json")
    theirs, info = getattr(transformers, cls_name).from_pretrained(out, attn_implementation="eager",
                                                                   output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    x = inputs()
    with torch.no_grad():
        got, ref = ours(**x), theirs.eval()(**x)
    if head == "mlm":
        assert real_diff(got["prediction_logits"], ref.logits, x["attention_mask"]) <= ATOL
    else:
        assert (got["logits"] - ref.logits).abs().max().item() <= ATOL


# ---- config.json -------------------------------------------------------------------------------
def test_config_fields_and_names():
    cfg = ModelConfig.from_dict({"model_type": "eurobert", "vocab_size": V, "hidden_size": 32,
                                 "num_attention_heads": 4,
                                 "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 48,
                                 "rms_norm_eps": 1e-5,
                                 "rope_theta": 250000, "head_dim": None, "pad_token_id": 0,
                                 "architectures": ["EuroBertForMaskedLM"]})
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
        ModelConfig.from_dict({"model_type": "eurobert", "vocab_size": V, "hidden_size": 32,
                               "num_attention_heads": 4,
                               "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 48,
                               "pad_token_id": 0, **change})


# ---- ONNX --------------------------------------------------------------------------------------
def test_exported_graphs_fuse_and_match_transformers(tmp_path):
    """As `mlmkit export` exports them: the MLM logits and the "bos" classifier with its last layer
    computed for the first token alone, fused (the RMSNorms with the residual adds before them) and,
    on a batch of another size and length than the export's, transformers' outputs."""
    mlm_dir = hf_dir(tmp_path, "EuroBertForMaskedLM", name="mlm")
    cfg, mlm, _ = load_ours(mlm_dir, core.BertForPreTraining)
    seq_dir = hf_dir(tmp_path, SEQ, name="seq", num_labels=3, classifier_pooling="bos")
    _, seq, _ = load_ours(seq_dir, seq_head)
    x = inputs(T=23, lengths=(23, 9, 17, 2))
    dummy = inputs(T=11, lengths=(11, 6))
    # 3 layers: the residual adds with the norms after them (two a layer), the first layer's input
    # norm alone; the [CLS]-only last layer's norm of its query alone, and the pooler's GELU
    fused = {"mlm": {"SkipSimplifiedLayerNormalization": 6, "SimplifiedLayerNormalization": 1},
             "cls": {"SkipSimplifiedLayerNormalization": 6, "SimplifiedLayerNormalization": 2, "Gelu": 1}}
    graphs = {"mlm": (Graph(mlm, lambda m, i, a: m(i, a)["prediction_logits"]), "EuroBertForMaskedLM",
                      mlm_dir),
              "cls": (Graph(seq, lambda m, i, a: m.classifier(core.encode_cls(m.bert, i, a))), SEQ, seq_dir)}
    for name, (graph, cls_name, d) in graphs.items():
        (tmp_path / "onnx" / name).mkdir(parents=True)
        session, counts = fused_graph(tmp_path / "onnx" / name, graph, cfg, dummy, per_token=name == "mlm")
        assert counts == fused[name], counts
        with torch.no_grad():
            ref = hf_model(cls_name, d)(**x).logits.numpy()
        diff = run(session, x) - ref
        assert abs(diff if name == "cls" else diff[x["attention_mask"].bool().numpy()]).max() <= 1e-4, name


@pytest.mark.parametrize("head", ["ForMaskedLM", "ForSequenceClassification"])
def test_mlmkit_export_gives_transformers_predictions(tmp_path, head):
    """`mlmkit export` of a checkpoint with EuroBERT's kind of tokenizer: fill-mask's top token at each
    <|mask|> is transformers' argmax, and the classifier's logits are transformers' on the texts as the
    tokenizer frames them."""
    fast = eurobert_tokenizer()
    src = hf_dir(tmp_path, "EuroBert" + head, vocab_size=len(fast), pad_token_id=fast.pad_token_id,
                 bos_token_id=fast.bos_token_id,
                 eos_token_id=fast.eos_token_id, mask_token_id=fast.mask_token_id, num_labels=3,
                 tokenizer=fast, name="src")
    meta = cli_export(src, tmp_path / "b")
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
    import onnxruntime as ort

    x = encode(fast, TEXTS)
    sess = ort.InferenceSession(str(tmp_path / "b" / "model.onnx"), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        np.testing.assert_allclose(sess.run(["logits"], {k: v.numpy() for k, v in x.items()})[0],
                                   ref_model(**x).logits.numpy(),
                                   atol=1e-4)


def test_fine_tunes_a_classifier_from_a_masked_lm(tmp_path):
    """A EuroBertForMaskedLM (the released checkpoints' head) fine-tuned as a classifier: the late-pooled
    head learns, and the run is a EuroBertForSequenceClassification transformers loads."""
    fast = eurobert_tokenizer()
    base = hf_dir(tmp_path, "EuroBertForMaskedLM", vocab_size=len(fast), pad_token_id=fast.pad_token_id,
                  bos_token_id=fast.bos_token_id,
                  eos_token_id=fast.eos_token_id, mask_token_id=fast.mask_token_id, tokenizer=fast,
                  name="base")
    fine_tunes_a_classifier(tmp_path, base, fast)


def test_pretraining_makes_a_model_transformers_loads(tmp_path):
    """`mlmkit pretrain --arch eurobert` (the tiny preset): a EuroBertForMaskedLM transformers loads with
    no missing or unexpected weight and the same logits."""
    from rotary_families import pretrain_loads_in_transformers

    saved, diff = pretrain_loads_in_transformers(tmp_path, "eurobert", "EuroBert")
    assert saved["architectures"] == ["EuroBertForMaskedLM"] and saved["max_position_embeddings"] == 8192
    assert (saved["intermediate_size"], saved["mask_token_id"], saved["tie_word_embeddings"]) == (341, 4,
                                                                                                  False)
    assert diff <= 1e-4


def test_a_sentence_transformers_directory_embeds_as_sentence_transformers_does(tmp_path):
    """A EuroBertModel with mean pooling and normalisation in a sentence-transformers directory: the
    exported bundle's embeddings are sentence-transformers' own on mixed-length texts."""
    fast = eurobert_tokenizer()
    hf = hf_dir(tmp_path, "EuroBertModel", vocab_size=len(fast), pad_token_id=fast.pad_token_id,
                bos_token_id=fast.bos_token_id,
                eos_token_id=fast.eos_token_id, mask_token_id=fast.mask_token_id, tokenizer=fast)
    st, bundle = sentence_transformers_bundle(tmp_path, hf, "mean")
    np.testing.assert_allclose(bundle_embeddings(bundle, TEXTS), st.encode(TEXTS), atol=1e-5)
