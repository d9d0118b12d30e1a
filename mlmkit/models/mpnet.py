"""MPNet (as Hugging Face's MPNetModel; Song et al. 2020, "MPNet: Masked and Permuted Pre-training for
Language Understanding"): config.json model_type "mpnet", the family of sentence-transformers'
all-mpnet-base-v2 and multi-qa-mpnet-base-*.

What differs from BERT:
- the layers are BERT's post-LN blocks under other names: ``attention.attn.q`` / ``k`` / ``v`` / ``o``
  for the projections, ``attention.LayerNorm`` for the attention's norm (renamed both ways; inside
  mlmkit they keep BERT's, so the distillation taps and the exporter see a BERT layer);
- a T5-style relative position bias on the attention scores, shared by all layers: the encoder's
  ``relative_attention_bias`` (buckets x heads) read at the bucket of each key - query distance,
  computed once a forward (Family.layer_context, which adds the padding mask to it) and added to
  every layer's scores;
- RoBERTa's positions (from padding_idx + 1 over the real tokens, padding at padding_idx), with the
  padding id fixed at 1 as transformers' MPNetEmbeddings fixes it, whatever the config's
  pad_token_id; no token types (no table: its graphs take no token_type_ids);
- no NSP and no pretraining here; the MLM head is RoBERTa's (``lm_head.{dense,layer_norm,bias}``,
  GELU), and so is the sequence head (``classifier.dense`` + tanh + ``classifier.out_proj`` on <s>);
  MPNetModel has BERT's pooler (``pooler.dense``, tanh).

The buckets, as transformers computes them: 32 of them (compute_position_bias's default, whatever
``relative_attention_num_buckets`` sizes the table to: a larger table has rows never read), half for
keys before the query and half for keys after it; 8 exact distances each way, then a log scale up to
128, beyond which every distance shares its half's last bucket. The bucket of each distance is tabled once
(RelativeBuckets), so an exported graph indexes a table with its runtime lengths and computes no
logarithm another runtime could round into another bucket.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from mlmkit.errors import ConfigError
from mlmkit.models.config import ExtraSize, Family, LayerArgs, ModelConfig
from mlmkit.models.core import (
    BertIntermediate,
    BertOutput,
    BertSelfAttention,
    BertSelfOutput,
    layer_norm,
)
from mlmkit.models.roberta import SEQUENCE_HEAD

PADDING_IDX = 1  # transformers' MPNetEmbeddings.padding_idx, fixed there
BUCKETS = 32  # the buckets MPNetEncoder.compute_position_bias reads (its default num_buckets)
MAX_DISTANCE = 128  # relative_position_bucket's default: distances from here on share the last bucket

LAYER, FAMILY_LAYER = "bert.encoder.layer.{n}", "mpnet.encoder.layer.{n}"


# ---- relative positions ------------------------------------------------------------------------
def bucket(relative: torch.Tensor, buckets: int = BUCKETS, max_distance: int = MAX_DISTANCE) -> torch.Tensor:
    """The bucket of each key - query distance, as transformers' relative_position_bucket (T5's,
    bidirectional): keys after the query in the upper half of the buckets, exact distances below a
    quarter of the buckets, a log scale up to ``max_distance``, the half's last bucket beyond.
    Float32, in transformers' order of operations."""
    n = -relative
    half = buckets // 2
    ret = (n < 0).to(torch.long) * half
    n = torch.abs(n)
    exact = half // 2
    large = exact + (torch.log(n.float() / exact) / math.log(max_distance / exact)
                     * (half - exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, half - 1))
    return ret + torch.where(n < exact, n, large)


