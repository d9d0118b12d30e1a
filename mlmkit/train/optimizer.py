"""The optimisation the training loop runs: AdamW's parameter groups, the learning-rate schedule, the seed."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TypedDict

import numpy as np
import torch
from torch import nn

from mlmkit.models.core import BertModel


class ParamGroup(TypedDict, total=False):
    """One of AdamW's parameter groups (``lr``: its own peak, else the optimizer's)."""

    params: list[nn.Parameter]
    weight_decay: float
    lr: float


def param_groups(model: nn.Module, weight_decay: float, head_lr: float | None = None) -> list[ParamGroup]:
    """AdamW's groups: matrices and embeddings decay; biases and LayerNorm weights (all 1-D) don't.
    ``head_lr``: the parameters outside the encoder (every BertModel's: a task head, a projection)
    at that peak instead of the optimizer's (a fresh head learns from nothing in a few steps)."""
    params = [p for p in model.parameters() if p.requires_grad]
    encoder = {id(p) for m in model.modules() if isinstance(m, BertModel) for p in m.parameters()}
    parts = [params] if head_lr is None else [[p for p in params if id(p) in encoder],
                                              [p for p in params if id(p) not in encoder]]
    groups: list[ParamGroup] = []
    for k, part in enumerate(parts):
        extra: dict[str, float] = {"lr": head_lr} if k == 1 and head_lr is not None else {}
        matrices: ParamGroup = {"params": [p for p in part if p.dim() >= 2], "weight_decay": weight_decay}
        vectors: ParamGroup = {"params": [p for p in part if p.dim() < 2], "weight_decay": 0.0}
        groups += [{**matrices, **extra}, {**vectors, **extra}]  # type: ignore[typeddict-item]
    return groups


def linear_schedule(warmup: int, total: int) -> Callable[[int], float]:
    """The learning-rate factor at each step: linear warmup over ``warmup`` steps, then linear decay to 0."""

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))

    return f


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
