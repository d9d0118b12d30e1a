"""What a config.json may hold, checked before anything is built on it: the ceilings on sizes, the
activations mlmkit runs (``ACT``), the label maps, probabilities, and the family keys that size a
module (``ExtraSize``). A config.json is input: a typo or a damaged file (10^9 rows) would otherwise
be found by the allocator.

``ModelConfig`` (models/config.py) runs these checks when it is made; its sizes are also checked
against the weights' shapes (rundir/weights.py, check_weights) where there are weights to compare with.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from mlmkit.errors import ConfigError

# hidden_act (and a family's head activations) by config.json name
ACT = {
    "gelu": F.gelu,  # exact erf form, as the original BERT and HF "gelu"
    "gelu_python": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "tanh": torch.tanh,
}

# Ceilings on config sizes, each well above every published encoder of the supported families and far
# below what kills a machine: a config.json is input, and a typo or a damaged file (10^9 rows) would
# otherwise be found by the allocator. Sizes are also checked against the weights' shapes
# (rundir/weights.py, check_weights); these hold where there are none to compare with (--config, a .bin).
CEILINGS = {
    "vocab_size": 1 << 20,  # 1,048,576; XLM-R and mDeBERTa have 250,002 / 251,000 tokens
    "hidden_size": 1 << 14,  # 16,384; XLM-R XXL (the largest) has 4,096
    "intermediate_size": 1 << 16,  # 65,536; XLM-R XXL has 16,384
    "num_hidden_layers": 256,  # XLM-R XXL and DeBERTa-v2-xxlarge have 48
    "num_attention_heads": 1 << 14,  # never above hidden_size (it divides it)
    "max_position_embeddings": 1 << 17,  # 131,072; ModernBERT has 8,192, the longest encoders 32,768
    "type_vocab_size": 1 << 10,  # 1,024; BERT has 2, RoBERTa 1
}
MAX_PARAMETERS = 20_000_000_000  # about twice XLM-R XXL's 10.7 billion, the largest published encoder
MAX_LABELS = 1 << 16  # labels of a classification / tagging head (id2label, num_labels)


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _label_id(k: Any) -> bool:
    if is_int(k):
        return k >= 0
    return isinstance(k, str) and k.isascii() and k.isdigit()


def check_probability(key: str, v: Any) -> None:
    if not is_number(v) or not 0 <= v < 1:
        raise ConfigError(f"config {key} must be a probability from 0 up to (not including) 1, got {v!r}",
                          "fix the config.json")


SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
         "max_position_embeddings", "type_vocab_size")
"""The canonical fields that size a module, each checked against its ceiling (CEILINGS)."""


def check_fields(values: Mapping[str, Any], name: Callable[[str], str]) -> None:
    """The canonical fields' types and ranges: sizes within their ceilings, heads that divide the
    hidden size, an activation of ``ACT``, probabilities, a positive LayerNorm epsilon, architectures
    as a list of names. ``values``: a ModelConfig's fields by name; ``name``: how the family's
    config.json names a field, for the message."""
    for k in SIZES:
        v, low = values[k], (0 if k == "type_vocab_size" else 1)
        if not is_int(v) or v < low:
            what = "a whole number, 0 or more" if low == 0 else "a positive integer"
            raise ConfigError(f"config {name(k)} must be {what}, got {v!r}", "fix the config.json")
        if v > CEILINGS[k]:
            raise ConfigError(f"config {name(k)} {v} is beyond what any encoder has (at most "
                              f"{CEILINGS[k]:,})",
                              "fix the config.json: is the value a typo, or a damaged file?")
    hidden, heads = values["hidden_size"], values["num_attention_heads"]
    if hidden % heads:
        raise ConfigError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}",
                          "pick a head count that divides the hidden size")
    act = values["hidden_act"]
    if not isinstance(act, str) or act not in ACT:
        raise ConfigError(f"unsupported {name('hidden_act')} {act!r}", f"use one of: {', '.join(ACT)}")
    for k in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
        check_probability(name(k), values[k])
    for k in ("layer_norm_eps", "initializer_range"):
        v = values[k]
        if not is_number(v) or not math.isfinite(v) or v < 0 or (v == 0 and k == "layer_norm_eps"):
            want = "a positive number" if k == "layer_norm_eps" else "a number, 0 or more"
            raise ConfigError(f"config {name(k)} must be {want}, got {v!r}", "fix the config.json")
    architectures = values["architectures"]
    if architectures is not None and (not isinstance(architectures, list)
                                      or not all(isinstance(a, str) for a in architectures)):
        raise ConfigError(f"config architectures must be a list of class names, got {architectures!r}",
                          "fix the config.json")


def checked_labels(id2label: Any, label2id: Any) -> dict[int, str] | None:
    """``id2label`` checked (ids 0 to n - 1, each label a name of its own) and keyed by int, as
    ``ModelConfig.id2label`` holds it; ``label2id`` checked to map names to ids."""
    if id2label is not None:
        if not isinstance(id2label, dict):
            raise ConfigError(f"config id2label must map label ids to names, got {id2label!r}",
                              "fix the config.json")
        bad = [k for k in id2label if not _label_id(k)]
        if bad:
            raise ConfigError(f"config id2label key {bad[0]!r} is not a label id (0, 1, ...)",
                              "fix the config.json")
        ids = {int(k): v for k, v in id2label.items()}
        if sorted(ids) != list(range(len(ids))) or len(ids) > MAX_LABELS:
            raise ConfigError("config id2label must number its labels 0 to n - 1 (n at most "
                              f"{MAX_LABELS:,}), "
                              f"got ids {sorted(ids)[:5]}{' ...' if len(ids) > 5 else ''}",
                              "fix the config.json")
        names = list(ids.values())
        if not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
            raise ConfigError("config id2label must give each label a name of its own, got "
                              f"{[ids[i] for i in sorted(ids)][:10]}", "fix the config.json")
        id2label = ids
    if label2id is not None and (not isinstance(label2id, dict)
                                 or not all(isinstance(k, str) and is_int(v) for k, v in label2id.items())):
        raise ConfigError(f"config label2id must map label names to ids, got {label2id!r}",
                          "fix the config.json")
    return id2label


@dataclass(frozen=True)
class ExtraSize:
    """A family key of config.json (kept in ``ModelConfig.extra``) that sizes a module: checked with
    the canonical sizes before anything is built, as a whole number from 1 up to the ceiling of the
    canonical field ``bound`` (CEILINGS, above), or one of ``unset`` (DeBERTa's -1 / 0:
    "as max_position_embeddings", "no buckets"). A config.json is input: a typo of 10^9 would
    otherwise be found by the allocator."""

    key: str
    bound: str = "hidden_size"
    unset: tuple[int, ...] = ()


def check_extra(extra: Any, sizes: Iterable[ExtraSize], probabilities: tuple[str, ...]) -> None:
    """The family keys (``extra``) that size or regularise a module, as the family declares them
    (``Family.extra_sizes``; ``probabilities``: ``Family.classifier_dropout_key`` and
    ``Family.dropout_keys``, checked even when they are not numbers)."""
    if not isinstance(extra, dict):
        raise ConfigError(f"config extra must be an object, got {type(extra).__name__}")
    for size in sizes:
        v = extra.get(size.key)
        if v is None or (is_int(v) and v in size.unset):
            continue
        ceiling = CEILINGS[size.bound]
        if not is_int(v) or not 1 <= v <= ceiling:
            raise ConfigError(f"config {size.key} must be a positive integer of at most {ceiling:,}, got "
                              f"{v!r}",
                              "fix the config.json")
    for k, v in extra.items():
        if "dropout" in k and (is_number(v) or k in probabilities):
            if v is not None:
                check_probability(k, v)
