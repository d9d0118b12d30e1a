"""ModernBERT's sliding-window attention (models/modernbert.py's local layers): a query sees the keys
within ``half`` positions on each side, both ends included. Short inputs take the plain T x T product
under a band mask (``window_mask``); longer ones are computed in blocks of half a window against their
own window of keys (``local_blocks``), O(T x window). ``window_plan`` picks the form once per forward,
``local_attend`` attends by it. Every size is computed from the runtime lengths, so one exported graph
serves every length.
"""

from __future__ import annotations

from typing import NamedTuple, TypeAlias

import torch
from torch import nn

from mlmkit.models.core import attend

__all__ = ["FAR", "PLAIN_UP_TO", "Size", "Window", "local_attend", "local_blocks", "window_mask",
           "window_plan"]

FAR = -10000.0  # the additive mask value of core.extended_mask: finite, so no row turns into NaN


def window_mask(T: torch.Tensor | int, Tq: torch.Tensor | int, half: int, device: torch.device,
                dtype: torch.dtype) -> torch.Tensor:
    """(Tq, T) additive mask of a sliding-window layer for the first Tq queries: 0 where |i - j| <=
    ``half``, FAR beyond. Built from the runtime lengths (aranges, no slicing by a size, which the
    tracer would freeze), so one exported graph serves every length."""
    # (Tq, T)
    far = (torch.arange(Tq, device=device)[:, None] - torch.arange(T, device=device)[None, :]).abs() > half
    return far.to(dtype) * FAR


PLAIN_UP_TO = 6  # eager mode: the plain form up to this many half-windows (window_plan)
# a length: a Python int in eager mode, a 0-d tensor while tracing (export)
Size: TypeAlias = int | torch.Tensor


def _minimum(a: Size, b: Size) -> Size:
    """min(a, b) of two lengths without a Python comparison of traced ones (which would freeze)."""
    if isinstance(a, torch.Tensor):
        return torch.clamp(a, max=b)
    if isinstance(b, torch.Tensor):
        return torch.clamp(b, max=a)
    return min(a, b)


