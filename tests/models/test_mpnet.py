"""MPNet parity with transformers: tiny random models of transformers' classes (MPNetModel and its
heads) load into mlmkit's core and give the same hidden states, pooled vector, MLM / sequence / token /
span logits, save back under transformers' names, and export to ONNX, by hand and through `mlmkit
export` with an MPNet tokenizer (whose special tokens only its tokenizer_config.json tells apart from
the bracket tokens its vocabulary also holds).

Sequences of up to 150 tokens: keys up to 149 positions away, so the exact, the log-scaled and the
clamped buckets of the relative position bias all occur, on both sides of the query. The weights are
perturbed well beyond their init so that every parameter matters.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from family_checkpoints import (
    bundle_embeddings,
    encode_batch,
    export,
    hf_out,
    save_checkpoint,
    sentence_transformers_bundle,
)
from family_parity import (
    ATOL,
    BUILDS,
    Checkpoints,
    HFFamily,
    export_eager,
    head_diff,
    head_graphs,
    head_of,
    hf_model,
    load_ours,
    mlm_diffs,
    onnx_diff,
    ort_run,
    ort_session,
    random_batch,
    real_diff,
    save_back,
    seq_head,
    token_head,
)
from torch import nn

from mlmkit.errors import ConfigError
from mlmkit.exporter.passes import fuse
from mlmkit.models import core, family_for
from mlmkit.models.config import ModelConfig
from mlmkit.models.mpnet import BUCKETS, MPNetLayer, RelativeBuckets, bucket
from mlmkit.rundir.config import load_config
from mlmkit.runtime.pipeline import Pipeline
from mlmkit.text.tokenizer import load_tokenizer, special_ids, special_tokens

transformers = pytest.importorskip("transformers")

V = 100
BASE = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=160, layer_norm_eps=1e-5)
FAMILY = HFFamily("MPNetConfig", BASE)  # (transformers' MPNet has eager attention only)
HEADS = {"mlm": "MPNetForMaskedLM", "seq": "MPNetForSequenceClassification",
         "tag": "MPNetForTokenClassification", "qa": "MPNetForQuestionAnswering"}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Checkpoints:
    return Checkpoints(FAMILY, tmp_path_factory.mktemp("mpnet"))


def inputs(T: int = 150, lengths: tuple[int, ...] = (150, 97, 9), seed: int = 1) -> dict[str, torch.Tensor]:
    """A right-padded batch: <s> (id 0) first, MPNet's padding id 1 with attention_mask 0 after each
    length."""
    return random_batch(V, T, lengths, seed, pad=1, first=0)


class Bare(nn.Module):
    """MPNetModel's outputs: the hidden states and the pooler's vector (mlmkit's bert.* names)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.bert = core.BertModel(config)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor,
                                                                                      torch.Tensor | None]:
        return self.bert(input_ids, attention_mask)


