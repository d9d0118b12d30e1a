"""The rerank losses (mlmkit/train/losses/rank.py) against plain formulas: BCE, MNRL over a query's
candidates, ListNet and LambdaLoss."""

from __future__ import annotations

import math

import pytest
import torch

from mlmkit.train import losses


def _data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(9, generator=g)
    y = torch.tensor([1.0, 0, 0, 2, 0, 1, 0, 1, 0])
    group = torch.tensor([0, 0, 0, 1, 1, 1, 1, 2, 2])
    return s, y, group


def _members(group):
    return [[i for i in range(len(group)) if int(group[i]) == g] for g in sorted(set(group.tolist()))]


def test_bce_is_the_sigmoid_cross_entropy_of_the_scaled_label():
    s, y, group = _data()
    want = [-(t * math.log(1 / (1 + math.exp(-x))) + (1 - t) * math.log(1 - 1 / (1 + math.exp(-x))))
            for x, t in zip(s.tolist(), (y / 2).tolist())]
    assert float(losses.BinaryCrossEntropyLoss(max_label=2.0)(s, y,
                                                              group)) == pytest.approx(sum(want) / len(want),
                                                                                       rel=1e-5)


def test_mnrl_is_each_relevant_candidates_softmax_against_the_irrelevant_ones():
    s, y, group = _data(1)
    terms = []
    for m in _members(group):
        neg = [s[i].item() for i in m if y[i] == 0]
        for i in m:
            if y[i] > 0:
                terms.append(-s[i].item() + math.log(math.exp(s[i].item()) + sum(math.exp(x) for x in neg)))
    assert float(losses.CrossEncoderMNRLoss()(s, y, group)) == pytest.approx(sum(terms) / len(terms),
                                                                             rel=1e-5)


def test_listnet_is_the_cross_entropy_of_the_two_softmaxes():
    s, y, group = _data(2)
    per = []
    for m in _members(group):
        zy = sum(math.exp(y[i].item()) for i in m)
        zs = sum(math.exp(s[i].item()) for i in m)
        per.append(-sum(math.exp(y[i].item()) / zy * (s[i].item() - math.log(zs)) for i in m))
    assert float(losses.ListNetLoss()(s, y, group)) == pytest.approx(sum(per) / len(per), rel=1e-5)


def test_lambda_weighs_each_misordered_pair_by_its_ndcg_change():
    s, y, group = _data(3)
    per = []
    for m in _members(group):
        order = sorted(m, key=lambda i: -s[i].item())
        rank = {i: r for r, i in enumerate(order)}
        gain = {i: 2 ** y[i].item() - 1 for i in m}
        ideal = sum(g / math.log2(r + 2) for r, g in enumerate(sorted(gain.values(), reverse=True)))
        total = 0.0
        for i in m:
            for j in m:
                if y[i] > y[j]:
                    delta = abs((gain[i] - gain[j])
                                * (1 / math.log2(rank[i] + 2) - 1 / math.log2(rank[j] + 2))) / ideal
                    total += delta * math.log(1 + math.exp(-(s[i].item() - s[j].item())))
        per.append(total)
    assert float(losses.LambdaLoss()(s, y, group)) == pytest.approx(sum(per) / len(per), rel=1e-5)
