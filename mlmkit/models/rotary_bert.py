"""The post-LN BERT encoder with rotary positions that GTE, NomicBERT and jina-embeddings-v3 share
(transformers derives GteLayer and NomicBertLayer from JinaEmbeddingsV3Layer, as each family's module
here derives from ``RotaryBert``).

What the three have in common, and differs from BERT:
- no position table (``positions`` "none"): rotary positions inside the attention
  (models/rotary.py's ``Rope``, one for all the layers, from the family's config keys);
- one fused projection to queries, keys and values (``qkv``, rows in that order: the fused
  ``Wqkv`` / ``qkv_proj`` of the published checkpoints, which transformers splits into
  q_proj / k_proj / v_proj on loading and joins again on saving), and an output projection ``out``;
- the post-LN block x = attn_norm(x + attention(x)), then mlp_norm(x + mlp(x)), with the family's
  MLP: GTE's and NomicBERT's gated one (``GatedMLP``: act(gate) * up), jina's plain one (``PlainMLP``);
- token types only where the config has more than one (``type_vocab_size`` > 1: NomicBERT's two,
  gte-large-en-v1.5's); with one (GTE, jina) its row is added everywhere, with none (gte-base-en-v1.5)
  nothing is.

Inside mlmkit a layer's parameters carry the names of this module (``attention.qkv``,
``attention.out``, ``attn_norm``, ``mlp.*``, ``mlp_norm``); each family renames them to its
checkpoints' (``layer_renames``). Dropouts as transformers places them: on the attention
probabilities (attention_probs_dropout_prob), after the attention and after the MLP
(hidden_dropout_prob), and inside GTE's MLP; none applies in eval mode.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from mlmkit.errors import ConfigError
from mlmkit.models.config import Family, LayerArgs, ModelConfig
from mlmkit.models.core import ACT, Attention, attend, layer_norm
from mlmkit.models.rotary import Rope, rotate


class RotaryAttention(Attention):
    """Self-attention with one fused q/k/v projection and rotary positions (``rope``)."""

    def __init__(self, config: ModelConfig, rope: Rope, bias: bool) -> None:
        super().__init__()
        H = config.hidden_size
        self.hidden, self.n_head, self.head_dim, self.rope = (H, config.num_attention_heads, config.head_dim,
                                                              rope)
        self.qkv = nn.Linear(H, 3 * H, bias=bias)  # rows: queries, keys, values
        self.out = nn.Linear(H, H, bias=bias)
        self.dropout_p = config.attention_probs_dropout_prob
        self.dropout = nn.Dropout(self.dropout_p)  # on the probabilities (eager; SDPA takes dropout_p)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, queries: torch.Tensor | None = None,
                angles: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        # x (B, T, H); mask (B, 1, 1, T) additive; queries (B, Tq, H): the first Tq positions only
        # (core.encode_cls); angles: layer_context's cos, sin (T, d) (computed here when not given)
        H = self.hidden
        if queries is None:
            # (B, nh, T, hd) each
            q, k, v = self.qkv(x).unflatten(-1, (3, self.n_head, self.head_dim)).transpose(1, 3).unbind(2)
        else:
            W, b = self.qkv.weight, self.qkv.bias
            q = F.linear(queries, W[:H], None if b is None
                         else b[:H]).unflatten(-1, (self.n_head, self.head_dim)).transpose(1, 2)
            k, v = F.linear(x, W[H:], None if b is None else b[H:]).unflatten(-1, (
                2, self.n_head, self.head_dim)).transpose(1, 3).unbind(2)
        # lengths from the inputs (sizes of unbind's outputs freeze in the ONNX trace), and the queries'
        # angles from their own arange (a slice cos[:Tq] would freeze too), at the whole input's base
        T = x.size(1)
        cos, sin = angles if angles is not None else self.rope.angles(T, x.device)
        qcs = (cos, sin) if queries is None else self.rope.angles(queries.size(1), x.device, length=T)
        q, k = rotate(q, *qcs, interleaved=self.rope.interleaved), rotate(k, cos, sin,
                                                                          interleaved=self.rope.interleaved)
        out = attend(self, q, k, v, mask).transpose(1, 2).flatten(2)  # (B, Tq, H)
        return self.out(out)


class GatedMLP(nn.Module):
    """act(gate(x)) * up(x), then ``down``: GTE's (one fused ``up_gate`` projection, the up rows first,
    dropout on the product, ``down`` with a bias) and NomicBERT's SwiGLU (``up`` and ``gate`` apart,
    no biases). No bias on up and gate in either."""

    def __init__(self, config: ModelConfig, *, fused: bool, down_bias: bool, dropout: float = 0.0) -> None:
        super().__init__()
        H, inter = config.hidden_size, config.intermediate_size
        self.fused = fused
        if fused:
            self.up_gate = nn.Linear(H, 2 * inter, bias=False)
        else:
            self.up = nn.Linear(H, inter, bias=False)
            self.gate = nn.Linear(H, inter, bias=False)
        self.act = ACT[config.hidden_act]
        self.drop = nn.Dropout(dropout)
        self.down = nn.Linear(inter, H, bias=down_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, T, I) each
        up, gate = self.up_gate(x).chunk(2, dim=-1) if self.fused else (self.up(x), self.gate(x))
        return self.down(self.drop(self.act(gate) * up))


class PlainMLP(nn.Module):
    """``fc1``, the activation, ``fc2``, with biases (jina-embeddings-v3's, transformers' CLIPMLP)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACT[config.hidden_act]
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class RotaryBertLayer(nn.Module):
    """The post-LN block: attn_norm(x + attention(x)), then mlp_norm(. + mlp(.))."""

    def __init__(self, config: ModelConfig, rope: Rope, *, attention_bias: bool, mlp: nn.Module) -> None:
        super().__init__()
        self.attention = RotaryAttention(config, rope, attention_bias)
        self.attn_drop = nn.Dropout(config.hidden_dropout_prob)
        self.attn_norm = layer_norm(config)
        self.mlp = mlp
        self.mlp_drop = nn.Dropout(config.hidden_dropout_prob)
        self.mlp_norm = layer_norm(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, queries: torch.Tensor | None = None,
                angles: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        residual = x if queries is None else queries
        h = self.attn_norm(residual + self.attn_drop(self.attention(x, mask, queries, angles)))  # (B, Tq, H)
        return self.mlp_norm(h + self.mlp_drop(self.mlp(h)))


def layer_renames(root: str, names: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """(mlmkit's name, the family's) prefix pairs of a layer's blocks: ``names`` maps this module's
    names (``attention.qkv`` ...) to the family's (``attn.Wqkv`` ...) under ``root``, the family's
    layer prefix with "{n}" for the index (``nomic_bert.encoder.layers.{n}``)."""
    return tuple((f"bert.encoder.layer.{{n}}.{ours}", f"{root}.{theirs}") for ours, theirs in names.items())


# ---- the families' common part ----------------------------------------------------------------------
class RotaryBert(Family):
    """What GTE, NomicBERT and jina-embeddings-v3 declare alike; each says its names, its rotary
    (``rope``), its MLP (``mlp``) and whether its attention has biases (``attention_bias``)."""

    token_types = False  # the class attribute; these configs decide by type_vocab_size (uses_token_types)
    positions = "none"
    attention_bias = True

    def rope(self, config: ModelConfig) -> Rope:
        raise NotImplementedError

    def mlp(self, config: ModelConfig) -> nn.Module:
        raise NotImplementedError

    def uses_token_types(self, config: ModelConfig) -> bool:
        return config.type_vocab_size > 1

    def check(self, config: ModelConfig) -> None:
        head_dim = config.extra.get("head_dim")
        if head_dim is not None and head_dim != config.head_dim:
            raise ConfigError(f"config head_dim {head_dim!r} is not hidden_size / num_attention_heads "
                              f"({config.head_dim}) "
                              f"for {self.name}",
                              "mlmkit runs heads of hidden_size / num_attention_heads dimensions")
        self.rope(config)

    def layer(self, config: ModelConfig, index: int) -> nn.Module:
        return RotaryBertLayer(config, self.rope(config), attention_bias=self.attention_bias,
                               mlp=self.mlp(config))

    def layer_context(self, encoder: nn.Module, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor,
                                                                                              LayerArgs]:
        """The rotary angles of the T positions, computed once for all the layers (they share one Rope)."""
        rope = encoder.layer[0].attention.rope
        return x, {"angles": rope.angles(x.size(1), x.device)}
