"""The encoder's blocks, under Hugging Face BERT's names: embeddings, the attention block every
family's subclasses (``Attention``), the post-LN layer, the encoder over a family's layers, the
pooler, and what they share (the family's LayerNorm, the additive mask, mean pooling, BERT's init).

These are BERT's blocks; a family (models/config.py's Family, a module of its own in models/)
supplies those that differ (positions, layers, norms, heads' activations), building on these. The
model and its heads (``BertModel``, ``BertForLabels``, ``BertForPreTraining``) are models/core.py's,
which re-exports everything here.

References: Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers" (the
post-LN encoder); Hugging Face's BertModel (the same parameter names, bert.embeddings.*,
bert.encoder.layer.N.*, and computation).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mlmkit.models.checks import ACT
from mlmkit.models.config import LayerArgs, ModelConfig


def family_of(config: ModelConfig) -> Any:
    """The config's model family (models/config.py's Family), looked up by its model_type."""
    return config.family


def layer_norm(config: ModelConfig, size: int | None = None) -> nn.LayerNorm:
    """The family's LayerNorm: eps from the config, a bias unless the config says none (ModernBERT)."""
    return nn.LayerNorm(size or config.hidden_size, eps=config.layer_norm_eps,
                        bias=bool(config.extra.get("norm_bias", True)))


def family_norm(config: ModelConfig, size: int | None = None) -> nn.Module:
    """The family's own normalisation (``Family.norm``: the RMSNorm of the Llama-style families),
    else its LayerNorm (``layer_norm``)."""
    return family_of(config).norm(config, size or config.hidden_size) or layer_norm(config, size)


