"""The one encoder core every family runs on: embeddings -> layers -> heads, named as Hugging Face BERT.

References:
1) Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers" (post-LN encoder,
   MLM + NSP, the tied decoder).
2) transformers' modeling_bert.py (and modeling_roberta / distilbert / electra / modernbert): inside
   mlmkit a model's parameters carry BERT's names (bert.embeddings.*, bert.encoder.layer.N.*,
   cls.predictions.*, classifier.*); a family (models/config.py's Family, a module of its own in
   models/) renames them to its own on the way in and out, and supplies the blocks that differ
   (positions, layers, norms, heads' activations).

The speed trick: in training, the MLM head (dense, activation, LayerNorm, the vocabulary-wide
decoder) runs only at the positions that carry a label (~15%), not at every token.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mlmkit.models.config import ACT, ModelConfig


def family_of(config: ModelConfig) -> Any:
    """The config's model family (models/config.py's Family), looked up by its model_type."""
    return config.family


def layer_norm(config: ModelConfig, size: int | None = None) -> nn.LayerNorm:
    """The family's LayerNorm: eps from the config, a bias unless the config says none (ModernBERT)."""
    return nn.LayerNorm(size or config.hidden_size, eps=config.layer_norm_eps, bias=bool(config.extra.get("norm_bias", True)))


