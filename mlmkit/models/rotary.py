"""Rotary position embeddings (Su et al. 2021, "RoFormer"), shared by every family that has them.

A rotary family has no position table (``Family.positions`` "none"): each attention layer turns
its queries and keys by angles that grow with the position, so q . k depends on the distance
between them. Only the plain rotary is here (transformers' rope_type "default": the two halves of
a head rotate together, base ``theta``, no scaling); a family reads its own config keys for the base
(ModernBERT's rope_parameters / global_rope_theta ...) and calls these.

Both functions take a traced length as well as an int, so one exported graph serves every length:
the angles come from an arange of the runtime length, never a slice of a table by a size (which the
ONNX tracer would freeze).
"""

from __future__ import annotations

import torch


def rotary(T: torch.Tensor | int, head_dim: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (T, head_dim) in float32 for positions 0 .. T-1; T may be a traced size (export)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))  # (hd/2,)
    freqs = torch.arange(T, device=device).float()[:, None] * inv_freq[None, :]  # (T, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, hd): the two halves rotate together
    return emb.cos(), emb.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, nh, T, hd) rotated by its positions' angles, computed in float32 as transformers does."""
    xf = x.float()
    first, second = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat((-second, first), dim=-1) * sin).to(x.dtype)
