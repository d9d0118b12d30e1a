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
from pathlib import Path

import numpy as np
import pytest
import torch
from family_checkpoints import encode_batch, export, hf_out, save_checkpoint
from family_parity import Logits, SpanModel, export_logits, load_ours, mlm_diffs, perturb, real_diff
from torch import nn

from mlmkit.errors import ConfigError
from mlmkit.exporter.passes import fuse
from mlmkit.models import core, family_for
from mlmkit.models.config import ModelConfig
from mlmkit.models.mpnet import BUCKETS, MPNetLayer, RelativeBuckets, bucket
from mlmkit.rundir.checkpoint import save_weights
from mlmkit.rundir.config import load_config, save_config
from mlmkit.runtime.pipeline import Pipeline
from mlmkit.text.tokenizer import load_tokenizer, special_ids, special_tokens

transformers = pytest.importorskip("transformers")

V = 100
ATOL = 1e-5
BASE = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=160, layer_norm_eps=1e-5)


def hf_dir(tmp_path: Path, cls_name: str, name: str = "hf", seed: int = 0, **kw) -> Path:
    """A random transformers MPNet model of class ``cls_name``, saved by save_pretrained."""
    cfg = transformers.MPNetConfig(**{**BASE, **kw})
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(cfg)
    perturb(model, seed)
    d = tmp_path / name
    model.save_pretrained(d)
    return d


def hf_model(cls_name: str, d: Path) -> nn.Module:
    # eager attention: transformers' MPNet has no other
    return getattr(transformers, cls_name).from_pretrained(d).eval()


