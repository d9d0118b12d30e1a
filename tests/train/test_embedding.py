"""The embedding losses (mlmkit/train/losses/embedding.py) against plain formulas: MNRL (InfoNCE),
CoSENT, Matryoshka, margin-MSE, MSE distillation, and SPLADE's FLOPS regulariser."""

from __future__ import annotations

import math

import pytest
import torch

from mlmkit.train import losses
from mlmkit.train.losses import PairBatch


def _batch(parts: list[list[int]], texts: list[list[int]] | None = None,
           scores: list[float] | None = None) -> PairBatch:
    """Features of examples in order: parts[i] the columns of example i (0 anchor, 1 positive, 2..
    negatives)."""
    example = [i for i, ps in enumerate(parts) for _ in ps]
    part = [p for ps in parts for p in ps]
    text = [t for ts in texts for t in ts] if texts else list(range(len(part)))
    score = [scores[i] for i in example] if scores else [0.0] * len(part)
    return PairBatch(torch.tensor(example), torch.tensor(part), torch.tensor(text), torch.tensor(score))


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.dot(a, b) / (a.norm() * b.norm()))


def test_mnrl_is_infonce_over_positives_and_hard_negatives():
    torch.manual_seed(0)
    b = _batch([[0, 1, 2], [0, 1], [0, 1, 2, 3]])
    E = torch.randn(len(b.part), 8)
    anchors, positives = [0, 3, 5], [1, 4, 6]
    candidates = positives + [2, 7, 8]
    want = 0.0
    for i, a in enumerate(anchors):
        logits = [20.0 * _cos(E[a], E[c]) for c in candidates]
        want += -logits[i] + math.log(sum(math.exp(x) for x in logits))
    assert float(losses.MultipleNegativesRankingLoss()(E, b)) == pytest.approx(want / 3, abs=1e-5)
    # symmetric: the mean of that and each positive against the anchors
    back = 0.0
    for i, p in enumerate(positives):
        logits = [20.0 * _cos(E[p], E[a]) for a in anchors]
        back += -logits[i] + math.log(sum(math.exp(x) for x in logits))
    assert float(losses.MultipleNegativesRankingLoss(symmetric=True)(E, b)) == pytest.approx((
        want / 3 + back / 3) / 2, abs=1e-5)


def test_a_text_twice_in_a_batch_is_no_false_negative():
    """Example 2's positive is example 0's positive text: for anchor 0 it is not a negative (nor the other
    way)."""
    torch.manual_seed(1)
    b = _batch([[0, 1], [0, 1], [0, 1]], texts=[[10, 11], [12, 13], [14, 11]])
    E = torch.randn(6, 8)
    E[5] = E[1]  # the same text embeds the same
    anchors, positives = [0, 2, 4], [1, 3, 5]
    want = 0.0
    for i, a in enumerate(anchors):
        keep = [j for j in range(3) if j == i or not (i != j and {i, j} == {0, 2})]
        logits = [10.0 * _cos(E[a], E[positives[j]]) for j in keep]
        want += -logits[keep.index(i)] + math.log(sum(math.exp(x) for x in logits))
    assert float(losses.MultipleNegativesRankingLoss(scale=10.0)(E, b)) == pytest.approx(want / 3, abs=1e-5)


def test_cosent_orders_the_cosines_as_the_scores():
    torch.manual_seed(2)
    scores = [0.9, 0.1, 0.5, 0.5]
    b = _batch([[0, 1]] * 4, scores=scores)
    E = torch.randn(8, 8)
    cos = [20.0 * _cos(E[2 * i], E[2 * i + 1]) for i in range(4)]
    terms = [math.exp(cos[j] - cos[i]) for i in range(4) for j in range(4) if scores[i] > scores[j]]
    assert float(losses.CoSENTLoss()(E, b)) == pytest.approx(math.log(1 + sum(terms)), abs=1e-4)


def test_matryoshka_is_the_weighted_inner_loss_on_leading_dimensions():
    torch.manual_seed(3)
    b = _batch([[0, 1], [0, 1], [0, 1, 2]])
    E = torch.randn(7, 16)
    inner = losses.MultipleNegativesRankingLoss()
    want = 1.0 * inner(E[:, :16], b) + 0.5 * inner(E[:, :8], b) + 0.25 * inner(E[:, :4], b)
    assert float(losses.MatryoshkaLoss(inner, [16, 8, 4],
                                       [1.0, 0.5, 0.25])(E, b)) == pytest.approx(float(want), abs=1e-6)
    b.target = torch.randn(7, 16)  # mse-distill: the teacher's vectors cut to the same leading dimensions
    want = sum(float(((E[:, :d] - b.target[:, :d]) ** 2).mean()) for d in (16, 8))
    assert float(losses.MatryoshkaLoss(losses.MSEDistillLoss(), [16, 8])(E, b)) == pytest.approx(want,
                                                                                                 rel=1e-5)


def test_margin_mse_regresses_the_teachers_margins():
    torch.manual_seed(2)
    b = _batch([[0, 1, 2, 3], [0, 1, 2]])
    # the teacher's score of each text for its anchor
    b.score = torch.tensor([0.0, 9.0, 4.0, 1.0, 0.0, 7.0, 6.5])
    E = torch.randn(7, 8)
    want = []
    for a, p, negs in ((0, 1, (2, 3)), (4, 5, (6,))):
        for n in negs:
            student = float(E[a] @ E[p] - E[a] @ E[n])
            want.append((student - float(b.score[p] - b.score[n])) ** 2)
    assert float(losses.MarginMSELoss()(E, b)) == pytest.approx(sum(want) / len(want), rel=1e-5)


def test_mse_distill_is_the_squared_error_to_the_teachers_vectors():
    torch.manual_seed(3)
    b = _batch([[0, 1], [0, 1]])
    E, T = torch.randn(4, 8), torch.randn(4, 8)
    b.target = T
    assert float(losses.MSEDistillLoss()(E, b)) == pytest.approx(float(((E - T) ** 2).mean()), rel=1e-5)
    proj = torch.nn.Linear(8, 5)
    b.target = T[:, :5]
    assert float(losses.MSEDistillLoss(project=proj)(E, b)) == pytest.approx(float(((proj(
        E) - T[:, :5]) ** 2).mean()), rel=1e-5)


def test_flops_is_the_sum_of_squared_mean_weights():
    X = torch.rand(5, 12)
    want = sum((sum(float(X[i, j]) for i in range(5)) / 5) ** 2 for j in range(12))
    assert float(losses.flops(X)) == pytest.approx(want, rel=1e-5)


def test_the_splade_loss_is_its_ranking_loss_plus_the_warmed_up_flops():
    torch.manual_seed(0)
    W = torch.rand(6, 20)
    b = PairBatch(torch.tensor([0, 0, 1, 1, 2, 2]), torch.tensor([0, 1] * 3), torch.arange(6), torch.zeros(6))
    for inner in (losses.MultipleNegativesRankingLoss(scale=1.0, dot=True), losses.CoSENTLoss()):
        splade = losses.SpladeLoss(inner, query_weight=0.5, document_weight=0.25, warmup=4)
        reg = 0.5 * losses.flops(W[b.part == 0]) + 0.25 * losses.flops(W[b.part > 0])
        for seen in range(6):
            want = float(inner(W, b)) + min(1.0, (seen / 4) ** 2) * float(reg)
            assert float(splade(W, b)) == pytest.approx(want, rel=1e-6), seen
            splade.step()
