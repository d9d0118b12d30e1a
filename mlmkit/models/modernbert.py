"""ModernBERT (as Hugging Face's ModernBertModel; Warner et al. 2024, "Smarter, Better, Faster, Longer").

What differs from BERT:
- the block is pre-LN (``attn_norm`` -> fused ``Wqkv`` attention -> ``Wo``, then ``mlp_norm`` -> GeGLU
  ``Wi`` / ``Wo``), layer 0 without an attention norm, and a final norm after the last layer;
- no position embeddings and no token types: rotary embeddings inside the attention, at the global
  theta on global layers and the local theta on sliding-window layers, where a query sees the keys
  within ``local_attention // 2`` positions on each side (both ends included), computed in blocks
  of half a window against their own window of keys, O(T x window) (``local_blocks``; the plain
  T x T product for short inputs: models/modernbert_attention.py); by default every third layer
  (0, 3, 6 ...) is global;
- LayerNorms without bias (``norm_bias``), linear layers without bias unless ``attention_bias`` /
  ``mlp_bias`` / ``classifier_bias`` say so;
- one head transform ``head`` (dense, ``classifier_activation``, norm) on every head: the MLM head's
  transform, the sequence head's pooler after [CLS] or mean pooling (``classifier_pooling``), and the
  per-token transform of the token and span heads; the span head's output layer is ``classifier``
  too (mlmkit's ``qa_outputs``);
- the MLM decoder's bias is ``decoder.bias``, its weight tied to the token embeddings.

config.json: ``hidden_activation``, ``norm_eps``; the window, layer pattern and thetas as
transformers 5 writes them (``layer_types``, ``rope_parameters``) or as earlier ones did
(``global_attn_every_n_layers``, ``global_rope_theta``, ``local_rope_theta``), read either way,
``local_attention`` in both. Dropouts: ``embedding_dropout`` is the canonical hidden_dropout_prob
(the core's embedding dropout, and the classifier's where a config has no ``classifier_dropout``),
``attention_dropout`` the canonical attention_probs_dropout_prob (on the attention probabilities
and after ``Wo``, as there), ``mlp_dropout`` read by the MLP itself. In eval mode none applies.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from mlmkit.errors import ConfigError
from mlmkit.models.config import CLS_SEP_IDS, ExtraSize, Family, LayerArgs, ModelConfig, Renamer, StateDict
from mlmkit.models.core import ACT, Attention, attend, layer_norm
from mlmkit.models.modernbert_attention import Window, local_attend, window_plan
from mlmkit.models.rotary import rotary, rotate
from mlmkit.registry import HFConfig

GLOBAL, LOCAL = "full_attention", "sliding_attention"  # transformers' layer types
DEFAULT_THETA = {GLOBAL: 160_000.0, LOCAL: 10_000.0}
OLD_THETA_KEY = {GLOBAL: "global_rope_theta", LOCAL: "local_rope_theta"}
DEFAULT_WINDOW = 128  # local_attention: the whole window, half of it on each side
DEFAULT_GLOBAL_EVERY = 3

MLM_HEAD = (("cls.predictions.transform.dense", "head.dense"),
            ("cls.predictions.transform.LayerNorm", "head.norm"))
CLASSIFIER_HEAD = (("bert.pooler", "head"),)
SPAN_OUTPUT = (("qa_outputs", "classifier"),)


# ---- config ------------------------------------------------------------------------------------
def _positive_int(config: ModelConfig, key: str, default: int) -> int:
    v = config.extra.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"config {key} must be a positive integer, got {v!r}", "fix the config.json")
    return v


def layer_types(config: ModelConfig) -> list[str]:
    """Each layer's attention, "full_attention" or "sliding_attention": ``layer_types`` where
    config.json has it (transformers 5), else every ``global_attn_every_n_layers``-th layer global."""
    types = config.extra.get("layer_types")
    if types is None:
        every = _positive_int(config, "global_attn_every_n_layers", DEFAULT_GLOBAL_EVERY)
        return [GLOBAL if i % every == 0 else LOCAL for i in range(config.num_hidden_layers)]
    if not isinstance(types, list) or len(types) != config.num_hidden_layers or any(t not in (GLOBAL, LOCAL)
                                                                                    for t in types):
        raise ConfigError(
            f"config layer_types must list '{GLOBAL}' or '{LOCAL}' for each of the "
            f"{config.num_hidden_layers} layers, got {types!r}",
            "fix the config.json",
        )
    return list(types)


def rope_theta(config: ModelConfig, kind: str) -> float:
    """The rotary base of one layer type, as transformers resolves it: ``rope_parameters[kind]``
    (with a legacy ``rope_scaling`` laid over it), else the older ``global_rope_theta`` /
    ``local_rope_theta``, else ModernBERT's defaults. Only the plain ("default") rotary runs here."""
    params = config.extra.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise ConfigError(f"config rope_parameters must be an object, got {params!r}", "fix the config.json")
    p, scaling = params.get(kind) or {}, config.extra.get("rope_scaling") or {}
    for what, v in ((f"rope_parameters.{kind}", p), ("rope_scaling", scaling)):
        if not isinstance(v, dict):
            raise ConfigError(f"config {what} must be an object, got {v!r}", "fix the config.json")
    p = {**p, **scaling}
    kind_of_rope = p.get("rope_type", p.get("type", "default"))
    if kind_of_rope != "default":
        raise ConfigError(
            f"rope type '{kind_of_rope}' ({kind} layers) is not supported for modernbert",
            "mlmkit runs ModernBERT's plain rotary embeddings (rope_type 'default') only",
        )
    theta = p.get("rope_theta")
    if theta is None:
        theta = config.extra.get(OLD_THETA_KEY[kind], DEFAULT_THETA[kind])
    if isinstance(theta, bool) or not isinstance(theta, int | float) or not 0 < theta < math.inf:  # NaN too
        raise ConfigError(f"config rope_theta of {kind} layers must be a positive number, got {theta!r}",
                          "fix the config.json")
    return float(theta)