class BertEmbeddings(nn.Module):
    """Word (+ position) (+ token type) embeddings, LayerNorm, dropout, at the family's embedding
    size, projected to the hidden size where that differs (ELECTRA's embeddings_project)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        fam = family_of(config)
        E, pad = fam.embedding_size(config), config.pad_token_id
        self.positions = fam.positions  # "absolute", "padding_offset" (RoBERTa) or "none" (rotary, in the layers)
        self.pad_id = pad
        self.word_embeddings = nn.Embedding(config.vocab_size, E, padding_idx=pad)
        # the tables a family lacks are not there at all (as in transformers: no such module, no such
        # weights); which ones are is said by ``positions`` and ``type_rows``
        if self.positions != "none":
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, E,
                                                    padding_idx=pad if self.positions == "padding_offset" else None)
        self.type_rows = config.type_vocab_size  # 0: no token-type table
        if self.type_rows:
            self.token_type_embeddings = nn.Embedding(config.type_vocab_size, E)
        self.token_types = fam.uses_token_types(config)
        self.LayerNorm = layer_norm(config, E)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.project = nn.Linear(E, config.hidden_size) if E != config.hidden_size else None

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        x = self.word_embeddings(input_ids)  # (B, T, E)
        if self.positions == "absolute":
            x = x + self.position_embeddings(torch.arange(input_ids.size(1), device=input_ids.device).unsqueeze(0))
        elif self.positions == "padding_offset":  # RoBERTa: pad + 1, pad + 2, ... over real tokens; pad on padding
            real = (input_ids != self.pad_id).long()
            x = x + self.position_embeddings(torch.cumsum(real, dim=1) * real + self.pad_id)
        if self.type_rows:
            if self.token_types and token_type_ids is not None:
                x = x + self.token_type_embeddings(token_type_ids)
            else:  # one token type (RoBERTa's): its row, added everywhere
                x = x + self.token_type_embeddings.weight[0]
        x = self.dropout(self.LayerNorm(x))
        return self.project(x) if self.project is not None else x  # (B, T, H)


class Attention(nn.Module):
    """What every family's attention block is: the exporter switches it between two forms of the
    same product, and finds it by this class (``set_attention_impl``), so a family's attention must
    subclass it. ``impl`` "sdpa" uses torch's fused kernels (flash / memory-efficient on GPU, what
    training runs); "eager" spells out matmul + softmax, the form onnxruntime's Attention fusion
    recognises (SDPA exports get no fusion: docs/performance.md, "BERT fusions need the TorchScript
    exporter and eager attention"). A block that computes attention without declaring itself would
    stay SDPA in the graph, silently unfused: export refuses it (exporter/graphs.py).

    ``attend`` reads ``impl``, ``dropout_p`` (SDPA's dropout) and ``dropout`` (eager's), which a
    subclass sets; the class holds no parameters, so state dicts are the family's own."""

    IMPLS = ("sdpa", "eager")
    impl = "sdpa"
    dropout_p: float
    dropout: nn.Module

    def set_impl(self, impl: str) -> None:
        if impl not in self.IMPLS:
            raise ValueError(f"attention impl must be 'sdpa' or 'eager', not {impl!r}")
        self.impl = impl


class BertSelfAttention(Attention):
    """Multi-head self-attention (query, key, value projections; core.attend)."""

    def __init__(self, config: ModelConfig) -> None:
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
        return attend(self, q, k, v, mask).permute(0, 2, 1, 3).contiguous().view(B, T, H)


def attend(m: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + mask) v for (B, nh, T, hd) heads: SDPA, or spelled out when ``m.impl``
    is "eager" (the form onnxruntime fuses)."""
    if m.impl == "sdpa":
        p = m.dropout_p if m.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), dropout_p=p)
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))  # (B, nh, Tq, T)
    probs = m.dropout(torch.softmax(scores + mask, dim=-1))
    return torch.matmul(probs, v)  # (B, nh, Tq, hd)


class BertSelfOutput(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = layer_norm(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)  # post-LN, as the original BERT


class BertAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, queries: torch.Tensor | None = None) -> torch.Tensor:
        return self.output(self.self(x, mask, queries), x if queries is None else queries)


class BertIntermediate(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACT[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class BertOutput(BertSelfOutput):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)


class BertLayer(nn.Module):
    """The post-LN block of BERT, RoBERTa, DistilBERT and ELECTRA."""

    def __init__(self, config: ModelConfig, index: int = 0) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, queries: torch.Tensor | None = None) -> torch.Tensor:
        x = self.attention(x, mask, queries)  # (B, Tq, H)
        return self.output(self.intermediate(x), x)


def make_layer(config: ModelConfig, index: int) -> nn.Module:
    """Layer ``index`` of the config's family: its own block, else the post-LN BertLayer."""
    return config.family.layer(config, index) or BertLayer(config, index)


def make_embeddings(config: ModelConfig) -> nn.Module:
    """The embeddings of the config's family: its own, else BertEmbeddings."""
    return config.family.embeddings(config) or BertEmbeddings(config)


class BertEncoder(nn.Module):
    """The family's layers, then its final norm where it has one (pre-LN families). A family may give
    the encoder modules of its own, shared by the layers (``Family.encoder_modules``), and hand every
    layer keyword arguments computed once per forward (``Family.layer_context``: DeBERTa's relative
    position embeddings and positions); BERT's layers get none."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        fam = family_of(config)
        self.config, self.family = config, fam  # (layer_context reads the config: which shared modules it has)
        self.layer = nn.ModuleList(make_layer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = layer_norm(config) if fam.final_norm else None  # pre-LN families' norm after the last layer
        for name, module in fam.encoder_modules(config).items():
            self.add_module(name, module)

    def start(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        """(the first layer's input, the keyword arguments of every layer call) for embeddings ``x``."""
        return self.family.layer_context(self, x, mask)

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        return self.final_norm(x) if self.final_norm is not None else x

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x, context = self.start(x, mask)
        for layer in self.layer:
            x = layer(x, mask, **context)
        return self.finish(x)


class BertPooler(nn.Module):
    """What a family's sequence head does before its classifier: pool ([CLS] or mean over real
    tokens), dense, activation (BERT/RoBERTa tanh, ELECTRA GELU, DistilBERT ReLU), and a LayerNorm
    where the family has one (ModernBERT); dropout before the dense layer where the family has it
    (DeBERTa's ContextPooler). ``pool`` "none" applies it at every token (ModernBERT's token and span
    heads)."""

    def __init__(self, config: ModelConfig, pool: str = "cls") -> None:
        super().__init__()
        fam = family_of(config)
        self.pool = pool
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=fam.head_bias(config))
        self.act = ACT[fam.pooler_act(config)]
        self.norm = layer_norm(config) if fam.pooler_norm else None
        p = fam.pooler_dropout(config)
        self.dropout = nn.Dropout(p) if p else None

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.pool == "cls":
            x = x[:, 0]  # (B, H)
        elif self.pool == "mean":
            x = mean_pool(x, torch.ones_like(x[..., 0]) if attention_mask is None else attention_mask)  # (B, H)
        if self.dropout is not None:
            x = self.dropout(x)
        x = self.act(self.dense(x))
        return self.norm(x) if self.norm is not None else x


def mean_pool(x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The mean of x (B, T, H) over the real tokens of (B, T) ``attention_mask`` -> (B, H): the
    sequence pooling of ModernBERT's head and the embedding task's. The token count is clamped at
    1e-9 as sentence-transformers clamps it (a fully padded row gives zeros, not NaN)."""
    m = attention_mask.to(x.dtype).unsqueeze(-1)  # (B, T, 1)
    return (x * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)


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
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def extended_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, T) 1/0 mask -> (B, 1, 1, T) additive mask broadcast over heads and query positions."""
    m = attention_mask[:, None, None, :].to(dtype)
    return (1.0 - m) * -10000.0  # finite, so a fully padded row never turns into NaN


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
        return x, (self.pooler(x, attention_mask) if self.pooler is not None else None)


def encode_cls(
    bert: BertModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
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

    def __init__(self, config: ModelConfig, per_token: bool, problem_type: str = "single_label_classification") -> None:
        super().__init__()
        fam = family_of(config)
        self.config, self.per_token, self.problem_type = config, per_token, problem_type
        if per_token:
            self.bert = BertModel(config, add_pooling_layer=fam.token_head, pool="none")
        else:
            self.bert = BertModel(config, pool=fam.sequence_pool(config))
        p = config.extra.get(fam.classifier_dropout_key)
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
        seq, pooled = self.bert(input_ids, attention_mask, token_type_ids)  # (B, T, H), the pooled vector (B, H) | per token
        logits = self.classifier(self.dropout(pooled if pooled is not None else seq))  # (B, T, L) or (B, L)
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


def token_encoder(config: ModelConfig) -> BertModel:
    """The encoder of a per-token head (QA spans, embeddings): the family's per-token transform
    (ModernBERT's head) as its pooler with ``pool`` "none", else no pooler."""
    return BertModel(config, add_pooling_layer=family_of(config).token_head, pool="none")


def token_states(bert: BertModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 token_type_ids: torch.Tensor | None) -> torch.Tensor:
    """(B, T, H) token vectors, through the per-token transform where the family has one."""
    seq, per_token = bert(input_ids, attention_mask, token_type_ids)
    return per_token if per_token is not None else seq


def attention_blocks(model: nn.Module) -> list[Attention]:
    """The model's attention blocks: the modules that declare themselves by subclassing Attention."""
    return [m for m in model.modules() if isinstance(m, Attention)]


def set_attention_impl(model: nn.Module, impl: str) -> int:
    """Switch every attention block between "sdpa" (training, GPU) and "eager" (ONNX export);
    returns how many there are (0: the model declares none, which export refuses)."""
    if impl not in Attention.IMPLS:
        raise ValueError(f"attention impl must be 'sdpa' or 'eager', not {impl!r}")
    blocks = attention_blocks(model)
    for m in blocks:
        m.set_impl(impl)
    return len(blocks)


class BertPredictionHeadTransform(nn.Module):
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
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        E = family_of(config).embedding_size(config)
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(E, config.vocab_size, bias=False)  # tied to word embeddings
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the bias inside the matmul (addmm): a separate add is one more pass over (N, V) logits
        return F.linear(self.transform(x), self.decoder.weight, self.bias)  # (..., V)


def tie_decoder(heads: nn.Module, bert: BertModel) -> None:
    """The MLM decoder's weight is the word embeddings (one parameter, as transformers ties them):
    checkpoints store it once (``Family.tied``), so every model with an MLM head ties it after
    building and after loading. ``heads``: a BertPreTrainingHeads."""
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
