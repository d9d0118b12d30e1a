"""DeBERTa-v2 and v3 (as Hugging Face's DebertaV2Model; He et al. 2021, "DeBERTa: Decoding-enhanced
BERT with Disentangled Attention", and "DeBERTaV3", 2023): config.json model_type "deberta-v2".

What differs from BERT:
- the embeddings: word embeddings at ``embedding_size``, absolute positions only where
  ``position_biased_input`` (v3: none), token types only where ``type_vocab_size`` > 0 (v3: none, so
  its graphs take no token_type_ids), the projection to the hidden size (``embed_proj``, no bias)
  before the LayerNorm, and the padding rows zeroed (the attention mask multiplied in);
- disentangled attention: besides content-to-content (query_proj / key_proj / value_proj), each
  query's content against the relative position of each key (c2p) and each key's content against
  the relative position of the query (p2c), all scaled by sqrt(head_dim * (1 + number of terms));
  the relative positions are log-bucketed (``position_buckets``, ``max_relative_positions``) and
  index ``encoder.rel_embeddings`` (normed by ``encoder.LayerNorm`` where ``norm_rel_ebd`` has
  "layer_norm"), projected by the layer's own query / key projections (``share_att_key``) or by
  ``pos_query_proj`` / ``pos_key_proj``; the encoder builds both once per forward
  (Family.layer_context) and hands them to every layer;
- the sequence head is the ContextPooler: dropout (``pooler_dropout``), ``pooler.dense`` and
  ``pooler_hidden_act`` (GELU) on [CLS], outside the backbone (``pooler.*``, mlmkit's bert.pooler.*);
  its classifier's dropout is ``cls_dropout``, else hidden_dropout_prob;
- no NSP: pretraining is MLM only and the run is a DebertaV2ForMaskedLM. Its head is BERT's
  (``cls.predictions.*``: what transformers writes with ``legacy`` true, its default); the head of
  ``legacy`` false and of the original checkpoints, ``lm_predictions.lm_head.{dense,LayerNorm,bias}``,
  computes the same and is read into it (written back as ``cls.predictions.*``).

The relative positions of a query i and a key j are a function of i - j only; the row of
``rel_embeddings`` each difference reads is tabled once (RelativePositions), and a forward indexes
the table with the differences of torch.arange of its runtime lengths: an exported graph serves
every length, and computes no logarithm that another runtime could round to another bucket.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from mlmkit.errors import ConfigError
from mlmkit.models.config import ExtraSize, Family, LayerArgs, ModelConfig, StateDict
from mlmkit.models.core import ACT, Attention, BertIntermediate, BertOutput, BertSelfOutput, layer_norm
from mlmkit.registry import HFConfig

TERMS = ("c2p", "p2c")  # the relative attention terms transformers' DeBERTa-v2 computes
LEGACY_MLM_HEAD = (  # DebertaV2OnlyMLMHead (legacy false, the original checkpoints) -> BERT's head
    ("lm_predictions.lm_head.dense.", "cls.predictions.transform.dense."),
    ("lm_predictions.lm_head.LayerNorm.", "cls.predictions.transform.LayerNorm."),
    ("lm_predictions.lm_head.bias", "cls.predictions.bias"),
)


# ---- config ------------------------------------------------------------------------------------
def _flag(config: ModelConfig, key: str, default: bool) -> bool:
    v = config.extra.get(key, default)
    if not isinstance(v, bool):
        raise ConfigError(f"config {key} must be true or false, got {v!r}", "fix the config.json")
    return v


def _int(config: ModelConfig, key: str, default: int) -> int:
    v = config.extra.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"config {key} must be an integer, got {v!r}", "fix the config.json")
    return v


def _names(config: ModelConfig, key: str, default: str | None) -> list[str]:
    """A list of names or a "|"-separated string of them (older configs), lowercased, as transformers reads
    it."""
    v = config.extra.get(key, default)
    if v is None:
        return []
    if isinstance(v, str):
        v = v.lower().split("|")
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ConfigError(f"config {key} must be a list of names or a '|'-separated string, got {v!r}",
                          "fix the config.json")
    return [x.strip().lower() for x in v if x.strip()]


def relative_attention(config: ModelConfig) -> bool:
    return _flag(config, "relative_attention", False)


def attention_terms(config: ModelConfig) -> tuple[str, ...]:
    """The relative terms among ("c2p", "p2c") the config's ``pos_att_type`` names."""
    names = _names(config, "pos_att_type", None)
    return tuple(t for t in TERMS if t in names)


