"""SPLADE: the encoder, the MLM head at every token, max pooling of log(1 + relu(logit)), the top terms."""

from __future__ import annotations

import torch

from mlmkit.model import (
    BertModel,
    BertPreTrainingHeads,
    ModelConfig,
    PairBatch,
    SpladeLoss,
    TextEncoder,
    init_weights,
    pool,
    tie_decoder,
    token_states,
)


class SparseEncoder(TextEncoder):
    """Sparse vectors over the vocabulary, the ``max_terms`` largest entries chosen in the graph;
    trained with ``objective`` (a ranking loss of the sparse vectors plus the FLOPS regulariser; none:
    the model predicts only)."""

    def __init__(self, config: ModelConfig, max_terms: int, objective: SpladeLoss | None = None) -> None:
        super().__init__()
        self.config, self.max_terms = config, min(max_terms, config.vocab_size)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls = BertPreTrainingHeads(config, nsp=False)
        init_weights(self, config.initializer_range)
        tie_decoder(self.cls, self.bert)
        self.objective = objective

    def vectors(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None, packed: bool = False) -> torch.Tensor:
        """(B, V): per vocabulary entry, the max over the real tokens of log(1 + relu(MLM logit)).
        ``packed`` (training): the vocabulary projection, the largest matrix product, runs for the
        real tokens only, not the padding (rows right-padded: each text's tokens are contiguous)."""
        seq = token_states(self.bert, input_ids, attention_mask, token_type_ids)  # (B, T, H)
        if not packed:
            logits = self.cls.predictions(seq)  # (B, T, V): inside the graph only
            return pool(torch.log1p(torch.relu(logits)), attention_mask, "max")
        # pool's "max" over the real tokens alone: each text's rows of the packed (tokens, V) weights
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

    def train_step(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   token_type_ids: torch.Tensor | None, batch: PairBatch) -> dict[str, torch.Tensor]:
        """The ranking loss + the FLOPS regulariser, warmed up quadratically (SpladeLoss)."""
        if self.objective is None:
            raise ValueError("the model was built without a loss")
        W = self.vectors(input_ids, attention_mask, token_type_ids, packed=True)
        ranking, reg = self.objective.terms(W, batch)
        if self.training:
            self.objective.step()
        q, d = W[batch.part == 0], W[batch.part > 0]
        return {**self._terms(W), "loss": ranking + reg, "flops_loss": reg.detach(),
                "log_query_terms": (q > 0).sum(1).float().mean().detach(),
                "log_document_terms": (d > 0).sum(1).float().mean().detach()}