# ---- blocks ------------------------------------------------------------------------------------
def layer_context(encoder: nn.Module, x: torch.Tensor, mask: torch.Tensor) -> LayerArgs:
    """What every layer would otherwise compute for itself, once per forward: the rotary angles of
    each base over the T positions, and each window's plan for all T queries."""
    T = x.size(1)
    attn = [layer.attn for layer in encoder.layer]
    rope = {a.theta: rotary(T, a.head_dim, a.theta, x.device) for a in attn}
    windows = {a.half_window: window_plan(mask, a.half_window, T, T) for a in attn
               if a.half_window is not None}
    return {"rope": rope, "windows": windows}


class ModernBertAttention(Attention):
    """Fused-projection self-attention with rotary positions (models/rotary.py), over the whole
    sequence (global layers) or a window around each query (local layers)."""

    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        H, bias = config.hidden_size, bool(config.extra.get("attention_bias", False))
        self.hidden, self.n_head, self.head_dim = H, config.num_attention_heads, config.head_dim
        self.Wqkv = nn.Linear(H, 3 * H, bias=bias)  # rows: queries, keys, values
        self.Wo = nn.Linear(H, H, bias=bias)
        self.dropout_p = config.attention_probs_dropout_prob
        self.dropout = nn.Dropout(self.dropout_p)  # on the probabilities (eager; SDPA takes dropout_p)
        # after Wo, as transformers applies attention_dropout twice
        self.out_drop = nn.Dropout(self.dropout_p)
        kind = layer_types(config)[index]
        self.theta = rope_theta(config, kind)
        local = _positive_int(config, "local_attention", DEFAULT_WINDOW)
        self.half_window = local // 2 if kind == LOCAL else None

    def forward(self, x: torch.Tensor, mask: torch.Tensor, queries: torch.Tensor | None = None,
                rope: dict[float, tuple[torch.Tensor, torch.Tensor]] | None = None,
                windows: dict[int, Window] | None = None) -> torch.Tensor:
        # x (B, T, H) normed; mask (B, 1, 1, T) additive; queries (B, Tq, H) normed: the first Tq positions;
        # rope, windows: layer_context's (computed here when not given)
        H = self.hidden
        if queries is None:
            # (B, nh, T, hd) each
            q, k, v = self.Wqkv(x).unflatten(-1, (3, self.n_head, self.head_dim)).transpose(1, 3).unbind(2)
        else:
            W, b = self.Wqkv.weight, self.Wqkv.bias
            q = F.linear(queries, W[:H], None if b is None
                         else b[:H]).unflatten(-1, (self.n_head, self.head_dim)).transpose(1, 2)
            k, v = F.linear(x, W[H:], None if b is None else b[H:]).unflatten(-1, (
                2, self.n_head, self.head_dim)).transpose(1, 3).unbind(2)
        # lengths from the inputs (q.size(2), of unbind's output, froze in the ONNX trace), and the
        # queries' angles (positions 0 .. Tq-1) from their own arange: cos[:Tq] would freeze too
        T = x.size(1)
        Tq = T if queries is None else queries.size(1)
        # (T, hd)
        cos, sin = rope[self.theta] if rope is not None else rotary(T, self.head_dim, self.theta, x.device)
        q = rotate(q, *((cos, sin) if queries is None else rotary(Tq, self.head_dim, self.theta, x.device)))
        k = rotate(k, cos, sin)
        if self.half_window is None:
            out = attend(self, q, k, v, mask)  # (B, nh, Tq, hd)
        else:
            plan = (windows[self.half_window] if windows is not None and queries is None
                    else window_plan(mask, self.half_window, Tq, T))
            out = local_attend(self, q, k, v, plan)
        out = out.transpose(1, 2).flatten(2)  # (B, Tq, H)
        return self.out_drop(self.Wo(out))


