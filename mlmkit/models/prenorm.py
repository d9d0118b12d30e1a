"""The blocks of the Llama-style pre-norm families, written once: EuroBERT, Gemma 3 (EmbeddingGemma)
and Qwen3 (Qwen3-Embedding) differ in their settings, not in their blocks.

What they share, as transformers' LlamaModel lays it out (Touvron et al. 2023, "LLaMA"):
- ``RMSNorm`` (Zhang & Sennrich 2019): x / rms(x), computed in float32, times a weight; Gemma's
  multiplies by (1 + weight) (transformers' Gemma3RMSNorm, weights stored as offsets from 1);
- ``GatedMLP`` (Shazeer 2020, "GLU Variants Improve Transformer"): down(act(gate(x)) * up(x)), SwiGLU
  (SiLU: Qwen3, EuroBERT) or GeGLU (gelu_pytorch_tanh: Gemma);
- ``PrenormAttention``: grouped-query attention (Ainslie et al. 2023, "GQA": num_key_value_heads
  key / value heads shared by groups of query heads) with heads of ``head_dim`` (not necessarily
  hidden / heads), optional RMSNorms of each query and key head (Qwen3, Gemma 3), rotary positions
  (models/rotary.py), a scale (head_dim^-1/2, Gemma's query_pre_attn_scalar^-1/2), an optional
  tanh softcap of the scores (Gemma 2's; transformers' Gemma 3 reads the key but does not apply it,
  nor does gemma3.py), and the layer's ``Span``: every key (bidirectional: EuroBERT,
  EmbeddingGemma), the causal mask (a decoder: Qwen3), or a sliding window (Gemma 3's local layers,
  both ways under ``use_bidirectional_attention``);
- ``PrenormLayer``: x + attn(norm(x)), then + mlp(norm(.)); Gemma's "sandwich" also normalises each
  block's output before the residual add (post_attention_layernorm, post_feedforward_layernorm);
- ``TokenEmbeddings``: the token table alone (no positions, token types or norm), Gemma's scaled
  by sqrt(hidden);
- ``PrenormFamily``: the Family base the three modules subclass (their config keys, names, blocks).

The parameters keep transformers' names inside a layer (self_attn.q_proj, mlp.gate_proj,
input_layernorm ...); the families rename only the prefixes (model.layers.N <-> bert.encoder.layer.N).
The masks are additive, 0 or FAR (as core.extended_mask: finite, so no row turns into NaN), and built
from aranges of the runtime lengths, so one exported graph serves every length.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn

from mlmkit.errors import ConfigError
from mlmkit.models.config import ExtraSize, Family, LayerArgs, ModelConfig
from mlmkit.models.core import ACT, Attention
from mlmkit.models.rotary import Rope, rope_config, rotate
from mlmkit.registry import HFConfig

FAR = -10000.0  # the additive mask value of core.extended_mask
FULL, SLIDING = "full_attention", "sliding_attention"  # transformers' layer types


# ---- config ------------------------------------------------------------------------------------
def head_dim(config: ModelConfig) -> int:
    """Each attention head's size: config.json's ``head_dim`` (Qwen3's and Gemma's are not hidden /
    heads), else hidden_size / num_attention_heads."""
    return int(config.extra.get("head_dim") or config.hidden_size // config.num_attention_heads)


def kv_heads(config: ModelConfig) -> int:
    """The key / value heads (``num_key_value_heads``), else one per query head."""
    return int(config.extra.get("num_key_value_heads") or config.num_attention_heads)


def check_heads(config: ModelConfig) -> None:
    """What grouped-query attention with rotary positions needs of the head counts and sizes."""
    heads, kv, hd = config.num_attention_heads, kv_heads(config), head_dim(config)
    if heads % kv:
        raise ConfigError(f"config num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}",
                          "fix the config.json: each key / value head serves a whole group of query heads")
    if hd % 2:
        raise ConfigError("config head_dim must be even (rotary positions turn pairs of dimensions), got "
                          f"{hd}",
                          "fix the config.json")


def positive_number(config: ModelConfig, key: str, default: float | None) -> float | None:
    """A family key that is a positive number, or None where it is unset (and has no default)."""
    v = config.extra.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < float("inf"):
        raise ConfigError(f"config {key} must be a positive number, got {v!r}", "fix the config.json")
    return float(v)


def rope_of(config: ModelConfig, family: str, params: HFConfig | None = None,
            default_theta: float = 10_000.0) -> Rope:
    """The rotary of ``config``'s layers as transformers reads it (rotary.rope_config): config.json's
    ``rope_parameters`` (a legacy ``rope_scaling`` replacing it, ``rope_theta`` beside it), or the
    ``params`` of one layer type (Gemma's, nested by type), else ``default_theta``."""
    extra = config.extra if params is None else {"rope_parameters": params}
    return rope_config(extra, family=family, head_dim=head_dim(config),
                       max_positions=config.max_position_embeddings,
                       default_theta=default_theta)


def layer_types(config: ModelConfig, default: list[str]) -> list[str]:
    """config.json's ``layer_types`` (each layer "full_attention" or "sliding_attention"), else
    ``default``."""
    types = config.extra.get("layer_types")
    if types is None:
        return default
    if not isinstance(types, list) or len(types) != config.num_hidden_layers or any(t not in (FULL, SLIDING)
                                                                                    for t in types):
        raise ConfigError(f"config layer_types must list '{FULL}' or '{SLIDING}' for each of the "
                          f"{config.num_hidden_layers} layers, got {types!r}", "fix the config.json")
    return list(types)


# ---- what one layer's attention sees -------------------------------------------------------------
Span = tuple[int | None, int | None] | None
"""The keys a query at position i sees besides the padding mask: None, all of them; else (left,
right), the keys j with i - left <= j <= i + right, None for no bound: (None, 0) is the causal mask,
(w - 1, 0) a causal sliding window of w, (h, h) a bidirectional window of h each side."""


class AttnSpec(NamedTuple):
    """One layer's attention settings: its rotary, score ``scale`` (None: head_dim^-1/2), ``softcap``
    (tanh capping of the scores, None: none), ``span`` and whether its heads have q / k norms."""

    rope: Rope
    scale: float | None = None
    softcap: float | None = None
    span: Span = None
    qk_norm: bool = False


def span_mask(Tq: torch.Tensor | int, T: torch.Tensor | int, span: Span, device: torch.device,
              dtype: torch.dtype) -> torch.Tensor | None:
    """(Tq, T) additive mask of ``span`` for the queries at positions 0 .. Tq-1 over T keys: 0 where a
    key is seen, FAR where not; None for a span of every key. Built from aranges of the (possibly
    traced) lengths."""
    if span is None:
        return None
    left, right = span
    d = torch.arange(T, device=device)[None, :] - torch.arange(Tq, device=device)[:, None]  # (Tq, T): j - i
    far = torch.zeros_like(d, dtype=torch.bool)
    if left is not None:
        far = far | (d < -left)
    if right is not None:
        far = far | (d > right)
    return far.to(dtype) * FAR


def with_span(mask: torch.Tensor, Tq: torch.Tensor | int, T: torch.Tensor | int, span: Span) -> torch.Tensor:
    """The padding mask (B, 1, 1, T) with ``span``'s added: (B, 1, Tq, T), or as it is for no span."""
    extra = span_mask(Tq, T, span, mask.device, mask.dtype)
    return mask if extra is None else mask + extra


# ---- blocks ------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) in float32, times ``weight`` (transformers' LlamaRMSNorm: the normed
    x cast back before the multiplication) or, ``offset``, times (1 + weight) in float32 (Gemma's,
    whose weights start at 0). Exported, it is the Pow / ReduceMean / Add / Sqrt / Div / Mul chain
    onnxruntime fuses into SimplifiedLayerNormalization."""

    def __init__(self, size: int, eps: float, offset: bool = False) -> None:
        super().__init__()
        self.eps, self.offset = eps, offset
        self.weight = nn.Parameter(torch.zeros(size) if offset else torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:
            return (normed * (1.0 + self.weight.float())).to(x.dtype)
        return self.weight * normed.to(x.dtype)


class GatedMLP(nn.Module):
    """down_proj(act(gate_proj(x)) * up_proj(x)): SwiGLU or GeGLU by ``hidden_act``; biases where
    ``bias`` (EuroBERT's mlp_bias)."""

    def __init__(self, config: ModelConfig, bias: bool = False) -> None:
        super().__init__()
        H, inter = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(H, inter, bias=bias)
        self.up_proj = nn.Linear(H, inter, bias=bias)
        self.down_proj = nn.Linear(inter, H, bias=bias)
        self.act = ACT[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


def grouped_attend(m: Attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                   scale: float, softcap: float | None) -> torch.Tensor:
    """softmax(q k^T scale (capped) + mask) v for q (B, nh, Tq, hd) over k, v (B, nkv, T, hd), each
    key / value head serving nh / nkv query heads (consecutive ones, as transformers' repeat_kv).
    SDPA where ``m.impl`` is "sdpa" and there is no softcap (SDPA has none), the keys and values
    repeated to every query head (as transformers' sdpa_attention_forward does: SDPA's own
    ``enable_gqa`` takes no mask but in its math form on CUDA, while the memory-efficient kernel takes
    the repeated heads with the mask); else spelled out as transformers' eager_attention_forward
    computes it, the query heads grouped by their key head (B, nkv, g, Tq, hd), so the keys and values
    are not copied g times (the exported form)."""
    groups = q.size(1) // k.size(1)
    if m.impl == "sdpa" and softcap is None:
        p = m.dropout_p if m.training else 0.0
        if groups > 1:
            k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))  # (B, nh, T, hd)
        return nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), dropout_p=p,
                                                          scale=scale)
    qg = q.unflatten(1, (k.size(1), groups))  # (B, nkv, g, Tq, hd)
    scores = torch.matmul(qg, k.unsqueeze(2).transpose(-1, -2)) * scale  # (B, nkv, g, Tq, T)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    probs = m.dropout(torch.softmax(scores + mask.unsqueeze(2), dim=-1))  # mask (B, 1, 1, Tq | 1, T)
    return torch.matmul(probs, v.unsqueeze(2)).flatten(1, 2)  # (B, nh, Tq, hd)


