"""Rotary position embeddings (Su et al. 2021, "RoFormer"), shared by every family that has them.

A rotary family has no position table (``Family.positions`` "none"): each attention layer turns
its queries and keys by angles that grow with the position, so q . k depends on the distance
between them. Two forms:

- ``rotary`` / ``rotate``: the plain rotary (transformers' rope_type "default": the two halves of
  a head rotate together, base ``theta``, no scaling), ModernBERT's; the family reads its own
  config keys for the base (rope_parameters / global_rope_theta ...) and calls these;
- ``Rope``: one layer stack's rotary as a config states it, for the families whose configs allow
  more (GTE, NomicBERT, jina-embeddings-v3, models/rotary_bert.py): a partial rotary (only the
  first ``dim`` of each head's dimensions turn, the rest pass through: NomicBERT's
  ``rotary_emb_fraction``), the interleaved layout (dimensions 2i and 2i + 1 turn together, as
  flash-attn's ``interleaved`` rotary, NomicBERT's ``rotary_emb_interleaved``) besides the
  half-split one, and transformers' "linear" (positions divided by ``factor``) and "dynamic"
  (NTK-aware: the base grows with the input's length beyond ``trained`` positions) scalings.
  ``rope_config`` reads transformers' ``rope_parameters`` (and the legacy ``rope_scaling`` /
  ``rope_theta``) into one, refusing the rope types these families never run.

Both forms take a traced length as well as an int, so one exported graph serves every length:
the angles come from an arange of the runtime length, never a slice of a table by a size (which the
ONNX tracer would freeze), and the dynamic base is a graph op on that length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from mlmkit.errors import ConfigError
from mlmkit.registry import HFConfig

ROPE_TYPES = ("default", "linear", "dynamic")  # what Rope computes of transformers' ROPE_INIT_FUNCTIONS


def rotary(T: torch.Tensor | int, head_dim: int, theta: float, device: torch.device) -> tuple[torch.Tensor,
                                                                                              torch.Tensor]:
    """cos, sin (T, head_dim) in float32 for positions 0 .. T-1; T may be a traced size (export)."""
    # (hd/2,)
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    freqs = torch.arange(T, device=device).float()[:, None] * inv_freq[None, :]  # (T, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, hd): the two halves rotate together
    return emb.cos(), emb.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """x (B, nh, T, hd) rotated by its positions' angles (cos, sin: (T, d), d <= hd), computed in
    float32 as transformers does. The first d dimensions turn (a partial rotary when d < hd; the
    rest pass through); ``interleaved``: dimensions 2i and 2i + 1 turn together (cos, sin then
    repeat each angle twice in a row), else dimensions i and i + d/2."""
    xf = x.float()
    d = cos.size(-1)
    part, rest = (xf, None) if d == x.size(-1) else (xf[..., :d], xf[..., d:])
    if interleaved:
        pairs = part.unflatten(-1, (-1, 2))  # (..., d/2, 2)
        turned = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    else:
        first, second = part.chunk(2, dim=-1)
        turned = torch.cat((-second, first), dim=-1)
    out = part * cos + turned * sin
    return (out if rest is None else torch.cat((out, rest), dim=-1)).to(x.dtype)


@dataclass(frozen=True)
class Rope:
    """The rotary of a layer stack: base ``theta`` over the first ``dim`` dimensions of each head
    (all of them unless partial), ``interleaved`` or half-split pairs, and a ``scaling``:
    "default" (none), "linear" (transformers': inverse frequencies divided by ``factor``) or
    "dynamic" (transformers' NTK-aware "dynamic": at an input of T > ``trained`` positions the base
    becomes theta * (factor T / trained - (factor - 1)) ** (dim / (dim - 2)), as NomicBERT's
    ``rotary_scaling_factor`` does too). transformers keeps the grown base across calls until an
    input shorter than ``trained`` comes (a state of the module); here each input's own length
    decides, what transformers gives on a fresh model."""

    theta: float
    dim: int
    interleaved: bool = False
    scaling: str = "default"
    factor: float = 1.0
    trained: int = 0

    def inv_freq(self, T: torch.Tensor | int, device: torch.device) -> torch.Tensor:
        """(dim/2,) float32 inverse frequencies for an input of T positions (T may be traced)."""
        exponents = torch.arange(0, self.dim, 2, dtype=torch.float32, device=device) / self.dim
        base: torch.Tensor | float = self.theta
        if self.scaling == "dynamic":  # transformers' _compute_dynamic_ntk_parameters, in float32 as there
            n = T if isinstance(T, torch.Tensor) else torch.tensor(T, device=device)
            n = torch.clamp(n.to(device=device, dtype=torch.long), min=self.trained)
            base = self.theta * ((self.factor * n / self.trained)
                                 - (self.factor - 1)) ** (self.dim / (self.dim - 2))
        inv = 1.0 / (base ** exponents)
        return inv / self.factor if self.scaling == "linear" else inv

    def angles(self, T: torch.Tensor | int, device: torch.device, *, length: torch.Tensor | int | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (T, dim) float32 for positions 0 .. T-1, the base of an input of ``length``
        positions (T's own by default: the dynamic base is the whole input's, also for the queries
        of its first positions alone)."""
        freqs = torch.arange(T, device=device).float()[:, None] * self.inv_freq(T if length is None
                                                                                else length, device)[None, :]
        # interleaved: each angle twice in a row (a stack, which exports at any length; repeat_interleave does
        # not) (T, dim)
        emb = torch.stack((freqs, freqs),
                          dim=-1).flatten(-2) if self.interleaved else torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def _number(v: Any, what: str, family: str, *, least: float = 0.0) -> float:
    """A finite number above 0 (``least`` 0) or at least ``least``."""
    # NaN too
    if isinstance(v, bool) or not isinstance(v, int | float) or not (v >= least if least else v
                                                                     > 0) or not v < math.inf:
        bound = f"at least {least:g}" if least else "above 0"
        raise ConfigError(f"config {what} of {family} must be a number {bound}, got {v!r}",
                          "fix the config.json")
    return float(v)


def rope_config(extra: HFConfig, *, family: str, head_dim: int, max_positions: int,
                default_theta: float) -> Rope:
    """The rotary transformers' rotary embedding of ``family`` computes from a config's
    ``rope_parameters`` (a legacy ``rope_scaling`` object replacing it, as transformers reads it; a
    top-level ``rope_theta`` where it names none), else the family's ``default_theta``. The rope
    types "default", "linear" and "dynamic" run (the last two with ``factor``; "dynamic" grows the
    base past ``max_positions``); the others (yarn, longrope, llama3, ...) are refused, and so is
    a ``partial_rotary_factor`` below 1, which transformers ignores under "default" and cannot
    run under the others for these families (its angles would not match the heads)."""
    params = extra.get("rope_scaling") or extra.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise ConfigError(f"config rope_parameters must be an object, got {params!r}", "fix the config.json")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ConfigError(f"rope type {kind!r} is not supported for {family}",
                          f"mlmkit runs {family}'s rotary embeddings with rope_type "
                          f"{', '.join(map(repr, ROPE_TYPES))}")
    theta = params.get("rope_theta", extra.get("rope_theta", default_theta))
    theta = _number(theta, "rope_theta", family)
    partial = params.get("partial_rotary_factor", extra.get("partial_rotary_factor", 1.0))
    if partial is not None and partial != 1.0:
        raise ConfigError(f"config partial_rotary_factor {partial!r} is not supported for {family}",
                          "transformers rotates the whole head for this family (partial_rotary_factor 1)")
    if kind == "default":
        return Rope(theta, head_dim)
    # as transformers validates it
    factor = _number(params.get("factor"), f"rope_parameters.factor ({kind})", family, least=1.0)
    if kind == "dynamic" and head_dim <= 2:
        raise ConfigError(f"dynamic rope scaling needs heads of more than 2 dimensions, got {head_dim}",
                          "fix the config.json")
    return Rope(theta, head_dim, scaling=kind, factor=factor, trained=max_positions)
