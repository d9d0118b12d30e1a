"""The one encoder core every family runs on: ``BertModel`` (embeddings -> layers -> pooler) and its
heads, named as Hugging Face BERT.

References:
1) Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers" (post-LN encoder,
   MLM + NSP, the tied decoder).
2) Hugging Face's BertModel and its heads: the same computation under the same parameter names
   (its RoBERTa, DistilBERT, ELECTRA and ModernBERT models likewise, under theirs). Inside mlmkit a
   model's parameters carry BERT's names (bert.embeddings.*, bert.encoder.layer.N.*,
   cls.predictions.*, classifier.*); a family (models/config.py's Family, a module of its own in
   models/) renames them to its own on the way in and out, and supplies the blocks that differ
   (positions, layers, norms, heads' activations).

The blocks the model is made of (embeddings, attention, layers, encoder, pooler) are
models/blocks.py's; their names are importable from here too.

The speed trick: in training, the MLM head (dense, activation, LayerNorm, the vocabulary-wide
decoder) runs only at the positions that carry a label (~15%), not at every token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mlmkit.models.blocks import (
    Attention,
    BertAttention,
    BertEmbeddings,
    BertEncoder,
    BertIntermediate,
    BertLayer,
    BertOutput,
    BertPooler,
    BertSelfAttention,
    BertSelfOutput,
    attend,
    attention_blocks,
    extended_mask,
    family_norm,
    family_of,
    init_weights,
    last_token,
    layer_norm,
    make_embeddings,
    make_layer,
    mean_pool,
    set_attention_impl,
)
from mlmkit.models.checks import ACT
from mlmkit.models.config import ModelConfig

__all__ = [
    # the blocks (mlmkit/models/blocks.py)
    "ACT", "family_of", "layer_norm", "BertEmbeddings", "Attention", "BertSelfAttention", "attend",
    "BertSelfOutput",
    "BertAttention", "BertIntermediate", "BertOutput", "BertLayer", "make_layer", "make_embeddings",
    "BertEncoder",
    "BertPooler", "mean_pool", "init_weights", "extended_mask", "attention_blocks", "set_attention_impl",
    "family_norm",
    "last_token",
    # the model and its heads
    "BertModel", "encode_cls", "reads_cls_only", "BertForLabels", "token_encoder", "token_states",
    "BertPredictionHeadTransform", "BertLMPredictionHead", "tie_decoder", "BertPreTrainingHeads",
    "masked_lm_loss",
    "BertForPreTraining",
]


class BertModel(nn.Module):
    """Embeddings -> encoder -> optional pooler. Returns (sequence_output (B,T,H), pooled (B,H) | None).

    Families without token types (RoBERTa, DistilBERT, ModernBERT) ignore ``token_type_ids``."""

    def __init__(self, config: ModelConfig, add_pooling_layer: bool = True, pool: str = "cls") -> None:
        super().__init__()
        self.config = config
        self.embeddings = make_embeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config, pool) if add_pooling_layer else None

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids)
        x = self.encoder(x, extended_mask(attention_mask, x.dtype))
        return x, (self.pooler(x, attention_mask, input_ids) if self.pooler is not None else None)


def encode_cls(
    bert: BertModel, input_ids: torch.Tensor, attention_mask: torch.Tensor,
    token_type_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """The pooled [CLS] vector (B, H), equal to ``bert(...)[1]``, with the last layer computed for
    [CLS] only: a sequence classifier that reads [CLS] reads nothing else, so 1/L of the encoder's
    work is skipped (inference only; export uses it for the classification graph)."""
    pooler = bert.pooler
    if pooler is None:
        raise ValueError("encode_cls needs a model with a pooler (reads_cls_only says when it applies)")
    if token_type_ids is None:
        token_type_ids = torch.zeros_like(input_ids)
    x = bert.embeddings(input_ids, token_type_ids)
    mask = extended_mask(attention_mask, x.dtype)
    x, context = bert.encoder.start(x, mask)
    *body, last = bert.encoder.layer
    for layer in body:
        x = layer(x, mask, **context)
    cls = bert.encoder.finish(last(x, mask, queries=x[:, :1], **context))  # (B, 1, H)
    return pooler(cls)


def reads_cls_only(bert: BertModel) -> bool:
    """Whether the pooled vector depends on the [CLS] position alone (encode_cls applies)."""
    return bert.pooler is not None and bert.pooler.pool == "cls"


class BertForLabels(nn.Module):
    """transformers' *ForSequenceClassification (``per_token`` False: a head on the pooled vector) or
    *ForTokenClassification (``per_token`` True: on every token), under BERT's parameter names
    (bert.*, classifier.*; the family renames them). The head's dropout is the config's
    ``classifier_dropout``, else ``hidden_dropout_prob``, as there, and so is the loss of each
    ``problem_type``: cross-entropy (label -100 ignored), per-label binary cross-entropy for
    multi_label_classification, mean squared error for regression."""

    def __init__(self, config: ModelConfig, per_token: bool,
                 problem_type: str = "single_label_classification") -> None:
        super().__init__()
        fam = family_of(config)
        self.config, self.per_token, self.problem_type = config, per_token, problem_type
        if per_token:
            self.bert = BertModel(config, add_pooling_layer=fam.token_head, pool="none")
        else:
            self.bert = BertModel(config, pool=fam.sequence_pool(config))
        p = config.extra.get(fam.classifier_dropout_key)
        self.dropout = nn.Dropout(config.hidden_dropout_prob if p is None else p)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels,
                                    bias=fam.classifier_bias(config, per_token))
        init_weights(self, config.initializer_range)  # the encoder is overwritten by the checkpoint

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        # (B, T, H), the pooled vector (B, H) | per token
        seq, pooled = self.bert(input_ids, attention_mask, token_type_ids)
        logits = self.classifier(self.dropout(pooled if pooled is not None else seq))  # (B, T, L) or (B, L)
        out = {"logits": logits, "probabilities": torch.softmax(logits.float(), dim=-1)}
        if labels is None:
            return out
        if self.problem_type == "regression":
            out["loss"] = F.mse_loss(logits.float().squeeze(-1), labels.float())  # (B,) against (B,)
        elif self.problem_type == "multi_label_classification":
            # (B, L) 0/1 targets
            out["loss"] = F.binary_cross_entropy_with_logits(logits.float(), labels.float())
        else:
            flat = logits.float().reshape(-1, logits.size(-1))  # (B*T, L) or (B, L)
            if bool((labels != -100).any()):
                out["loss"] = F.cross_entropy(flat, labels.reshape(-1), ignore_index=-100)
            else:  # a batch of continuation windows only: no target, no NaN
                out["loss"] = flat.sum() * 0.0
        return out


def token_encoder(config: ModelConfig) -> BertModel:
    """The encoder of a per-token head (QA spans, embeddings): the family's per-token transform
    (ModernBERT's head) as its pooler with ``pool`` "none", else no pooler."""
    return BertModel(config, add_pooling_layer=family_of(config).token_head, pool="none")


def token_states(bert: BertModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 token_type_ids: torch.Tensor | None) -> torch.Tensor:
    """(B, T, H) token vectors, through the per-token transform where the family has one."""
    seq, per_token = bert(input_ids, attention_mask, token_type_ids)
    return per_token if per_token is not None else seq


class BertPredictionHeadTransform(nn.Module):
    """The MLM head's transform before the decoder: dense, activation, LayerNorm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        fam = family_of(config)
        E = fam.embedding_size(config)
        self.dense = nn.Linear(config.hidden_size, E, bias=fam.head_bias(config))
        self.act = ACT[fam.mlm_act(config)]
        self.LayerNorm = layer_norm(config, E)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    """The MLM head: the transform (none where the family's head has none: ``Family.mlm_transform``,
    EuroBERT's bare ``lm_head``), the decoder to the vocabulary (tied to the word embeddings unless
    ``Family.ties_decoder`` says otherwise) and its bias (none where ``Family.decoder_bias`` says so)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        fam = family_of(config)
        E = fam.embedding_size(config)
        self.transform: nn.Module = (BertPredictionHeadTransform(config) if fam.mlm_transform(config)
                                     else nn.Identity())
        # tied to the word embeddings (tie_decoder)
        self.decoder = nn.Linear(E, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size)) if fam.decoder_bias(config) else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the bias inside the matmul (addmm): a separate add is one more pass over (N, V) logits
        return F.linear(self.transform(x), self.decoder.weight, self.bias)  # (..., V)


