"""The model against hand computations: MLM loss values, the masked-only head, padding, attention forms."""

from __future__ import annotations

import math

import pytest
import torch

from mlmkit.models.config import ModelConfig
from mlmkit.models.core import BertForPreTraining, BertModel, masked_lm_loss, set_attention_impl

V = 50


def tiny(**kw) -> ModelConfig:
    base = dict(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=128,
                max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return ModelConfig(**{**base, **kw})


def batch(B: int = 3, T: int = 12, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, T - 4 :] = 0  # row 1 is padded
    ids[mask == 0] = 0
    types = torch.zeros(B, T, dtype=torch.long)
    types[:, T // 2 :] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def constant_head(model: BertForPreTraining, logits: torch.Tensor) -> None:
    """Make the MLM head output ``logits`` (V,) at every position: zero the transform's LayerNorm so
    the decoder sees 0, and put the logits in the output bias."""
    with torch.no_grad():
        ln = model.cls.predictions.transform.LayerNorm
        ln.weight.zero_()
        ln.bias.zero_()
        model.cls.predictions.bias.copy_(logits)


def test_masked_lm_loss_hand_computation():
    # two masked positions, true-token probabilities 0.2 and 0.5
    p = torch.tensor([[0.2, 0.3, 0.5], [0.25, 0.5, 0.25]])
    targets = torch.tensor([0, 1])
    logits = p.log()
    assert masked_lm_loss(logits, targets, reduction="sum").item() == pytest.approx(2.3026, abs=1e-4)
    assert masked_lm_loss(logits, targets).item() == pytest.approx(1.1513, abs=1e-4)
    # softmax is shift-invariant: the same with unnormalised logits
    assert masked_lm_loss(logits + 7.0, targets, reduction="sum").item() == pytest.approx(2.3026, abs=1e-4)


def test_pretraining_loss_hand_computation_through_the_model():
    torch.manual_seed(0)
    model = BertForPreTraining(tiny()).eval()
    probs = torch.full((V,), 0.3 / (V - 2))
    probs[7], probs[9] = 0.2, 0.5
    constant_head(model, probs.log())
    b = batch()
    labels = torch.full_like(b["input_ids"], -100)
    labels[0, 3], labels[2, 5] = 7, 9
    out = model(**b, labels=labels)
    assert out["mlm_logits"].shape == (2, V)
    assert out["mlm_loss"].item() == pytest.approx(1.1513, abs=1e-4)  # (-ln 0.2 - ln 0.5) / 2
    assert (out["mlm_loss"] * 2).item() == pytest.approx(2.3026, abs=1e-4)
    # no NSP label: the loss is the MLM loss alone
    assert out["loss"].item() == pytest.approx(out["mlm_loss"].item())


def test_uniform_model_costs_log_v_per_token():
    torch.manual_seed(0)
    model = BertForPreTraining(tiny()).eval()
    constant_head(model, torch.zeros(V))
    b = batch()
    labels = b["input_ids"].clone()
    labels[b["attention_mask"] == 0] = -100
    out = model(**b, labels=labels)
    assert out["mlm_logits"].shape[0] == int(b["attention_mask"].sum())
    assert out["mlm_loss"].item() == pytest.approx(math.log(V), abs=1e-5)


def test_nothing_masked_costs_zero_and_backward_works():
    torch.manual_seed(0)
    model = BertForPreTraining(tiny()).train()
    b = batch()
    labels = torch.full_like(b["input_ids"], -100)
    out = model(**b, labels=labels)
    assert out["mlm_logits"].shape == (0, V)
    assert out["mlm_loss"].item() == 0.0  # not NaN
    out["mlm_loss"].backward()  # a graph exists, gradients are zero
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())
    model.zero_grad()
    out = model(**b, labels=labels, next_sentence_label=torch.tensor([0, 1, 0]))
    assert torch.isfinite(out["loss"]) and out["loss"].item() == pytest.approx(out["nsp_loss"].item())
    out["loss"].backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert model.cls.seq_relationship.weight.grad.abs().sum() > 0


def test_mlm_head_runs_only_at_masked_positions_and_matches_the_full_head():
    torch.manual_seed(0)
    model = BertForPreTraining(tiny()).eval()
    b = batch(B=4, T=16)
    labels = torch.full_like(b["input_ids"], -100)
    where = torch.rand(labels.shape, generator=torch.Generator().manual_seed(1)) < 0.2
    where &= b["attention_mask"].bool()
    labels[where] = b["input_ids"][where]
    n = int(where.sum())
    assert 0 < n < where.numel() // 2

    rows_seen = []  # what goes into the vocabulary projection
    hook = model.cls.predictions.transform.register_forward_hook(lambda m, i, o: rows_seen.append(o.shape))
    with torch.no_grad():
        part = model(**b, labels=labels)
        full = model(**b)
    hook.remove()
    assert rows_seen[0] == (n, 64)  # the vocabulary projection saw only the N masked rows
    assert rows_seen[1] == (4, 16, 64)
    assert part["mlm_logits"].shape == (n, V)
    assert torch.equal(part["mlm_labels"], labels[where])
    torch.testing.assert_close(part["mlm_logits"], full["prediction_logits"][where], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(part["nsp_logits"], full["nsp_logits"])
    assert full["prediction_logits"].shape == (4, 16, V)


def test_decoder_is_tied_to_the_word_embeddings():
    model = BertForPreTraining(tiny())
    emb = model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.weight is emb
    assert sum(p is emb for p in model.parameters()) == 1  # one parameter, updated once per step
    # after loading a state dict (which, as transformers', omits the decoder copy) it is still tied
    from mlmkit.rundir.checkpoint import TIED_KEYS, load_weights

    other = BertForPreTraining(tiny())
    sd = {k: v for k, v in other.state_dict().items() if k not in TIED_KEYS}
    load_weights(model, sd)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert torch.equal(model.cls.predictions.decoder.weight, other.bert.embeddings.word_embeddings.weight)


def test_padding_does_not_change_real_positions():
    torch.manual_seed(0)
    model = BertModel(tiny()).eval()
    b = batch()
    other = {k: v.clone() for k, v in b.items()}
    other["input_ids"][b["attention_mask"] == 0] = 17  # garbage under the padding
    with torch.no_grad():
        x, pooled = model(**b)
        y, pooled2 = model(**other)
    real = b["attention_mask"].bool()
    torch.testing.assert_close(x[real], y[real], atol=1e-6, rtol=0)
    torch.testing.assert_close(pooled, pooled2, atol=1e-6, rtol=0)
    # and a shorter, unpadded copy of the padded row gives the same outputs
    T = int(b["attention_mask"][1].sum())
    with torch.no_grad():
        z, _ = model(b["input_ids"][1:2, :T], token_type_ids=b["token_type_ids"][1:2, :T])
    torch.testing.assert_close(z[0], x[1, :T], atol=1e-5, rtol=1e-5)


def test_token_types_matter():
    torch.manual_seed(0)
    model = BertModel(tiny()).eval()
    b = batch()
    with torch.no_grad():
        x, _ = model(**b)
        y, _ = model(b["input_ids"], b["attention_mask"], torch.zeros_like(b["token_type_ids"]))
    assert (x - y).abs().max() > 1e-3


def test_sdpa_and_eager_attention_agree():
    torch.manual_seed(0)
    model = BertForPreTraining(tiny()).eval()
    b = batch()
    with torch.no_grad():
        a = model(**b)
        set_attention_impl(model, "eager")
        e = model(**b)
    torch.testing.assert_close(a["prediction_logits"], e["prediction_logits"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a["nsp_logits"], e["nsp_logits"], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="sdpa"):
        set_attention_impl(model, "flash")


def test_dropout_is_active_in_training_only():
    torch.manual_seed(0)
    model = BertModel(tiny(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1))
    b = batch()
    model.train()
    x1, _ = model(**b)
    x2, _ = model(**b)
    assert (x1 - x2).abs().max() > 1e-3
    model.eval()
    with torch.no_grad():
        y1, _ = model(**b)
        y2, _ = model(**b)
    assert torch.equal(y1, y2)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_encode_cls_equals_the_pooled_output(impl):
    """The classification graph's shortcut (last layer for [CLS] only) changes nothing it outputs."""
    from mlmkit.models.core import BertModel, encode_cls, set_attention_impl

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                      intermediate_size=64,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    bert = BertModel(cfg).eval()
    set_attention_impl(bert, impl)
    ids = torch.randint(5, 50, (3, 9))
    am = torch.ones_like(ids)
    am[1, 4:] = 0
    tt = torch.zeros_like(ids)
    tt[2, 5:] = 1
    with torch.no_grad():
        torch.testing.assert_close(encode_cls(bert, ids, am, tt), bert(ids, am, tt)[1], atol=1e-6, rtol=1e-5)
