"""The cross-encoder: a one-label BertForLabels trained with a rerank loss over a query's candidates."""

from __future__ import annotations

import torch
from mlmkit_tasks.classification import REGRESSION

from mlmkit.model import BertForLabels, ModelConfig, build_loss
from mlmkit.taskkit import Loss


class BertForRerank(BertForLabels):
    """One relevance logit per (query, document) pair; ``loss`` is a rank loss of the registry
    (bce, listnet ...), computed over the pairs of each query (``example``)."""

    def __init__(self, config: ModelConfig, loss: Loss, max_label: float) -> None:
        super().__init__(config, per_token=False, problem_type=REGRESSION)
        self.objective = build_loss(loss, max_label=max_label)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                example: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = super().forward(input_ids, attention_mask, token_type_ids)["logits"]  # (B, 1)
        out = {"logits": logits}
        if labels is not None:
            group = example if example is not None else torch.zeros_like(labels, dtype=torch.long)
            out["loss"] = self.objective(logits.float().squeeze(-1), labels.float(), group)
        return out