class RelativeBuckets(nn.Module):
    """The bucket that query position i reads for key position j: a table over the distances
    j - i from -MAX_DISTANCE to MAX_DISTANCE, beyond which transformers' bucket is the last of each
    half. A (non-persistent) buffer, in no state dict, computed on the CPU whatever device the module
    is built on (the meta device of rundir/weights.py's shape check)."""

    def __init__(self) -> None:
        super().__init__()
        self.reach = MAX_DISTANCE
        table = bucket(torch.arange(-self.reach, self.reach + 1, device="cpu"))
        self.register_buffer("table", table, persistent=False)  # (2 * reach + 1,)

    def forward(self, Tq: torch.Tensor | int, T: torch.Tensor | int, device: torch.device) -> torch.Tensor:
        """(Tq, T) buckets for queries 0 .. Tq-1 against keys 0 .. T-1, from aranges of the runtime
        lengths (no slicing by a size, which the ONNX tracer would freeze)."""
        rel = torch.arange(T, device=device)[None, :] - torch.arange(Tq, device=device)[:, None]
        return self.table[rel.clamp(-self.reach, self.reach) + self.reach]


# ---- blocks ------------------------------------------------------------------------------------
class MPNetEmbeddings(nn.Module):
    """Word + position embeddings, LayerNorm, dropout: positions count from PADDING_IDX + 1 over the
    tokens other than PADDING_IDX, which keep position PADDING_IDX (transformers' MPNetEmbeddings)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=PADDING_IDX)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size,
                                                padding_idx=PADDING_IDX)
        self.LayerNorm = layer_norm(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        real = (input_ids != PADDING_IDX).long()
        positions = torch.cumsum(real, dim=1) * real + PADDING_IDX  # (B, T)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        return self.dropout(self.LayerNorm(x))  # (B, T, H)


class MPNetSelfAttention(BertSelfAttention):
    """BERT's projections (``attn.q`` / ``k`` / ``v`` in MPNet's checkpoints) and product, on scores
    that get the relative position bias as well as the padding mask: ``bias`` from the encoder holds
    both (its first Tq query rows for the [CLS]-only last layer), so each form of ``attend`` (SDPA's
    float mask, the eager sum) adds one tensor, as for BERT.

    Measured (tests/models/test_mpnet.py): onnxruntime fuses no Attention here. Its BERT fusion
    takes a bias on the scores only in DistilBERT's old pattern (a Where on the padding, then the
    bias), and onnxruntime 1.32 never verifies that pattern's shapes (its shape inference is off in
    the attention fusion), so that form runs unfused as well; this one adds a tensor less a layer."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor, queries: torch.Tensor | None = None,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        # mask (B, 1, 1, T) additive; bias (B, nh, T, T): the relative bias plus that mask
        if bias is not None:
            mask = bias if queries is None else bias[:, :, : queries.size(1)]
        return super().forward(x, mask, queries)


class MPNetAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self = MPNetSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, queries: torch.Tensor | None = None,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        return self.output(self.self(x, mask, queries, bias), x if queries is None else queries)


class MPNetLayer(nn.Module):
    """BERT's post-LN block around the biased attention; ``bias`` from the encoder (layer_context)."""

    def __init__(self, config: ModelConfig, index: int = 0) -> None:
        super().__init__()
        self.attention = MPNetAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, queries: torch.Tensor | None = None,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        x = self.attention(x, mask, queries, bias)  # (B, Tq, H)
        return self.output(self.intermediate(x), x)


# ---- the family --------------------------------------------------------------------------------
def num_buckets(config: ModelConfig) -> int:
    """The rows of the relative attention bias (``relative_attention_num_buckets``, 32 by default)."""
    return int(config.extra.get("relative_attention_num_buckets", BUCKETS))


