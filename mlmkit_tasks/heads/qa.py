"""*ForQuestionAnswering of the config's family, under mlmkit's (BERT's) parameter names."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from mlmkit.model import ModelConfig, init_weights, token_encoder, token_states


class BertForQuestionAnswering(nn.Module):
    """Start and end logits per token (qa_outputs: hidden -> 2); with gold positions, the mean of the
    two cross-entropies, positions outside the sequence clamped to T and ignored, as transformers."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = token_encoder(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        init_weights(self, config.initializer_range)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        seq = token_states(self.bert, input_ids, attention_mask, token_type_ids)  # (B, T, H)
        logits = self.qa_outputs(seq)  # (B, T, 2)
        start, end = logits[..., 0].contiguous(), logits[..., 1].contiguous()  # (B, T) each
        out = {"start_logits": start, "end_logits": end}
        if start_positions is not None and end_positions is not None:
            T = start.size(1)
            sp, ep = start_positions.view(-1).clamp(0, T), end_positions.view(-1).clamp(0, T)
            out["loss"] = (F.cross_entropy(start.float(), sp, ignore_index=T)
                           + F.cross_entropy(end.float(), ep, ignore_index=T)) / 2
        return out