class PrenormAttention(Attention):
    """Grouped-query self-attention with rotary positions, optional q / k head norms and the layer's
    span (``AttnSpec``): transformers' LlamaAttention, Qwen3Attention, Gemma3Attention and
    EuroBertAttention under their names (q_proj, k_proj, v_proj, o_proj, q_norm, k_norm)."""

    def __init__(self, config: ModelConfig, spec: AttnSpec, norm_offset: bool = False) -> None:
        super().__init__()
        H, bias = config.hidden_size, bool(config.extra.get("attention_bias", False))
        self.n_head, self.n_kv, self.head_dim = config.num_attention_heads, kv_heads(config), head_dim(config)
        self.spec = spec
        self.scale = spec.scale if spec.scale is not None else self.head_dim ** -0.5
        self.q_proj = nn.Linear(H, self.n_head * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(H, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(H, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_head * self.head_dim, H, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, config.layer_norm_eps, norm_offset) if spec.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.layer_norm_eps, norm_offset) if spec.qk_norm else None
        self.dropout_p = config.attention_probs_dropout_prob
        self.dropout = nn.Dropout(self.dropout_p)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, queries: torch.Tensor | None = None,
                angles: dict[Rope, tuple[torch.Tensor, torch.Tensor]] | None = None,
                masks: dict[Span, torch.Tensor] | None = None) -> torch.Tensor:
        # x (B, T, H) normed; mask (B, 1, 1, T) additive padding; queries (B, Tq, H) normed: the first
        # Tq positions alone (core.encode_cls); angles, masks: layer_context's (computed here when not given)
        T = x.size(1)
        Tq = T if queries is None else queries.size(1)
        # (B, Tq, nh, hd)
        q = self.q_proj(x if queries is None else queries).unflatten(-1, (self.n_head, self.head_dim))
        k = self.k_proj(x).unflatten(-1, (self.n_kv, self.head_dim))  # (B, T, nkv, hd)
        v = self.v_proj(x).unflatten(-1, (self.n_kv, self.head_dim)).transpose(1, 2)  # (B, nkv, T, hd)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        rope = self.spec.rope
        cos, sin = angles[rope] if angles is not None else rope.angles(T, x.device)  # (T, hd)
        # their own angles, from an arange of Tq (a slice by a size would freeze in the trace)
        if queries is not None:
            q_cos, q_sin = rope.angles(Tq, x.device, length=T)
        else:
            q_cos, q_sin = cos, sin
        q, k = rotate(q.transpose(1, 2), q_cos, q_sin), rotate(k.transpose(1, 2), cos, sin)
        m = masks[self.spec.span] if masks is not None and queries is None else with_span(mask, Tq, T,
                                                                                          self.spec.span)
        out = grouped_attend(self, q, k, v, m, self.scale, self.spec.softcap)  # (B, nh, Tq, hd)
        return self.o_proj(out.transpose(1, 2).flatten(2))  # (B, Tq, H)


