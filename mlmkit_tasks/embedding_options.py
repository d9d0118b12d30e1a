"""The embedding task's options checked and resolved: the matryoshka dimensions and weights, the Dense
layers after the pooling, the loss (as the options name it, and ``auto`` resolved)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, TypedDict

from mlmkit.taskkit import TaskContext, TaskError, get_loss, losses
from mlmkit_tasks.embedding_st import ST_ACTIVATIONS

DenseLayer = TypedDict("DenseLayer", {"in": int, "out": int, "bias": bool, "activation": str})
"""One Dense layer after the pooling, as sentence_transformers_options writes it."""


def matryoshka_dims(value: Any, hidden: int | None = None) -> list[int]:
    """``matryoshka_dims`` ("384,256,128,64") as whole numbers from 1 to the hidden size."""
    if value in ("", None):
        return []
    try:
        dims = [int(x) for x in str(value).split(",") if x.strip()]
    except ValueError:
        raise TaskError(f"matryoshka_dims must be whole numbers separated by commas, not {value!r}",
                        "e.g. --option matryoshka_dims=384,256,128,64") from None
    if any(d < 1 or (hidden is not None and d > hidden) for d in dims) or len(set(dims)) != len(dims):
        size = f" ({hidden})" if hidden else ""
        raise TaskError(f"matryoshka_dims {value!r}: each must be from 1 to the hidden size{size}, once",
                        "e.g. --option matryoshka_dims=384,256,128,64")
    return dims


def matryoshka_weights(value: Any, n: int) -> list[float]:
    if value in ("", None):
        return [1.0] * n
    try:
        w = [float(x) for x in str(value).split(",") if x.strip()]
    except ValueError:
        w = []
    if len(w) != n or not all(math.isfinite(x) and x >= 0 for x in w):
        raise TaskError(f"matryoshka_weights {value!r}: give one non-negative number per dimension of "
                        "matryoshka_dims",
                        "e.g. --option matryoshka_weights=1,1,1,1")
    return w


def dense_layers(value: Any, hidden: int) -> list[DenseLayer]:
    """``dense_layers`` (JSON, as sentence_transformers_options writes it) checked: each layer's input
    the size before it, starting at the encoder's hidden size."""
    if value in ("", None):
        return []
    try:
        layers = json.loads(value)
    except ValueError:
        layers = None
    width, ok = hidden, isinstance(layers, list) and bool(layers)
    for layer in layers if ok else []:
        ok = (isinstance(layer, dict) and layer.get("in") == width and isinstance(layer.get("out"), int)
              and not isinstance(layer["out"], bool) and 0 < layer["out"] <= 1 << 20
              and layer.get("activation") in ST_ACTIVATIONS)
        if not ok:
            break
        width = layer["out"]
    if not ok:
        raise TaskError(f"dense_layers {str(value)[:200]!r}: expected a JSON list of layers "
                        f"{{\"in\", \"out\", \"bias\", \"activation\"}}, the first taking the encoder's "
                        f"{hidden} dimensions, each the one before's output",
                        f"activations: {', '.join(ST_ACTIVATIONS)}")
    return list(layers)


def embedding_width(options: Mapping[str, Any], hidden: int) -> int:
    """The embedding's size: the last Dense layer's output, else the encoder's hidden size."""
    dense = dense_layers(options.get("dense_layers", ""), hidden)
    return int(dense[-1]["out"]) if dense else hidden


def loss_option(options: Mapping[str, Any]) -> str:
    """The loss as far as the options say: ``auto`` with a teacher is mse-distill (else still auto)."""
    loss = options.get("loss", "auto")
    return "mse-distill" if loss == "auto" and options.get("teacher") else loss


def resolved_loss(ctx: TaskContext) -> str:
    """The loss option, ``auto`` resolved: mse-distill with a teacher, else by the kind of training data
    (fit_state): cosent for scored pairs, mnrl for rows."""
    loss = loss_option(ctx.options)
    if loss == "auto":
        return "cosent" if ctx.state.get("data") == "scored" else "mnrl"
    return loss


def trains_on_teacher_scores(options: Mapping[str, Any]) -> bool:
    """Whether the loss option names a loss that trains on the teacher's scores (margin-mse, kl-distill)."""
    name = loss_option(options)
    return name in losses("embedding") and get_loss("embedding", name).teacher_scores