class ModernBertMLP(nn.Module):
    """GeGLU: ``Wi`` to twice the intermediate size, act(first half) * second half, ``Wo`` back."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        H, inter, bias = config.hidden_size, config.intermediate_size, bool(config.extra.get("mlp_bias",
                                                                                             False))
        self.Wi = nn.Linear(H, 2 * inter, bias=bias)
        self.act = ACT[config.hidden_act]
        self.drop = nn.Dropout(float(config.extra.get("mlp_dropout", 0.0)))
        self.Wo = nn.Linear(inter, H, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, gate = self.Wi(x).chunk(2, dim=-1)  # (B, T, I) each
        return self.Wo(self.drop(self.act(h) * gate))


class ModernBertLayer(nn.Module):
    """The pre-LN block: x + attn(attn_norm(x)), then + mlp(mlp_norm(.)). Layer 0 has no attention
    norm (its input is the embeddings' norm), so no parameters there either."""

    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        self.attn_norm = layer_norm(config) if index else nn.Identity()
        self.attn = ModernBertAttention(config, index)
        self.mlp_norm = layer_norm(config)
        self.mlp = ModernBertMLP(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, queries: torch.Tensor | None = None,
                **context: Any) -> torch.Tensor:
        normed = None if queries is None else self.attn_norm(queries)
        # (B, Tq, H)
        h = (x if queries is None else queries) + self.attn(self.attn_norm(x), mask, normed, **context)
        return h + self.mlp(self.mlp_norm(h))


# ---- the family --------------------------------------------------------------------------------
class ModernBert(Family):
    name = "modernbert"
    model_types = ("modernbert",)
    class_prefixes = {"modernbert": "ModernBert"}
    prefix = "model"
    bare_roots = ("embeddings", "layers", "final_norm")
    config_aliases = {
        "hidden_act": "hidden_activation", "layer_norm_eps": "norm_eps",
        "hidden_dropout_prob": "embedding_dropout", "attention_probs_dropout_prob": "attention_dropout",
    }
    # ModernModelConfig's defaults where the core's readers default otherwise; norm_bias and
    # classifier_dropout are family keys (they land in ``extra``) that core.layer_norm and
    # BertForLabels read with BERT's defaults
    config_defaults = {
        "vocab_size": 50368, "intermediate_size": 1152, "max_position_embeddings": 8192,
        "layer_norm_eps": 1e-5,
        "pad_token_id": 50283, "type_vocab_size": 0, "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "norm_bias": False, "classifier_dropout": 0.0,
    }
    renames = (
        ("bert.embeddings.word_embeddings", "model.embeddings.tok_embeddings"),
        ("bert.embeddings.LayerNorm", "model.embeddings.norm"),
        # the block keeps its own names (attn.Wqkv, mlp.Wi ...)
        ("bert.encoder.layer.{n}", "model.layers.{n}"),
        ("bert.encoder.final_norm", "model.final_norm"),
        ("cls.predictions.bias", "decoder.bias"),
        ("cls.predictions.decoder", "decoder"),
    )
    token_types = False
    positions = "none"
    pretrains = True
    max_length = 8192  # no position table: a new model keeps ModernBERT's context
    config_token_ids = CLS_SEP_IDS
    extra_sizes = (ExtraSize("local_attention"), ExtraSize("global_attn_every_n_layers"))
    final_norm = True
    pooler_norm = True
    token_head = True
    # measured: the pre-LN residual adds + norms fuse (SkipLayerNormalization, two a layer) and GELU does; the
    # attention does not (rotary + the sliding window are outside onnxruntime's BERT Attention pattern)
    fusions: dict[str, int] = {"SkipLayerNormalization": 2}
    # with BERT's special-token names (the base class's) on a byte-level BPE, as ModernBERT's
    tokenizer_kind = "bpe"

    def pooler_act(self, config: ModelConfig) -> str:
        return config.extra.get("classifier_activation", "gelu")

    def mlm_act(self, config: ModelConfig) -> str:
        return config.extra.get("classifier_activation", "gelu")

    def head_bias(self, config: ModelConfig) -> bool:
        return bool(config.extra.get("classifier_bias", False))

    def sequence_pool(self, config: ModelConfig) -> str:
        return config.extra.get("classifier_pooling", "cls")

    def check(self, config: ModelConfig) -> None:
        types = layer_types(config)
        for kind in sorted(set(types)):
            rope_theta(config, kind)
        window = _positive_int(config, "local_attention", DEFAULT_WINDOW)
        # transformers attends local_attention // 2 each side: an odd window is one it never runs
        if window % 2:
            raise ConfigError("config local_attention must be even (half of the window on each side), got "
                              f"{window}",
                              "fix the config.json")
        pool = self.sequence_pool(config)
        if pool not in ("cls", "mean"):
            raise ConfigError(f"config classifier_pooling must be 'cls' or 'mean', got {pool!r}",
                              "fix the config.json")
        act = self.pooler_act(config)
        if act not in ACT:
            raise ConfigError(f"unsupported classifier_activation {act!r}", f"use one of: {', '.join(ACT)}")

    def preset_overrides(self, hidden: int, intermediate: int) -> HFConfig:
        # GeGLU at ModernBERT-base's ratio (1152 for BERT-base's 3072: Wi's 2 x 1152 = 3 x hidden);
        # pad 0: [PAD]'s id in a tokenizer trained with this family's special tokens
        return {"intermediate_size": intermediate * 3 // 8, "pad_token_id": 0}

    def preset_extra(self) -> HFConfig:
        # the keys transformers 4.48+ and 5 both read; the token ids are those of a tokenizer
        # trained with the family's special tokens ([PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4)
        return {
            "local_attention": DEFAULT_WINDOW, "global_attn_every_n_layers": DEFAULT_GLOBAL_EVERY,
            "global_rope_theta": DEFAULT_THETA[GLOBAL], "local_rope_theta": DEFAULT_THETA[LOCAL],
            "attention_bias": False, "mlp_bias": False, "norm_bias": False, "mlp_dropout": 0.0,
            "classifier_pooling": "cls", "classifier_activation": "gelu", "classifier_bias": False,
            "classifier_dropout": 0.0, "decoder_bias": True, "tie_word_embeddings": True,
            "bos_token_id": 2, "cls_token_id": 2, "eos_token_id": 3, "sep_token_id": 3,
        }

    def layer(self, config: ModelConfig, index: int) -> nn.Module:
        return ModernBertLayer(config, index)

    def layer_context(self, encoder: nn.Module, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor,
                                                                                              LayerArgs]:
        return x, layer_context(encoder, x, mask)

    # ---- names -------------------------------------------------------------------------------
    def head_renames(self, keys: set[str], *, to_family: bool) -> tuple[tuple[str, str], ...]:
        # every head's transform is ``head``: the MLM head's when there is a decoder (its bias; the
        # weight is tied and not stored) or no classifier, else the classifier heads' pooler
        if to_family:
            return MLM_HEAD if any(k.startswith("cls.predictions.")
                                   for k in keys) else CLASSIFIER_HEAD + SPAN_OUTPUT
        mlm = any(k.startswith("decoder.") for k in keys) or ("head.dense.weight" in keys
                                                              and "classifier.weight" not in keys)
        return MLM_HEAD if mlm else CLASSIFIER_HEAD

    def from_family(self, sd: StateDict) -> StateDict:
        """As the base class, plus every other name a key can stand for where the keys alone do not
        tell the head (the model it is loaded into takes the one it has; load_weights returns the rest
        as unexpected): a two-way ``classifier`` is also the span head's ``qa_outputs``
        (ModernBertForQuestionAnswering names its output layer ``classifier``, as the token head), and
        a ``head`` with neither decoder bias nor classifier is an MLM head of ``decoder_bias`` false,
        given the zero bias it computes with, or a per-token encoder's transform (bert.pooler)."""
        out = super().from_family(sd)
        if ("bert.pooler.dense.weight" in out and "classifier.weight" in out
            and out["classifier.weight"].size(0) == 2):
            out.update({f"qa_outputs.{p}": out[f"classifier.{p}"] for p in ("weight", "bias")
                        if f"classifier.{p}" in out})
        emb = out.get("bert.embeddings.word_embeddings.weight")
        if "cls.predictions.transform.dense.weight" in out and "cls.predictions.bias" not in out:
            as_pooler = Renamer(CLASSIFIER_HEAD)
            out.update({as_pooler(k, to_family=False): v for k, v in sd.items() if k.startswith("head.")})
            if emb is not None:
                out["cls.predictions.bias"] = emb.new_zeros(emb.size(0))
        return out


family = ModernBert()
