"""The Llama-style blocks (models/prenorm.py) on their own: the RMSNorms are transformers', the spans
mask what they say at every length (traced lengths too), grouped-query attention equals the
repeated-heads product in either form (and caps its scores where asked), a layer computed for its
first queries alone gives those rows, and the last-token pooling reads the last real token that is
not padding."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mlmkit.models import core
from mlmkit.models.config import ModelConfig
from mlmkit.models.prenorm import RMSNorm, grouped_attend, span_mask, with_span

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("offset", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norms_are_transformers(offset, dtype):
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    theirs = Gemma3RMSNorm(24, eps=1e-6) if offset else Qwen3RMSNorm(24, eps=1e-6)
    ours = RMSNorm(24, 1e-6, offset)
    assert torch.equal(ours.weight, theirs.weight)  # the init: 0 (Gemma's offset from 1) or 1
    with torch.no_grad():
        theirs.weight.normal_()
        ours.weight.copy_(theirs.weight)
    ours, theirs = ours.to(dtype), theirs.to(dtype)
    x = (torch.randn(3, 5, 24) * 4).to(dtype)
    assert torch.equal(ours(x), theirs(x))


def test_spans_mask_what_they_say():
    def seen(Tq, T, span):
        m = span_mask(Tq, T, span, torch.device("cpu"), torch.float32)
        return None if m is None else (m == 0)

    i, j = torch.arange(7)[:, None], torch.arange(9)[None, :]
    assert seen(7, 9, None) is None
    assert torch.equal(seen(7, 9, (None, 0)), j <= i)  # causal
    assert torch.equal(seen(7, 9, (2, 0)), (j <= i) & (i - j <= 2))  # a causal window of 3
    assert torch.equal(seen(7, 9, (2, 2)), (j - i).abs() <= 2)  # 2 each side
    assert torch.equal(seen(7, 9, (None, 1)), j <= i + 1)
    traced = span_mask(torch.tensor(7), torch.tensor(9), (2, 2), torch.device("cpu"), torch.float32)
    assert torch.equal(traced, span_mask(7, 9, (2, 2), torch.device("cpu"), torch.float32))
    pad = torch.zeros(2, 1, 1, 9)
    pad[1, ..., 6:] = -10000.0
    assert with_span(pad, 7, 9, None) is pad and with_span(pad, 7, 9, (None, 0)).shape == (2, 1, 7, 9)


class _Attn(nn.Module):
    """What ``grouped_attend`` reads of an attention block."""

    def __init__(self, impl: str) -> None:
        super().__init__()
        self.impl, self.dropout_p, self.dropout = impl, 0.0, nn.Dropout(0.0)


def reference(q, k, v, mask, scale, softcap=None):
    """transformers' eager_attention_forward: the key / value heads repeated (repeat_kv), then the product."""
    g = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = q @ k.transpose(-1, -2) * scale
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    return torch.softmax(s + mask, dim=-1) @ v


@pytest.mark.parametrize("kv", [1, 2, 6])
@pytest.mark.parametrize("softcap", [None, 3.0])
def test_grouped_attention_is_the_repeated_heads_product(kv, softcap):
    g = torch.Generator().manual_seed(kv)
    q, k, v = (torch.randn(2, 6, 5, 8, generator=g) * 2, torch.randn(2, kv, 9, 8, generator=g) * 2,
               torch.randn(2, kv, 9, 8, generator=g))
    pad = torch.zeros(2, 1, 1, 9)
    pad[1, ..., 4:] = -10000.0
    for mask in (pad, with_span(pad, 5, 9, (None, 0)), with_span(pad, 5, 9, (1, 1))):
        ref = reference(q, k, v, mask, 0.3, softcap)
        for impl in ("eager", "sdpa"):
            got = grouped_attend(_Attn(impl), q, k, v, mask, 0.3, softcap)
            assert (got - ref).abs().max().item() <= 1e-5, (impl, mask.shape)


@pytest.mark.parametrize("arch, extra", [
    ("qwen3", {"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1}),
    ("gemma3_text", {"use_bidirectional_attention": True, "sliding_window": 4, "sliding_window_pattern": 2}),
    ("eurobert", {"pad_token_id": 0}),
])
def test_a_layer_for_its_first_queries_gives_those_rows(arch, extra):
    """core.encode_cls's path: a layer given its first Tq positions as ``queries`` computes their rows
    as the whole layer does (their angles, the causal or windowed rows of the mask)."""
    cfg = ModelConfig.from_dict({"model_type": arch, "vocab_size": 50, "hidden_size": 32,
                                 "num_attention_heads": 4,
                                 "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2,
                                 "intermediate_size": 48, **extra})
    torch.manual_seed(0)
    model = core.BertModel(cfg, add_pooling_layer=False).eval()
    x = torch.randn(2, 12, 32)
    mask = core.extended_mask(torch.tensor([[1] * 12, [1] * 7 + [0] * 5]), x.dtype)
    with torch.no_grad():
        for layer in model.encoder.layer:
            for impl in ("eager", "sdpa"):
                core.set_attention_impl(layer, impl)
                whole = layer(x, mask)
                assert (layer(x, mask, queries=x[:, :3]) - whole[:, :3]).abs().max().item() <= 1e-5


def test_last_token_pooling_reads_the_last_real_token_that_is_not_padding():
    x = torch.arange(2 * 6 * 1, dtype=torch.float32).reshape(2, 6, 1)
    ids = torch.tensor([[5, 6, 7, 9, 9, 9], [5, 9, 6, 9, 0, 0]])  # 9: the padding id, also appended to a text
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0]])
    assert core.last_token(x, mask, ids, 9)[:, 0].tolist() == [2.0, 8.0]  # rows' positions 2 and 2
    # no padding id: the last real token
    assert core.last_token(x, mask, ids, None)[:, 0].tolist() == [3.0, 9.0]
    assert core.last_token(x, torch.zeros_like(mask), ids, 9)[:, 0].tolist() == [0.0, 6.0]  # none: the first
