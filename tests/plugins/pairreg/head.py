"""The pair regressor's head: a module-level torch class, imported by ``build_model`` only (the task
module stays torch-free, so the onnxruntime commands can import it)."""

from __future__ import annotations

import torch
from torch import nn

from mlmkit.model import BertModel, ModelConfig, init_weights


class PairRegressor(nn.Module):
    """One score per pair: a linear layer on the pooled [CLS] vector; MSE against the gold score."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.bert = BertModel(config, add_pooling_layer=True)  # must be named `bert`
        self.regressor = nn.Linear(config.hidden_size, 1)  # the head: any names but bert.*
        init_weights(self, config.initializer_range)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        _, pooled = self.bert(input_ids, attention_mask, token_type_ids)  # (B, H)
        out = {"score": self.regressor(pooled).squeeze(-1)}  # (B,): each name of the task's outputs
        if labels is not None:  # training only
            out["loss"] = nn.functional.mse_loss(out["score"].float(), labels.float())
        return out
