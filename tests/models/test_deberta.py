"""DeBERTa-v2 / v3 parity with transformers: tiny random models of transformers' classes load into
mlmkit's core and give the same hidden states, MLM / sequence / token / span logits, save back under
transformers' names, and export to ONNX.

Two layouts: "v3" (DeBERTa-v3's: relative attention with both terms through the shared projections,
log buckets, normed relative embeddings, no absolute positions, no token types) with 8 buckets over
16 relative positions on sequences of up to 36 tokens, so near, bucketed and clamped distances all
occur; "v2" (absolute positions and two token types as well, separate position projections, plain
clamped distances, a smaller embedding size projected to the hidden size). The weights are perturbed
well beyond their init so that every parameter matters.
"""

from __future__ import annotations

import json

import pytest
import torch
from family_parity import (
    ATOL,
    BUILDS,
    Backbone,
    Checkpoints,
    HFFamily,
    SpanModel,
    backbone_matches,
    eager_export_diff,
    head_diff,
    head_graphs,
    head_of,
    hf_model,
    load_back,
    load_ours,
    mlm_diffs,
    perturb,
    random_batch,
    real_diff,
    save_back,
    seq_head,
    token_head,
    write_ours,
)

from mlmkit.errors import ConfigError
from mlmkit.models import core, family_for
from mlmkit.models.config import ModelConfig
from mlmkit.models.deberta import DebertaLayer
from mlmkit.models.deberta_attention import RelativePositions, bucket
from mlmkit.models.presets import preset
from mlmkit.rundir.checkpoint import load_state_dict

transformers = pytest.importorskip("transformers")

V = 100
BASE = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2,
            max_position_embeddings=64, pad_token_id=0, relative_attention=True, pos_att_type=["p2c", "c2p"])
VARIANTS = {
    "v3": dict(position_biased_input=False, share_att_key=True, norm_rel_ebd="layer_norm", position_buckets=8,
               max_relative_positions=16, type_vocab_size=0),
    "v2": dict(num_hidden_layers=2, position_biased_input=True, type_vocab_size=2, share_att_key=False,
               embedding_size=16,
               max_relative_positions=12, hidden_act="gelu_new", pooler_hidden_act="tanh"),
}


FAMILY = HFFamily("DebertaV2Config", BASE, VARIANTS)  # (transformers' DeBERTa has eager attention only)
SEQ = "DebertaV2ForSequenceClassification"


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Checkpoints:
    return Checkpoints(FAMILY, tmp_path_factory.mktemp("deberta"))


def inputs(variant: str = "v3", T: int = 36, lengths: tuple[int, ...] = (36, 23, 9),
           seed: int = 1) -> dict[str, torch.Tensor]:
    """A right-padded batch: [CLS] first, padding id 0 with attention_mask 0 after each length; for
    a layout with token types, the second half of each row's real tokens is segment 1."""
    return random_batch(V, T, lengths, seed, first=2, types=bool(VARIANTS[variant].get("type_vocab_size")))