class MPNet(Family):
    name = "mpnet"
    model_types = ("mpnet",)
    class_prefixes = {"mpnet": "MPNet"}
    prefix = "mpnet"
    # MPNetConfig's defaults where the core's readers default otherwise (it has no token types)
    config_defaults = {"vocab_size": 30527, "type_vocab_size": 0, "pad_token_id": PADDING_IDX}
    renames = (
        (f"{LAYER}.attention.self.query", f"{FAMILY_LAYER}.attention.attn.q"),
        (f"{LAYER}.attention.self.key", f"{FAMILY_LAYER}.attention.attn.k"),
        (f"{LAYER}.attention.self.value", f"{FAMILY_LAYER}.attention.attn.v"),
        (f"{LAYER}.attention.output.dense", f"{FAMILY_LAYER}.attention.attn.o"),
        (f"{LAYER}.attention.output.LayerNorm", f"{FAMILY_LAYER}.attention.LayerNorm"),
        ("cls.predictions.transform.dense", "lm_head.dense"),
        ("cls.predictions.transform.LayerNorm", "lm_head.layer_norm"),
        ("cls.predictions.decoder", "lm_head.decoder"),
        ("cls.predictions.bias", "lm_head.bias"),
        ("bert", "mpnet"),
    )
    token_types = False
    positions = "padding_offset"
    extra_sizes = (ExtraSize("relative_attention_num_buckets"),)
    # measured (tests/models/test_mpnet.py): each layer's two residual adds + LayerNorms fuse; the
    # attention does not (its relative bias is outside onnxruntime's BERT Attention pattern: see
    # MPNetSelfAttention), nor do the embeddings (the cumulative positions, as RoBERTa's)
    fusions: dict[str, int] = {"SkipLayerNormalization": 2}

    def mlm_act(self, config: ModelConfig) -> str:
        return "gelu"  # MPNetLMHead calls gelu whatever hidden_act says

    def max_tokens(self, config: ModelConfig) -> int:
        """Positions start at PADDING_IDX + 1, whatever the config's pad_token_id says."""
        return config.max_position_embeddings - PADDING_IDX - 1

    def check(self, config: ModelConfig) -> None:
        """No token types, a position for at least one token, and the 32 rows of the bias table the
        buckets read (a smaller table would fail in transformers too)."""
        if config.type_vocab_size:
            raise ConfigError(f"config type_vocab_size {config.type_vocab_size}: MPNet has no token types",
                              "leave type_vocab_size out of an mpnet config.json (or set it to 0)")
        if config.max_position_embeddings <= PADDING_IDX + 1:
            raise ConfigError(f"config max_position_embeddings {config.max_position_embeddings} leaves MPNet "
                              "no "
                              f"position (they start at {PADDING_IDX + 1})", "fix the config.json")
        if num_buckets(config) < BUCKETS:
            raise ConfigError(
                f"config relative_attention_num_buckets {num_buckets(config)} is below the {BUCKETS} buckets "
                "MPNet reads",
                f"transformers' MPNet reads {BUCKETS} buckets whatever the table holds: use {BUCKETS} or "
                "more",
            )

    def shape_mismatch(self, config: ModelConfig, shapes: dict[str, tuple[int, ...]]) -> tuple[str, Any,
                                                                                               str] | None:
        """The bias table's rows against relative_attention_num_buckets, named as the field it is."""
        rows = shapes.get("bert.encoder.relative_attention_bias.weight")
        if rows and rows[0] != num_buckets(config):
            return ("relative_attention_num_buckets", num_buckets(config),
                    f"the relative attention bias has {rows[0]} rows")
        return None

    def head_renames(self, keys: set[str], *, to_family: bool) -> tuple[tuple[str, str], ...]:
        seq = {"bert.pooler.dense.weight",
               "classifier.weight"} <= keys if to_family else "classifier.out_proj.weight" in keys
        return SEQUENCE_HEAD if seq else ()

    # ---- blocks ------------------------------------------------------------------------------
    def embeddings(self, config: ModelConfig) -> nn.Module:
        return MPNetEmbeddings(config)

    def layer(self, config: ModelConfig, index: int) -> nn.Module:
        return MPNetLayer(config, index)

    def encoder_modules(self, config: ModelConfig) -> dict[str, nn.Module]:
        return {"relative_attention_bias": nn.Embedding(num_buckets(config), config.num_attention_heads),
                "relative_buckets": RelativeBuckets()}

    def layer_context(self, encoder: nn.Module, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor,
                                                                                              LayerArgs]:
        """The relative position bias of every query and key, plus the padding mask: one (B, nh, T, T)
        tensor for all the layers (transformers adds the two in each layer; the sum at real keys is
        the same, the bias plus 0)."""
        T = x.size(1)
        rows = encoder.relative_buckets(T, T, x.device)  # (T, T)
        bias = encoder.relative_attention_bias(rows).permute(2, 0, 1).unsqueeze(0)  # (1, nh, T, T)
        return x, {"bias": bias.to(x.dtype) + mask}  # (B, nh, T, T)


family = MPNet()
