"""The late-interaction (ColBERT) model: the encoder, a projection of every token, L2 normalisation."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mlmkit.model import (
    BertModel,
    DistributedLoss,
    EmbeddingLoss,
    ModelConfig,
    PairBatch,
    TextEncoder,
    cached,
    direct,
    embedding_loss,
    maxsim,
    pool,
    token_states,
)
from mlmkit.taskkit import Loss


class ColbertEncoder(TextEncoder):
    """One vector per token: the encoder's last hidden states through ``linear`` (hidden -> ``dim``, no
    bias: sentence-transformers' Dense module, Stanford ColBERT's ``linear``), L2-normalised
    (``normalize``); ``vectors`` (B, T, dim), zero at padding.

    Query expansion: with ``expansion_id`` (the [MASK] id; None where the expansion tokens are
    attended, ``attend``), the run of that token ending a text (after its last other real token: the
    [MASK]s the task pads a query with) is kept out of the encoder's attention, as ColBERTv2 does; its
    positions still get vectors, and MaxSim counts them.

    Training: ``loss`` of the registry with MaxSim as the similarity, over all the batch's texts at
    once or, ``cached``, GradCache-style in mini-batches of ``mini_batch_size``. A text's vectors are
    flattened to one row of ``width`` x ``dim`` (zero-padded) for the losses; a document's (a
    positive's, a negative's) ``skiplist`` tokens are zeroed there, out of MaxSim."""

    def __init__(self, config: ModelConfig, dim: int, *, normalize: bool = True,
                 expansion_id: int | None = None, skiplist: Sequence[int] = (), width: int = 512,
                 loss: Loss | None = None, cached: bool = False, scale: float = 1.0,
                 mini_batch_size: int = 32, temperature: float = 1.0) -> None:
        super().__init__()
        self.config, self.dim, self.normalize, self.expansion_id = config, dim, normalize, expansion_id
        self.width = width
        self.bert = BertModel(config, add_pooling_layer=False)
        self.linear = nn.Linear(config.hidden_size, dim, bias=False)
        # a fresh projection starts as orthonormal rows: at dim == hidden size a rotation, which keeps every
        # dot product of the encoder's token states (MaxSim starts as the encoder's own); below it, a random
        # projection like nn.Linear's start (docs/late-interaction.md). A checkpoint's projection replaces it.
        nn.init.orthogonal_(self.linear.weight)
        self.register_buffer("skiplist", torch.tensor(sorted(set(skiplist)), dtype=torch.long),
                             persistent=False)
        self.objective: EmbeddingLoss | None = None
        if loss is not None:  # in-batch negatives from every rank under torchrun
            self.objective = DistributedLoss(embedding_loss(loss, scale=scale, similarity=self.similarity,
                                                            temperature=temperature))
        self.mini_batch_size = mini_batch_size if cached else 0
        self.syncs_own_gradients = bool(cached)  # under torchrun: no DDP reducer (mlmkit.train.devices)

    def module_weights(self) -> dict[str, dict[str, torch.Tensor]]:
        """The projection again as sentence-transformers' Dense module keeps it (1_Dense/)."""
        return {"1_Dense/model.safetensors": {"linear.weight": self.linear.weight}}

    def expansion(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, T) bool: the expansion tokens, the run of ``expansion_id`` after a text's last other real
        token."""
        real = attention_mask != 0
        other = (real & (input_ids != self.expansion_id)).long()
        after = torch.flip(torch.cumsum(torch.flip(other, [1]), 1), [1])  # other real tokens from here on
        return real & (input_ids == self.expansion_id) & (after == 0)

    def vectors(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None) -> torch.Tensor:
        attend = attention_mask
        if self.expansion_id is not None:
            attend = attention_mask * (~self.expansion(input_ids, attention_mask)).to(attention_mask.dtype)
        seq = token_states(self.bert, input_ids, attend, token_type_ids)  # (B, T, H)
        x = self.linear(seq)
        if self.normalize:
            x = F.normalize(x, p=2.0, dim=-1)
        return pool(x, attention_mask, "tokens")  # zero at padding

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               token_type_ids: torch.Tensor | None) -> dict[str, torch.Tensor]:
        return {"vectors": self.vectors(input_ids, attention_mask, token_type_ids)}

    def similarity(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """MaxSim of flattened rows: every text of ``a`` as a query against every text of ``b``; the
        zero vectors (padding, skiplist) of a document never match."""
        Q, D = _trimmed(a.reshape(len(a), -1, self.dim)), _trimmed(b.reshape(len(b), -1, self.dim))
        return maxsim(Q, D, None, (D != 0).any(-1))

    def train_step(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   token_type_ids: torch.Tensor | None, batch: PairBatch) -> dict[str, torch.Tensor]:
        fn = self.objective
        if fn is None:
            raise ValueError("the model was built without a loss")

        def embed(idx: torch.Tensor) -> torch.Tensor:  # rows trimmed to their longest, flattened to width
            idx = idx.to(input_ids.device)
            n = int(attention_mask[idx].sum(1).max())
            ids, mask = input_ids[idx, :n], attention_mask[idx, :n]
            tt = token_type_ids[idx, :n] if token_type_ids is not None else None
            x = self.vectors(ids, mask, tt)
            if len(self.skiplist):
                doc = (batch.part[idx] > 0)[:, None]
                skipped = doc & torch.isin(ids, self.skiplist.to(ids.device))
                x = x * (~skipped).unsqueeze(-1).to(x.dtype)
            return F.pad(x, (0, 0, 0, self.width - n)).reshape(len(idx), -1)

        lengths = attention_mask.sum(1)
        if self.mini_batch_size:
            loss, E = cached(embed, len(input_ids), lambda E: fn(E, batch), self.mini_batch_size,
                             input_ids.device, lengths=lengths)
        else:
            loss, E = direct(embed, len(input_ids), lambda E: fn(E, batch), lengths=lengths)
        vectors = E.reshape(len(input_ids), self.width, self.dim)[:, : input_ids.shape[1]]
        return {"loss": loss, "vectors": vectors, "log_examples": (batch.part == 0).sum().float()}


def _trimmed(x: torch.Tensor) -> torch.Tensor:
    """(n, T, dim) token vectors without the trailing positions that are zero in every row (the
    padding to ``width``): the same MaxSim, in a fraction of the work where texts are short."""
    used = (x != 0).any(-1).any(0).nonzero()
    return x[:, : int(used[-1]) + 1] if len(used) else x[:, :1]
