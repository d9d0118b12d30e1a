"""Gemma 3's text model (as transformers' Gemma3TextModel; Gemma Team 2025, "Gemma 3 Technical
Report"), bidirectional as EmbeddingGemma runs it (Vera et al. 2025, "EmbeddingGemma"), or causal.

What differs from BERT (the blocks are models/prenorm.py's):
- the "sandwich" pre-norm layer: RMSNorms of (1 + weight) in float32 (Gemma3RMSNorm) before and
  after the attention and the MLP, a GeGLU MLP (``hidden_activation`` gelu_pytorch_tanh), a final norm;
- grouped-query attention with heads of ``head_dim``, q / k head norms, scores scaled by
  ``query_pre_attn_scalar``^-1/2 (not head_dim's). ``attn_logit_softcapping`` (Gemma 2's tanh cap of
  the scores) is read by Gemma3TextConfig but not applied by transformers' Gemma3Attention, nor here;
- local and global layers (``layer_types``, else every ``sliding_window_pattern``-th layer global):
  rotary at ``rope_parameters``' full_attention theta on global layers and sliding_attention's on
  local ones (older configs: ``rope_theta`` and ``rope_local_base_freq``), a linear scaling where
  set. Under ``use_bidirectional_attention`` (EmbeddingGemma) the global layers see every token and
  a local layer's query sees the keys within ``sliding_window`` // 2 positions on each side (transformers
  halves the window to sliding_window // 2 + 1 and keeps |i - j| < it); otherwise the mask is causal,
  a local query seeing itself and the sliding_window - 1 tokens before it;
- embeddings scaled by sqrt(hidden_size); no positions table, token types or dropout;
- heads: Gemma3TextModel (the bare backbone, EmbeddingGemma's), and Gemma3TextForSequenceClassification,
  transformers' generic head: a ``score`` layer without bias on the last token that is not the
  padding id. transformers has no token, span or masked-LM head for it.

config.json: ``hidden_activation``, ``rms_norm_eps``, ``attention_dropout``, ``head_dim`` and
``num_key_value_heads`` (extra sizes), ``sliding_window`` as written (before transformers halves it).
"""

from __future__ import annotations

from mlmkit.errors import ConfigError
from mlmkit.models.config import ModelConfig
from mlmkit.models.prenorm import (
    FULL,
    SLIDING,
    AttnSpec,
    PrenormFamily,
    Span,
    layer_types,
    positive_number,
    rope_of,
)
from mlmkit.models.rotary import Rope
from mlmkit.registry import HFConfig

DEFAULT_THETA = {FULL: 1_000_000.0, SLIDING: 10_000.0}
OLD_THETA_KEY = {FULL: "rope_theta", SLIDING: "rope_local_base_freq"}
DEFAULT_PATTERN = 6  # every sixth layer global, as Gemma3TextConfig's sliding_window_pattern


def _positive_int(config: ModelConfig, key: str, default: int) -> int:
    v = config.extra.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"config {key} must be a positive integer, got {v!r}", "fix the config.json")
    return v


def kinds(config: ModelConfig) -> list[str]:
    """Each layer's type: ``layer_types``, else every ``sliding_window_pattern``-th layer global."""
    every = _positive_int(config, "sliding_window_pattern", DEFAULT_PATTERN)
    return layer_types(config,
                       [SLIDING if (i + 1) % every else FULL for i in range(config.num_hidden_layers)])


def rope(config: ModelConfig, kind: str) -> Rope:
    """One layer type's rotary as Gemma3TextConfig reads it: ``rope_parameters[kind]`` (a legacy
    ``rope_scaling`` laid over the full_attention one), its theta else the older top-level key of
    the type, else Gemma's default."""
    params = config.extra.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise ConfigError(f"config rope_parameters must be an object, got {params!r}", "fix the config.json")
    own, scaling = params.get(kind) or {}, config.extra.get("rope_scaling") if kind == FULL else None
    for what, v in ((f"rope_parameters.{kind}", own), ("rope_scaling", scaling or {})):
        if not isinstance(v, dict):
            raise ConfigError(f"config {what} must be an object, got {v!r}", "fix the config.json")
    theta = config.extra.get(OLD_THETA_KEY[kind], DEFAULT_THETA[kind])
    return rope_of(config, "gemma3_text", {**own, **(scaling or {})}, default_theta=theta)


def span(config: ModelConfig, kind: str) -> Span:
    """The keys one layer type sees: every one or the causal mask (global layers), a window around
    or before the query (local layers)."""
    both_ways = bool(config.extra.get("use_bidirectional_attention", False))
    if kind == FULL:
        return None if both_ways else (None, 0)
    window = _positive_int(config, "sliding_window", 4096)
    return (window // 2, window // 2) if both_ways else (window - 1, 0)


class Gemma3Text(PrenormFamily):
    name = "gemma3_text"
    model_types = ("gemma3_text",)
    class_prefixes = {"gemma3_text": "Gemma3Text"}
    config_aliases = {**PrenormFamily.config_aliases, "hidden_act": "hidden_activation"}
    # Gemma3TextConfig's defaults where the core's readers default otherwise (the family keys land
    # in ``extra``); not the sizes, which every config.json states and a size preset sets
    config_defaults = {
        "vocab_size": 262_208, "hidden_act": "gelu_pytorch_tanh", "max_position_embeddings": 131_072,
        "layer_norm_eps": 1e-6,
        "pad_token_id": 0, "type_vocab_size": 0, "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "num_key_value_heads": 4, "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4096,
    }
    renames = (*PrenormFamily.renames, ("classifier", "score"))
    sandwich = True
    norm_offset = True
    # measured (`mlmkit export`, 2 and 3 layers, both heads): of the six RMSNorms a layer, the two after
    # a residual add fuse with it (SkipSimplifiedLayerNormalization), the block outputs' two and the
    # q / k head norms alone (SimplifiedLayerNormalization, and once the first layer's input norm);
    # the tanh GELU of the MLP (FastGelu); not the attention (rotary, q / k norms, grouped heads)
    fusions = {"SkipSimplifiedLayerNormalization": 2, "SimplifiedLayerNormalization": 4, "FastGelu": 1}

    def spec(self, config: ModelConfig, index: int) -> AttnSpec:
        kind = kinds(config)[index]
        scalar = positive_number(config, "query_pre_attn_scalar", 256)
        # checked, not applied: see the module's docstring
        positive_number(config, "attn_logit_softcapping", None)
        return AttnSpec(rope(config, kind), scale=None if scalar is None else scalar ** -0.5,
                        span=span(config, kind), qk_norm=True)

    def embed_scale(self, config: ModelConfig) -> float:
        return float(config.hidden_size ** 0.5)

    def sequence_pool(self, config: ModelConfig) -> str:
        return "last"

    def pooler_dense(self, config: ModelConfig) -> bool:
        return False

    def classifier_bias(self, config: ModelConfig, per_token: bool) -> bool:
        return per_token  # GenericForSequenceClassification's score has no bias; a token head's has

    def preset_overrides(self, hidden: int, intermediate: int) -> HFConfig:
        # a preset's heads are its own: one key / value head each, hidden / heads dimensions
        return {"num_key_value_heads": None, "head_dim": None, "query_pre_attn_scalar": None}


family = Gemma3Text()
