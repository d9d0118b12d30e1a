"""The torch modules that are exported: the fill-mask graph (MLM head and top-k at the [MASK]
positions only) and a task's graph, and the TorchScript export of either.

The TorchScript exporter (``dynamo=False``) from an eager attention is the only combination
onnxruntime's BERT fusions recognise (docs/performance.md, "BERT fusions need the TorchScript exporter and eager attention"): every attention block
declares itself (core.Attention) so that the exporter can switch it, and a graph whose attention is
not all declared is refused before it is exported (``check_attention``).
"""

from __future__ import annotations

import functools
import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from mlmkit.errors import ConfigError
from mlmkit.infer.bundle import DYNAMIC_AXES, FILL_MASK_OUTPUTS, INPUT_NAMES
from mlmkit.models.config import ModelConfig
from mlmkit.models.core import BertForPreTraining, extended_mask, set_attention_impl
from mlmkit.registry import BATCH, SEQUENCE, get_task
from mlmkit.rundir.checkpoint import load_state_dict, load_weights
from mlmkit.rundir.meta import RunMeta

log = logging.getLogger("mlmkit")


# ---- the graphs ------------------------------------------------------------------------------
class FillMaskGraph(nn.Module):
    """Encoder + MLM head at the [MASK] positions only + top-k: the exported fill-mask model."""

    def __init__(self, model: BertForPreTraining, mask_id: int, top_k: int) -> None:
        super().__init__()
        self.bert, self.head = model.bert, model.cls.predictions
        self.mask_id, self.top_k = mask_id, top_k

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.bert.embeddings(input_ids, token_type_ids)
        x = self.bert.encoder(x, extended_mask(attention_mask, x.dtype))  # (B, T, H); no pooler needed
        B, T, H = x.shape
        is_mask = ((input_ids == self.mask_id) & (attention_mask != 0)).reshape(-1)  # (B*T,)
        flat = torch.nonzero(is_mask).squeeze(1)  # (N,) indices into B*T, row-major
        h = self.head.transform(x.reshape(-1, H).index_select(0, flat))  # (N, H)
        # F.linear on a 2-D input exports as Gemm(transB=1) reading the embedding matrix itself, so the
        # tied decoder weight is stored once (a MatMul on its transpose would get a folded second copy)
        logits = F.linear(h, self.head.decoder.weight, self.head.bias)  # (N, V)
        probs, ids = torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)  # (N, k)
        positions = torch.stack([flat // T, flat % T], dim=1)  # (N, 2): [row, position]
        return positions, ids, probs


class TaskGraph(nn.Module):
    """A task model's forward, returning its declared ``outputs`` as a tuple in a fixed order."""

    def __init__(self, model: nn.Module, names: list[str]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        out = self.model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return tuple(out[n].float() for n in self.names)


# ---- loading the run -------------------------------------------------------------------------
def build_graph(
    d: Path, meta: RunMeta, cfg: ModelConfig, mask_id: int, top_k: int
) -> tuple[nn.Module, nn.Module, dict[str, tuple[str, ...]], int]:
    """(module to export, PyTorch reference it must match, outputs with their axes, partial layers).

    A task's ``export_module(model)`` (the model itself by default) is exported and checked against
    the model's own forward; ``partial_layers`` tells the fusion check what it skipped (nothing
    when the task kept the model as it is, as for a head that reads every position)."""
    sd = load_state_dict(d, cfg)
    if meta.pretraining:
        model = BertForPreTraining(cfg)
        # a BertForMaskedLM checkpoint has no NSP head or pooler; neither is in the fill-mask graph
        load_weights(model, sd, allow_missing=("cls.seq_relationship", "bert.pooler"))
        model.tie_weights()
        if top_k > cfg.vocab_size:
            raise ConfigError(f"--top-k must be between 1 and the vocabulary size {cfg.vocab_size}, got {top_k}")
        graph = FillMaskGraph(model, mask_id, top_k)
        return graph, graph, dict(FILL_MASK_OUTPUTS), 0
    task = get_task(meta.task)
    model = task.build_model(cfg, meta.context(task.resolve_options(saved=meta.options)))
    load_weights(model, sd)
    model.eval()
    names = list(task.outputs)
    module = task.export_module(model)
    partial = task.partial_layers if module is not model else 0
    return TaskGraph(module, names), TaskGraph(model, names), dict(task.outputs), partial


def graph_inputs(cfg: ModelConfig) -> tuple[str, ...]:
    """The exported graph's inputs: token_type_ids only for families that have token types."""
    return INPUT_NAMES if cfg.family.uses_token_types(cfg) else INPUT_NAMES[:2]


class _RefuseSdpa(TorchFunctionMode):
    """Raises ConfigError at a call of torch's scaled_dot_product_attention, naming the innermost
    module running (``running``: (name, class) of the modules whose forward has begun, not ended)."""

    def __init__(self, running: list[tuple[str, str]]) -> None:
        super().__init__()
        self.running = running

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is F.scaled_dot_product_attention:
            name, cls = self.running[-1] if self.running else ("", "?")
            raise ConfigError(
                f"{name or 'the model'} ({cls}) computes attention with scaled_dot_product_attention but is not a "
                "declared attention block: the exporter cannot switch it to the form onnxruntime fuses",
                "subclass mlmkit.models.core.Attention and compute with core.attend (or its eager form when impl is 'eager')",
            )
        return func(*args, **(kwargs or {}))


def check_attention(graph: nn.Module, dummy: tuple[torch.Tensor, ...]) -> None:
    """Switch every attention block of ``graph`` to the eager form, or refuse it: a graph with no
    declared block (core.Attention), or whose forward on ``dummy`` still calls SDPA (an attention
    that did not declare itself), would export unfused (several times slower), and silently."""
    if not set_attention_impl(graph, "eager"):
        raise ConfigError("the model has no attention block the exporter can switch to the form onnxruntime fuses",
                          "a family's attention subclasses mlmkit.models.core.Attention")
    running: list[tuple[str, str]] = []  # the modules whose forward has begun and not ended, innermost last

    def begin(m: nn.Module, _: Any, name: str) -> None:
        running.append((name, type(m).__name__))

    def end(*_: Any) -> None:  # (a forward hook returning something would replace the output)
        running.pop()

    hooks = []
    for name, m in graph.named_modules():
        hooks += [m.register_forward_pre_hook(functools.partial(begin, name=name)), m.register_forward_hook(end)]
    try:
        with torch.no_grad(), _RefuseSdpa(running):
            graph(*dummy)
    finally:
        for h in hooks:
            h.remove()


def torch_export(graph: nn.Module, batch: dict[str, np.ndarray], axes: dict[str, tuple[str, ...]], path: Path, opset: int,
                  inputs: tuple[str, ...]) -> None:
    dummy = tuple(torch.from_numpy(batch[k][:2, : max(2, int(batch["attention_mask"][:2].sum(1).max()))]) for k in inputs)
    check_attention(graph, dummy)
    dynamic = {name: {i: a for i, a in enumerate(ax) if a in DYNAMIC_AXES} for name, ax in {**dict.fromkeys(inputs, (BATCH, SEQUENCE)), **axes}.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(
            graph, dummy, str(path), dynamo=False, opset_version=opset, input_names=list(inputs),
            output_names=list(axes), dynamic_axes=dynamic, do_constant_folding=True,
        )
