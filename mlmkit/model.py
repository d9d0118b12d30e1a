"""BERT's classes under their old import path (task plugins import them from here); the code is the
family-agnostic core in models/core.py."""

from mlmkit.models.core import (  # noqa: F401
    BertEmbeddings,
    BertForLabels,
    BertForPreTraining,
    BertLayer,
    BertModel,
    BertPooler,
    BertSelfAttention,
    encode_cls,
    extended_mask,
    init_weights,
    masked_lm_loss,
    reads_cls_only,
    set_attention_impl,
    token_encoder,
    token_states,
)
