"""Rotary positions (models/rotary.py): each pair of dimensions turned by its position's angle, in the
half-split and interleaved layouts, whole or partial; transformers' linear and dynamic (NTK)
scalings as transformers computes their frequencies, from a traced length as from an int; the
config reading and its refusals. The families' own parity tests (test_gte.py, test_nomic_bert.py,
test_jina.py, test_modernbert.py) check the same against their transformers models."""

from __future__ import annotations

import math

import pytest
import torch

from mlmkit.errors import ConfigError
from mlmkit.models.rotary import Rope, rope_config, rotary, rotate


def turned_by_hand(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Each pair (a, b) of x (B, nh, T, hd) at position t turned by t * inv_freq[i]: (a cos - b sin,
    a sin + b cos); the pairs are (2i, 2i + 1) interleaved, else (i, i + dim/2); the dimensions past
    ``dim`` stay."""
    T = x.size(2)
    inv = rope.inv_freq(T, x.device).double()
    out = x.double().clone()
    for i in range(rope.dim // 2):
        a, b = (2 * i, 2 * i + 1) if rope.interleaved else (i, i + rope.dim // 2)
        for t in range(T):
            c, s = math.cos(t * inv[i].item()), math.sin(t * inv[i].item())
            xa, xb = x[:, :, t, a].double(), x[:, :, t, b].double()
            out[:, :, t, a], out[:, :, t, b] = xa * c - xb * s, xa * s + xb * c
    return out


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dim", [16, 8, 4])
def test_each_pair_turns_by_its_angle(interleaved, dim):
    rope = Rope(100.0, dim, interleaved)
    x = torch.randn(2, 3, 11, 16, generator=torch.Generator().manual_seed(dim))
    got = rotate(x, *rope.angles(11, x.device), interleaved=interleaved)
    assert (got.double() - turned_by_hand(x, rope)).abs().max() < 1e-5
    assert torch.equal(got[..., dim:], x[..., dim:])


def test_the_plain_form_is_the_whole_head_half_split():
    cos, sin = rotary(9, 16, 500.0, torch.device("cpu"))
    c2, s2 = Rope(500.0, 16).angles(9, torch.device("cpu"))
    assert torch.equal(cos, c2) and torch.equal(sin, s2)


def _transformers_inv_freq(kind: str, seq_len: int | None) -> torch.Tensor:
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = transformers.GteConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=32,
                                 rope_parameters={"rope_type": kind, "factor": 3.0, "rope_theta": 1000.0})
    return ROPE_INIT_FUNCTIONS[kind](cfg, None, seq_len=None if seq_len is None else torch.tensor(seq_len))[0]


@pytest.mark.parametrize("kind, T", [("linear", 10), ("dynamic", 10), ("dynamic", 32), ("dynamic", 33),
                                     ("dynamic", 500)])
def test_scaled_frequencies_are_transformers(kind, T):
    """transformers' linear scaling, and its dynamic one at the length it updates to (the input's,
    at least max_position_embeddings), from an int and from a traced length alike."""
    rope = rope_config({"rope_parameters": {"rope_type": kind, "factor": 3.0, "rope_theta": 1000.0}},
                       family="gte", head_dim=16, max_positions=32, default_theta=1.0)
    assert rope == Rope(1000.0, 16, scaling=kind, factor=3.0, trained=32)
    ref = _transformers_inv_freq(kind, T if kind == "dynamic" else None)
    for n in (T, torch.tensor(T)):
        assert torch.allclose(rope.inv_freq(n, torch.device("cpu")), ref, rtol=1e-6, atol=0), n
    if kind == "dynamic" and T <= 32:  # up to the trained positions: the plain frequencies
        assert torch.allclose(rope.inv_freq(T, torch.device("cpu")),
                              Rope(1000.0, 16).inv_freq(T, torch.device("cpu")), rtol=1e-6)


def test_the_queries_take_the_whole_inputs_base():
    """The first positions' angles of a 20-token input (core.encode_cls's queries) are that input's."""
    rope = Rope(1000.0, 16, scaling="dynamic", factor=2.0, trained=8)
    short, whole = rope.angles(3, torch.device("cpu")), rope.angles(3, torch.device("cpu"), length=20)
    # 3 positions: no scaling
    assert torch.allclose(short[0], Rope(1000.0, 16).angles(3, torch.device("cpu"))[0], atol=1e-6)
    assert torch.allclose(whole[0], rope.angles(20, torch.device("cpu"))[0][:3])
    assert not torch.allclose(whole[1], short[1])


@pytest.mark.parametrize("extra, theta", [
    ({}, 7.0),
    ({"rope_theta": 50.0}, 50.0),  # the legacy top-level key
    ({"rope_theta": 50.0, "rope_parameters": {"rope_type": "default", "rope_theta": 60.0}}, 60.0),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 60.0},
      "rope_scaling": {"type": "linear", "factor": 2.0}}, 7.0),
])
def test_the_base_as_transformers_resolves_it(extra, theta):
    assert rope_config(extra, family="gte", head_dim=8, max_positions=4, default_theta=7.0).theta == theta


@pytest.mark.parametrize("params, words", [
    ({"rope_type": "yarn", "factor": 2.0}, "rope type 'yarn' is not supported for gte"),
    ({"rope_type": "default", "partial_rotary_factor": 0.25}, "partial_rotary_factor 0.25"),
    ({"rope_type": "linear", "factor": True}, "factor"),
    ({"rope_type": "default", "rope_theta": float("nan")}, "rope_theta"),
    ("default", "must be an object"),
])
def test_what_it_does_not_run_is_refused(params, words):
    with pytest.raises(ConfigError, match=words):
        rope_config({"rope_parameters": params}, family="gte", head_dim=8, max_positions=4, default_theta=7.0)
