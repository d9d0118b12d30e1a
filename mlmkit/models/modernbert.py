"""ModernBERT (as Hugging Face's ModernBertModel; Warner et al. 2024, "Smarter, Better, Faster, Longer").

What differs from BERT:
- the block is pre-LN (``attn_norm`` -> fused ``Wqkv`` attention -> ``Wo``, then ``mlp_norm`` -> GeGLU
  ``Wi`` / ``Wo``), layer 0 without an attention norm, and a final norm after the last layer;
- no position embeddings and no token types: rotary embeddings inside the attention, at the global
  theta on global layers and the local theta on sliding-window layers, where a query sees the keys
  within ``local_attention // 2`` positions on each side (both ends included), computed in blocks
  of half a window against their own window of keys, O(T x window) (``local_blocks``; the plain
  T x T product for short inputs); by default every third layer (0, 3, 6 ...) is global;
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
from typing import Any, NamedTuple, TypeAlias

import torch
from torch import nn
from torch.nn import functional as F

from mlmkit.errors import ConfigError
from mlmkit.models.config import CLS_SEP_IDS, ExtraSize, Family, LayerArgs, ModelConfig, Renamer, StateDict
from mlmkit.models.core import ACT, Attention, attend, layer_norm
from mlmkit.models.rotary import rotary, rotate
from mlmkit.registry import HFConfig

GLOBAL, LOCAL = "full_attention", "sliding_attention"  # transformers' layer types
DEFAULT_THETA = {GLOBAL: 160_000.0, LOCAL: 10_000.0}
OLD_THETA_KEY = {GLOBAL: "global_rope_theta", LOCAL: "local_rope_theta"}
DEFAULT_WINDOW = 128  # local_attention: the whole window, half of it on each side
DEFAULT_GLOBAL_EVERY = 3
FAR = -10000.0  # the additive mask value of core.extended_mask: finite, so no row turns into NaN

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
def window_mask(T: torch.Tensor | int, Tq: torch.Tensor | int, half: int, device: torch.device,
                dtype: torch.dtype) -> torch.Tensor:
    """(Tq, T) additive mask of a sliding-window layer for the first Tq queries: 0 where |i - j| <=
    ``half``, FAR beyond. Built from the runtime lengths (aranges, no slicing by a size, which the
    tracer would freeze), so one exported graph serves every length."""
    # (Tq, T)
    far = (torch.arange(Tq, device=device)[:, None] - torch.arange(T, device=device)[None, :]).abs() > half
    return far.to(dtype) * FAR


PLAIN_UP_TO = 6  # eager mode: the plain form up to this many half-windows (window_plan)
# a length: a Python int in eager mode, a 0-d tensor while tracing (export)
Size: TypeAlias = int | torch.Tensor


def _minimum(a: Size, b: Size) -> Size:
    """min(a, b) of two lengths without a Python comparison of traced ones (which would freeze)."""
    if isinstance(a, torch.Tensor):
        return torch.clamp(a, max=b)
    if isinstance(b, torch.Tensor):
        return torch.clamp(b, max=a)
    return min(a, b)


def local_blocks(Tq: Size, T: Size, half: int, device: torch.device, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The blocks of a sliding-window layer, for the first ``Tq`` of ``T`` positions as queries:
    query blocks of ``bq`` positions, each with one key window of ``W`` positions that holds every key
    within ``half`` of its queries, so the attention costs O(Tq x W), not O(Tq x T).

    bq is ``half`` (ModernBERT's 64), and W = bq + 2 half (192); a short input (T <= 3 half) is one
    block of all Tq queries against W = min(Tq + 2 half, T) keys: the whole sequence, the plain form's
    work. Nothing is padded: the last query block and the key windows near the ends are shifted
    (clamped) to lie inside the sequence, so the last block may overlap the one before it, and W <= T.

    Returns qidx (nb, bq) and kidx (nb, W), the positions of each block's queries and keys; oidx (Tq,),
    the row of query i among the nb x bq rows the blocks compute; band (nb, bq, W), the additive mask
    (0 where |i - j| <= half, FAR beyond). Eager mode computes the sizes with Python ints; under the
    ONNX tracer ``T`` and ``Tq`` are 0-d tensors and every size here is a graph op on them (no
    comparison or branch in Python), so one exported graph serves every length."""
    b, span = half, 3 * half
    # traced: the choice is a Where in the graph
    if isinstance(T, torch.Tensor) or isinstance(Tq, torch.Tensor):
        T_t, Tq_t = (n if isinstance(n, torch.Tensor) else torch.full((), n, dtype=torch.long, device=device)
                     for n in (T, Tq))
        bq = torch.where(T_t <= span, Tq_t, torch.clamp(Tq_t, max=b))
    else:
        bq = Tq if T <= span else min(b, Tq)
    nb = (Tq + bq - 1) // bq  # ceil(Tq / bq)
    W = _minimum(bq + 2 * half, T)
    # (nb,): the last block ends at Tq
    qstart = torch.clamp(torch.arange(nb, device=device) * bq, max=Tq - bq)
    kstart = torch.clamp(qstart - half, min=0)
    # (nb,): the window [qstart - half, qstart + bq - 1 + half], inside [0, T)
    kstart = torch.clamp(kstart, max=T - W)
    qidx = qstart[:, None] + torch.arange(bq, device=device)[None, :]  # (nb, bq)
    kidx = kstart[:, None] + torch.arange(W, device=device)[None, :]  # (nb, W)
    i = torch.arange(Tq, device=device)
    last = (nb - 1) * bq  # queries from here on are the last block's, which starts at Tq - bq
    oidx = i + (i >= last).long() * (nb * bq - Tq)  # (Tq,)
    band = ((qidx[:, :, None] - kidx[:, None, :]).abs() > half).to(dtype) * FAR  # (nb, bq, W)
    return qidx, kidx, oidx, band


