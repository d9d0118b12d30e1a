"""The torch module that is exported (a task's graph: its model's forward, or the module its
``export_module`` writes for inference) and its TorchScript export.

The TorchScript exporter (``dynamo=False``) from an eager attention is the only combination
onnxruntime's BERT fusions recognise (docs/performance.md, "BERT fusions need the TorchScript exporter and
eager attention"): every attention block declares itself (core.Attention) so that the exporter can switch it,
and a graph whose attention is not all declared is refused before it is exported (``check_attention``).
"""

from __future__ import annotations

import functools
import logging
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from mlmkit.errors import ConfigError
from mlmkit.models.config import ModelConfig
from mlmkit.models.core import set_attention_impl
from mlmkit.registry import BATCH, SEQUENCE, task_of
from mlmkit.rundir.checkpoint import load_state_dict, load_weights
from mlmkit.rundir.meta import RunMeta
from mlmkit.runtime.bundle import DYNAMIC_AXES, INPUT_NAMES

log = logging.getLogger("mlmkit")


# ---- the graphs ------------------------------------------------------------------------------
class TaskGraph(nn.Module):
    """A task model's forward, returning its declared ``outputs`` as a tuple in a fixed order."""

    def __init__(self, model: nn.Module, names: list[str]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        out = self.model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return tuple(out[n].float() for n in self.names)


# ---- loading the run -------------------------------------------------------------------------
def build_graph(
    d: Path, meta: RunMeta, cfg: ModelConfig, tokenizer: Any
) -> tuple[nn.Module, nn.Module, dict[str, tuple[str, ...]], int]:
    """(module to export, PyTorch reference it must match, outputs with their axes, partial layers).

    The run's task (a pretraining run's: the masked-LM task) builds its model with the run's options
    and the tokenizer in its context, and the run's weights are loaded into it (a checkpoint's heads
    the model does not have, such as a pretraining run's next-sentence head, are left out). A task's
    ``export_module(model)`` (the model itself by default) is exported and checked against the model's
    own forward; ``partial_layers`` tells the fusion check what it skipped (nothing when the task kept
    the model as it is, as for a head that reads every position)."""
    sd = load_state_dict(d, cfg)
    task = task_of(meta.task)
    ctx = replace(meta.context(task.resolve_options(saved=meta.options)), tokenizer=tokenizer)
    model = task.build_model(cfg, ctx)
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
                f"{name or 'the model'} ({cls}) computes attention with scaled_dot_product_attention but is "
                "not a "
                "declared attention block: the exporter cannot switch it to the form onnxruntime fuses",
                "subclass mlmkit.models.core.Attention and compute with core.attend (or its eager form when "
                "impl is 'eager')",
            )
        return func(*args, **(kwargs or {}))


def check_attention(graph: nn.Module, dummy: tuple[torch.Tensor, ...]) -> None:
    """Switch every attention block of ``graph`` to the eager form, or refuse it: a graph with no
    declared block (core.Attention), or whose forward on ``dummy`` still calls SDPA (an attention
    that did not declare itself), would export unfused (several times slower), and silently."""
    if not set_attention_impl(graph, "eager"):
        raise ConfigError("the model has no attention block the exporter can switch to the form onnxruntime "
                          "fuses",
                          "a family's attention subclasses mlmkit.models.core.Attention")
    running: list[tuple[str, str]] = []  # the modules whose forward has begun and not ended, innermost last

    def begin(m: nn.Module, _: Any, name: str) -> None:
        running.append((name, type(m).__name__))

    def end(*_: Any) -> None:  # (a forward hook returning something would replace the output)
        running.pop()

    hooks = []
    for name, m in graph.named_modules():
        hooks += [m.register_forward_pre_hook(functools.partial(begin, name=name)),
                  m.register_forward_hook(end)]
    try:
        with torch.no_grad(), _RefuseSdpa(running):
            graph(*dummy)
    finally:
        for h in hooks:
            h.remove()


def torch_export(graph: nn.Module, batch: dict[str, np.ndarray], axes: dict[str, tuple[str, ...]], path: Path,
                 opset: int,
                  inputs: tuple[str, ...]) -> None:
    dummy = tuple(torch.from_numpy(batch[k][:2, : max(2, int(batch["attention_mask"][:2].sum(1).max()))])
                  for k in inputs)
    check_attention(graph, dummy)
    dynamic = {name: {i: a for i, a in enumerate(ax) if a in DYNAMIC_AXES}
               for name, ax in {**dict.fromkeys(inputs, (BATCH, SEQUENCE)), **axes}.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(
            graph, dummy, str(path), dynamo=False, opset_version=opset, input_names=list(inputs),
            output_names=list(axes), dynamic_axes=dynamic, do_constant_folding=True,
        )
