"""The size presets a new model is made at (`mlmkit pretrain --preset`): the published compact BERT
sizes, each made a config of the family asked for, with that family's own defaults."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from mlmkit.errors import ConfigError
from mlmkit.models.config import ModelConfig, family_for

__all__ = ["PRESETS", "preset"]

# name -> (layers, hidden, heads, intermediate): the published compact BERT sizes (Turc et al.,
# "Well-Read Students Learn Better")
PRESETS: dict[str, tuple[int, int, int, int]] = {
    "tiny": (2, 128, 2, 512),
    "mini": (4, 256, 4, 1024),
    "small": (4, 512, 8, 2048),
    "base": (12, 768, 12, 3072),
}


def preset(name: str, arch: str = "bert", **overrides: Any) -> ModelConfig:
    """A config of a named size for the family ``arch`` (its own defaults: RoBERTa's padding id and
    one token type, ModernBERT's rotary and local attention ...); ``overrides`` set any other field
    (vocab_size, max_position_embeddings, ...)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset '{name}'", f"choose one of: {', '.join(PRESETS)}")
    layers, hidden, heads, inter = PRESETS[name]
    fam = family_for(arch)
    fields_, extra = {**fam.config_defaults, **fam.preset_overrides(hidden, inter), **overrides}, {}
    names = {f.name for f in fields(ModelConfig)}
    for k in [k for k in fields_ if k not in names]:
        extra[k] = fields_.pop(k)
    sizes = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                 intermediate_size=inter)
    return ModelConfig(**{**sizes, **fields_, "model_type": arch, "extra": {**fam.preset_extra(), **extra}})