# ---- the relative positions --------------------------------------------------------------------
def test_buckets_are_transformers_at_every_distance():
    """The tabled buckets equal transformers' bucketing of every key - query distance of a 400-token
    sequence (far beyond the table's 128 each way), and so does the function the table is made of."""
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    T = 400
    rel = torch.arange(T)[None, :] - torch.arange(T)[:, None]  # key - query, as compute_position_bias
    theirs = MPNetEncoder.relative_position_bucket(rel, num_buckets=BUCKETS)
    assert torch.equal(RelativeBuckets()(T, T, torch.device("cpu")), theirs)
    assert torch.equal(bucket(rel), theirs)
    # every bucket occurs but the first of the upper half (keys after the query: never at distance 0)
    assert set(theirs.unique().tolist()) == set(range(BUCKETS)) - {BUCKETS // 2}
    first = RelativeBuckets()(1, T, torch.device("cpu"))  # the [CLS]-only layer's row
    assert torch.equal(first, theirs[:1])


# ---- the backbone and the heads against transformers -------------------------------------------
def test_backbone_and_pooler_match_transformers_eager_and_sdpa(hf_dir):
    d = hf_dir("MPNetModel")  # a bare backbone with its pooler: keys without "mpnet."
    cfg, ours, unexpected = load_ours(d, Bare)
    assert unexpected == []
    assert all(isinstance(x, MPNetLayer) for x in ours.bert.encoder.layer)
    x = inputs()
    with torch.no_grad():
        ref = hf_model("MPNetModel", d)(**x)
        got = {}
        for impl in ("eager", "sdpa"):
            core.set_attention_impl(ours, impl)
            got[impl] = ours(**x)
        for impl, (h, pooled) in got.items():
            assert real_diff(h, ref.last_hidden_state, x["attention_mask"]) <= ATOL, impl
            assert (pooled - ref.pooler_output).abs().max().item() <= ATOL, impl
        # the comparison is sensitive to the relative bias and to the positions
        bias = ours.bert.encoder.relative_attention_bias.weight
        kept = bias.clone()
        bias[BUCKETS - 1].add_(1.0)  # the last bucket of keys after the query: 128 positions on and more
        assert real_diff(ours(**x)[0], ref.last_hidden_state, x["attention_mask"]) > 1e-3
        bias.copy_(kept)
        shifted = {**x, "input_ids": torch.cat([x["input_ids"][:, :1], x["input_ids"]], 1)[:, :-1]}
        assert real_diff(ours(**shifted)[0][:, 1:], ref.last_hidden_state[:, :-1],
                         x["attention_mask"][:, :-1]) > 1e-3
    assert ref.last_hidden_state.abs().max() > 1.0


def test_mlm_logits_match(hf_dir):
    d = hf_dir("MPNetForMaskedLM")
    cfg, ours, unexpected = load_ours(d, core.BertForPreTraining)
    assert unexpected == []  # lm_head.decoder.bias is tied to lm_head.bias, as in transformers
    x = inputs()
    with torch.no_grad():
        ref = hf_model("MPNetForMaskedLM", d)(**x).logits
    assert max(mlm_diffs(ours, ref, x)) <= ATOL  # every token, and the head at the labelled positions only
    assert ref.abs().max() > 1.0


def test_sequence_classification_matches(hf_dir):
    d = hf_dir("MPNetForSequenceClassification", num_labels=3)
    cfg, ours, unexpected = load_ours(d, seq_head)
    assert unexpected == []
    x = inputs()
    with torch.no_grad():
        got = ours(**x)["logits"]
        ref = hf_model("MPNetForSequenceClassification", d)(**x).logits
        assert (got - ref).abs().max().item() <= ATOL
        assert core.reads_cls_only(ours.bert)
        # the [CLS]-only last layer (the bias row of query 0 against every key) gives the same vector
        fast = core.encode_cls(ours.bert, x["input_ids"], x["attention_mask"])
        assert (fast - ours.bert(**x)[1]).abs().max().item() <= ATOL
        assert (ours.classifier(fast) - ref).abs().max().item() <= ATOL


def test_token_classification_matches(hf_dir):
    d = hf_dir("MPNetForTokenClassification", num_labels=5)
    cfg, ours, unexpected = load_ours(d, token_head)
    assert unexpected == []
    theirs = hf_model("MPNetForTokenClassification", d)
    assert head_diff(ours, theirs, "ForTokenClassification", inputs()) <= ATOL


def test_question_answering_matches(hf_dir):
    d = hf_dir("MPNetForQuestionAnswering")
    cfg, ours, unexpected = load_ours(d, BUILDS["ForQuestionAnswering"])
    assert unexpected == []
    theirs = hf_model("MPNetForQuestionAnswering", d)
    assert head_diff(ours, theirs, "ForQuestionAnswering", inputs()) <= ATOL  # the start and end logits


# ---- back to transformers ----------------------------------------------------------------------
@pytest.mark.parametrize("head", HEADS)
def test_saves_back_to_transformers(hf_dir, tmp_path, head):
    cls_name = HEADS[head]
    cfg, ours, _ = load_ours(hf_dir(cls_name), BUILDS[head_of(cls_name)])
    theirs = save_back(cfg, ours, cls_name, tmp_path / "ours")
    assert "type_vocab_size" not in json.loads((tmp_path / "ours" / "config.json").read_text())
    assert head_diff(ours, theirs, head_of(cls_name), inputs()) <= ATOL


# ---- config.json -------------------------------------------------------------------------------
def test_config_fields_and_names(tmp_path):
    # its own checkpoint: the test rewrites its config.json; rows past 32 are never read
    d = FAMILY.save(tmp_path / "hf", "MPNetForMaskedLM", relative_attention_num_buckets=40)
    cfg = load_config(d)
    assert (cfg.type_vocab_size, cfg.pad_token_id, cfg.architectures) == (0, 1, ["BertForMaskedLM"])
    assert cfg.max_tokens == 160 - 2  # positions start at padding_idx + 1
    fam = family_for("mpnet")
    assert not fam.uses_token_types(cfg) and fam.architecture("BertForPreTraining",
                                                              "mpnet") == "MPNetForMaskedLM"
    _, ours, _ = load_ours(d, core.BertForPreTraining)
    assert ours.bert.encoder.relative_attention_bias.weight.shape == (40, 2)
    emb = ours.bert.embeddings
    assert not hasattr(emb, "token_type_embeddings") and emb.position_embeddings.padding_idx == 1
    x = inputs()
    with torch.no_grad():
        ref = hf_model("MPNetForMaskedLM", d)(**x).logits
        assert real_diff(ours(**x)["prediction_logits"], ref, x["attention_mask"]) <= ATOL
    defaults = ModelConfig.from_dict({"model_type": "mpnet"})
    assert (defaults.vocab_size, defaults.pad_token_id, defaults.type_vocab_size) == (30527, 1, 0)
    # the weights' bias table is checked against the config before anything is built
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "relative_attention_num_buckets": 64}))
    with pytest.raises(ConfigError,
                       match="relative_attention_num_buckets 64 does not match the weights .*has 40 rows"):
        load_config(d)


