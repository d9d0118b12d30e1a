"""The torch side of the task author's kit: what a plugin's ``build_model`` and head modules import.

``mlmkit.taskkit`` is the torch-free kit a task imports at module level; this one imports torch, so a
task imports it inside ``build_model`` only, or from a head module that ``build_model`` imports
(docs/plugins.md). This module is the one public path of these names; each is defined where the core
uses it:

- the model config (mlmkit.models.config) and the encoder core (mlmkit.models.core): ``BertModel``
  (the encoder of whatever family the config is, under BERT's parameter names), its heads and helpers;
- the one forward and pooling of the models with an output per text (``token_states`` and ``pool``),
  and the PairBatch they train on (mlmkit.models.pooled);
- the embedding and ranking losses, one class each (MultipleNegativesRankingLoss, CoSENTLoss ...),
  ``register_loss_class`` (a plugin's class for the name it declared in mlmkit.objectives) and
  ``build_loss``, and how a batch's embeddings are computed for them, all at once or GradCache-style
  (mlmkit.train.losses);
- a fine-tuned run loaded for prediction, and the one prediction loop (mlmkit.train.finetune,
  mlmkit.runtime.prediction): a teacher's outputs computed inside a task.
"""

from __future__ import annotations

from mlmkit.models.config import ModelConfig
from mlmkit.models.core import (
    BertEmbeddings,
    BertForLabels,
    BertForPreTraining,
    BertLayer,
    BertModel,
    BertPooler,
    BertPreTrainingHeads,
    BertSelfAttention,
    encode_cls,
    extended_mask,
    init_weights,
    masked_lm_loss,
    mean_pool,
    reads_cls_only,
    set_attention_impl,
    tie_decoder,
    token_encoder,
)
from mlmkit.models.pooled import Dense, PairBatch, TextEncoder, pool, token_states
from mlmkit.retrieval.maxsim import maxsim
from mlmkit.runtime.prediction import predict
from mlmkit.train.finetune import load_finetuned, torch_forward
from mlmkit.train.losses import (
    BinaryCrossEntropyLoss,
    CachedMultipleNegativesRankingLoss,
    CoSENTLoss,
    CrossEncoderMNRLoss,
    DistillKLDivLoss,
    DistributedLoss,
    EmbeddingLoss,
    LambdaLoss,
    ListNetLoss,
    MarginMSELoss,
    MatryoshkaLoss,
    MSEDistillLoss,
    MultipleNegativesRankingLoss,
    RankLoss,
    SpladeLoss,
    build_loss,
    cached,
    direct,
    embedding_loss,
    flops,
    rank_loss,
)
from mlmkit.train.losses import register as register_loss_class

__all__ = [
    # the config and the encoder
    "ModelConfig", "BertEmbeddings", "BertLayer", "BertModel", "BertPooler", "BertSelfAttention",
    "extended_mask", "init_weights", "set_attention_impl", "token_encoder", "token_states", "mean_pool",
    "encode_cls", "reads_cls_only",
    # the models with an output per text: one forward (part -> training on a PairBatch), one pooling
    "TextEncoder", "pool", "Dense",
    # heads
    "BertForLabels", "BertForPreTraining", "BertPreTrainingHeads", "tie_decoder", "masked_lm_loss",
    # losses of embeddings (a batch's PairBatch) and of rankings (a query's candidates), one class each
    "PairBatch", "maxsim", "EmbeddingLoss", "RankLoss", "register_loss_class", "build_loss", "embedding_loss",
    "rank_loss", "MultipleNegativesRankingLoss", "CachedMultipleNegativesRankingLoss", "CoSENTLoss",
    "MarginMSELoss", "DistillKLDivLoss", "MSEDistillLoss", "MatryoshkaLoss", "SpladeLoss", "DistributedLoss",
    "flops", "direct", "cached",
    "BinaryCrossEntropyLoss", "CrossEncoderMNRLoss", "ListNetLoss", "LambdaLoss",
    # prediction with a fine-tuned run
    "load_finetuned", "torch_forward", "predict",
]
