"""SPLADE: the encoder, the MLM head at every token, max pooling of log(1 + relu(logit)), the top terms."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mlmkit.model import (
    BertModel,
    BertPreTrainingHeads,
    ModelConfig,
    PairBatch,
    TextEncoder,
    distributed,
    flops,
    init_weights,
    mnrl,
    pool,
    tie_decoder,
)


class SparseEncoder(TextEncoder):
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
            return pool(torch.log1p(torch.relu(logits)), attention_mask, "max")
        mask = attention_mask.bool()
        w = torch.log1p(torch.relu(self.cls.predictions(seq[mask])))  # (real tokens, V)
        return torch.stack([part.max(0).values for part in w.split(mask.sum(1).tolist())])

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               token_type_ids: torch.Tensor | None) -> dict[str, torch.Tensor]:
        return self._terms(self.vectors(input_ids, attention_mask, token_type_ids))

    def _terms(self, W: torch.Tensor) -> dict[str, torch.Tensor]:
        """The ``max_terms`` largest entries of each vector: their ids (-1 for an entry of weight 0, so
        that which of the tied zeros topk picks never matters) and weights."""
        values, indices = torch.topk(W, self.max_terms, dim=-1)  # (B, k)
        return {"indices": torch.where(values > 0, indices, torch.full_like(indices, -1)), "values": values}

    def train_step(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None,
                   batch: PairBatch) -> dict[str, torch.Tensor]:
        """Sparse mnrl + the FLOPS regulariser, warmed up quadratically."""
        W = self.vectors(input_ids, attention_mask, token_type_ids, packed=True)
        contrastive = self.objective(W, batch)
        q, d = W[batch.part == 0], W[batch.part > 0]
        ramp = min(1.0, (self.seen / self.warmup) ** 2) if self.warmup > 0 else 1.0
        reg = ramp * (self.flops_weights[0] * flops(q) + self.flops_weights[1] * flops(d))
        if self.training:
            self.seen += 1
        return {**self._terms(W), "loss": contrastive + reg, "flops_loss": reg.detach(),
                "log_query_terms": (q > 0).sum(1).float().mean().detach(),
                "log_document_terms": (d > 0).sum(1).float().mean().detach()}