def inputs(T: int = 150, lengths: tuple[int, ...] = (150, 97, 9), seed: int = 1) -> dict[str, torch.Tensor]:
    """A right-padded batch: <s> (id 0) first, MPNet's padding id 1 with attention_mask 0 after each
    length."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (len(lengths), T), generator=g)
    ids[:, 0] = 0
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids[mask == 0] = 1
    return {"input_ids": ids, "attention_mask": mask}


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
def test_backbone_and_pooler_match_transformers_eager_and_sdpa(tmp_path):
    d = hf_dir(tmp_path, "MPNetModel")  # a bare backbone with its pooler: keys without "mpnet."
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


def test_mlm_logits_match(tmp_path):
    d = hf_dir(tmp_path, "MPNetForMaskedLM")
    cfg, ours, unexpected = load_ours(d, core.BertForPreTraining)
    assert unexpected == []  # lm_head.decoder.bias is tied to lm_head.bias, as in transformers
    x = inputs()
    with torch.no_grad():
        ref = hf_model("MPNetForMaskedLM", d)(**x).logits
    assert max(mlm_diffs(ours, ref, x)) <= ATOL  # every token, and the head at the labelled positions only
    assert ref.abs().max() > 1.0


def test_sequence_classification_matches(tmp_path):
    d = hf_dir(tmp_path, "MPNetForSequenceClassification", num_labels=3)
    cfg, ours, unexpected = load_ours(d, lambda c: core.BertForLabels(c, per_token=False))
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


def test_token_classification_matches(tmp_path):
    d = hf_dir(tmp_path, "MPNetForTokenClassification", num_labels=5)
    cfg, ours, unexpected = load_ours(d, lambda c: core.BertForLabels(c, per_token=True))
    assert unexpected == []
    x = inputs()
    with torch.no_grad():
        got = ours(**x)["logits"]
        ref = hf_model("MPNetForTokenClassification", d)(**x).logits
    assert real_diff(got, ref, x["attention_mask"]) <= ATOL


def test_question_answering_matches(tmp_path):
    d = hf_dir(tmp_path, "MPNetForQuestionAnswering")
    cfg, ours, unexpected = load_ours(d, SpanModel)
    assert unexpected == []
    x = inputs()
    with torch.no_grad():
        start, end = ours(**x)
        ref = hf_model("MPNetForQuestionAnswering", d)(**x)
    assert real_diff(start, ref.start_logits, x["attention_mask"]) <= ATOL
    assert real_diff(end, ref.end_logits, x["attention_mask"]) <= ATOL


# ---- back to transformers ----------------------------------------------------------------------
@pytest.mark.parametrize("head", ["mlm", "seq", "tag", "qa"])
def test_saves_back_to_transformers(tmp_path, head):
    cls_name, build = {"mlm": ("MPNetForMaskedLM", core.BertForPreTraining),
                       "seq": ("MPNetForSequenceClassification",
                               lambda c: core.BertForLabels(c, per_token=False)),
                       "tag": ("MPNetForTokenClassification",
                               lambda c: core.BertForLabels(c, per_token=True)),
                       "qa": ("MPNetForQuestionAnswering", SpanModel)}[head]
    cfg, ours, _ = load_ours(hf_dir(tmp_path, cls_name), build)
    out = tmp_path / "ours"
    out.mkdir()
    save_weights(ours, out / "model.safetensors", cfg)
    save_config(cfg, out / "config.json")
    assert "type_vocab_size" not in json.loads((out / "config.json").read_text())
    theirs, info = getattr(transformers, cls_name).from_pretrained(out, output_loading_info=True)
    assert info["missing_keys"] in ([], set()) and info["unexpected_keys"] in ([], set()), info
    x = inputs()
    with torch.no_grad():
        got, ref = ours(**x), theirs.eval()(**x)
    if head == "mlm":
        assert real_diff(got["prediction_logits"], ref.logits, x["attention_mask"]) <= ATOL
    elif head == "seq":
        assert (got["logits"] - ref.logits).abs().max().item() <= ATOL
    elif head == "tag":
        assert real_diff(got["logits"], ref.logits, x["attention_mask"]) <= ATOL
    else:
        assert real_diff(got[0], ref.start_logits, x["attention_mask"]) <= ATOL
        assert real_diff(got[1], ref.end_logits, x["attention_mask"]) <= ATOL


# ---- config.json -------------------------------------------------------------------------------
def test_config_fields_and_names(tmp_path):
    d = hf_dir(tmp_path, "MPNetForMaskedLM", relative_attention_num_buckets=40)  # rows past 32 are never read
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
def test_eager_graphs_export_fuse_and_match(tmp_path):
    """The TorchScript exporter at opset 17 with dynamic batch and sequence axes, then onnxruntime's
    fusions as `mlmkit export` runs them (held to the family's declaration): on a batch of another
    size and length than the export's, the fused graph gives PyTorch's outputs. Two graphs: MLM
    logits, and the [CLS]-only classifier. Measured: each layer's two SkipLayerNormalization fuse,
    no Attention (its bias is outside onnxruntime's BERT attention pattern)."""
    ort = pytest.importorskip("onnxruntime")
    cfg, mlm, _ = load_ours(hf_dir(tmp_path, "MPNetForMaskedLM", name="mlm"), core.BertForPreTraining)
    _, seq, _ = load_ours(hf_dir(tmp_path, "MPNetForSequenceClassification", name="seq", num_labels=3),
                          lambda c: core.BertForLabels(c, per_token=False))
    graphs = {
        "mlm": (Logits(mlm, lambda m, i, a: m(i, a)["prediction_logits"]), 0),
        "cls": (Logits(seq, lambda m, i, a: m.classifier(core.encode_cls(m.bert, i, a))), 1),
    }
    dummy, x = inputs(T=12, lengths=(12, 7)), inputs()
    for name, (graph, partial) in graphs.items():
        graph.eval()
        core.set_attention_impl(graph, "eager")
        plain, fused = tmp_path / f"{name}.onnx", tmp_path / f"{name}-fused.onnx"
        export_logits(graph, dummy, plain, per_token=name == "mlm")
        core.set_attention_impl(graph, "sdpa")
        counts = fuse(plain, fused, cfg, partial_layers=partial)
        assert counts.get("SkipLayerNormalization",
                          0) >= 2 * (cfg.num_hidden_layers - partial) and "Attention" not in counts, counts
        with torch.no_grad():
            ref = graph(**x).numpy()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        for path in (plain, fused):
            sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
            (got,) = sess.run(None, {k: v.numpy() for k, v in x.items()})
            diff = got - ref
            if name == "mlm":
                diff = diff[x["attention_mask"].bool().numpy()]
            assert abs(diff).max() <= 1e-4, (name, path.name)


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
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as st_models

    save_checkpoint(tmp_path / "enc", "mpnet", "Model")
    word = st_models.Transformer(str(tmp_path / "enc"), max_seq_length=64)
    model = SentenceTransformer(modules=[word, st_models.Pooling(word.get_embedding_dimension(),
                                                                 pooling_mode="mean"),
                                         st_models.Normalize()], device="cpu")
    model.save(str(tmp_path / "st"))
    meta = export(tmp_path / "st", tmp_path / "b")
    assert (meta["task"] == "embedding" and meta["options"]["normalize"] is True
            and "token_type_ids" not in meta["inputs"])
    texts = ["the film was good", "john went to paris and the plot was very dull", "a"]
    ours = np.stack([r["embedding"] for r in Pipeline.load(tmp_path / "b")(texts)])
    assert np.abs(ours - model.encode(texts, convert_to_numpy=True)).max() < 1e-4
    q = export(tmp_path / "st", tmp_path / "int8", "--quantize", "int8")
    assert q["precision"] == "int8" and q["parity"]["int8_agreement"]["cosine"] >= 0.99, q["parity"]
