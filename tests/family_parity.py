"""What the model-family parity tests share (test_deberta.py, test_modernbert.py, test_mpnet.py ...): noise on
a random transformers model, mlmkit's model of a checkpoint directory, the largest difference at real tokens
(and a masked LM's, mlm_diffs),
and small modules that expose one output of mlmkit's core for comparison and ONNX export."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from mlmkit.models import core
from mlmkit.models.config import ModelConfig
from mlmkit.rundir.checkpoint import load_state_dict, load_weights
from mlmkit.rundir.config import load_config


def perturb(model: nn.Module, seed: int) -> None:
    """Noise well above the init (std 0.02, LayerNorms at 1, biases at 0), on every parameter."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)


def load_ours(d: Path, build) -> tuple[ModelConfig, nn.Module, list[str]]:
    """mlmkit's model of ``d`` (config.json + weights through the family's renames), in eval mode;
    nothing it has may be missing. Returns the keys the state dict had beyond the model's."""
    cfg = load_config(d)
    model = build(cfg)
    missing, unexpected = load_weights(model, load_state_dict(d))
    assert missing == []
    return cfg, model.eval(), unexpected


def real_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    """Largest difference at real tokens (a, b: (B, T, ...))."""
    return (a - b)[mask.bool()].abs().max().item()


def mlm_diffs(model: nn.Module, ref: torch.Tensor, x: dict[str, torch.Tensor]) -> tuple[float, float]:
    """mlmkit's masked LM (a BertForPreTraining) against transformers' logits ``ref`` (B, T, V) on ``x``:
    the largest difference at real tokens, and that of the head computed at labelled positions only
    (positions 3-6 of each row, the training path) at those positions."""
    with torch.no_grad():
        got = model(**x)["prediction_logits"]
        labels = torch.full_like(x["input_ids"], -100)
        labels[:, 3:7] = x["input_ids"][:, 3:7]
        part = model(**x, labels=labels)["mlm_logits"]
    return real_diff(got, ref, x["attention_mask"]), (part - ref[labels != -100]).abs().max().item()


class Backbone(nn.Module):
    """The encoder alone, under the heads' ``bert.`` prefix (mlmkit's names)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.bert = core.BertModel(config, add_pooling_layer=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.bert(input_ids, attention_mask, token_type_ids)[0]


class SpanModel(nn.Module):
    """mlmkit_tasks/qa.py's model: the family's per-token encoder and a two-way qa_outputs layer."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.bert = core.token_encoder(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        # (B, T, 2)
        logits = self.qa_outputs(core.token_states(self.bert, input_ids, attention_mask, token_type_ids))
        return logits[..., 0], logits[..., 1]


class Logits(nn.Module):
    def __init__(self, model: nn.Module, fn) -> None:
        super().__init__()
        self.model, self.fn = model, fn

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.fn(self.model, input_ids, attention_mask)


def export_logits(graph: nn.Module, dummy: dict[str, torch.Tensor], path: Path, *, per_token: bool) -> None:
    """``graph`` (input_ids, attention_mask -> one output "out") to ONNX with the TorchScript exporter:
    batch and sequence dynamic, the output per token (an MLM head) or per row (a classifier)."""
    axes = {0: "batch", 1: "sequence"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(graph, (dummy["input_ids"], dummy["attention_mask"]), str(path), dynamo=False,
                          opset_version=17,
                          input_names=["input_ids", "attention_mask"], output_names=["out"],
                          dynamic_axes={"input_ids": axes, "attention_mask": axes,
                                        "out": axes if per_token else {0: "batch"}})