class PrenormLayer(nn.Module):
    """x + attn(input_layernorm(x)), then + mlp(post_attention_layernorm(.)) (Llama's, Qwen3's,
    EuroBERT's); ``sandwich`` (Gemma's): x + post_attention_layernorm(attn(input_layernorm(x))), then
    + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(.)))."""

    def __init__(self, config: ModelConfig, spec: AttnSpec, *, sandwich: bool = False, offset: bool = False,
                 mlp_bias: bool = False) -> None:
        super().__init__()
        H, eps = config.hidden_size, config.layer_norm_eps
        self.sandwich = sandwich
        self.input_layernorm = RMSNorm(H, eps, offset)
        self.self_attn = PrenormAttention(config, spec, offset)
        self.post_attention_layernorm = RMSNorm(H, eps, offset)
        self.mlp = GatedMLP(config, mlp_bias)
        if sandwich:
            self.pre_feedforward_layernorm = RMSNorm(H, eps, offset)
            self.post_feedforward_layernorm = RMSNorm(H, eps, offset)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, queries: torch.Tensor | None = None,
                **context: Any) -> torch.Tensor:
        normed = None if queries is None else self.input_layernorm(queries)
        h = self.self_attn(self.input_layernorm(x), mask, normed, **context)  # (B, Tq, H)
        h = (x if queries is None else queries) + (self.post_attention_layernorm(h) if self.sandwich else h)
        if self.sandwich:
            return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))
        return h + self.mlp(self.post_attention_layernorm(h))


