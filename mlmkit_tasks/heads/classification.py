"""The classifier's inference form (also the reranker's): the last layer runs for [CLS] only."""

from __future__ import annotations

import torch
from torch import nn

from mlmkit.model import BertForLabels, encode_cls


class ClsOnlyGraph(nn.Module):
    """A BertForLabels whose pooled vector is [CLS]'s, with 1/L of the encoder's work skipped: the
    last layer computes [CLS]'s row only (encode_cls). The same logits as the model's own forward."""

    def __init__(self, model: BertForLabels) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        return {"logits": self.model.classifier(encode_cls(self.model.bert, input_ids, attention_mask,
                                                           token_type_ids))}