@pytest.mark.parametrize("change, words", [
    ({"relative_attention_num_buckets": 16}, "relative_attention_num_buckets 16 is below the 32 buckets"),
    ({"relative_attention_num_buckets": 0}, "relative_attention_num_buckets must be a positive integer"),
    ({"type_vocab_size": 2}, "MPNet has no token types"),
    ({"max_position_embeddings": 2}, "leaves MPNet no position"),
])
def test_configs_it_cannot_run_are_refused(change, words):
    with pytest.raises(ConfigError, match=words):
        ModelConfig.from_dict({"model_type": "mpnet", "vocab_size": V, "hidden_size": 32,
                               "num_attention_heads": 2,
                               "num_hidden_layers": 2, "intermediate_size": 48, **change})


# ---- ONNX --------------------------------------------------------------------------------------
def test_eager_graphs_export_fuse_and_match(hf_dir, tmp_path):
    """The TorchScript exporter at opset 17 with dynamic batch and sequence axes, then onnxruntime's
    fusions as `mlmkit export` runs them (held to the family's declaration): on a batch of another
    size and length than the export's, the fused graph gives PyTorch's outputs. Two graphs: MLM
    logits, and the [CLS]-only classifier. Measured: each layer's two SkipLayerNormalization fuse,
    no Attention (its bias is outside onnxruntime's BERT attention pattern)."""
    pytest.importorskip("onnxruntime")
    cfg, mlm, _ = load_ours(hf_dir("MPNetForMaskedLM"), core.BertForPreTraining)
    _, seq, _ = load_ours(hf_dir("MPNetForSequenceClassification", num_labels=3), seq_head)
    dummy, x = inputs(T=12, lengths=(12, 7)), inputs()
    for name, graph in head_graphs(mlm, seq).items():
        partial, per_token = int(name == "cls"), name == "mlm"
        plain = export_eager(graph, dummy, tmp_path / f"{name}.onnx", per_token=per_token)
        fused = tmp_path / f"{name}-fused.onnx"
        counts = fuse(plain, fused, cfg, partial_layers=partial)
        assert counts.get("SkipLayerNormalization",
                          0) >= 2 * (cfg.num_hidden_layers - partial) and "Attention" not in counts, counts
        with torch.no_grad():
            ref = graph(**x).numpy()
        for path in (plain, fused):
            diff = onnx_diff(ort_run(ort_session(path), x), ref, x, per_token=per_token)
            assert diff <= 1e-4, (name, path.name)