def tie_decoder(heads: nn.Module, bert: BertModel) -> None:
    """The MLM decoder's weight is the word embeddings (one parameter, as transformers ties them):
    checkpoints store it once (rundir.checkpoint.tied_keys), so every model with an MLM head ties it after
    building and after loading. ``heads``: a BertPreTrainingHeads. A family whose config unties them
    (``Family.ties_decoder``: tie_word_embeddings false) keeps a decoder of its own."""
    if family_of(bert.config).ties_decoder(bert.config):
        heads.predictions.decoder.weight = bert.embeddings.word_embeddings.weight


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: ModelConfig, nsp: bool = True) -> None:
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        if nsp:
            self.seq_relationship = nn.Linear(config.hidden_size, 2)


def masked_lm_loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy over the masked positions only: logits (N, V), targets (N,).

    With nothing masked it is 0 (with a graph, so backward still works), never NaN."""
    if targets.numel() == 0:
        return logits.sum() * 0.0
    return F.cross_entropy(logits.float(), targets, reduction=reduction)


class BertForPreTraining(nn.Module):
    """The encoder with the MLM head, and for BERT the NSP head (other families have none: their
    pretraining is MLM only, and their run is a *ForMaskedLM checkpoint).

    forward(..., labels=(B,T) with -100 off the masked set) computes the MLM head at the labelled
    positions only and returns ``mlm_logits`` (N, V) for those N positions; without labels it returns
    full ``prediction_logits`` (B, T, V), as transformers does.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.nsp = family_of(config).nsp
        self.bert = BertModel(config, add_pooling_layer=self.nsp)
        self.cls = BertPreTrainingHeads(config, nsp=self.nsp)
        init_weights(self, config.initializer_range)
        self.tie_weights()

    def tie_weights(self) -> None:
        tie_decoder(self.cls, self.bert)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        seq, pooled = self.bert(input_ids, attention_mask, token_type_ids)
        out = {"nsp_logits": self.cls.seq_relationship(pooled)} if self.nsp else {}  # (B, 2)
        if labels is None:
            out["prediction_logits"] = self.cls.predictions(seq)  # (B, T, V)
            return out
        where = labels != -100  # (B, T)
        out["mlm_logits"] = self.cls.predictions(seq[where])  # (N, V): the head at masked positions only
        out["mlm_labels"] = labels[where]
        out["mlm_loss"] = masked_lm_loss(out["mlm_logits"], out["mlm_labels"])
        loss = out["mlm_loss"]
        if next_sentence_label is not None and self.nsp:
            out["nsp_loss"] = F.cross_entropy(out["nsp_logits"].float(), next_sentence_label)
            loss = loss + out["nsp_loss"]
        out["loss"] = loss
        return out