def local_blocks(Tq: Size, T: Size, half: int, device: torch.device, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The blocks of a sliding-window layer, for the first ``Tq`` of ``T`` positions as queries:
    query blocks of ``bq`` positions, each with one key window of ``W`` positions that holds every key
    within ``half`` of its queries, so the attention costs O(Tq x W), not O(Tq x T).

    bq is ``half`` (ModernBERT's 64), and W = bq + 2 half (192); a short input (T <= 3 half) is one
    block of all Tq queries against W = min(Tq + 2 half, T) keys: the whole sequence, the plain form's
    work. Nothing is padded: the last query block and the key windows near the ends are shifted
    (clamped) to lie inside the sequence, so the last block may overlap the one before it, and W <= T.

    Returns qidx (nb, bq) and kidx (nb, W), the positions of each block's queries and keys; oidx (Tq,),
    the row of query i among the nb x bq rows the blocks compute; band (nb, bq, W), the additive mask
    (0 where |i - j| <= half, FAR beyond). Eager mode computes the sizes with Python ints; under the
    ONNX tracer ``T`` and ``Tq`` are 0-d tensors and every size here is a graph op on them (no
    comparison or branch in Python), so one exported graph serves every length."""
    b, span = half, 3 * half
    # traced: the choice is a Where in the graph
    if isinstance(T, torch.Tensor) or isinstance(Tq, torch.Tensor):
        T_t, Tq_t = (n if isinstance(n, torch.Tensor) else torch.full((), n, dtype=torch.long, device=device)
                     for n in (T, Tq))
        bq = torch.where(T_t <= span, Tq_t, torch.clamp(Tq_t, max=b))
    else:
        bq = Tq if T <= span else min(b, Tq)
    nb = (Tq + bq - 1) // bq  # ceil(Tq / bq)
    W = _minimum(bq + 2 * half, T)
    # (nb,): the last block ends at Tq
    qstart = torch.clamp(torch.arange(nb, device=device) * bq, max=Tq - bq)
    kstart = torch.clamp(qstart - half, min=0)
    # (nb,): the window [qstart - half, qstart + bq - 1 + half], inside [0, T)
    kstart = torch.clamp(kstart, max=T - W)
    qidx = qstart[:, None] + torch.arange(bq, device=device)[None, :]  # (nb, bq)
    kidx = kstart[:, None] + torch.arange(W, device=device)[None, :]  # (nb, W)
    i = torch.arange(Tq, device=device)
    last = (nb - 1) * bq  # queries from here on are the last block's, which starts at Tq - bq
    oidx = i + (i >= last).long() * (nb * bq - Tq)  # (Tq,)
    band = ((qidx[:, :, None] - kidx[:, None, :]).abs() > half).to(dtype) * FAR  # (nb, bq, W)
    return qidx, kidx, oidx, band


class Window(NamedTuple):
    """How a local layer attends, for one forward: ``mask`` the whole additive mask (padding + band);
    with ``qidx`` None the plain form (mask (B, 1, Tq, T)), else the blocks of ``local_blocks``
    (mask (B, 1, nb, bq, W), and their qidx, kidx, oidx)."""

    mask: torch.Tensor
    qidx: torch.Tensor | None = None
    kidx: torch.Tensor | None = None
    oidx: torch.Tensor | None = None


def window_plan(mask: torch.Tensor, half: int, Tq: Size, T: Size) -> Window:
    """The local attention of the first ``Tq`` of ``T`` positions under ``mask`` (B, 1, 1, T), the
    additive padding mask; ``Tq`` and ``T`` as the caller has them from its inputs (sizes of unbind's
    outputs freeze in the ONNX trace). Once per forward for all the local layers (layer_context).

    In eager mode an input of up to PLAIN_UP_TO half-windows (384 tokens at ModernBERT's window) takes
    the plain form, ``attend`` with the band mask: up to 3 half it is what the blocks compute (one
    block, the whole sequence) without their index copies, and up to 6 half SDPA's fused kernel on
    the whole product was measured as fast as the blocks forward and faster forward + backward (the
    blocks' copies scatter back; 2 CPU threads, 12 heads of 32). A traced graph always has the blocks,
    which reduce to one block of the whole sequence up to 3 half (in onnxruntime the plain product and
    the blocks were measured alike at 4 and 6 half, the blocks faster from 8 half on)."""
    if not isinstance(T, torch.Tensor) and not isinstance(Tq, torch.Tensor) and T <= PLAIN_UP_TO * half:
        return Window(mask + window_mask(T, Tq, half, mask.device, mask.dtype))  # (B, 1, Tq, T)
    qidx, kidx, oidx, band = local_blocks(Tq, T, half, mask.device, mask.dtype)
    # mask (B, 1, nb, bq, W)
    return Window(band + mask[:, :, 0][:, :, kidx][:, :, :, None, :], qidx, kidx, oidx)


def local_attend(m: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 plan: Window) -> torch.Tensor:
    """Sliding-window attention of q (B, nh, Tq, hd), the first Tq positions, over k, v (B, nh, T, hd)
    as ``plan`` says. Returns (B, nh, Tq, hd), what ``attend`` with ``mask + window_mask`` gives at
    every real query (a padding query, whose row nothing reads, sees only its window)."""
    if plan.qidx is None:
        return attend(m, q, k, v, plan.mask)
    # SDPA's fused kernels take 4-D only (5-D runs its math form, 3x slower): the blocks into the batch
    if m.impl == "sdpa":
        qb, kb, vb = (t.transpose(1, 2)[:, i].transpose(2, 3).flatten(0, 1)
                      for t, i in ((q, plan.qidx), (k, plan.kidx), (v, plan.kidx)))
        # (B nb, nh, bq, hd); mask (B nb, 1, bq, W)
        out = attend(m, qb, kb, vb, plan.mask.transpose(1, 2).flatten(0, 1))
        out = out.unflatten(0, (q.size(0), -1)).transpose(1, 2)  # (B, nh, nb, bq, hd)
    else:  # the exported form: onnxruntime's MatMul takes the 5-D blocks as they are gathered
        # (B, nh, nb, bq, hd), (B, nh, nb, W, hd) x 2
        qb, kb, vb = q[:, :, plan.qidx], k[:, :, plan.kidx], v[:, :, plan.kidx]
        out = attend(m, qb, kb, vb, plan.mask)  # (B, nh, nb, bq, hd)
    return out.flatten(2, 3)[:, :, plan.oidx]  # (B, nh, Tq, hd)
