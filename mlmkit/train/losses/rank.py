"""The rank losses, one class each: a cross-encoder's scores of each query's candidates, their gold
labels and their query (``group``, 0.. within the batch) -> the loss (the rerank task's)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mlmkit.train.losses.base import RankLoss


def _groups(group: torch.Tensor) -> list[torch.Tensor]:
    """The candidate indices of each query of the batch."""
    return [(group == g).nonzero().squeeze(1) for g in torch.unique(group)]


class BinaryCrossEntropyLoss(RankLoss):
    """Pointwise: binary cross-entropy of sigmoid(score) against label / max_label (graded labels
    become soft targets)."""

    name = "bce"

    def __init__(self, max_label: float = 1.0) -> None:
        self.max_label = max_label

    def __call__(self, s: torch.Tensor, y: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(s, y / self.max_label)


class CrossEncoderMNRLoss(RankLoss):
    """For every relevant candidate (label > 0) of a query: its softmax cross-entropy against the
    query's irrelevant ones (label 0), averaged over the relevant candidates."""

    name = "mnrl"

    def __call__(self, s: torch.Tensor, y: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        terms = []
        for idx in _groups(group):
            ys, ss = y[idx], s[idx]
            neg = ss[ys <= 0]
            for p in ss[ys > 0]:
                terms.append(torch.logsumexp(torch.cat([p[None], neg]), 0) - p)
        return torch.stack(terms).mean() if terms else s.sum() * 0.0


class ListNetLoss(RankLoss):
    """ListNet: per query, the cross-entropy of the softmax of the scores against the softmax of the
    labels, averaged over the queries."""

    name = "listnet"

    def __call__(self, s: torch.Tensor, y: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        per = [-(torch.softmax(y[idx], 0) * torch.log_softmax(s[idx], 0)).sum() for idx in _groups(group)]
        return torch.stack(per).mean()


class LambdaLoss(RankLoss):
    """LambdaRank with NDCG weights: per query, over the pairs (i, j) with label_i > label_j,
    |delta NDCG_ij| x log(1 + exp(-(s_i - s_j))), where delta NDCG_ij is the change of NDCG (gains
    2^label - 1, the current ranks by score) from swapping i and j; summed per query, averaged over
    queries."""

    name = "lambda"

    def __call__(self, s: torch.Tensor, y: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        out = []
        for idx in _groups(group):
            ys, ss = y[idx], s[idx]
            gain = torch.pow(2.0, ys) - 1.0
            positions = torch.arange(len(ys), device=s.device)
            ideal = (torch.sort(gain, descending=True).values / torch.log2(positions + 2.0)).sum()
            rank = torch.empty_like(ss)
            rank[torch.argsort(ss.detach(), descending=True)] = positions.to(ss.dtype)
            disc = 1.0 / torch.log2(rank + 2.0)
            better = ys[:, None] > ys[None, :]
            swap = (gain[:, None] - gain[None, :]) * (disc[:, None] - disc[None, :])
            delta = swap.abs() / ideal.clamp_min(1e-12)
            pair = F.softplus(-(ss[:, None] - ss[None, :]))
            out.append((delta * pair)[better].sum())
        return torch.stack(out).mean()