class Window(NamedTuple):
    """How a local layer attends, for one forward: ``mask`` the whole additive mask (padding + band);
    with ``qidx`` None the plain form (mask (B, 1, Tq, T)), else the blocks of ``local_blocks``
    (mask (B, 1, nb, bq, W), and their qidx, kidx, oidx)."""

    mask: torch.Tensor
    qidx: torch.Tensor | None = None
    kidx: torch.Tensor | None = None
    oidx: torch.Tensor | None = None


def window_plan(mask: torch.Tensor, half: int, Tq: Size, T: Size) -> Window:
    """The local attention of the first ``Tq`` of ``T`` positions under ``mask`` (B, 1, 1, T), the
    additive padding mask; ``Tq`` and ``T`` as the caller has them from its inputs (sizes of unbind's
    outputs freeze in the ONNX trace). Once per forward for all the local layers (layer_context).

    In eager mode an input of up to PLAIN_UP_TO half-windows (384 tokens at ModernBERT's window) takes
    the plain form, ``attend`` with the band mask: up to 3 half it is what the blocks compute (one
    block, the whole sequence) without their index copies, and up to 6 half SDPA's fused kernel on
    the whole product was measured as fast as the blocks forward and faster forward + backward (the
    blocks' copies scatter back; 2 CPU threads, 12 heads of 32). A traced graph always has the blocks,
    which reduce to one block of the whole sequence up to 3 half (in onnxruntime the plain product and
    the blocks were measured alike at 4 and 6 half, the blocks faster from 8 half on)."""
    if not isinstance(T, torch.Tensor) and not isinstance(Tq, torch.Tensor) and T <= PLAIN_UP_TO * half:
        return Window(mask + window_mask(T, Tq, half, mask.device, mask.dtype))  # (B, 1, Tq, T)
    qidx, kidx, oidx, band = local_blocks(Tq, T, half, mask.device, mask.dtype)
    # mask (B, 1, nb, bq, W)
    return Window(band + mask[:, :, 0][:, :, kidx][:, :, :, None, :], qidx, kidx, oidx)


def local_attend(m: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 plan: Window) -> torch.Tensor:
    """Sliding-window attention of q (B, nh, Tq, hd), the first Tq positions, over k, v (B, nh, T, hd)
    as ``plan`` says. Returns (B, nh, Tq, hd), what ``attend`` with ``mask + window_mask`` gives at
    every real query (a padding query, whose row nothing reads, sees only its window)."""
    if plan.qidx is None:
        return attend(m, q, k, v, plan.mask)
    # SDPA's fused kernels take 4-D only (5-D runs its math form, 3x slower): the blocks into the batch
    if m.impl == "sdpa":
        qb, kb, vb = (t.transpose(1, 2)[:, i].transpose(2, 3).flatten(0, 1)
                      for t, i in ((q, plan.qidx), (k, plan.kidx), (v, plan.kidx)))
        # (B nb, nh, bq, hd); mask (B nb, 1, bq, W)
        out = attend(m, qb, kb, vb, plan.mask.transpose(1, 2).flatten(0, 1))
        out = out.unflatten(0, (q.size(0), -1)).transpose(1, 2)  # (B, nh, nb, bq, hd)
    else:  # the exported form: onnxruntime's MatMul takes the 5-D blocks as they are gathered
        # (B, nh, nb, bq, hd), (B, nh, nb, W, hd) x 2
        qb, kb, vb = q[:, :, plan.qidx], k[:, :, plan.kidx], v[:, :, plan.kidx]
        out = attend(m, qb, kb, vb, plan.mask)  # (B, nh, nb, bq, hd)
    return out.flatten(2, 3)[:, :, plan.oidx]  # (B, nh, Tq, hd)


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