# ---- the relative positions --------------------------------------------------------------------
@pytest.mark.parametrize("buckets, M", [(8, 16), (9, 16), (256, 512), (-1, 12)])
def test_relative_rows_are_transformers_at_every_distance(buckets, M):
    """The tabled rows equal transformers' bucketing and clamping, for distances inside and far
    beyond the table (a 700-token sequence against DeBERTa-v3's 256 buckets over 512)."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

    cfg = ModelConfig.from_dict({"model_type": "deberta-v2", "vocab_size": V, "hidden_size": 32,
                                 "num_attention_heads": 2,
                                 "num_hidden_layers": 1, "intermediate_size": 48,
                                 "max_position_embeddings": 64,
                                 "relative_attention": True, "position_buckets": buckets,
                                 "max_relative_positions": M})
    S = buckets if buckets > 0 else M
    T = 700
    h = torch.zeros(1, T, 1)
    theirs = (build_relative_position(h, h, bucket_size=buckets, max_position=M)[0] + S).clamp(0, 2 * S - 1)
    ours = RelativePositions(cfg)(T, T, torch.device("cpu"))
    assert torch.equal(ours, theirs)
    if buckets > 0:  # the table's own bucketing is transformers' function on its range
        from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

        rel = torch.arange(-600, 601)
        assert torch.equal(bucket(rel, buckets, M), make_log_bucket_position(rel, buckets, M).long())


# ---- the backbone and the heads against transformers -------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_backbone_matches_transformers_eager_and_sdpa(hf_dir, variant):
    d = hf_dir("DebertaV2Model", variant)  # a bare backbone: keys without "deberta."
    cfg, ours, unexpected = load_ours(d, Backbone)
    assert unexpected == []
    assert all(isinstance(x, DebertaLayer) for x in ours.bert.encoder.layer)
    x = inputs(variant)
    mine, ref = backbone_matches(ours, d, "DebertaV2Model", x, theirs=("eager",))
    assert real_diff(mine["eager"], mine["sdpa"], x["attention_mask"]) <= ATOL
    with torch.no_grad():
        # and the comparison is sensitive to the relative positions and to the token types
        for change in ({"pos_att_type": ["c2p"]},
                       *([{"max_relative_positions": 10}] if variant == "v3" else [])):
            other = Backbone(ModelConfig.from_dict({**json.loads((d / "config.json").read_text()),
                                                    **change})).eval()
            other.load_state_dict(ours.state_dict(), strict=False)  # c2p alone: no pos_query_proj
            assert real_diff(other(**x), ref, x["attention_mask"]) > 1e-3, change
        if "token_type_ids" in x:
            assert real_diff(ours(x["input_ids"], x["attention_mask"]), ref, x["attention_mask"]) > 1e-3


@pytest.mark.parametrize("variant", VARIANTS)
def test_mlm_logits_match(hf_dir, variant):
    # legacy true, transformers' default: cls.predictions.*
    d = hf_dir("DebertaV2ForMaskedLM", variant)
    cfg, ours, unexpected = load_ours(d, core.BertForPreTraining)
    assert unexpected == []
    x = inputs(variant)
    with torch.no_grad():
        ref = hf_model("DebertaV2ForMaskedLM", d)(**x).logits
    assert max(mlm_diffs(ours, ref, x)) <= ATOL  # every token, and the head at the labelled positions only
    assert ref.abs().max() > 1.0


def test_mlm_head_of_legacy_false_and_original_checkpoints_is_read(tmp_path):
    """legacy false (and the original DeBERTa-v3 checkpoints) name the MLM head lm_predictions.lm_head.*;
    it is BERT's head and reads into it; the replaced-token-detection head of those checkpoints
    (mask_predictions.*) comes back as unexpected."""
    d = FAMILY.save(tmp_path / "hf", "DebertaV2ForMaskedLM", legacy=False)  # its own: the test rewrites it
    from safetensors.torch import load_file, save_file

    sd = load_file(d / "model.safetensors")
    assert any(k.startswith("lm_predictions.lm_head.") for k in sd) and not any(k.startswith("cls.")
                                                                                for k in sd)
    save_file({**sd, "mask_predictions.classifier.weight": torch.zeros(1, 32)}, d / "model.safetensors")
    cfg, ours, unexpected = load_ours(d, core.BertForPreTraining)
    assert unexpected == ["mask_predictions.classifier.weight"]
    x = inputs()
    with torch.no_grad():
        ref = transformers.DebertaV2ForMaskedLM.from_pretrained(d).eval()(**x).logits
        assert real_diff(ours(**x)["prediction_logits"], ref, x["attention_mask"]) <= ATOL


@pytest.mark.parametrize("variant", VARIANTS)
def test_sequence_classification_matches(hf_dir, variant):
    d = hf_dir(SEQ, variant, num_labels=3)
    cfg, ours, unexpected = load_ours(d, seq_head)
    assert unexpected == []
    x = inputs(variant)
    with torch.no_grad():
        got = ours(**x)["logits"]
        ref = hf_model(SEQ, d)(**x).logits
        assert (got - ref).abs().max().item() <= ATOL
        assert core.reads_cls_only(ours.bert)
        # the [CLS]-only last layer (relative positions of query 0 against every key) gives the same vector
        pooled = ours.bert(**x)[1]
        fast = core.encode_cls(ours.bert, x["input_ids"], x["attention_mask"], x.get("token_type_ids"))
        assert (fast - pooled).abs().max().item() <= ATOL
        assert (ours.classifier(fast) - ref).abs().max().item() <= ATOL


@pytest.mark.parametrize("variant", VARIANTS)
def test_token_classification_matches(hf_dir, variant):
    d = hf_dir("DebertaV2ForTokenClassification", variant, num_labels=5)
    cfg, ours, unexpected = load_ours(d, token_head)
    assert unexpected == []
    theirs = hf_model("DebertaV2ForTokenClassification", d)
    assert head_diff(ours, theirs, "ForTokenClassification", inputs(variant)) <= ATOL


@pytest.mark.parametrize("variant", VARIANTS)
def test_question_answering_matches(hf_dir, variant):
    d = hf_dir("DebertaV2ForQuestionAnswering", variant)
    cfg, ours, unexpected = load_ours(d, SpanModel)
    assert unexpected == []
    theirs = hf_model("DebertaV2ForQuestionAnswering", d)
    assert head_diff(ours, theirs, "ForQuestionAnswering", inputs(variant)) <= ATOL  # start and end logits


# ---- back to transformers ----------------------------------------------------------------------
@pytest.mark.parametrize("head", ["mlm", "seq", "qa"])
def test_saves_back_to_transformers(hf_dir, tmp_path, head):
    cls_name = {"mlm": "DebertaV2ForMaskedLM", "seq": SEQ, "qa": "DebertaV2ForQuestionAnswering"}[head]
    variant = "v2" if head == "seq" else "v3"
    cfg, ours, _ = load_ours(hf_dir(cls_name, variant), BUILDS[head_of(cls_name)])
    theirs = save_back(cfg, ours, cls_name, tmp_path / "ours")
    assert head_diff(ours, theirs, head_of(cls_name), inputs(variant)) <= ATOL


def test_preset_model_loads_in_transformers(tmp_path):
    cfg = preset("tiny", "deberta-v2", vocab_size=V)
    cfg.architectures = ["BertForPreTraining"]
    assert (cfg.hidden_size, cfg.pad_token_id, cfg.type_vocab_size, cfg.layer_norm_eps,
            cfg.max_position_embeddings) == (128, 0, 0, 1e-7, 512)
    torch.manual_seed(0)
    ours = core.BertForPreTraining(cfg)
    perturb(ours, 0)
    hc = transformers.AutoConfig.from_pretrained(write_ours(cfg, ours, tmp_path))
    assert hc.model_type == "deberta-v2" and hc.architectures == ["DebertaV2ForMaskedLM"]
    assert (hc.relative_attention, hc.position_biased_input, hc.share_att_key, hc.position_buckets,
            hc.norm_rel_ebd) == (
        True, False, True, 256, "layer_norm")
    assert hc.pos_att_type == ["p2c", "c2p"] and hc.type_vocab_size == 0 and hc.legacy is True
    theirs = load_back("DebertaV2ForMaskedLM", tmp_path)
    x = inputs(T=300, lengths=(300, 150, 20))  # distances beyond the 128 each side kept as they are
    with torch.no_grad():
        got, ref = ours.eval()(**x)["prediction_logits"], theirs(**x).logits
    assert real_diff(got, ref, x["attention_mask"]) <= 2 * ATOL


# ---- config.json -------------------------------------------------------------------------------
def test_config_fields_and_names(hf_dir):
    d = hf_dir("DebertaV2ForMaskedLM")
    c = json.loads((d / "config.json").read_text())
    cfg = ModelConfig.from_dict({**c, "pos_att_type": "p2c|c2p"})  # older configs' form: the same model
    assert (cfg.layer_norm_eps, cfg.type_vocab_size, cfg.architectures) == (1e-7, 0, ["BertForMaskedLM"])
    fam = family_for("deberta-v2")
    assert (not fam.uses_token_types(cfg)
            and fam.uses_token_types(ModelConfig.from_dict({**c, "type_vocab_size": 2})))
    model = core.BertForPreTraining(cfg)
    model.load_state_dict(load_state_dict(d, cfg), strict=False)
    x = inputs()
    with torch.no_grad():
        ref = hf_model("DebertaV2ForMaskedLM", d)(**x).logits
        assert real_diff(model.eval()(**x)["prediction_logits"], ref, x["attention_mask"]) <= ATOL
    out = cfg.to_dict()
    assert out["architectures"] == ["DebertaV2ForMaskedLM"] and "type_vocab_size" not in out
    # DebertaV2Config's default
    assert ModelConfig.from_dict({"model_type": "deberta-v2"}).layer_norm_eps == 1e-7
    emb = model.bert.embeddings
    assert (not hasattr(emb, "position_embeddings") and not hasattr(emb, "token_type_embeddings")
            and not hasattr(emb, "embed_proj"))
    assert model.bert.pooler is None and not model.nsp
    assert fam.architecture("BertForPreTraining", "deberta-v2") == "DebertaV2ForMaskedLM"


@pytest.mark.parametrize("change, words", [
    ({"conv_kernel_size": 3}, "convolution"),
    ({"pos_att_type": ["p2p", "c2p"]}, "pos_att_type 'p2p'"),
    ({"norm_rel_ebd": "batch_norm"}, "norm_rel_ebd"),
    ({"position_buckets": 2}, "position_buckets 2"),
    ({"position_buckets": 40, "max_relative_positions": 16}, "position_buckets 40"),
    ({"pooler_hidden_size": 16}, "pooler_hidden_size"),
    ({"attention_head_size": 8}, "attention_head_size"),
    ({"pooler_hidden_act": "swish7"}, "pooler_hidden_act"),
    ({"share_att_key": "yes"}, "share_att_key"),
])
def test_configs_it_cannot_run_are_refused(change, words):
    with pytest.raises(ConfigError, match=words):
        ModelConfig.from_dict({"model_type": "deberta-v2", "vocab_size": V, "hidden_size": 32,
                               "num_attention_heads": 2,
                               "num_hidden_layers": 2, "intermediate_size": 48, "relative_attention": True,
                               **change})


# ---- ONNX --------------------------------------------------------------------------------------
def test_eager_graphs_export_to_onnx(hf_dir, tmp_path):
    """The TorchScript exporter at opset 17 with dynamic batch and sequence axes: onnxruntime on a
    batch of another size and length than the export's gives PyTorch's outputs (the relative
    positions come from the runtime length). Two graphs: MLM logits and the [CLS]-only classifier."""
    pytest.importorskip("onnxruntime")
    _, mlm, _ = load_ours(hf_dir("DebertaV2ForMaskedLM"), core.BertForPreTraining)
    _, seq, _ = load_ours(hf_dir(SEQ, num_labels=3), seq_head)
    dummy, x = inputs(T=12, lengths=(12, 7)), inputs()
    for name, graph in head_graphs(mlm, seq).items():
        diff = eager_export_diff(graph, dummy, x, tmp_path / f"{name}.onnx", per_token=name == "mlm")
        assert diff <= 1e-4, name
