"""The BERT encoder and its pretraining heads (MLM + NSP), parameter names as Hugging Face BERT.

References:
1) Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers" (post-LN encoder,
   MLM + NSP, the tied decoder).
2) transformers' modeling_bert.py: the parameter names below are the same, so a state dict moves
   between the two without renaming (see checkpoint.py for the old gamma/beta spellings).

The speed trick: in training, the MLM head (dense, GELU, LayerNorm, the vocabulary-wide decoder)
runs only at the positions that carry a label (~15%), not at every token.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import BertConfig

ACT = {
    "gelu": F.gelu,  # exact erf form, as the original BERT
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        T = input_ids.size(1)
        pos = torch.arange(T, device=input_ids.device).unsqueeze(0)  # (1, T)
        x = self.word_embeddings(input_ids) + self.position_embeddings(pos) + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))  # (B, T, H)


class BertSelfAttention(nn.Module):
    """Multi-head self-attention. ``impl`` "sdpa" uses torch's fused kernels (flash / memory-efficient
    on GPU); "eager" spells out matmul + softmax, the form onnxruntime's Attention fusion recognises
    (export.py switches to it; PERF_NOTES: SDPA exports get no fusion)."""

    impl = "sdpa"

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.n_head, self.head_dim = config.num_attention_heads, config.head_dim
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_head, self.head_dim).permute(0, 2, 1, 3)  # (B, nh, T, hd)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, queries: torch.Tensor | None = None) -> torch.Tensor:
        # mask: (B, 1, 1, T) additive, 0 on real tokens and a large negative number on padding;
        # queries: (B, Tq, H) when only some positions need an output (see encode_cls), else all of x
        B, T, H = x.shape
        if queries is not None:
            T = queries.size(1)
        q = self._heads(self.query(x if queries is None else queries))  # (B, nh, Tq, hd)
        k, v = self._heads(self.key(x)), self._heads(self.value(x))
        if self.impl == "sdpa":
            p = self.dropout_p if self.training else 0.0
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), dropout_p=p)
        else:
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)  # (B, nh, T, T)
            probs = self.dropout(torch.softmax(scores + mask, dim=-1))
            ctx = torch.matmul(probs, v)  # (B, nh, T, hd)
        return ctx.permute(0, 2, 1, 3).contiguous().view(B, T, H)


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)  # post-LN, as the original BERT


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, queries: torch.Tensor | None = None) -> torch.Tensor:
        return self.output(self.self(x, mask, queries), x if queries is None else queries)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACT[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class BertOutput(BertSelfOutput):
    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, queries: torch.Tensor | None = None) -> torch.Tensor:
        x = self.attention(x, mask, queries)  # (B, Tq, H)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x, mask)
        return x


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(x[:, 0]))  # (B, H) from [CLS]


def init_weights(module: nn.Module, std: float) -> None:
    """BERT init: N(0, initializer_range) weights, zero biases, unit LayerNorm; padding row zero."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=std)
            if m.padding_idx is not None:
                with torch.no_grad():
                    m.weight[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def extended_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, T) 1/0 mask -> (B, 1, 1, T) additive mask broadcast over heads and query positions."""
    m = attention_mask[:, None, None, :].to(dtype)
    return (1.0 - m) * -10000.0  # finite, so a fully padded row never turns into NaN


class BertModel(nn.Module):
    """Embeddings -> encoder -> optional pooler. Returns (sequence_output (B,T,H), pooled (B,H) | None)."""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None

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
        return x, (self.pooler(x) if self.pooler is not None else None)


def encode_cls(
    bert: BertModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
) -> torch.Tensor:
    """The pooled [CLS] vector (B, H), equal to ``bert(...)[1]``, with the last layer computed for
    [CLS] only: a sequence classifier reads nothing else, so 1/L of the encoder's work is skipped
    (inference only; export uses it for the classification graph)."""
    x = bert.embeddings(input_ids, token_type_ids)
    mask = extended_mask(attention_mask, x.dtype)
    *body, last = bert.encoder.layer
    for layer in body:
        x = layer(x, mask)
    cls = last(x, mask, queries=x[:, :1])  # (B, 1, H)
    return bert.pooler(cls)


class BertForLabels(nn.Module):
    """transformers' BertForSequenceClassification (``per_token`` False: a linear head on the pooled
    [CLS] vector) or BertForTokenClassification (``per_token`` True: on every token, no pooler),
    under their parameter names (bert.*, classifier.*). The head's dropout is the config's
    ``classifier_dropout``, else ``hidden_dropout_prob``, as there, and so is the loss of each
    ``problem_type``: cross-entropy (label -100 ignored), per-label binary cross-entropy for
    multi_label_classification, mean squared error for regression."""

    def __init__(self, config: BertConfig, per_token: bool, problem_type: str = "single_label_classification") -> None:
        super().__init__()
        self.config, self.per_token, self.problem_type = config, per_token, problem_type
        self.bert = BertModel(config, add_pooling_layer=not per_token)
        p = config.extra.get("classifier_dropout")
        self.dropout = nn.Dropout(config.hidden_dropout_prob if p is None else p)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        init_weights(self, config.initializer_range)  # the encoder is overwritten by the checkpoint

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        seq, pooled = self.bert(input_ids, attention_mask, token_type_ids)  # (B, T, H), tanh(W h_[CLS]) (B, H)
        logits = self.classifier(self.dropout(seq if self.per_token else pooled))  # (B, T, L) or (B, L)
        out = {"logits": logits, "probabilities": torch.softmax(logits.float(), dim=-1)}
        if labels is None:
            return out
        if self.problem_type == "regression":
            out["loss"] = F.mse_loss(logits.float().squeeze(-1), labels.float())  # (B,) against (B,)
        elif self.problem_type == "multi_label_classification":
            out["loss"] = F.binary_cross_entropy_with_logits(logits.float(), labels.float())  # (B, L) 0/1 targets
        else:
            flat = logits.float().reshape(-1, logits.size(-1))  # (B*T, L) or (B, L)
            if bool((labels != -100).any()):
                out["loss"] = F.cross_entropy(flat, labels.reshape(-1), ignore_index=-100)
            else:  # a batch of continuation windows only: no target, no NaN
                out["loss"] = flat.sum() * 0.0
        return out


def set_attention_impl(model: nn.Module, impl: str) -> None:
    """Switch every attention block between "sdpa" (training, GPU) and "eager" (ONNX export)."""
    if impl not in ("sdpa", "eager"):
        raise ValueError(f"attention impl must be 'sdpa' or 'eager', not {impl!r}")
    for m in model.modules():
        if isinstance(m, BertSelfAttention):
            m.impl = impl


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACT[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)  # tied to word embeddings
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the bias inside the matmul (addmm): a separate add is one more pass over (N, V) logits
        return F.linear(self.transform(x), self.decoder.weight, self.bias)  # (..., V)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


def masked_lm_loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy over the masked positions only: logits (N, V), targets (N,).

    With nothing masked it is 0 (with a graph, so backward still works), never NaN."""
    if targets.numel() == 0:
        return logits.sum() * 0.0
    return F.cross_entropy(logits.float(), targets, reduction=reduction)


