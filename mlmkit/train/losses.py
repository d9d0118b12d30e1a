"""Losses of embedding and ranking training: plain functions, one interface each.

Each loss a user can name is declared once in the loss registry (mlmkit.objectives: its name, kind
and data); its function here is registered with ``@implements`` under the function's name, and
``build_loss`` makes it from the registry's entry. Plugins reach these through mlmkit.model.

A loss is a function of a batch's embeddings ``E`` (F, H), one row per feature, and its ``PairBatch``
(which example each feature belongs to, and which column of it: 0 the anchor, 1 the positive, 2.. the
hard negatives; the gold score of scored pairs). How the embeddings are computed is the other half:
all at once (``direct``), or GradCache-style in mini-batches (``cached``), which gives the same loss
and the same gradients in the memory of one mini-batch:

1. embed every mini-batch without a graph, saving each one's RNG state (dropout);
2. compute the loss on the detached embeddings, and its gradient with respect to them;
3. in backward, embed each mini-batch again from its saved RNG state, with a graph, and push the
   saved gradient through it (times the gradient the loss receives, e.g. 1 / grad_accum).

Texts that are equal (the same token ids: ``text_id``) are never each other's negatives: a candidate
with the positive's text is masked out of the softmax, so a duplicate in a batch is no false negative.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import TypeVar

import torch
import torch.nn.functional as F

from mlmkit.errors import ConfigError
from mlmkit.models.pooled import PairBatch
from mlmkit.objectives import Loss

EmbeddingLoss = Callable[[torch.Tensor, PairBatch], torch.Tensor]
Similarity = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(a (n, H), b (m, H)) -> (n, m): every row of ``a`` against every row of ``b``."""
Embed = Callable[[torch.Tensor], torch.Tensor]
"""Feature indices (n,) -> their embeddings (n, H), with a graph where grad is enabled."""


Factory = TypeVar("Factory", bound=Callable[..., Callable[..., torch.Tensor]])
IMPLEMENTATIONS: dict[str, Callable[..., Callable[..., torch.Tensor]]] = {}
"""function name -> the factory of a loss (the registry's ``Loss.function``): ``implements`` adds to it."""


def implements(factory: Factory) -> Factory:
    """Register ``factory`` (options -> a loss function) as the implementation named after it."""
    have = IMPLEMENTATIONS.get(factory.__name__)
    if have is not None and have is not factory:
        raise ValueError(f"a loss implementation named {factory.__name__!r} is registered already")
    IMPLEMENTATIONS[factory.__name__] = factory
    return factory


def build_loss(loss: Loss, **options: object) -> Callable[..., torch.Tensor]:
    """The loss function of the registry's ``loss``, made with ``options`` (scale, max_label ...; an
    embedding loss ignores the options it has no use for)."""
    factory = IMPLEMENTATIONS.get(loss.function)
    if factory is None:
        raise ConfigError(f"the {loss.kind} loss {loss.name!r} has no implementation {loss.function!r}",
                          "import the module that defines it (with @implements) before the model is built")
    return factory(**options)


def _rows(b: PairBatch, part: int) -> torch.Tensor:
    """Indices of the features of column ``part``, ordered by example (one per example)."""
    idx = (b.part == part).nonzero().squeeze(1)
    return idx[torch.argsort(b.example[idx], stable=True)]


def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T


def _similarity(dot: bool, similarity: Similarity | None) -> Similarity:
    return similarity if similarity is not None else (lambda a, b: a @ b.T) if dot else _cos


@implements
def mnrl(scale: float = 20.0, symmetric: bool = False, dot: bool = False, similarity: Similarity | None = None,
         **_: object) -> EmbeddingLoss:
    """Multiple negatives ranking (InfoNCE): each anchor against every positive and hard negative of
    the batch, its own positive the target, cosine times ``scale`` (20: temperature 0.05), or the dot
    product times ``scale`` with ``dot`` (sparse vectors: SPLADE's similarity), or ``similarity``
    times ``scale`` (late interaction's MaxSim).
    ``symmetric`` adds the positive -> anchor direction and averages the two."""
    sim = _similarity(dot, similarity)

    def loss(E: torch.Tensor, b: PairBatch) -> torch.Tensor:
        a, p = _rows(b, 0), _rows(b, 1)
        if len(a) != len(p) or not len(a):
            raise ValueError("every example needs an anchor and a positive")
        cand = torch.cat([p, (b.part >= 2).nonzero().squeeze(1)])
        n = len(a)
        target = torch.arange(n, device=E.device)
        # a candidate with the same text as the anchor's positive is not a negative (but the positive is)
        same = b.text_id[cand][None, :] == b.text_id[p][:, None]  # (n, n + negatives)
        same[target, target] = False
        s = (scale * sim(E[a], E[cand])).masked_fill(same, -math.inf)
        out = F.cross_entropy(s, target)
        if symmetric:  # each positive against the anchors, its own anchor the target
            same_anchor = b.text_id[a][None, :] == b.text_id[a][:, None]
            same_anchor[target, target] = False
            back = (scale * sim(E[p], E[a])).masked_fill(same_anchor, -math.inf)
            out = (out + F.cross_entropy(back, target)) / 2
        return out

    return loss


