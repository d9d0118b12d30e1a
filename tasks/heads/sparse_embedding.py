"""SPLADE: the encoder, the MLM head at every token, max pooling of log(1 + relu(logit)), the top terms."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from mlmkit.model import (
    BertModel,
    BertPreTrainingHeads,
    ModelConfig,
    PairBatch,
    distributed,
    flops,
    init_weights,
    mnrl,
    tie_decoder,
)


class SparseEncoder(nn.Module):
    """Sparse vectors over the vocabulary, the ``max_terms`` largest entries chosen in the graph; trained
    with the sparse mnrl (dot products) plus the FLOPS regulariser, warmed up quadratically."""

    def __init__(self, config: ModelConfig, max_terms: int, options: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.config, self.max_terms = config, min(max_terms, config.vocab_size)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls = BertPreTrainingHeads(config, nsp=False)
        init_weights(self, config.initializer_range)
        tie_decoder(self.cls, self.bert)
        o = options or {}
        self.objective = distributed(mnrl(scale=float(o.get("scale", 1.0)), dot=True))
        self.flops_weights = (float(o.get("query_flops", 5e-5)), float(o.get("document_flops", 3e-5)))
        self.warmup = int(o.get("flops_warmup", 100))
        self.seen = 0  # training forwards, for the warm-up (a resumed run warms up again)

    def vectors(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None, packed: bool = False) -> torch.Tensor:
        """(B, V): per vocabulary entry, the max over the real tokens of log(1 + relu(MLM logit)).
        ``packed`` (training): the vocabulary projection, the largest matrix product, runs for the
        real tokens only, not the padding (rows right-padded: each text's tokens are contiguous)."""
        seq, _ = self.bert(input_ids, attention_mask, token_type_ids)  # (B, T, H)
        if not packed:
            logits = self.cls.predictions(seq)  # (B, T, V): inside the graph only
            return (torch.log1p(torch.relu(logits)) * attention_mask.unsqueeze(-1).to(logits.dtype)).max(dim=1).values
        mask = attention_mask.bool()
        w = torch.log1p(torch.relu(self.cls.predictions(seq[mask])))  # (real tokens, V)
        return torch.stack([part.max(0).values for part in w.split(mask.sum(1).tolist())])

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, part: torch.Tensor | None = None,
                text_id: torch.Tensor | None = None, score: torch.Tensor | None = None,
                example: torch.Tensor | None = None, target: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        W = self.vectors(input_ids, attention_mask, token_type_ids, packed=part is not None)
        values, indices = torch.topk(W, self.max_terms, dim=-1)  # (B, k)
        # entries of weight 0 are no terms: -1, so that which of the tied zeros topk picks never matters
        out = {"indices": torch.where(values > 0, indices, torch.full_like(indices, -1)), "values": values}
        if part is not None:  # training: sparse mnrl + the FLOPS regulariser, warmed up quadratically
            if example is None:
                example = torch.cumsum(part == 0, 0) - 1
            contrastive = self.objective(W, PairBatch(example, part, text_id, score))
            q, d = W[part == 0], W[part > 0]
            ramp = min(1.0, (self.seen / self.warmup) ** 2) if self.warmup > 0 else 1.0
            reg = ramp * (self.flops_weights[0] * flops(q) + self.flops_weights[1] * flops(d))
            if self.training:
                self.seen += 1
            return {**out, "loss": contrastive + reg, "flops_loss": reg.detach(),
                    "log_query_terms": (q > 0).sum(1).float().mean().detach(),
                    "log_document_terms": (d > 0).sum(1).float().mean().detach()}
        return out
