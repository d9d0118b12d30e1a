"""The embedding model: the encoder with pooling and normalisation, and its training losses."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

import mlmkit.model as kit
from mlmkit.model import BertModel, ModelConfig, PairBatch, cached, direct, distributed, matryoshka, mean_pool


class BertForEmbedding(nn.Module):
    """One vector per text: ``pooling`` (mean, cls or max over the real tokens), then an optional L2
    normalisation, as sentence-transformers' Pooling and Normalize modules.

    Training (features with a ``part``): ``loss`` names an embedding loss of mlmkit.model (the task's
    LOSSES say which), over all of the batch's embeddings at once or, ``cached``, GradCache-style in
    mini-batches of ``mini_batch_size`` texts; ``matryoshka`` dimensions (with their weights) add the
    same loss on leading dimensions. mse-distill from a teacher of another size (``teacher_dim``) maps
    the embeddings to the teacher's through a projection (training only: the run's and the bundle's
    embeddings are the model's own)."""

    def __init__(self, config: ModelConfig, pooling: str, normalize: bool, *, loss: str = "mnrl", cached: bool = False,
                 scale: float = 20.0, symmetric: bool = False, mini_batch_size: int = 32,
                 matryoshka: Sequence[int] = (), matryoshka_weights: Sequence[float] = (),
                 teacher_dim: int | None = None) -> None:
        super().__init__()
        self.config, self.pooling, self.normalize = config, pooling, normalize
        self.bert = BertModel(config, add_pooling_layer=False)
        self.distill_projection = (nn.Linear(config.hidden_size, teacher_dim)
                                   if teacher_dim and teacher_dim != config.hidden_size else None)
        self.objective = getattr(kit, loss)(scale=scale, symmetric=symmetric, project=self.distill_projection)
        self.mini_batch_size = mini_batch_size if cached else 0
        self.syncs_own_gradients = bool(cached)  # under torchrun: no DDP reducer (mlmkit.train.devices)
        self.matryoshka, self.weights = list(matryoshka), list(matryoshka_weights) or [1.0] * len(matryoshka)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, part: torch.Tensor | None = None,
                text_id: torch.Tensor | None = None, score: torch.Tensor | None = None,
                example: torch.Tensor | None = None, target: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if target is not None and target.shape[-1] == 0:  # no teacher (the task's NO_TARGET)
            target = None
        if part is not None:  # training: the loss over the batch's examples, and the embeddings it saw
            if example is None:  # an example's features come together, its anchor (part 0) first
                example = torch.cumsum(part == 0, 0) - 1
            loss, emb = self.loss(input_ids, attention_mask, token_type_ids, PairBatch(example, part, text_id, score, target))
            # the examples (anchors) the step held: metrics.jsonl's "examples", what a pairs/s figure counts
            return {"loss": loss, "embedding": emb, "log_examples": (part == 0).sum().float()}
        return {"embedding": self.embed(input_ids, attention_mask, token_type_ids)}

    def loss(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None,
             batch: PairBatch) -> tuple[torch.Tensor, torch.Tensor]:
        def embed(idx: torch.Tensor) -> torch.Tensor:  # some rows, trimmed to their longest (right padding)
            idx = idx.to(input_ids.device)
            n = int(attention_mask[idx].sum(1).max())
            tt = token_type_ids[idx, :n] if token_type_ids is not None else None
            return self.embed(input_ids[idx, :n], attention_mask[idx, :n], tt)

        fn = self.objective
        if self.matryoshka:
            fn = matryoshka(fn, self.matryoshka, self.weights)
        fn = distributed(fn)  # in-batch negatives from every rank under torchrun
        if self.mini_batch_size:
            return cached(embed, len(input_ids), lambda E: fn(E, batch), self.mini_batch_size, input_ids.device,
                          lengths=attention_mask.sum(1))
        return direct(embed, len(input_ids), lambda E: fn(E, batch), lengths=attention_mask.sum(1))

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
              token_type_ids: torch.Tensor | None) -> torch.Tensor:
        seq, _ = self.bert(input_ids, attention_mask, token_type_ids)  # (B, T, H)
        if self.pooling == "cls":
            x = seq[:, 0]
        elif self.pooling == "max":  # padding can never win (sentence-transformers fills it with -1e9)
            m = attention_mask.unsqueeze(-1).to(seq.dtype)  # (B, T, 1)
            x = (seq + (m - 1.0) * 1e9).max(dim=1).values
        else:  # over the real tokens, as sentence-transformers' mean (and ModernBERT's head)
            x = mean_pool(seq, attention_mask)  # (B, H)
        if self.normalize:
            x = F.normalize(x, p=2.0, dim=-1)
        return x
