"""The embedding losses, one class each (sentence-transformers' losses are the model), and the losses
that wrap another: MatryoshkaLoss (leading dimensions) and SpladeLoss (a ranking loss plus FLOPS).

Each is a function of a batch's embeddings ``E`` (F, H), one row per feature, and its ``PairBatch``
(which example each feature belongs to, and which column of it: 0 the anchor, 1 the positive, 2.. the
hard negatives; the gold score of scored pairs). Texts that are equal (the same token ids:
``text_id``) are never each other's negatives: a candidate with the positive's text is masked out of
the softmax, so a duplicate in a batch is no false negative.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F

from mlmkit.models.pooled import PairBatch
from mlmkit.train.losses.base import EmbeddingLoss, Similarity, rows, similarity_of


class MultipleNegativesRankingLoss(EmbeddingLoss):
    """Multiple negatives ranking (InfoNCE): each anchor against every positive and hard negative of
    the batch, its own positive the target, cosine times ``scale`` (20: temperature 0.05), or the dot
    product times ``scale`` with ``dot`` (sparse vectors: SPLADE's similarity), or ``similarity``
    times ``scale`` (late interaction's MaxSim).
    ``symmetric`` adds the positive -> anchor direction and averages the two."""

    name = "mnrl"

    def __init__(self, scale: float = 20.0, symmetric: bool = False, dot: bool = False,
                 similarity: Similarity | None = None) -> None:
        self.scale, self.symmetric = scale, symmetric
        self.similarity = similarity_of(dot, similarity)

    def __call__(self, E: torch.Tensor, b: PairBatch) -> torch.Tensor:
        a, p = rows(b, 0), rows(b, 1)
        if len(a) != len(p) or not len(a):
            raise ValueError("every example needs an anchor and a positive")
        cand = torch.cat([p, (b.part >= 2).nonzero().squeeze(1)])
        n = len(a)
        target = torch.arange(n, device=E.device)
        # a candidate with the same text as the anchor's positive is not a negative (but the positive is)
        same = b.text_id[cand][None, :] == b.text_id[p][:, None]  # (n, n + negatives)
        same[target, target] = False
        s = (self.scale * self.similarity(E[a], E[cand])).masked_fill(same, -math.inf)
        out = F.cross_entropy(s, target)
        if self.symmetric:  # each positive against the anchors, its own anchor the target
            same_anchor = b.text_id[a][None, :] == b.text_id[a][:, None]
            same_anchor[target, target] = False
            back = (self.scale * self.similarity(E[p], E[a])).masked_fill(same_anchor, -math.inf)
            out = (out + F.cross_entropy(back, target)) / 2
        return out


class CachedMultipleNegativesRankingLoss(MultipleNegativesRankingLoss):
    """The same loss, declared ``cached``: the heads embed the batch GradCache-style in mini-batches
    (mlmkit.train.losses.batches.cached), the same loss and gradients in the memory of one."""

    name = "cached-mnrl"


class MarginMSELoss(EmbeddingLoss):
    """MarginMSE (TAS-B): for every negative of an example, the student's margin dot(a, p) - dot(a, n)
    regressed on the teacher's, score(p) - score(n) (the rows' scores), the squared errors averaged.
    Dot products, as the teacher scores are raw (a cross-encoder's logits, a retriever's scores), or
    ``similarity`` (late interaction's MaxSim)."""

    name = "margin-mse"

    def __init__(self, similarity: Similarity | None = None) -> None:
        self.similarity = similarity

    def __call__(self, E: torch.Tensor, b: PairBatch) -> torch.Tensor:
        a, p = rows(b, 0), rows(b, 1)
        neg = (b.part >= 2).nonzero().squeeze(1)
        if len(a) != len(p) or not len(neg):
            raise ValueError("margin-mse needs an anchor, a positive and negatives per example")
        # each negative's example
        row = torch.searchsorted(b.example[a].contiguous(), b.example[neg].contiguous())
        ai, pi = a[row], p[row]
        if self.similarity is None:
            student = (E[ai] * E[pi]).sum(-1) - (E[ai] * E[neg]).sum(-1)
        else:  # each anchor against its own candidates only
            s = self.similarity(E[a], E[torch.cat([p, neg])])  # (examples, examples + negatives)
            student = s[row, row] - s[row, len(p) + torch.arange(len(neg), device=E.device)]
        return F.mse_loss(student, (b.score[pi] - b.score[neg]).to(student.dtype))


class DistillKLDivLoss(EmbeddingLoss):
    """Distillation of a teacher's ranking (ColBERTv2): over each example's candidates (its positive
    and hard negatives), the KL divergence from the softmax of the teacher's scores (the rows' scores)
    to that of the student's (``similarity``, the dot product with ``dot``, else the cosine, times
    ``scale``), both divided by ``temperature``; the batch's mean, times temperature squared."""

    name = "kl-distill"

    def __init__(self, scale: float = 1.0, dot: bool = False, similarity: Similarity | None = None,
                 temperature: float = 1.0) -> None:
        self.scale, self.temperature = scale, temperature
        self.similarity = similarity_of(dot, similarity)

    def __call__(self, E: torch.Tensor, b: PairBatch) -> torch.Tensor:
        a = rows(b, 0)
        cand = (b.part >= 1).nonzero().squeeze(1)
        if not len(a) or not len(cand):
            raise ValueError("kl-distill needs an anchor and scored candidates per example")
        t = self.temperature
        own = b.example[cand][None, :] == b.example[a][:, None]  # (examples, candidates): each example's own
        student = (self.scale * self.similarity(E[a], E[cand]) / t).masked_fill(~own, -math.inf)
        teacher = (b.score[cand][None, :].to(student.dtype) / t).expand_as(student)
        teacher = teacher.masked_fill(~own, -math.inf)
        log_s, log_t = F.log_softmax(student, dim=-1), F.log_softmax(teacher, dim=-1)
        kl = torch.where(own, log_t.exp() * (log_t - log_s), torch.zeros_like(log_s)).sum(-1)
        return kl.mean() * t ** 2


class MSEDistillLoss(EmbeddingLoss):
    """Every text's embedding toward the teacher's (``PairBatch.target``): the mean squared error over
    their components; ``project`` maps the student's dimension to the teacher's where they differ."""

    name = "mse-distill"

    def __init__(self, project: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.project = project

    def __call__(self, E: torch.Tensor, b: PairBatch) -> torch.Tensor:
        if b.target is None:
            raise ValueError("mse-distill needs the teacher's embedding of every text")
        S = self.project(E) if self.project is not None else E
        return F.mse_loss(S, b.target.to(S.dtype))


class CoSENTLoss(EmbeddingLoss):
    """CoSENT for scored pairs: log(1 + sum over pairs (i, j) with gold_i > gold_j of
    exp(scale * (cos_j - cos_i))), so the cosines are ordered as the gold scores are."""

    name = "cosent"

    def __init__(self, scale: float = 20.0) -> None:
        self.scale = scale

    def __call__(self, E: torch.Tensor, b: PairBatch) -> torch.Tensor:
        a, p = rows(b, 0), rows(b, 1)
        cos = (F.normalize(E[a], dim=-1) * F.normalize(E[p], dim=-1)).sum(-1) * self.scale  # (n,)
        gold = b.score[a]
        diff = cos[None, :] - cos[:, None]  # (i, j): cos_j - cos_i
        diff = diff.masked_fill(~(gold[:, None] > gold[None, :]), -math.inf)
        zero = torch.zeros(1, device=E.device, dtype=diff.dtype)
        return torch.logsumexp(torch.cat([zero, diff.flatten()]), dim=0)


class MatryoshkaLoss(EmbeddingLoss):
    """``inner`` on the first d dimensions of the embeddings for each d of ``dims``, weighted: the
    leading dimensions carry a usable embedding by themselves (what the `dimensions` request field cuts)."""

    def __init__(self, inner: EmbeddingLoss, dims: Sequence[int],
                 weights: Sequence[float] | None = None) -> None:
        self.inner, self.dims = inner, list(dims)
        self.weights = list(weights) if weights else [1.0] * len(self.dims)

    def __call__(self, E: torch.Tensor, b: PairBatch) -> torch.Tensor:
        terms = [w * self.inner(E[:, :d], b if b.target is None else replace(b, target=b.target[:, :d]))
                 for d, w in zip(self.dims, self.weights)]  # a teacher's vectors (mse-distill) are cut alike
        out = terms[0]
        for t in terms[1:]:
            out = out + t
        return out


def flops(X: torch.Tensor) -> torch.Tensor:
    """SPLADE's FLOPS regulariser of a batch of sparse vectors (n, V): the sum over the vocabulary of
    the squared mean weight, the expected cost of a dot product with an inverted index."""
    return (X.mean(0) ** 2).sum()


class SpladeLoss(EmbeddingLoss):
    """SPLADE's loss, composed as sentence-transformers' SpladeLoss is: ``inner``, any ranking loss of
    the sparse vectors, plus the FLOPS regulariser of the queries (the anchors) and of the documents,
    weighted by ``query_weight`` and ``document_weight`` (0 turns one off), each weight reached by a
    quadratic warm-up over ``warmup`` training steps (``step`` counts them)."""

    def __init__(self, inner: EmbeddingLoss, *, query_weight: float, document_weight: float,
                 warmup: int) -> None:
        self.inner, self.query_weight, self.document_weight = inner, query_weight, document_weight
        self.warmup = warmup
        self.seen = 0  # training steps taken, for the warm-up (a resumed run warms up again)

    def step(self) -> None:
        self.seen += 1

    def regulariser(self, W: torch.Tensor, b: PairBatch) -> torch.Tensor:
        """The warmed-up FLOPS term of the batch's sparse vectors ``W`` (n, V)."""
        q, d = W[b.part == 0], W[b.part > 0]
        ramp = min(1.0, (self.seen / self.warmup) ** 2) if self.warmup > 0 else 1.0
        return ramp * (self.query_weight * flops(q) + self.document_weight * flops(d))

    def terms(self, E: torch.Tensor, b: PairBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(the ranking loss, the regulariser) of the batch: their sum is the loss."""
        return self.inner(E, b), self.regulariser(E, b)

    def __call__(self, E: torch.Tensor, b: PairBatch) -> torch.Tensor:
        ranking, reg = self.terms(E, b)
        return ranking + reg