def test_mlmkit_export_with_the_mpnet_tokenizer(tmp_path):
    """`mlmkit export` of an MPNet classifier saved by transformers with its own tokenizer: the special
    tokens are the tokenizer_config.json's (<pad> 1, not the [PAD] its vocabulary also holds), the
    bundle keeps them beside its tokenizer.json, and the bundle's logits are transformers' on a
    mixed-length batch, through the parity gate and the family's fusions."""
    src = tmp_path / "src"
    hf = save_checkpoint(src, "mpnet", "ForSequenceClassification", id2label={0: "neg", 1: "neu", 2: "pos"})
    tok = load_tokenizer(src)
    assert special_tokens(tok).names() == {"pad_token": "<pad>", "unk_token": "[UNK]", "cls_token": "<s>",
                                           "sep_token": "</s>",
                                           "mask_token": "<mask>", "bos_token": "<s>", "eos_token": "</s>"}
    assert (special_ids(tok).pad, special_ids(tok).mask) == (1, tok.token_to_id("<mask>"))
    meta = export(src, tmp_path / "b")
    assert meta["inputs"] == ["input_ids", "attention_mask"] and meta["tokenizer"]["pad_id"] == 1
    assert all(v <= 1e-4 for v in meta["parity"]["max_abs_diff"].values()), meta["parity"]
    assert meta["fused_operators"].get("SkipLayerNormalization", 0) >= 2, meta["fused_operators"]
    assert json.loads((tmp_path / "b" / "special_tokens_map.json").read_text())["pad_token"] == "<pad>"
    texts = ["the film was good", "john went to paris and the plot was very dull", "a",
             ("the story", "was great and fine")]
    b = encode_batch(src, texts)
    assert b["input_ids"][2, 3] == 1  # padded with <pad>
    got = Pipeline.load(tmp_path / "b")([t if isinstance(t, str) else {"text": t[0], "text_pair": t[1]}
                                         for t in texts])
    ref = torch.softmax(hf_out(hf, b, "mpnet").logits, -1).numpy()
    np.testing.assert_allclose([list(r["probabilities"].values()) for r in got], ref, atol=1e-4)


def test_sentence_transformers_directory_exports_with_its_embeddings(tmp_path):
    """all-mpnet-base-v2's layout (a sentence-transformers directory: MPNetModel, mean pooling,
    normalisation) exports as the embedding task and gives sentence-transformers' embeddings; its
    int8 bundle agrees with fp32."""
    save_checkpoint(tmp_path / "enc", "mpnet", "Model")
    model, bundle = sentence_transformers_bundle(tmp_path, tmp_path / "enc", "mean", max_seq_length=64)
    meta = json.loads((bundle / "mlmkit.json").read_text())
    assert meta["options"]["normalize"] is True and "token_type_ids" not in meta["inputs"]
    texts = ["the film was good", "john went to paris and the plot was very dull", "a"]
    assert np.abs(bundle_embeddings(bundle, texts) - model.encode(texts, convert_to_numpy=True)).max() < 1e-4
    q = export(tmp_path / "st", tmp_path / "int8", "--quantize", "int8")
    assert q["precision"] == "int8" and q["parity"]["int8_agreement"]["cosine"] >= 0.99, q["parity"]