class BertForPreTraining(nn.Module):
    """BERT with the MLM and NSP heads.

    forward(..., labels=(B,T) with -100 off the masked set) computes the MLM head at the labelled
    positions only and returns ``mlm_logits`` (N, V) for those N positions; without labels it returns
    full ``prediction_logits`` (B, T, V), as transformers does.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config)
        init_weights(self, config.initializer_range)
        self.tie_weights()

    def tie_weights(self) -> None:
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        seq, pooled = self.bert(input_ids, attention_mask, token_type_ids)
        out = {"nsp_logits": self.cls.seq_relationship(pooled)}  # (B, 2)
        if labels is None:
            out["prediction_logits"] = self.cls.predictions(seq)  # (B, T, V)
            return out
        where = labels != -100  # (B, T)
        out["mlm_logits"] = self.cls.predictions(seq[where])  # (N, V): the head at masked positions only
        out["mlm_labels"] = labels[where]
        out["mlm_loss"] = masked_lm_loss(out["mlm_logits"], out["mlm_labels"])
        loss = out["mlm_loss"]
        if next_sentence_label is not None:
            out["nsp_loss"] = F.cross_entropy(out["nsp_logits"].float(), next_sentence_label)
            loss = loss + out["nsp_loss"]
        out["loss"] = loss
        return out
