"""The embedding model: the encoder with pooling and normalisation, and its training losses."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mlmkit.model import (
    BertModel,
    Dense,
    DistributedLoss,
    EmbeddingLoss,
    MatryoshkaLoss,
    ModelConfig,
    PairBatch,
    TextEncoder,
    cached,
    direct,
    embedding_loss,
    pool,
    token_states,
)
from mlmkit.taskkit import Loss
from mlmkit_tasks.embedding_options import DenseLayer


class BertForEmbedding(TextEncoder):
    """One vector per text: ``pooling`` over the real tokens (models/pooled.py's modes), the ``dense``
    layers after it where the model has them (each {"in", "out", "bias", "activation"}), then an optional
    L2 normalisation: sentence-transformers' Pooling, Dense and Normalize modules, in that order.

    Training (features with a ``part``): ``loss``, an embedding loss of the registry, over all of the
    batch's embeddings at once or, ``cached``, GradCache-style in mini-batches of ``mini_batch_size``
    texts; ``matryoshka`` dimensions (with their weights) add the same loss on leading dimensions.
    mse-distill from a teacher of another size (``teacher_dim``) maps the embeddings to the teacher's
    through a projection (training only: the run's and the bundle's embeddings are the model's own)."""

    def __init__(self, config: ModelConfig, pooling: str, normalize: bool, *, loss: Loss,
                 cached: bool = False, scale: float = 20.0, symmetric: bool = False,
                 mini_batch_size: int = 32,
                 matryoshka: Sequence[int] = (), matryoshka_weights: Sequence[float] = (),
                 teacher_dim: int | None = None, dense: Sequence[DenseLayer] = ()) -> None:
        super().__init__()
        self.config, self.pooling, self.normalize = config, pooling, normalize
        self.bert = BertModel(config, add_pooling_layer=False)
        self.dense = nn.ModuleList(Dense(d["in"], d["out"], d["bias"], d["activation"]) for d in dense)
        width = int(dense[-1]["out"]) if dense else config.hidden_size
        distill = teacher_dim is not None and teacher_dim != width
        self.distill_projection = nn.Linear(width, teacher_dim) if teacher_dim and distill else None
        objective = embedding_loss(loss, scale=scale, symmetric=symmetric, project=self.distill_projection)
        if matryoshka:
            weights = list(matryoshka_weights) or [1.0] * len(matryoshka)
            objective = MatryoshkaLoss(objective, matryoshka, weights)
        # in-batch negatives from every rank under torchrun
        self.objective: EmbeddingLoss = DistributedLoss(objective)
        self.mini_batch_size = mini_batch_size if cached else 0
        self.syncs_own_gradients = bool(cached)  # under torchrun: no DDP reducer (mlmkit.train.devices)

    def module_weights(self) -> dict[str, dict[str, torch.Tensor]]:
        """Each Dense layer's weights where sentence-transformers reads them (``2_Dense/``, ``3_Dense/`` ...:
        its modules after the encoder and the pooling)."""
        return {f"{i + 2}_Dense/model.safetensors": dict(layer.state_dict())
                for i, layer in enumerate(self.dense)}

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               token_type_ids: torch.Tensor | None) -> dict[str, torch.Tensor]:
        return {"embedding": self.embed(input_ids, attention_mask, token_type_ids)}

    def train_step(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   token_type_ids: torch.Tensor | None, batch: PairBatch) -> dict[str, torch.Tensor]:
        """The loss over the batch's examples, and the embeddings it saw."""
        loss, emb = self.loss(input_ids, attention_mask, token_type_ids, batch)
        # the examples (anchors) the step held: metrics.jsonl's "examples", what a pairs/s figure counts
        return {"loss": loss, "embedding": emb, "log_examples": (batch.part == 0).sum().float()}

    def loss(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None,
             batch: PairBatch) -> tuple[torch.Tensor, torch.Tensor]:
        def embed(idx: torch.Tensor) -> torch.Tensor:  # some rows, trimmed to their longest (right padding)
            idx = idx.to(input_ids.device)
            n = int(attention_mask[idx].sum(1).max())
            tt = token_type_ids[idx, :n] if token_type_ids is not None else None
            return self.embed(input_ids[idx, :n], attention_mask[idx, :n], tt)

        fn, lengths = self.objective, attention_mask.sum(1)
        if self.mini_batch_size:
            return cached(embed, len(input_ids), lambda E: fn(E, batch), self.mini_batch_size,
                          input_ids.device, lengths=lengths)
        return direct(embed, len(input_ids), lambda E: fn(E, batch), lengths=lengths)

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
              token_type_ids: torch.Tensor | None) -> torch.Tensor:
        seq = token_states(self.bert, input_ids, attention_mask, token_type_ids)  # (B, T, H)
        x = pool(seq, attention_mask, self.pooling)  # (B, H)
        for layer in self.dense:
            x = layer(x)  # (B, out)
        if self.normalize:
            x = F.normalize(x, p=2.0, dim=-1)
        return x
