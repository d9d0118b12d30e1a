"""Losses of embedding and ranking training: one class per loss, constructed with its options.

Each loss a user can name is declared once in the torch-free registry (mlmkit.objectives: its name,
kind and the data it trains on); its class here carries that name and is registered under it
(``register``, the shape tasks and families register in), and ``build_loss`` constructs it from the
declaration. Plugins reach these through mlmkit.model.

- base: the two interfaces (``EmbeddingLoss``, ``RankLoss``) and the registry;
- embedding: the embedding losses (mnrl, cosent ...), MatryoshkaLoss and SpladeLoss, which wrap another;
- rank: the rank losses of a cross-encoder (bce, listnet ...);
- batches: how a batch's embeddings are computed for a loss (all at once, GradCache), DistributedLoss.
"""

from __future__ import annotations

from mlmkit.models.pooled import PairBatch
from mlmkit.train.losses.base import (
    LOSS_CLASSES,
    EmbeddingLoss,
    RankLoss,
    RegisteredLoss,
    Similarity,
    build_loss,
    embedding_loss,
    loss_class,
    rank_loss,
    register,
)
from mlmkit.train.losses.batches import DistributedLoss, Embed, cached, direct
from mlmkit.train.losses.embedding import (
    CachedMultipleNegativesRankingLoss,
    CoSENTLoss,
    DistillKLDivLoss,
    MarginMSELoss,
    MatryoshkaLoss,
    MSEDistillLoss,
    MultipleNegativesRankingLoss,
    SpladeLoss,
    flops,
)
from mlmkit.train.losses.rank import BinaryCrossEntropyLoss, CrossEncoderMNRLoss, LambdaLoss, ListNetLoss

__all__ = [
    "PairBatch", "Similarity", "Embed", "RegisteredLoss", "EmbeddingLoss", "RankLoss",
    "LOSS_CLASSES", "register", "loss_class", "build_loss", "embedding_loss", "rank_loss",
    "MultipleNegativesRankingLoss", "CachedMultipleNegativesRankingLoss", "CoSENTLoss", "MarginMSELoss",
    "DistillKLDivLoss", "MSEDistillLoss", "MatryoshkaLoss", "SpladeLoss", "flops",
    "BinaryCrossEntropyLoss", "CrossEncoderMNRLoss", "ListNetLoss", "LambdaLoss",
    "DistributedLoss", "direct", "cached",
]

register(
    MultipleNegativesRankingLoss, CachedMultipleNegativesRankingLoss, CoSENTLoss, MarginMSELoss,
    DistillKLDivLoss, MSEDistillLoss, BinaryCrossEntropyLoss, CrossEncoderMNRLoss, ListNetLoss, LambdaLoss,
)
