"""How a batch's embeddings are computed for an embedding loss: all at once (``direct``), or
GradCache-style in mini-batches (``cached``), which gives the same loss and the same gradients in the
memory of one mini-batch; and ``DistributedLoss``, a loss over the global batch under torchrun.

GradCache:

1. embed every mini-batch without a graph, saving each one's RNG state (dropout);
2. compute the loss on the detached embeddings, and its gradient with respect to them;
3. in backward, embed each mini-batch again from its saved RNG state, with a graph, and push the
   saved gradient through it (times the gradient the loss receives, e.g. 1 / grad_accum).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from mlmkit.models.pooled import PairBatch
from mlmkit.train.losses.base import EmbeddingLoss

Embed = Callable[[torch.Tensor], torch.Tensor]
"""Feature indices (n,) -> their embeddings (n, H), with a graph where grad is enabled."""


class DistributedLoss(EmbeddingLoss):
    """``inner`` over the global batch under torchrun: every rank's embeddings gathered (in rank order,
    its examples renumbered after the previous ranks'), the gradient flowing back to each rank's own
    rows. Each rank then computes the same loss, d(loss)/d(own rows) arrives world-size times (one from
    every rank's copy), and DistributedDataParallel's averaging makes the parameters' gradients those
    of one process over the whole batch. One process: ``inner`` itself."""

    def __init__(self, inner: EmbeddingLoss) -> None:
        self.inner = inner

    def __call__(self, E: torch.Tensor, b: PairBatch) -> torch.Tensor:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return self.inner(E, b)
        from torch.distributed.nn.functional import all_gather

        world = dist.get_world_size()
        n = torch.tensor([len(E)], device=E.device)
        sizes = [torch.zeros_like(n) for _ in range(world)]
        dist.all_gather(sizes, n)
        rows = [int(s) for s in sizes]
        most = max(rows)
        pad = most - len(E)

        def padded(x: torch.Tensor) -> torch.Tensor:
            return torch.cat([x, x.new_zeros((pad, *x.shape[1:]))]) if pad else x

        Es = all_gather(padded(E))  # with gradients back to each rank's own rows
        meta = torch.stack([b.example, b.part, b.text_id]).T.contiguous()  # (n, 3) int64
        metas = [torch.zeros((most, 3), dtype=meta.dtype, device=meta.device) for _ in range(world)]
        dist.all_gather(metas, padded(meta))
        scores = [torch.zeros(most, dtype=b.score.dtype, device=b.score.device) for _ in range(world)]
        dist.all_gather(scores, padded(b.score))
        targets = None
        if b.target is not None:
            t = b.target
            targets = [torch.zeros((most, t.shape[1]), dtype=t.dtype, device=t.device) for _ in range(world)]
            dist.all_gather(targets, padded(t.contiguous()))
        offset, ex = 0, []
        for m, r in zip(metas, rows):
            ex.append(m[:r, 0] + offset)
            offset += int(m[:r, 0].max()) + 1 if r else 0
        glob = PairBatch(torch.cat(ex), torch.cat([m[:r, 1] for m, r in zip(metas, rows)]),
                         torch.cat([m[:r, 2] for m, r in zip(metas, rows)]),
                         torch.cat([s[:r] for s, r in zip(scores, rows)]),
                         torch.cat([t[:r] for t, r in zip(targets, rows)]) if targets is not None else None)
        return self.inner(torch.cat([e[:r] for e, r in zip(Es, rows)]), glob)


def direct(embed: Embed, n: int, loss: Callable[[torch.Tensor], torch.Tensor],
           lengths: torch.Tensor | None = None, pieces: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
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