def position_buckets(config: ModelConfig) -> int:
    """``position_buckets``; 0 or less: relative positions are not bucketed."""
    return _int(config, "position_buckets", -1)


def max_relative_positions(config: ModelConfig) -> int:
    """``max_relative_positions``, max_position_embeddings where it is below 1 (as transformers)."""
    m = _int(config, "max_relative_positions", -1)
    return m if m >= 1 else config.max_position_embeddings


def span(config: ModelConfig) -> int:
    """Relative distances have rows -span .. span - 1 of ``rel_embeddings`` (2 * span rows)."""
    b = position_buckets(config)
    return b if b > 0 else max_relative_positions(config)


def bucket(rel: torch.Tensor, buckets: int, max_position: int) -> torch.Tensor:
    """Log-bucketed relative positions (DeBERTa's make_log_bucket_position): distances within
    buckets // 2 as they are, farther ones on a log scale reaching buckets - 1 at max_position - 1,
    the sign kept. Float32, in transformers' order of operations (its buckets to the last one)."""
    mid = buckets // 2
    sign = torch.sign(rel)
    near = (rel < mid) & (rel > -mid)
    dist = torch.where(near, torch.tensor(mid - 1).type_as(rel), rel.abs())
    log_ratio = torch.log(dist / mid) / torch.log(torch.tensor((max_position - 1) / mid)) * (mid - 1)
    far = torch.ceil(log_ratio) + mid
    return torch.where(dist <= mid, rel.type_as(far), far * sign).long()


# ---- blocks ------------------------------------------------------------------------------------
class DebertaEmbeddings(nn.Module):
    """Word (+ position) (+ token type) embeddings at the embedding size, ``embed_proj`` to the hidden
    size, LayerNorm, dropout. The padding rows are zeroed by the encoder (layer_context), which has the
    mask."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        fam = config.family
        E = fam.embedding_size(config)
        self.word_embeddings = nn.Embedding(config.vocab_size, E, padding_idx=config.pad_token_id)
        # the modules a config leaves out are not there at all (no weights, as in transformers): the flags say
        # which are
        self.absolute, self.typed, self.projected = (_flag(config, "position_biased_input", True),
                                                     config.type_vocab_size > 0,
                                                     E != config.hidden_size)
        if self.absolute:
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, E)
        if self.typed:
            self.token_type_embeddings = nn.Embedding(config.type_vocab_size, E)
        if self.projected:
            self.embed_proj = nn.Linear(E, config.hidden_size, bias=False)
        self.LayerNorm = layer_norm(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        x = self.word_embeddings(input_ids)  # (B, T, E)
        if self.absolute:
            x = x + self.position_embeddings(torch.arange(input_ids.size(1),
                                                          device=input_ids.device).unsqueeze(0))
        if self.typed:
            x = x + (self.token_type_embeddings(token_type_ids) if token_type_ids is not None
                     else self.token_type_embeddings.weight[0])
        if self.projected:
            x = self.embed_proj(x)
        return self.dropout(self.LayerNorm(x))  # (B, T, H)


class RelativePositions(nn.Module):
    """The row of ``rel_embeddings`` that query position i reads for key position j: a table over
    the differences i - j, clamped to -span .. span - 1 as transformers clamps them. Beyond
    ``reach`` (where the clamp holds on both sides) every difference reads the first or last row,
    so the table ends there; a (non-persistent) buffer, in no state dict."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        S, M, buckets = span(config), max_relative_positions(config), position_buckets(config)
        reach = max(S, M) + 1
        # the rows grow with the distance (both ways), so once both ends are clamped all farther ones are
        while True:
            rel = torch.arange(-reach, reach + 1)
            table = ((bucket(rel, buckets, M) if buckets > 0 else rel) + S).clamp(0, 2 * S - 1)
            if table[0] == 0 and table[-1] == 2 * S - 1:
                break
            if reach > 1 << 22:
                raise ConfigError(f"relative positions of {buckets} buckets over {M} never reach the span",
                                  "fix the config.json")
            reach *= 2  # odd bucket counts clamp farther out on one side
        self.reach = reach
        self.register_buffer("table", table, persistent=False)  # (2 * reach + 1,)

    def forward(self, Tq: torch.Tensor | int, T: torch.Tensor | int, device: torch.device) -> torch.Tensor:
        """(Tq, T) rows for queries 0 .. Tq-1 against keys 0 .. T-1, from aranges of the runtime
        lengths (no slicing by a size, which the ONNX tracer would freeze)."""
        rel = torch.arange(Tq, device=device)[:, None] - torch.arange(T, device=device)[None, :]
        return self.table[rel.clamp(-self.reach, self.reach) + self.reach]