@implements
def margin_mse(similarity: Similarity | None = None, **_: object) -> EmbeddingLoss:
    """MarginMSE (TAS-B): for every negative of an example, the student's margin dot(a, p) - dot(a, n)
    regressed on the teacher's, score(p) - score(n) (the rows' scores), the squared errors averaged.
    Dot products, as the teacher scores are raw (a cross-encoder's logits, a retriever's scores), or
    ``similarity`` (late interaction's MaxSim)."""

    def loss(E: torch.Tensor, b: PairBatch) -> torch.Tensor:
        a, p = _rows(b, 0), _rows(b, 1)
        neg = (b.part >= 2).nonzero().squeeze(1)
        if len(a) != len(p) or not len(neg):
            raise ValueError("margin-mse needs an anchor, a positive and negatives per example")
        row = torch.searchsorted(b.example[a].contiguous(), b.example[neg].contiguous())  # each negative's example
        ai, pi = a[row], p[row]
        if similarity is None:
            student = (E[ai] * E[pi]).sum(-1) - (E[ai] * E[neg]).sum(-1)
        else:  # each anchor against its own candidates only
            s = similarity(E[a], E[torch.cat([p, neg])])  # (examples, examples + negatives)
            student = s[row, row] - s[row, len(p) + torch.arange(len(neg), device=E.device)]
        return F.mse_loss(student, (b.score[pi] - b.score[neg]).to(student.dtype))

    return loss


@implements
def kl_distill(scale: float = 1.0, dot: bool = False, similarity: Similarity | None = None, temperature: float = 1.0,
               **_: object) -> EmbeddingLoss:
    """Distillation of a teacher's ranking (ColBERTv2): over each example's candidates (its positive
    and hard negatives), the KL divergence from the softmax of the teacher's scores (the rows' scores)
    to that of the student's (``similarity``, the dot product with ``dot``, else the cosine, times
    ``scale``), both divided by ``temperature``; the batch's mean, times temperature squared."""
    sim = _similarity(dot, similarity)

    def loss(E: torch.Tensor, b: PairBatch) -> torch.Tensor:
        a = _rows(b, 0)
        cand = (b.part >= 1).nonzero().squeeze(1)
        if not len(a) or not len(cand):
            raise ValueError("kl-distill needs an anchor and scored candidates per example")
        own = b.example[cand][None, :] == b.example[a][:, None]  # (examples, candidates): each example's own
        student = (scale * sim(E[a], E[cand]) / temperature).masked_fill(~own, -math.inf)
        teacher = (b.score[cand][None, :].to(student.dtype) / temperature).expand_as(student).masked_fill(~own, -math.inf)
        log_s, log_t = F.log_softmax(student, dim=-1), F.log_softmax(teacher, dim=-1)
        kl = torch.where(own, log_t.exp() * (log_t - log_s), torch.zeros_like(log_s)).sum(-1)
        return kl.mean() * temperature ** 2

    return loss


@implements
def mse_distill(project: Callable[[torch.Tensor], torch.Tensor] | None = None, **_: object) -> EmbeddingLoss:
    """Every text's embedding toward the teacher's (``PairBatch.target``): the mean squared error over
    their components; ``project`` maps the student's dimension to the teacher's where they differ."""

    def loss(E: torch.Tensor, b: PairBatch) -> torch.Tensor:
        if b.target is None:
            raise ValueError("mse-distill needs the teacher's embedding of every text")
        S = project(E) if project is not None else E
        return F.mse_loss(S, b.target.to(S.dtype))

    return loss


@implements
def cosent(scale: float = 20.0, **_: object) -> EmbeddingLoss:
    """CoSENT for scored pairs: log(1 + sum over pairs (i, j) with gold_i > gold_j of
    exp(scale * (cos_j - cos_i))), so the cosines are ordered as the gold scores are."""

    def loss(E: torch.Tensor, b: PairBatch) -> torch.Tensor:
        a, p = _rows(b, 0), _rows(b, 1)
        cos = (F.normalize(E[a], dim=-1) * F.normalize(E[p], dim=-1)).sum(-1) * scale  # (n,)
        gold = b.score[a]
        diff = cos[None, :] - cos[:, None]  # (i, j): cos_j - cos_i
        diff = diff.masked_fill(~(gold[:, None] > gold[None, :]), -math.inf)
        return torch.logsumexp(torch.cat([torch.zeros(1, device=E.device, dtype=diff.dtype), diff.flatten()]), dim=0)

    return loss


