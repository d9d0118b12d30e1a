"""ModernBERT parity with transformers: tiny random models of transformers' classes load into mlmkit's
core and give the same hidden states, MLM / sequence / token / span logits, save back under
transformers' names, and export to ONNX.

The models have global and local layers and a window of 8 (4 positions each side) on sequences of
up to 36 tokens, so the window, both rotary bases and the [CLS] row of a local last layer all count;
the weights are perturbed well beyond their init so that every parameter matters.
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
    export_logits,
    head_diff,
    head_graphs,
    head_of,
    hf_model,
    load_back,
    load_ours,
    mlm_diffs,
    onnx_diff,
    ort_run,
    ort_session,
    perturb,
    random_batch,
    real_diff,
    save_back,
    seq_head,
    token_head,
    write_ours,
)
from torch import nn

from mlmkit.errors import ConfigError
from mlmkit.models import core, family_for, modernbert
from mlmkit.models.config import ModelConfig
from mlmkit.models.modernbert import GLOBAL, LOCAL, ModernBertLayer
from mlmkit.models.modernbert_attention import Window, local_attend, local_blocks, window_mask, window_plan
from mlmkit.models.presets import preset

transformers = pytest.importorskip("transformers")

V = 100
BASE = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=2,
            local_attention=8, global_attn_every_n_layers=2, global_rope_theta=1000.0, local_rope_theta=100.0,
            pad_token_id=0, bos_token_id=2, cls_token_id=2, eos_token_id=3, sep_token_id=3,
            max_position_embeddings=64)
VARIANTS = {
    # layers global, local, global, local; ModernBERT's defaults: no biases anywhere, GELU
    "plain": {},
    # every bias there is, other activations, and a layer pattern global_attn_every_n_layers cannot
    # state (transformers writes both keys; layer_types wins)
    "biased": dict(attention_bias=True, mlp_bias=True, norm_bias=True, classifier_bias=True,
                   classifier_activation="silu",
                   hidden_activation="gelu_pytorch_tanh", layer_types=[LOCAL, GLOBAL, LOCAL, LOCAL]),
}


FAMILY = HFFamily("ModernBertConfig", BASE, VARIANTS)
SEQ = "ModernBertForSequenceClassification"


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Checkpoints:
    return Checkpoints(FAMILY, tmp_path_factory.mktemp("modernbert"))


def inputs(T: int = 36, lengths: tuple[int, ...] = (36, 23, 9), seed: int = 1) -> dict[str, torch.Tensor]:
    """A right-padded batch: [CLS] first, padding id 0 with attention_mask 0 after each length."""
    return random_batch(V, T, lengths, seed, first=2)


# ---- the backbone and the heads against transformers -------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_backbone_matches_transformers_eager_and_sdpa(hf_dir, variant):
    d = hf_dir("ModernBertModel", variant)  # a bare backbone: keys without "model."
    cfg, ours, unexpected = load_ours(d, Backbone)
    assert unexpected == []
    x = inputs()
    mine, _ = backbone_matches(ours, d, "ModernBertModel", x)
    assert real_diff(mine["eager"], mine["sdpa"], x["attention_mask"]) <= ATOL


@pytest.mark.parametrize("variant", [*VARIANTS, "no_decoder_bias"])
def test_mlm_logits_match(hf_dir, variant):
    kw = dict(decoder_bias=False) if variant == "no_decoder_bias" else {}
    d = hf_dir("ModernBertForMaskedLM", "plain" if kw else variant, **kw)
    cfg, ours, unexpected = load_ours(d, core.BertForPreTraining)
    # without a decoder bias the head could also be a bare per-token encoder's (bert.pooler): both given
    assert sorted(unexpected) == ([] if not kw else ["bert.pooler.dense.weight", "bert.pooler.norm.weight"])
    x = inputs()
    with torch.no_grad():
        ref = hf_model("ModernBertForMaskedLM", d)(**x).logits
    assert max(mlm_diffs(ours, ref, x)) <= ATOL  # every token, and the head at the labelled positions only
    assert ref.abs().max() > 1.0


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_sequence_classification_matches(hf_dir, variant, pooling):
    d = hf_dir(SEQ, variant, classifier_pooling=pooling, num_labels=3)
    cfg, ours, unexpected = load_ours(d, seq_head)
    assert unexpected == []
    x = inputs()
    with torch.no_grad():
        got = ours(**x)["logits"]
        ref = hf_model(SEQ, d)(**x).logits
        assert (got - ref).abs().max().item() <= ATOL
        assert core.reads_cls_only(ours.bert) == (pooling == "cls")
        if pooling == "cls":  # the [CLS]-only last layer (a local one in "plain") gives the same vector
            pooled = ours.bert(**x)[1]
            fast = core.encode_cls(ours.bert, x["input_ids"], x["attention_mask"])
            assert (fast - pooled).abs().max().item() <= ATOL
            assert (ours.classifier(fast) - ref).abs().max().item() <= ATOL


@pytest.mark.parametrize("variant", VARIANTS)
def test_token_classification_matches(hf_dir, variant):
    d = hf_dir("ModernBertForTokenClassification", variant, num_labels=5)
    cfg, ours, unexpected = load_ours(d, token_head)
    assert unexpected == []
    theirs = hf_model("ModernBertForTokenClassification", d)
    assert head_diff(ours, theirs, "ForTokenClassification", inputs()) <= ATOL


@pytest.mark.parametrize("variant", VARIANTS)
def test_question_answering_matches(hf_dir, variant):
    d = hf_dir("ModernBertForQuestionAnswering", variant)
    cfg, ours, unexpected = load_ours(d, SpanModel)
    # transformers names the span output layer "classifier", as the token head's: given as both
    assert sorted(unexpected) == ["classifier.bias", "classifier.weight"]
    theirs = hf_model("ModernBertForQuestionAnswering", d)
    assert head_diff(ours, theirs, "ForQuestionAnswering", inputs()) <= ATOL  # the start and end logits


# ---- back to transformers ----------------------------------------------------------------------
@pytest.mark.parametrize("head", ["mlm", "qa"])
def test_saves_back_to_transformers(hf_dir, tmp_path, head):
    cls_name = {"mlm": "ModernBertForMaskedLM", "qa": "ModernBertForQuestionAnswering"}[head]
    cfg, ours, _ = load_ours(hf_dir(cls_name, "biased"), BUILDS[head_of(cls_name)])
    theirs = save_back(cfg, ours, cls_name, tmp_path / "ours")
    assert head_diff(ours, theirs, head_of(cls_name), inputs()) <= ATOL


def test_preset_model_loads_in_transformers(tmp_path):
    assert preset("tiny", "modernbert", vocab_size=V).max_position_embeddings == 8192
    cfg = preset("tiny", "modernbert", vocab_size=V, max_position_embeddings=256)
    cfg.architectures = ["BertForPreTraining"]
    assert (cfg.intermediate_size, cfg.pad_token_id, cfg.type_vocab_size, cfg.layer_norm_eps) == (192, 0, 0,
                                                                                                  1e-5)
    torch.manual_seed(0)
    ours = core.BertForPreTraining(cfg)
    perturb(ours, 0)
    hc = transformers.AutoConfig.from_pretrained(write_ours(cfg, ours, tmp_path))
    assert hc.model_type == "modernbert" and hc.architectures == ["ModernBertForMaskedLM"]
    assert hc.layer_types == [GLOBAL,
                              LOCAL] and hc.local_attention == 128 and hc.max_position_embeddings == 256
    assert (hc.rope_parameters[GLOBAL]["rope_theta"] == 160_000.0 and hc.rope_parameters[LOCAL]["rope_theta"]
            == 10_000.0)
    assert (hc.norm_bias, hc.attention_bias, hc.mlp_bias, hc.decoder_bias,
            hc.hidden_activation) == (False, False, False, True, "gelu")
    theirs = load_back("ModernBertForMaskedLM", tmp_path)
    x = inputs(T=150, lengths=(150, 97, 20))  # beyond the 64 positions each side of the window
    with torch.no_grad():
        got, ref = ours.eval()(**x)["prediction_logits"], theirs(**x).logits
    assert real_diff(got, ref, x["attention_mask"]) <= ATOL


# ---- config.json -------------------------------------------------------------------------------
def test_older_config_keys_read_the_same(hf_dir, tmp_path):
    """Configs written before transformers 5 state the pattern and bases as global_attn_every_n_layers,
    global_rope_theta and local_rope_theta, without layer_types or rope_parameters."""
    d = hf_dir("ModernBertForMaskedLM")
    old = tmp_path / "old"
    old.mkdir()
    (old / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes())
    c = json.loads((d / "config.json").read_text())
    del c["layer_types"], c["rope_parameters"]
    c.update(global_rope_theta=BASE["global_rope_theta"], local_rope_theta=BASE["local_rope_theta"])
    (old / "config.json").write_text(json.dumps(c))
    cfg, ours, _ = load_ours(old, core.BertForPreTraining)
    x = inputs()
    with torch.no_grad():
        assert real_diff(ours(**x)["prediction_logits"], hf_model("ModernBertForMaskedLM", d)(**x).logits,
                         x["attention_mask"]) <= ATOL
        # and the comparison is sensitive to the window and to the bases
        base = ours(**x)["prediction_logits"]
        for change in ({"local_attention": 10}, {"local_rope_theta": 10_000.0},
                       {"global_rope_theta": 160_000.0}):
            other = core.BertForPreTraining(ModelConfig.from_dict({**c, **change}))
            other.load_state_dict(ours.state_dict())
            assert real_diff(other.eval()(**x)["prediction_logits"], base, x["attention_mask"]) > 1e-3, change


def test_config_fields_and_names():
    cfg = ModelConfig.from_dict({"model_type": "modernbert", "vocab_size": V, "hidden_size": 32,
                                 "num_attention_heads": 2,
                                 "num_hidden_layers": 3, "intermediate_size": 48,
                                 "hidden_activation": "gelu_new", "pad_token_id": 0,
                                 "norm_eps": 1e-6, "embedding_dropout": 0.1, "attention_dropout": 0.2,
                                 "mlp_dropout": 0.3,
                                 "architectures": ["ModernBertForQuestionAnswering"]})
    assert (cfg.hidden_act, cfg.layer_norm_eps, cfg.hidden_dropout_prob,
            cfg.attention_probs_dropout_prob) == ("gelu_new", 1e-6, 0.1, 0.2)
    assert (cfg.type_vocab_size, cfg.max_position_embeddings,
            cfg.architectures) == (0, 8192, ["BertForQuestionAnswering"])
    # ModernBertConfig's default
    assert ModelConfig.from_dict({"model_type": "modernbert"}).pad_token_id == 50283
    d = cfg.to_dict()
    assert {"hidden_activation", "norm_eps", "embedding_dropout", "attention_dropout"} <= set(d)
    assert not {"hidden_act", "layer_norm_eps", "hidden_dropout_prob", "type_vocab_size"} & set(d)
    assert d["architectures"] == ["ModernBertForQuestionAnswering"] and d["norm_bias"] is False
    model = core.BertForPreTraining(cfg)
    layers = model.bert.encoder.layer
    assert all(isinstance(x, ModernBertLayer) for x in layers) and isinstance(layers[0].attn_norm,
                                                                              nn.Identity)
    # local_attention 128, every third layer global
    assert [x.attn.half_window for x in layers] == [None, 64, 64]
    assert (model.bert.embeddings.dropout.p, layers[1].attn.dropout_p, layers[1].attn.out_drop.p,
            layers[1].mlp.drop.p) == (0.1, 0.2, 0.2, 0.3)
    fam = family_for("modernbert")
    assert fam.architecture("BertForPreTraining", "modernbert") == "ModernBertForMaskedLM"
    assert not hasattr(model.bert.embeddings, "position_embeddings") and not hasattr(model.bert.embeddings,
                                                                                     "token_type_embeddings")


@pytest.mark.parametrize("change, words", [
    ({"rope_parameters": {GLOBAL: {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}}},
     "rope type 'yarn'"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope type 'linear'"),
    ({"layer_types": [GLOBAL, LOCAL]}, "layer_types"),
    ({"layer_types": [GLOBAL, "chunked_attention", LOCAL]}, "layer_types"),
    ({"classifier_pooling": "max"}, "classifier_pooling"),
    ({"classifier_activation": "swish7"}, "classifier_activation"),
    ({"local_attention": 0}, "local_attention"),
])
def test_configs_it_cannot_run_are_refused(change, words):
    with pytest.raises(ConfigError, match=words):
        ModelConfig.from_dict({"model_type": "modernbert", "vocab_size": V, "hidden_size": 32,
                               "num_attention_heads": 2,
                               "num_hidden_layers": 3, "intermediate_size": 48, **change})


# ---- ONNX --------------------------------------------------------------------------------------
def test_eager_graphs_export_to_onnx(hf_dir, tmp_path):
    """The TorchScript exporter at opset 17 with dynamic batch and sequence axes: onnxruntime on a
    batch of another size and length than the export's gives PyTorch's outputs (the window and the
    rotary angles come from the runtime length). Two graphs: MLM logits and the [CLS]-only classifier."""
    pytest.importorskip("onnxruntime")
    _, mlm, _ = load_ours(hf_dir("ModernBertForMaskedLM"), core.BertForPreTraining)
    _, seq, _ = load_ours(hf_dir(SEQ, num_labels=3), seq_head)
    dummy, x = inputs(T=12, lengths=(12, 7)), inputs()
    for name, graph in head_graphs(mlm, seq).items():
        diff = eager_export_diff(graph, dummy, x, tmp_path / f"{name}.onnx", per_token=name == "mlm")
        assert diff <= 1e-4, name


# ---- the sliding window in blocks --------------------------------------------------------------
def full_mask_attend(m, q, k, v, mask, half, Tq, T):
    """The local layers' attention as the whole Tq x T product with the band mask added: the form
    the blocked one replaces (O(T^2)), kept as the reference."""
    return core.attend(m, q, k, v, mask + window_mask(T, Tq, half, q.device, mask.dtype))


def full_mask_plan(mask, half, Tq, T):
    """window_plan's plain form at every length (the model's local layers as they were)."""
    return Window(mask + window_mask(T, Tq, half, mask.device, mask.dtype))


class _Attn(nn.Module):
    """What ``local_attend`` reads of an attention block."""

    def __init__(self, impl: str) -> None:
        super().__init__()
        self.impl, self.dropout_p, self.dropout = impl, 0.0, nn.Dropout(0.0)


LENGTHS = (1, 2, 3, 4, 5, 7, 8, 11, 12, 13, 16, 23, 24, 25, 36, 63, 64, 65, 100, 128, 129, 191, 192, 193, 200,
           256, 257, 300, 513)


@pytest.mark.parametrize("half", [1, 4, 5, 64])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_blocked_window_equals_the_full_mask(half, impl):
    """At lengths that are and are not multiples of the block (``half``), shorter than one block
    and longer than several windows, all queries or the first few (the queries path), with padding:
    the same rows as the full product at every real query."""
    m = _Attn(impl).eval()
    g = torch.Generator().manual_seed(half)
    B, nh, hd = 3, 2, 8
    for T in LENGTHS:
        lengths = torch.tensor([T, max(1, T // 2), max(1, T - 5)])
        # as core.extended_mask
        mask = ((torch.arange(T)[None] >= lengths[:, None]).float() * -10000.0)[:, None, None, :]
        for Tq in sorted({T, 1, min(T, 3), min(T, 70)}):
            q, k, v = (torch.randn(B, nh, n, hd, generator=g) for n in (Tq, T, T))
            ref = full_mask_attend(m, q, k, v, mask, half, Tq, T)
            real = torch.arange(Tq)[None] < lengths[:, None]  # (B, Tq)
            # Python sizes (eager: the plain form up to 3 half) and 0-d tensors (the traced graph's blocks)
            for sizes in ((Tq, T), (torch.tensor(Tq), torch.tensor(T))):
                got = local_attend(m, q, k, v, window_plan(mask, half, *sizes))
                assert got.shape == ref.shape
                assert (got - ref).transpose(1, 2)[real].abs().max().item() <= ATOL, (T, Tq, sizes)


def test_blocks_cost_tq_times_window():
    """The work is Tq x W with W = 3 half keys a block of half queries, and a short input is one block
    of the whole sequence (what the plain form computes)."""
    def work(Tq, T, half=64):
        qidx, kidx, oidx, band = local_blocks(Tq, T, half, torch.device("cpu"), torch.float32)
        traced = local_blocks(torch.tensor(Tq), torch.tensor(T), half, torch.device("cpu"), torch.float32)
        assert all(torch.equal(a, b) for a, b in zip((qidx, kidx, oidx, band), traced))
        assert oidx.shape == (Tq,) and band.shape == (*qidx.shape, kidx.size(1))
        assert 0 <= int(qidx.min()) and int(qidx.max()) < Tq and 0 <= int(kidx.min()) and int(kidx.max()) < T
        return tuple(qidx.shape), kidx.size(1)

    assert work(32, 32) == ((1, 32), 32)
    assert work(192, 192) == ((1, 192), 192)
    assert work(193, 193) == ((4, 64), 192)
    assert work(8192, 8192) == ((128, 64), 192)
    assert work(1, 8192) == ((1, 1), 129)  # encode_cls's [CLS] row: its 129 keys
    assert work(1, 20) == ((1, 1), 20)


@pytest.mark.parametrize("T, lengths",
                         [(5, (5, 3)), (13, (13, 9, 4)), (129, (129, 70, 5)), (300, (300, 257, 31))])
def test_long_inputs_match_transformers(hf_dir, T, lengths):
    """Beyond several windows (4 positions each side; a MiniLM-ish window of 64 each side at 300):
    hidden states and the [CLS]-only classifier as transformers computes them, with either impl."""
    kw = dict(local_attention=128) if T == 300 else {}
    d = hf_dir(SEQ, max_position_embeddings=512, num_labels=3, **kw)
    _, ours, _ = load_ours(d, seq_head)
    ref_model = hf_model(SEQ, d)
    x = inputs(T=T, lengths=lengths)
    with torch.no_grad():
        ref, ref_hidden = ref_model(**x), ref_model.model(**x).last_hidden_state
        for impl in ("eager", "sdpa"):
            core.set_attention_impl(ours, impl)
            hidden = ours.bert(**x)[0]
            assert real_diff(hidden, ref_hidden, x["attention_mask"]) <= ATOL, impl
            assert (ours(**x)["logits"] - ref.logits).abs().max().item() <= ATOL, impl
            assert (ours.classifier(core.encode_cls(ours.bert, x["input_ids"], x["attention_mask"]))
                    - ref.logits).abs().max().item() <= ATOL


def test_blocked_graph_exports_for_every_length(hf_dir, tmp_path, monkeypatch):
    """The TorchScript export of the blocked window: no size of the export's dummy (19 tokens) frozen
    in the graph, and onnxruntime exact, against the full-mask form in PyTorch, at lengths shorter
    than a block, multiples of it and not, and past several windows (4 positions each side)."""
    pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from onnx import numpy_helper

    _, mlm, _ = load_ours(hf_dir("ModernBertForMaskedLM", max_position_embeddings=512),
                          core.BertForPreTraining)
    _, seq, _ = load_ours(hf_dir(SEQ, num_labels=3, max_position_embeddings=512), seq_head)
    dummy = inputs(T=19, lengths=(19, 7))
    for name, graph in head_graphs(mlm, seq).items():
        core.set_attention_impl(graph, "eager")
        path = tmp_path / f"{name}.onnx"
        export_logits(graph, dummy, path, per_token=name == "mlm")
        ints = [numpy_helper.to_array(a.t).ravel().tolist() for n in onnx.load(str(path)).graph.node
                if n.op_type == "Constant"
                for a in n.attribute if a.name == "value" and a.t.data_type == onnx.TensorProto.INT64]
        assert not [c for c in ints if 19 in c or 18 in c], name  # the dummy's length, its last position
        sess = ort_session(path)
        for T, lengths in ((5, (5, 2, 4)), (12, (12, 3, 8)), (64, (64, 30, 60)), (129, (129, 64, 100)),
                           (300, (300, 17, 299))):
            x = inputs(T=T, lengths=lengths, seed=T)
            got = ort_run(sess, x)
            with monkeypatch.context() as mp, torch.no_grad():
                mp.setattr(modernbert, "window_plan", full_mask_plan)
                ref = graph(**x).numpy()
            assert onnx_diff(got, ref, x, per_token=name == "mlm") <= 1e-4, (name, T)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_blocked_window_gradients_equal_the_full_mask(impl):
    """Training through the blocks (their index copies scatter back in the backward pass)."""
    m = _Attn(impl)
    g = torch.Generator().manual_seed(0)
    T = 300
    q, k, v = (torch.randn(2, 2, T, 8, generator=g).requires_grad_() for _ in range(3))
    mask = torch.zeros(2, 1, 1, T)
    mask[1, ..., 250:] = -10000.0
    w = torch.randn(2, 2, T, 8, generator=g)
    w[1, :, 250:] = 0  # the padding queries' rows are read by nothing
    got = torch.autograd.grad((local_attend(m, q, k, v, window_plan(mask, 64, T, T)) * w).sum(), (q, k, v))
    ref = torch.autograd.grad((full_mask_attend(m, q, k, v, mask, 64, T, T) * w).sum(), (q, k, v))
    for a, b in zip(got, ref):
        assert (a - b).abs().max().item() <= ATOL