class TokenEmbeddings(nn.Module):
    """The token table alone, ``word_embeddings`` (transformers' embed_tokens), times ``scale`` where
    there is one (Gemma's sqrt(hidden), a float32 buffer cast to the table's dtype as
    Gemma3TextScaledWordEmbedding does). No positions (rotary), token types, norm or dropout."""

    def __init__(self, config: ModelConfig, scale: float | None = None) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size,
                                            padding_idx=config.pad_token_id)
        self.scale: torch.Tensor | None
        self.register_buffer("scale", None if scale is None else torch.tensor(scale), persistent=False)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        x = self.word_embeddings(input_ids)  # (B, T, H)
        return x if self.scale is None else x * self.scale.to(x.dtype)


def layer_context(encoder: nn.Module, x: torch.Tensor, mask: torch.Tensor) -> LayerArgs:
    """What every layer would otherwise compute for itself, once per forward: the rotary angles of
    each distinct rotary over the T positions, and the padding mask with each distinct span added."""
    T = x.size(1)
    specs = [layer.self_attn.spec for layer in encoder.layer]
    angles = {s.rope: s.rope.angles(T, x.device) for s in specs}
    masks = {s.span: with_span(mask, T, T, s.span) for s in specs}
    return {"angles": angles, "masks": masks}


# ---- the family base -----------------------------------------------------------------------------
LAYERS = (
    ("bert.embeddings.word_embeddings", "{root}.embed_tokens"),
    # the layer keeps transformers' names (self_attn.q_proj ...)
    ("bert.encoder.layer.{n}", "{root}.layers.{n}"),
    ("bert.encoder.final_norm", "{root}.norm"),
)


def backbone_renames(root: str) -> tuple[tuple[str, str], ...]:
    """The backbone's prefix pairs with the backbone under ``root`` (transformers' base_model_prefix)."""
    return tuple((a, b.replace("{root}", root)) for a, b in LAYERS)


class PrenormFamily(Family):
    """What EuroBERT, Gemma 3 and Qwen3 declare alike: config.json's rms_norm_eps and
    attention_dropout, head_dim and num_key_value_heads (extra sizes), no positions table (rotary),
    no token types, RMSNorm layers and a final norm, the backbone under ``model.`` (embed_tokens,
    layers.N, norm). A subclass gives its layers' settings (``spec``), its layout (``sandwich``,
    ``norm_offset``, ``embed_scale``) and its heads."""

    prefix = "model"
    bare_roots = ("embed_tokens", "layers", "norm")
    config_aliases = {"layer_norm_eps": "rms_norm_eps", "attention_probs_dropout_prob": "attention_dropout"}
    renames = backbone_renames("model")
    token_types = False
    positions = "none"
    final_norm = True
    extra_sizes = (ExtraSize("head_dim"), ExtraSize("num_key_value_heads", bound="num_attention_heads"))
    sandwich = False  # Gemma's extra norms around each block's output
    norm_offset = False  # Gemma's RMSNorm: x (1 + weight)
    # measured (2 layers, `mlmkit export` of each head): the residual adds and the RMSNorms fuse
    # (SkipSimplifiedLayerNormalization); the attention does not (rotary, grouped heads)
    fusions: dict[str, int] = {"SkipSimplifiedLayerNormalization": 2}

    def spec(self, config: ModelConfig, index: int) -> AttnSpec:
        """Layer ``index``'s attention settings."""
        raise NotImplementedError

    def embed_scale(self, config: ModelConfig) -> float | None:
        return None

    def mlp_bias(self, config: ModelConfig) -> bool:
        return False

    def check(self, config: ModelConfig) -> None:
        check_heads(config)
        for i in range(config.num_hidden_layers):
            self.spec(config, i)  # each layer's rotary, window and scale are ones it runs

    def norm(self, config: ModelConfig, size: int) -> nn.Module:
        return RMSNorm(size, config.layer_norm_eps, self.norm_offset)

    def embeddings(self, config: ModelConfig) -> nn.Module:
        return TokenEmbeddings(config, self.embed_scale(config))

    def layer(self, config: ModelConfig, index: int) -> nn.Module:
        return PrenormLayer(config, self.spec(config, index), sandwich=self.sandwich, offset=self.norm_offset,
                            mlp_bias=self.mlp_bias(config))

    def layer_context(self, encoder: nn.Module, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor,
                                                                                              LayerArgs]:
        return x, layer_context(encoder, x, mask)