def matryoshka(inner: EmbeddingLoss, dims: Sequence[int], weights: Sequence[float] | None = None) -> EmbeddingLoss:
    """``inner`` on the first d dimensions of the embeddings for each d of ``dims``, weighted: the
    leading dimensions carry a usable embedding by themselves (what the `dimensions` request field cuts)."""
    w = list(weights) if weights else [1.0] * len(dims)

    def loss(E: torch.Tensor, b: PairBatch) -> torch.Tensor:  # a teacher's vectors (mse-distill) are cut alike
        return sum(wi * inner(E[:, :d], b if b.target is None else replace(b, target=b.target[:, :d]))
                   for d, wi in zip(dims, w))

    return loss


def distributed(inner: EmbeddingLoss) -> EmbeddingLoss:
    """``inner`` over the global batch under torchrun: every rank's embeddings gathered (in rank order,
    its examples renumbered after the previous ranks'), the gradient flowing back to each rank's own
    rows. Each rank then computes the same loss, d(loss)/d(own rows) arrives world-size times (one from
    every rank's copy), and DistributedDataParallel's averaging makes the parameters' gradients those
    of one process over the whole batch. One process: ``inner`` itself."""

    def loss(E: torch.Tensor, b: PairBatch) -> torch.Tensor:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return inner(E, b)
        from torch.distributed.nn.functional import all_gather

        world = dist.get_world_size()
        n = torch.tensor([len(E)], device=E.device)
        sizes = [torch.zeros_like(n) for _ in range(world)]
        dist.all_gather(sizes, n)
        rows = [int(s) for s in sizes]
        pad = max(rows) - len(E)

        def padded(x: torch.Tensor) -> torch.Tensor:
            return torch.cat([x, x.new_zeros((pad, *x.shape[1:]))]) if pad else x

        Es = all_gather(padded(E))  # with gradients back to each rank's own rows
        meta = torch.stack([b.example, b.part, b.text_id]).T.contiguous()  # (n, 3) int64
        metas = [torch.zeros((max(rows), 3), dtype=meta.dtype, device=meta.device) for _ in range(world)]
        dist.all_gather(metas, padded(meta))
        scores = [torch.zeros(max(rows), dtype=b.score.dtype, device=b.score.device) for _ in range(world)]
        dist.all_gather(scores, padded(b.score))
        targets = None
        if b.target is not None:
            targets = [torch.zeros((max(rows), b.target.shape[1]), dtype=b.target.dtype, device=b.target.device)
                       for _ in range(world)]
            dist.all_gather(targets, padded(b.target.contiguous()))
        offset, ex = 0, []
        for m, r in zip(metas, rows):
            ex.append(m[:r, 0] + offset)
            offset += int(m[:r, 0].max()) + 1 if r else 0
        glob = PairBatch(torch.cat(ex), torch.cat([m[:r, 1] for m, r in zip(metas, rows)]),
                         torch.cat([m[:r, 2] for m, r in zip(metas, rows)]),
                         torch.cat([s[:r] for s, r in zip(scores, rows)]),
                         torch.cat([t[:r] for t, r in zip(targets, rows)]) if targets is not None else None)
        return inner(torch.cat([e[:r] for e, r in zip(Es, rows)]), glob)

    return loss


def flops(X: torch.Tensor) -> torch.Tensor:
    """SPLADE's FLOPS regulariser of a batch of sparse vectors (n, V): the sum over the vocabulary of
    the squared mean weight, the expected cost of a dot product with an inverted index."""
    return (X.mean(0) ** 2).sum()


