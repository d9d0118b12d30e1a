"""DeBERTa-v2 and v3 (as Hugging Face's DebertaV2Model; He et al. 2021, "DeBERTa: Decoding-enhanced
BERT with Disentangled Attention", and "DeBERTaV3", 2023): config.json model_type "deberta-v2".

What differs from BERT:
- the embeddings: word embeddings at ``embedding_size``, absolute positions only where
  ``position_biased_input`` (v3: none), token types only where ``type_vocab_size`` > 0 (v3: none, so
  its graphs take no token_type_ids), the projection to the hidden size (``embed_proj``, no bias)
  before the LayerNorm, and the padding rows zeroed (the attention mask multiplied in);
- disentangled attention (models/deberta_attention.py): besides content-to-content (query_proj /
  key_proj / value_proj), the c2p and p2c terms over log-bucketed relative positions, which index
  ``encoder.rel_embeddings`` (normed by ``encoder.LayerNorm`` where ``norm_rel_ebd`` has
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
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mlmkit.errors import ConfigError
from mlmkit.models.config import ExtraSize, Family, LayerArgs, ModelConfig, StateDict
from mlmkit.models.core import ACT, BertIntermediate, BertOutput, BertSelfOutput, layer_norm
from mlmkit.models.deberta_attention import (
    TERMS,
    DisentangledSelfAttention,
    Relative,
    RelativePositions,
    max_relative_positions,
    position_buckets,
    read_flag,
    read_int,
    read_names,
    relative_attention,
    span,
)
from mlmkit.registry import HFConfig

LEGACY_MLM_HEAD = (  # DebertaV2OnlyMLMHead (legacy false, the original checkpoints) -> BERT's head
    ("lm_predictions.lm_head.dense.", "cls.predictions.transform.dense."),
    ("lm_predictions.lm_head.LayerNorm.", "cls.predictions.transform.LayerNorm."),
    ("lm_predictions.lm_head.bias", "cls.predictions.bias"),
)


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
        self.absolute, self.typed, self.projected = (read_flag(config, "position_biased_input", True),
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
            read_flag(config, key, default)
        unknown = sorted(set(read_names(config, "pos_att_type", None)) - set(TERMS))
        if unknown:
            raise ConfigError(f"pos_att_type {unknown[0]!r} is not supported for deberta-v2",
                              "DeBERTa-v2 computes 'c2p' and 'p2c' terms only")
        norms = sorted(set(read_names(config, "norm_rel_ebd", "none")) - {"none", "layer_norm"})
        if norms:
            raise ConfigError(f"norm_rel_ebd {norms[0]!r} is not supported for deberta-v2",
                              "use 'layer_norm' or 'none'")
        if read_int(config, "conv_kernel_size", 0) > 0:
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
        if "layer_norm" in read_names(config, "norm_rel_ebd", "none"):
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
        if "layer_norm" in read_names(encoder.config, "norm_rel_ebd", "none"):
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
