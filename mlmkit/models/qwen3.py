"""Qwen3 (as transformers' Qwen3Model; Qwen team 2025, "Qwen3 Technical Report"): a causal decoder
run as an encoder, as Qwen3-Embedding does (Zhang et al. 2025, "Qwen3 Embedding").

What differs from BERT (the blocks are models/prenorm.py's):
- Llama's pre-norm layer: RMSNorm, grouped-query attention with an RMSNorm on each query and key
  head (q_norm, k_norm), rotary positions (rope_parameters' rope_theta), a SwiGLU MLP
  (gate_proj, up_proj, down_proj), no biases (unless ``attention_bias``), a final norm;
- the causal mask: each token sees itself and those before it. With right padding (mlmkit's
  batches), every real token's state is what it is without the padding; layers past
  ``max_window_layers`` see a causal window of ``sliding_window`` tokens where ``use_sliding_window``;
- no positions table, token types, embedding norm or dropout;
- the heads are transformers' generic ones: the sequence head (Qwen3ForSequenceClassification) is a
  ``score`` layer without bias on the last token that is not the padding id (no pooler), the token
  head a ``score`` layer with a bias, the span head ``qa_outputs`` with the backbone under
  ``transformer.`` (Qwen3ForQuestionAnswering's base_model_prefix), and Qwen3Model the bare backbone.
  There is no masked-LM head: Qwen3 is not pretrained here.

config.json: ``rms_norm_eps``, ``attention_dropout``, ``head_dim`` and ``num_key_value_heads``
(extra sizes); ``pad_token_id`` may be null (Qwen3Config's default): the last-token head then reads
the last real token.
"""

from __future__ import annotations

from mlmkit.errors import ConfigError
from mlmkit.models.config import ModelConfig
from mlmkit.models.prenorm import (
    FULL,
    SLIDING,
    AttnSpec,
    PrenormFamily,
    backbone_renames,
    layer_types,
    rope_of,
)
from mlmkit.registry import HFConfig

SPAN_BACKBONE = backbone_renames("transformer")  # Qwen3ForQuestionAnswering's backbone


def sliding_window(config: ModelConfig) -> int | None:
    """The causal window of the sliding layers: ``sliding_window`` where ``use_sliding_window``, as
    Qwen3Config reads them; None: no layer slides."""
    if not config.extra.get("use_sliding_window", False):
        return None
    w = config.extra.get("sliding_window", 4096)
    if isinstance(w, bool) or not isinstance(w, int) or w < 1:
        raise ConfigError(f"config sliding_window must be a positive integer, got {w!r}",
                          "fix the config.json")
    return w


class Qwen3(PrenormFamily):
    name = "qwen3"
    model_types = ("qwen3",)
    class_prefixes = {"qwen3": "Qwen3"}
    # Qwen3Config's defaults where the core's readers default otherwise (num_key_value_heads and
    # head_dim are family keys, in ``extra``); not the sizes, which every config.json states and a
    # size preset sets
    config_defaults = {
        "vocab_size": 151936, "hidden_act": "silu", "max_position_embeddings": 32768, "layer_norm_eps": 1e-6,
        "pad_token_id": None, "type_vocab_size": 0, "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "num_key_value_heads": 32, "head_dim": 128,
    }
    renames = (*PrenormFamily.renames, ("classifier", "score"))
    # measured (`mlmkit export`, 2 and 3 layers, every head): the residual adds with the RMSNorms after
    # them (SkipSimplifiedLayerNormalization, two a layer; the first layer's input norm and the q / k
    # head norms SimplifiedLayerNormalization); not the attention (rotary, q / k norms, grouped heads)
    fusions = {"SkipSimplifiedLayerNormalization": 2, "SimplifiedLayerNormalization": 2}

    def spec(self, config: ModelConfig, index: int) -> AttnSpec:
        window = sliding_window(config)
        every = config.extra.get("max_window_layers", 28)
        default = [SLIDING if window is not None and isinstance(every, int) and i >= every else FULL
                   for i in range(config.num_hidden_layers)]
        kind = layer_types(config, default)[index]
        if kind == SLIDING and window is None:  # transformers cannot build its mask either
            raise ConfigError("config layer_types has sliding layers but use_sliding_window is not set",
                              "fix the config.json: set use_sliding_window and sliding_window, or make every "
                              "layer full_attention")
        span = (None, 0) if kind == FULL else (window - 1 if window is not None else None, 0)
        return AttnSpec(rope_of(config, self.name), span=span, qk_norm=True)

    def sequence_pool(self, config: ModelConfig) -> str:
        return "last"

    def pooler_dense(self, config: ModelConfig) -> bool:
        return False

    def classifier_bias(self, config: ModelConfig, per_token: bool) -> bool:
        # GenericForSequenceClassification's score has no bias; GenericForTokenClassification's has
        return per_token and bool(config.extra.get("token_classification_bias", True))

    def preset_overrides(self, hidden: int, intermediate: int) -> HFConfig:
        # a preset's heads are its own: one key / value head each, hidden / heads dimensions
        return {"num_key_value_heads": None, "head_dim": None}

    def head_renames(self, keys: set[str], *, to_family: bool) -> tuple[tuple[str, str], ...]:
        # the span head (qa_outputs, under either name) keeps its backbone under ``transformer.``
        return SPAN_BACKBONE if any(k.startswith("qa_outputs.") for k in keys) else ()


family = Qwen3()