# ---- computing the embeddings -------------------------------------------------------------------------
def direct(embed: Embed, n: int, loss: Callable[[torch.Tensor], torch.Tensor], lengths: torch.Tensor | None = None,
           pieces: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """(the loss, the embeddings) of all ``n`` features, with one graph. With ``lengths`` (tokens per
    feature) they are embedded in ``pieces`` groups of similar length, each padded to its own
    longest: a batch of short queries and long documents is not all padded to the longest document."""
    if lengths is None or n < 2 * pieces:
        E = embed(torch.arange(n))
        return loss(E), E
    order = torch.argsort(lengths.cpu(), stable=True)
    parts = torch.cat([embed(idx) for idx in order.tensor_split(pieces)])
    E = parts[torch.argsort(order).to(parts.device)]  # back in feature order
    return loss(E), E


class _Rng:
    """The RNG state one mini-batch was embedded with, to embed it again with the same dropout."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    def replay(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        with torch.random.fork_rng(devices=[self.device] if self.cuda is not None else []):
            torch.set_rng_state(self.cpu)
            if self.cuda is not None:
                torch.cuda.set_rng_state(self.cuda, self.device)
            return fn()


def cached(embed: Embed, n: int, loss: Callable[[torch.Tensor], torch.Tensor], mini_batch_size: int,
           device: torch.device, lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``direct``'s loss with its gradients, computed GradCache-style (the module docstring), and the
    embeddings (without a graph); memory holds the graph of one mini-batch, not of ``n`` features.
    With ``lengths`` (tokens per feature) the mini-batches are cut from the features sorted by
    length, so each is padded only to its own longest: less memory and time, the same loss."""
    order = torch.argsort(lengths.cpu(), stable=True) if lengths is not None else torch.arange(n)
    chunks = list(order.split(mini_batch_size))
    rngs, reps = [], []
    with torch.no_grad():
        for c in chunks:
            rngs.append(_Rng(device))
            reps.append(embed(c))
    E = torch.empty((n, reps[0].shape[1]), dtype=reps[0].dtype, device=reps[0].device)
    E[order.to(E.device)] = torch.cat(reps)  # back in feature order
    E.requires_grad_()
    with torch.enable_grad():
        value = loss(E)
        (grad,) = torch.autograd.grad(value, E)
    out = value.detach().requires_grad_()

    def backward(g: torch.Tensor) -> None:  # g: d(final objective) / d(loss), e.g. 1 / grad_accum
        for c, rng in zip(chunks, rngs):
            with torch.enable_grad():
                e = rng.replay(partial(embed, c))
            e.backward(grad[c.to(grad.device)] * g)

    out.register_hook(backward)
    return out, E.detach()


# ---- reranking: a cross-encoder's scores of a query's candidates ---------------------------------------
RankLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(scores (n,), gold labels (n,), group (n,): the query of each candidate, 0.. within the batch) -> the loss."""


def _groups(group: torch.Tensor) -> list[torch.Tensor]:
    """The candidate indices of each query of the batch."""
    return [(group == g).nonzero().squeeze(1) for g in torch.unique(group)]


@implements
def rank_bce(max_label: float = 1.0) -> RankLoss:
    """Pointwise: binary cross-entropy of sigmoid(score) against label / max_label (graded labels
    become soft targets)."""

    def loss(s: torch.Tensor, y: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(s, y / max_label)

    return loss


@implements
def rank_mnrl(max_label: float = 1.0) -> RankLoss:
    """For every relevant candidate (label > 0) of a query: its softmax cross-entropy against the
    query's irrelevant ones (label 0), averaged over the relevant candidates."""

    def loss(s: torch.Tensor, y: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        terms = []
        for idx in _groups(group):
            ys, ss = y[idx], s[idx]
            neg = ss[ys <= 0]
            for p in ss[ys > 0]:
                terms.append(torch.logsumexp(torch.cat([p[None], neg]), 0) - p)
        return torch.stack(terms).mean() if terms else s.sum() * 0.0

    return loss


@implements
def rank_listnet(max_label: float = 1.0) -> RankLoss:
    """ListNet: per query, the cross-entropy of the softmax of the scores against the softmax of the
    labels, averaged over the queries."""

    def loss(s: torch.Tensor, y: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        return torch.stack([-(torch.softmax(y[idx], 0) * torch.log_softmax(s[idx], 0)).sum() for idx in _groups(group)]).mean()

    return loss


@implements
def rank_lambda(max_label: float = 1.0) -> RankLoss:
    """LambdaRank with NDCG weights: per query, over the pairs (i, j) with label_i > label_j,
    |delta NDCG_ij| x log(1 + exp(-(s_i - s_j))), where delta NDCG_ij is the change of NDCG (gains
    2^label - 1, the current ranks by score) from swapping i and j; summed per query, averaged over queries."""

    def loss(s: torch.Tensor, y: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        out = []
        for idx in _groups(group):
            ys, ss = y[idx], s[idx]
            gain = torch.pow(2.0, ys) - 1.0
            ideal = (torch.sort(gain, descending=True).values / torch.log2(torch.arange(len(ys), device=s.device) + 2.0)).sum()
            rank = torch.empty_like(ss)
            rank[torch.argsort(ss.detach(), descending=True)] = torch.arange(len(ss), device=s.device, dtype=ss.dtype)
            disc = 1.0 / torch.log2(rank + 2.0)
            better = ys[:, None] > ys[None, :]
            delta = ((gain[:, None] - gain[None, :]) * (disc[:, None] - disc[None, :])).abs() / ideal.clamp_min(1e-12)
            pair = F.softplus(-(ss[:, None] - ss[None, :]))
            out.append((delta * pair)[better].sum())
        return torch.stack(out).mean()

    return loss