class BertEmbeddings(nn.Module):
    """Word (+ position) (+ token type) embeddings, LayerNorm, dropout, at the family's embedding
    size, projected to the hidden size where that differs (ELECTRA's embeddings_project)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        fam = family_of(config)
        E, pad = fam.embedding_size(config), config.pad_token_id
        # "absolute", "padding_offset" (RoBERTa) or "none" (rotary, in the layers)
        self.positions = fam.positions
        self.pad_id = pad
        self.word_embeddings = nn.Embedding(config.vocab_size, E, padding_idx=pad)
        # the tables a family lacks are not there at all (as in transformers: no such module, no such
        # weights); which ones are is said by ``positions`` and ``type_rows``
        if self.positions != "none":
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, E,
                                                    padding_idx=pad if self.positions == "padding_offset"
                                                    else None)
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
            x = x + self.position_embeddings(torch.arange(input_ids.size(1),
                                                          device=input_ids.device).unsqueeze(0))
        # RoBERTa: pad + 1, pad + 2, ... over real tokens; pad on padding
        elif self.positions == "padding_offset":
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
    """Multi-head self-attention (query, key, value projections; ``attend``, below)."""

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

    def forward(self, x: torch.Tensor, mask: torch.Tensor,
                queries: torch.Tensor | None = None) -> torch.Tensor:
        # mask: (B, 1, 1, T) additive, 0 on real tokens and a large negative number on padding;
        # queries: (B, Tq, H) when only some positions need an output (see core.encode_cls), else all of x
        B, T, H = x.shape
        if queries is not None:
            T = queries.size(1)
        q = self._heads(self.query(x if queries is None else queries))  # (B, nh, Tq, hd)
        k, v = self._heads(self.key(x)), self._heads(self.value(x))
        return attend(self, q, k, v, mask).permute(0, 2, 1, 3).contiguous().view(B, T, H)


def attend(m: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           mask: torch.Tensor) -> torch.Tensor:
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

    def forward(self, x: torch.Tensor, mask: torch.Tensor,
                queries: torch.Tensor | None = None) -> torch.Tensor:
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

    def forward(self, x: torch.Tensor, mask: torch.Tensor,
                queries: torch.Tensor | None = None) -> torch.Tensor:
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
        # (layer_context reads the config: which shared modules it has)
        self.config, self.family = config, fam
        self.layer = nn.ModuleList(make_layer(config, i) for i in range(config.num_hidden_layers))
        # pre-LN families' norm after the last layer
        self.final_norm = family_norm(config) if fam.final_norm else None
        for name, module in fam.encoder_modules(config).items():
            self.add_module(name, module)

    def start(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, LayerArgs]:
        """(the first layer's input, the keyword arguments of every layer call) for embeddings ``x``."""
        return self.family.layer_context(self, x, mask)

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        return self.final_norm(x) if self.final_norm is not None else x

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x, context = self.start(x, mask)
        for layer in self.layer:
            x = layer(x, mask, **context)
        return self.finish(x)


POOLS = ("cls", "mean", "last", "late", "none")
"""BertPooler's poolings: see ``Family.sequence_pool``; "none" keeps every token (per-token heads)."""


class BertPooler(nn.Module):
    """What a family's sequence head does before its classifier: pool ([CLS], mean over real tokens,
    or the last real token), dense, activation (BERT/RoBERTa tanh, ELECTRA GELU, DistilBERT ReLU),
    and a LayerNorm where the family has one (ModernBERT); dropout before the dense layer where the
    family has it (DeBERTa's ContextPooler). ``pool`` "none" applies it at every token (ModernBERT's
    token and span heads); "late" applies dense and activation at every token, then takes the mean
    (EuroBERT's, which averages the classifier's logits: the same, the classifier being linear). A
    family without the dense layer (``Family.pooler_dense``: a decoder's ``score`` head) only pools."""

    def __init__(self, config: ModelConfig, pool: str = "cls") -> None:
        super().__init__()
        fam = family_of(config)
        if pool not in POOLS:
            raise ValueError(f"pooling {pool!r} is not one of {POOLS}")
        # "last" passes over the padding id (transformers' rule)
        self.pool, self.pad_id = pool, config.pad_token_id
        dense = fam.pooler_dense(config)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size,
                               bias=fam.head_bias(config)) if dense else None
        self.act = ACT[fam.pooler_act(config)] if dense else None
        self.norm = layer_norm(config) if fam.pooler_norm else None
        p = fam.pooler_dropout(config)
        self.dropout = nn.Dropout(p) if p else None

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None,
                input_ids: torch.Tensor | None = None) -> torch.Tensor:
        if attention_mask is None:
            attention_mask = torch.ones_like(x[..., 0])
        if self.pool == "late":
            return mean_pool(self._transform(x), attention_mask)  # (B, H)
        if self.pool == "cls":
            x = x[:, 0]  # (B, H)
        elif self.pool == "mean":
            x = mean_pool(x, attention_mask)  # (B, H)
        elif self.pool == "last":
            x = last_token(x, attention_mask, input_ids, self.pad_id)  # (B, H)
        return self._transform(x)

    def _transform(self, x: torch.Tensor) -> torch.Tensor:
        if self.dropout is not None:
            x = self.dropout(x)
        if self.dense is not None and self.act is not None:
            x = self.act(self.dense(x))
        return self.norm(x) if self.norm is not None else x


def last_token(x: torch.Tensor, attention_mask: torch.Tensor, input_ids: torch.Tensor | None,
               pad_id: int | None) -> torch.Tensor:
    """The state (B, H) of each row's last token that is real (``attention_mask``) and not the padding
    id: transformers' GenericForSequenceClassification takes the rightmost token whose id is not
    pad_token_id, so a text that ends with the padding token (Qwen3's tokenizer appends
    <|endoftext|>, its pad token) is read at the token before it. The first token where none is."""
    keep = attention_mask != 0  # (B, T)
    if input_ids is not None and pad_id is not None:
        keep = keep & (input_ids != pad_id)
    where = torch.arange(x.size(1), device=x.device)[None, :] * keep  # (B, T): a position where kept, else 0
    last = where.amax(dim=1)  # (B,): ReduceMax, not ArgMax (onnxruntime has no int64 ArgMax)
    return x.gather(1, last[:, None, None].expand(-1, 1, x.size(-1))).squeeze(1)


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

