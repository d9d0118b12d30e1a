"""The model config (BERT's field names, whatever the family), and the size presets.

config.json written by mlmkit is the Hugging Face config of the model's family (BertConfig,
RobertaConfig, DistilBertConfig ...): ``transformers.AutoConfig`` reads it, and a Hugging Face
config.json reads back here. In memory the fields are BERT's (hidden_size, num_hidden_layers ...)
and so are the architectures (BertForSequenceClassification ...); the family (models/) renames both
on the way in and out. Keys mlmkit does not use are kept in ``extra`` and written back.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .files import atomic_write_text, parse_json
from .models import family_for
from .models.core import ACT

LABELLED_HEADS = ("ForSequenceClassification", "ForTokenClassification")


@dataclass
class ModelConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"  # exact erf GELU, as the original BERT and HF "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2  # segments A and B for NSP / sentence pairs; 0: the family has none
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12  # the original BERT value; HF checkpoints expect it
    pad_token_id: int = 0
    model_type: str = "bert"
    architectures: list[str] | None = None
    id2label: dict[int, str] | None = None
    label2id: dict[str, int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # HF keys we do not use, round-tripped

    def __post_init__(self) -> None:
        sizes = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "max_position_embeddings", "type_vocab_size")
        bad = [k for k in sizes if isinstance(getattr(self, k), bool) or not isinstance(getattr(self, k), int)
               or getattr(self, k) < (0 if k == "type_vocab_size" else 1)]
        if bad:
            raise ConfigError(f"config {bad[0]} must be a positive integer, got {getattr(self, bad[0])!r}",
                              "fix the config.json")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                f"{self.num_attention_heads}",
                "pick a head count that divides the hidden size",
            )
        if self.hidden_act not in ACT:
            raise ConfigError(f"unsupported hidden_act '{self.hidden_act}'", f"use one of: {', '.join(ACT)}")
        if self.id2label is not None:
            self.id2label = {int(k): v for k, v in self.id2label.items()}
        self.family.check(self)

    @property
    def family(self) -> Any:
        """The model family (models/family.py) of this config's model_type."""
        return family_for(self.model_type)

    @property
    def max_tokens(self) -> int:
        """The longest input the model's positions allow (RoBERTa's count from padding_idx + 1)."""
        return self.family.max_tokens(self)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_labels(self) -> int:
        return len(self.id2label) if self.id2label else 0

    def to_dict(self) -> dict[str, Any]:
        """config.json as the family's transformers config writes it."""
        fam = self.family
        d = asdict(self)
        extra = d.pop("extra")
        if d["id2label"] is not None:
            d["id2label"] = {str(k): v for k, v in d["id2label"].items()}
        else:
            d.pop("id2label")
            d.pop("label2id")
        if d["architectures"] is None:
            d.pop("architectures")
        else:
            d["architectures"] = [fam.architecture(a, self.model_type) for a in d["architectures"]]
        if not fam.uses_token_types(self) and not d["type_vocab_size"]:
            d.pop("type_vocab_size")
        for canonical, name in fam.config_aliases.items():
            d[name] = d.pop(canonical)
        return {**extra, **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """A config.json of any supported family (its own key names) -> the canonical fields."""
        model_type = d.get("model_type", "bert")
        fam = family_for(model_type if isinstance(model_type, str) else repr(model_type))
        d = dict(d)
        for canonical, name in fam.config_aliases.items():
            if name in d:
                d[canonical] = d.pop(name)
        d = {**fam.config_defaults, **d}
        if isinstance(d.get("architectures"), list):
            d["architectures"] = [fam.canonical_architecture(a, model_type) if isinstance(a, str) else a
                                  for a in d["architectures"]]
        names = {f.name for f in fields(cls)} - {"extra"}
        known = {k: v for k, v in d.items() if k in names}
        extra = {k: v for k, v in d.items() if k not in names and k != "transformers_version"}
        if known.get("id2label") is None and any(a.endswith(LABELLED_HEADS) for a in known.get("architectures") or []):
            # transformers leaves out id2label when it is its default: num_labels (default 2) of LABEL_i
            n = extra.pop("num_labels", 2)
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ConfigError(f"config num_labels must be a positive integer, got {n!r}", "fix the config.json")
            known["id2label"] = {i: f"LABEL_{i}" for i in range(n)}
            known["label2id"] = {f"LABEL_{i}": i for i in range(n)}
        return cls(**known, extra=extra)

    def save(self, path: str | Path) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> ModelConfig:
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        try:
            d = parse_json(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config not found: {p}", "pass a run directory or a config.json") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{p}: not a valid config.json ({e})") from None
        if not isinstance(d, dict):
            raise ConfigError(f"{p}: a config.json holds a JSON object, not a {type(d).__name__}", "pass a model's config.json")
        try:
            return cls.from_dict(d)
        except ConfigError as e:
            raise ConfigError(f"{p}: {e.message}", e.hint) from None
        except (TypeError, ValueError, AttributeError) as e:
            raise ConfigError(f"{p}: not a valid config.json ({e})") from None


BertConfig = ModelConfig  # the name task plugins and earlier code use


# name -> (layers, hidden, heads, intermediate); the published compact BERT sizes (Turc et al. 2019)
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
    sizes = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, intermediate_size=inter)
    return ModelConfig(**{**sizes, **fields_, "model_type": arch, "extra": {**fam.preset_extra(), **extra}})