class Relative(NamedTuple):
    """What every layer gets from the encoder for one forward."""

    embeddings: torch.Tensor  # (2 * span, H): rel_embeddings, normed where the config says
    index: torch.Tensor  # (T, T): the row of ``embeddings`` for query i, key j
    positions: RelativePositions  # builds the index for the first Tq queries only (the [CLS]-only last layer)


class DisentangledSelfAttention(Attention):
    """Content-to-content attention plus the c2p / p2c relative terms, which enter as an additive bias
    on the scores: SDPA's float mask, or the eager form's added scores."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        H = config.hidden_size
        self.n_head, self.head_dim = config.num_attention_heads, config.head_dim
        self.query_proj = nn.Linear(H, H)
        self.key_proj = nn.Linear(H, H)
        self.value_proj = nn.Linear(H, H)
        self.relative = relative_attention(config)
        self.terms = attention_terms(config)
        # transformers scales every term by sqrt(head_dim * (1 + len(terms))), relative attention or not
        self.scale_factor = 1 + len(self.terms)
        self.share = _flag(config, "share_att_key", False)
        if self.relative:
            self.pos_dropout = nn.Dropout(config.hidden_dropout_prob)
            if not self.share and "c2p" in self.terms:
                self.pos_key_proj = nn.Linear(H, H)
            if not self.share and "p2c" in self.terms:
                self.pos_query_proj = nn.Linear(H, H)
        self.dropout_p = config.attention_probs_dropout_prob
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.n_head, self.head_dim)).transpose(-3, -2)  # (..., nh, T, hd)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, queries: torch.Tensor | None = None,
                relative: Relative | None = None) -> torch.Tensor:
        # x (B, T, H); mask (B, 1, 1, T) additive; queries (B, Tq, H): the first Tq positions, else all of x
        q = self._heads(self.query_proj(x if queries is None else queries))  # (B, nh, Tq, hd)
        k, v = self._heads(self.key_proj(x)), self._heads(self.value_proj(x))  # (B, nh, T, hd)
        if self.relative and self.terms and relative is not None:
            index = relative.index if queries is None else relative.positions(queries.size(1), x.size(1),
                                                                              x.device)
            # (B, nh, Tq, T)
            mask = mask + self.relative_scores(q, k, self.pos_dropout(relative.embeddings), index, x.size(0))
        return self.attend(q, k, v, mask).transpose(1, 2).flatten(2)  # (B, Tq, H)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """softmax(q k^T / sqrt(head_dim * scale_factor) + bias) v: core.attend at DeBERTa's scale, the
        eager form multiplying the scores by it. Measured: onnxruntime's BERT Attention fusion takes a
        division of the scores (or of q) for 1 / sqrt(head_dim) whatever the divisor, and the fused
        graph of a layer without relative terms (relative_attention false, scale_factor 3) lost the scale."""
        scale = 1.0 / math.sqrt(self.head_dim * self.scale_factor)
        if self.impl == "sdpa":
            p = self.dropout_p if self.training else 0.0
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), dropout_p=p,
                                                  scale=scale)
        scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # (B, nh, Tq, T)
        probs = self.dropout(torch.softmax(scores + bias, dim=-1))
        return torch.matmul(probs, v)  # (B, nh, Tq, hd)

    def relative_scores(self, q: torch.Tensor, k: torch.Tensor, rel: torch.Tensor, index: torch.Tensor,
                        batch: torch.Tensor | int) -> torch.Tensor:
        """(B, nh, Tq, T): c2p[i, j] = q_i . Kr[row(i, j)] and p2c[i, j] = k_j . Qr[row(i, j)], Kr / Qr
        the relative embeddings ``rel`` (2S, H) projected to keys / queries; row(i, j) = row(j, i)
        mirrored, so transformers' transposed p2c gather is this one."""
        # the batch size from the layer's input: sizes of unflatten's outputs froze in the ONNX trace
        at = index.expand(batch, self.n_head, index.size(0), index.size(1))  # (B, nh, Tq, T)
        terms = []
        if "c2p" in self.terms:
            pos_key = self._heads((self.key_proj if self.share else self.pos_key_proj)(rel))  # (nh, 2S, hd)
            # (B, nh, Tq, 2S): every query against every row
            by_query = torch.matmul(q, pos_key.transpose(-1, -2))
            terms.append(torch.gather(by_query, -1, at))  # (B, nh, Tq, T)
        if "p2c" in self.terms:
            # (nh, 2S, hd)
            pos_query = self._heads((self.query_proj if self.share else self.pos_query_proj)(rel))
            # (B, nh, 2S, T): every row against every key
            by_key = torch.matmul(pos_query, k.transpose(-1, -2))
            terms.append(torch.gather(by_key, -2, at))  # (B, nh, Tq, T)
        return sum(terms[1:], terms[0]) / math.sqrt(self.head_dim * self.scale_factor)


class DebertaAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self = DisentangledSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, queries: torch.Tensor | None = None,
                relative: Relative | None = None) -> torch.Tensor:
        return self.output(self.self(x, mask, queries, relative), x if queries is None else queries)


class DebertaLayer(nn.Module):
    """BERT's post-LN block around the disentangled attention; ``relative`` from the encoder."""

    def __init__(self, config: ModelConfig, index: int = 0) -> None:
        super().__init__()
        self.attention = DebertaAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, queries: torch.Tensor | None = None,
                relative: Relative | None = None) -> torch.Tensor:
        x = self.attention(x, mask, queries, relative)  # (B, Tq, H)
        return self.output(self.intermediate(x), x)


# ---- the family --------------------------------------------------------------------------------
class Deberta(Family):
    name = "deberta-v2"
    model_types = ("deberta-v2",)
    class_prefixes = {"deberta-v2": "DebertaV2"}
    prefix = "deberta"
    bare_roots = ("embeddings", "encoder")
    # DebertaV2Config's defaults where the core's readers default otherwise
    # (not the sizes: a preset's would give way to them, and every config.json states its own)
    config_defaults = {"vocab_size": 128100, "type_vocab_size": 0, "layer_norm_eps": 1e-7, "pad_token_id": 0}
    renames = (
        ("bert.pooler", "pooler"),  # the ContextPooler sits beside the backbone
        ("bert", "deberta"),  # the blocks keep their own names (query_proj, rel_embeddings ...)
    )
    # the class attribute the exporter and ModelConfig read; these configs decide by type_vocab_size
    # (uses_token_types): every published DeBERTa-v2 / v3 checkpoint has none
    token_types = False
    classifier_dropout_key = "cls_dropout"
    dropout_keys = ("pooler_dropout",)
    # -1 / 0: "as max_position_embeddings" / "no buckets"
    extra_sizes = (ExtraSize("embedding_size"), ExtraSize("pooler_hidden_size"),
                   ExtraSize("attention_head_size"),
                   *(ExtraSize(k, bound="max_position_embeddings", unset=(-1, 0))
                     for k in ("position_buckets", "max_relative_positions")))
    # measured (tests/models/test_deberta.py): the two residual adds + LayerNorms of each layer fuse; the
    # attention does not (its relative bias is outside onnxruntime's BERT Attention pattern), nor do
    # the embeddings (no position table in v3, the projection before the norm, the mask after it)
    fusions: dict[str, int] = {"SkipLayerNormalization": 2}
    # SentencePiece, as DeBERTa-v3's, with BERT's special tokens (the base class's)
    tokenizer_kind = "unigram"

    def embedding_size(self, config: ModelConfig) -> int:
        return int(config.extra.get("embedding_size") or config.hidden_size)

    def pooler_act(self, config: ModelConfig) -> str:
        return config.extra.get("pooler_hidden_act", "gelu")

    def pooler_dropout(self, config: ModelConfig) -> float:
        return float(config.extra.get("pooler_dropout") or 0.0)

    def uses_token_types(self, config: ModelConfig) -> bool:
        return config.type_vocab_size > 0

    def check(self, config: ModelConfig) -> None:
        for key, default in (("relative_attention", False), ("position_biased_input", True),
                             ("share_att_key", False),
                             ("legacy", True)):
            _flag(config, key, default)
        unknown = sorted(set(_names(config, "pos_att_type", None)) - set(TERMS))
        if unknown:
            raise ConfigError(f"pos_att_type {unknown[0]!r} is not supported for deberta-v2",
                              "DeBERTa-v2 computes 'c2p' and 'p2c' terms only")
        norms = sorted(set(_names(config, "norm_rel_ebd", "none")) - {"none", "layer_norm"})
        if norms:
            raise ConfigError(f"norm_rel_ebd {norms[0]!r} is not supported for deberta-v2",
                              "use 'layer_norm' or 'none'")
        if _int(config, "conv_kernel_size", 0) > 0:
            raise ConfigError(
                "the convolution layer of DeBERTa-v2 (conv_kernel_size > 0: deberta-v2-xlarge / xxlarge) is "
                "not supported",
                "mlmkit runs DeBERTa-v3's layout: relative attention without the convolution",
            )
        buckets, M = position_buckets(config), max_relative_positions(config)
        if relative_attention(config) and buckets > 0 and (buckets < 4 or M - 1 <= buckets // 2):
            raise ConfigError(  # the log scale needs a ratio above 1 and (buckets // 2 - 1) steps
                f"position_buckets {buckets} with max_relative_positions {M} cannot bucket relative "
                "positions",
                "position_buckets must be at least 4 and max_relative_positions above position_buckets / 2 + "
                "1",
            )
        for key in ("pooler_hidden_size", "attention_head_size"):
            want = config.hidden_size if key == "pooler_hidden_size" else config.head_dim
            if config.extra.get(key, want) != want:
                raise ConfigError(f"config {key} {config.extra[key]!r} other than {want} is not supported",
                                  "mlmkit runs DeBERTa models whose pooler and heads are at the hidden size")
        act = self.pooler_act(config)
        if act not in ACT:
            raise ConfigError(f"unsupported pooler_hidden_act {act!r}", f"use one of: {', '.join(ACT)}")

    def shape_mismatch(self, config: ModelConfig, shapes: dict[str, tuple[int, ...]]) -> tuple[str, Any,
                                                                                               str] | None:
        """The rows of rel_embeddings against the span the config's buckets make: RelativePositions
        computes its table from those values, so the meta-device comparison cannot build it."""
        rel = shapes.get("bert.encoder.rel_embeddings.weight")
        if rel and rel[0] != 2 * span(config):
            field = "position_buckets" if position_buckets(config) > 0 else "max_relative_positions"
            return (field, config.extra.get(field), f"the relative position embeddings have {rel[0]} rows, "
                                                    f"the config makes {2 * span(config)}")
        return None

    def preset_extra(self) -> HFConfig:
        # DeBERTa-v3's layout (microsoft/deberta-v3-base's config.json) at a preset's size
        return {
            "relative_attention": True, "position_biased_input": False, "pos_att_type": ["p2c", "c2p"],
            "share_att_key": True, "norm_rel_ebd": "layer_norm", "position_buckets": 256,
            "max_relative_positions": -1,
            "pooler_hidden_act": "gelu", "pooler_dropout": 0.0, "legacy": True, "tie_word_embeddings": True,
        }

    # ---- blocks ------------------------------------------------------------------------------
    def embeddings(self, config: ModelConfig) -> nn.Module:
        return DebertaEmbeddings(config)

    def layer(self, config: ModelConfig, index: int) -> nn.Module:
        return DebertaLayer(config, index)

    def encoder_modules(self, config: ModelConfig) -> dict[str, nn.Module]:
        if not relative_attention(config):
            return {}
        modules: dict[str, nn.Module] = {"rel_embeddings": nn.Embedding(2 * span(config), config.hidden_size)}
        if "layer_norm" in _names(config, "norm_rel_ebd", "none"):
            modules["LayerNorm"] = layer_norm(config)
        modules["relative_positions"] = RelativePositions(config)
        return modules

    def layer_context(self, encoder: nn.Module, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor,
                                                                                              LayerArgs]:
        # padding rows zero, as transformers' embeddings leave them
        x = x * (mask[:, 0, 0, :, None] == 0).to(x.dtype)
        if not relative_attention(encoder.config):
            return x, {}
        rel = encoder.rel_embeddings.weight
        if "layer_norm" in _names(encoder.config, "norm_rel_ebd", "none"):
            rel = encoder.LayerNorm(rel)
        positions = encoder.relative_positions
        return x, {"relative": Relative(rel, positions(x.size(1), x.size(1), x.device), positions)}

    # ---- names -------------------------------------------------------------------------------
    def from_family(self, sd: StateDict) -> StateDict:
        """As the base class, with the MLM head of legacy false / the original checkpoints
        (lm_predictions.lm_head.*) read as BERT's; their replaced-token-detection head
        (mask_predictions.*) stays as it is, for load_weights to return as unexpected."""
        out = {}
        for k, v in sd.items():
            for old, new in LEGACY_MLM_HEAD:
                if k.startswith(old):
                    k = new + k[len(old):]
                    break
            out[k] = v
        return super().from_family(out)


family = Deberta()
