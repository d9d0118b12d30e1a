"""DeBERTa-v2's disentangled attention (models/deberta.py's layers) and the relative positions it reads:
besides content-to-content, each query's content against the relative position of each key (c2p)
and each key's content against the relative position of the query (p2c), all scaled by
sqrt(head_dim * (1 + number of terms)); the relative positions are log-bucketed (``position_buckets``,
``max_relative_positions``) and index ``encoder.rel_embeddings``. Also the readers of the DeBERTa
config keys that say so (``relative_attention``, ``pos_att_type`` ...).

The relative positions of a query i and a key j are a function of i - j only; the row of
``rel_embeddings`` each difference reads is tabled once (RelativePositions), and a forward indexes
the table with the differences of torch.arange of its runtime lengths: an exported graph serves
every length, and computes no logarithm that another runtime could round to another bucket.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from mlmkit.errors import ConfigError
from mlmkit.models.config import ModelConfig
from mlmkit.models.core import Attention

TERMS = ("c2p", "p2c")  # the relative attention terms transformers' DeBERTa-v2 computes


# ---- config ------------------------------------------------------------------------------------
def read_flag(config: ModelConfig, key: str, default: bool) -> bool:
    """The DeBERTa config key ``key`` (in ``extra``), true or false."""
    v = config.extra.get(key, default)
    if not isinstance(v, bool):
        raise ConfigError(f"config {key} must be true or false, got {v!r}", "fix the config.json")
    return v


def read_int(config: ModelConfig, key: str, default: int) -> int:
    """The DeBERTa config key ``key`` (in ``extra``), an integer."""
    v = config.extra.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"config {key} must be an integer, got {v!r}", "fix the config.json")
    return v


def read_names(config: ModelConfig, key: str, default: str | None) -> list[str]:
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
    return read_flag(config, "relative_attention", False)


def attention_terms(config: ModelConfig) -> tuple[str, ...]:
    """The relative terms among ("c2p", "p2c") the config's ``pos_att_type`` names."""
    names = read_names(config, "pos_att_type", None)
    return tuple(t for t in TERMS if t in names)


def position_buckets(config: ModelConfig) -> int:
    """``position_buckets``; 0 or less: relative positions are not bucketed."""
    return read_int(config, "position_buckets", -1)


def max_relative_positions(config: ModelConfig) -> int:
    """``max_relative_positions``, max_position_embeddings where it is below 1 (as transformers)."""
    m = read_int(config, "max_relative_positions", -1)
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
        self.share = read_flag(config, "share_att_key", False)
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
