"""The model config (BERT's field names, whatever the family), and the size presets.

config.json written by mlmkit is the Hugging Face config of the model's family (BertConfig,
RobertaConfig, DistilBertConfig ...): ``transformers.AutoConfig`` reads it, and a Hugging Face
config.json reads back here. In memory the fields are BERT's (hidden_size, num_hidden_layers ...)
and so are the architectures (BertForSequenceClassification ...); the family (models/) renames both
on the way in and out. Keys mlmkit does not use are kept in ``extra`` and written back.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from mlmkit.errors import ConfigError
from mlmkit.files import atomic_write_text, parse_json
from mlmkit.models import family_for
from mlmkit.models.core import ACT

LABELLED_HEADS = ("ForSequenceClassification", "ForTokenClassification")

# Ceilings on config sizes, each well above every published encoder of the supported families and far
# below what kills a machine: a config.json is input, and a typo or a damaged file (10^9 rows) would
# otherwise be found by the allocator. Sizes are also checked against the weights' shapes
# (checkpoint.check_weights); these hold where there are none to compare with (--config, a .bin).
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


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _label_id(k: Any) -> bool:
    if _is_int(k):
        return k >= 0
    return isinstance(k, str) and k.isascii() and k.isdigit()


def _check_probability(key: str, v: Any) -> None:
    if not _is_number(v) or not 0 <= v < 1:
        raise ConfigError(f"config {key} must be a probability from 0 up to (not including) 1, got {v!r}",
                          "fix the config.json")


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
        """Every field's type and range, checked before anything is built on them: a config.json is
        input, and a size of 10^9 would otherwise be found out by the allocator (256 GB)."""
        if not isinstance(self.model_type, str):
            raise ConfigError(f"config model_type must be a name, got {self.model_type!r}", "fix the config.json")
        key = self.family.config_aliases.get  # the field as the family's config.json names it
        sizes = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "max_position_embeddings", "type_vocab_size")
        for k in sizes:
            v, low = getattr(self, k), (0 if k == "type_vocab_size" else 1)
            if not _is_int(v) or v < low:
                what = "a whole number, 0 or more" if low == 0 else "a positive integer"
                raise ConfigError(f"config {key(k, k)} must be {what}, got {v!r}", "fix the config.json")
            if v > CEILINGS[k]:
                raise ConfigError(f"config {key(k, k)} {v} is beyond what any encoder has (at most {CEILINGS[k]:,})",
                                  "fix the config.json: is the value a typo, or a damaged file?")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                f"{self.num_attention_heads}",
                "pick a head count that divides the hidden size",
            )
        if not isinstance(self.hidden_act, str) or self.hidden_act not in ACT:
            raise ConfigError(f"unsupported {key('hidden_act', 'hidden_act')} {self.hidden_act!r}", f"use one of: {', '.join(ACT)}")
        for k in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            _check_probability(key(k, k), getattr(self, k))
        for k in ("layer_norm_eps", "initializer_range"):
            v = getattr(self, k)
            if not _is_number(v) or not math.isfinite(v) or v < 0 or (v == 0 and k == "layer_norm_eps"):
                want = "a positive number" if k == "layer_norm_eps" else "a number, 0 or more"
                raise ConfigError(f"config {key(k, k)} must be {want}, got {v!r}", "fix the config.json")
        if self.architectures is not None and (not isinstance(self.architectures, list)
                                               or not all(isinstance(a, str) for a in self.architectures)):
            raise ConfigError(f"config architectures must be a list of class names, got {self.architectures!r}",
                              "fix the config.json")
        self._check_labels()
        self._check_extra()
        self.family.check(self)
        if self.pad_token_id is not None or self.family.positions == "padding_offset":  # RoBERTa's positions count from it
            if not _is_int(self.pad_token_id) or not 0 <= self.pad_token_id < self.vocab_size:
                raise ConfigError(f"config pad_token_id must be a token id from 0 to {self.vocab_size - 1}, "
                                  f"got {self.pad_token_id!r}", "fix the config.json")
        params = self.parameter_estimate()
        if params > MAX_PARAMETERS:
            raise ConfigError(f"config sizes make a model of about {params / 1e9:.0f} billion parameters, beyond any "
                              f"encoder (at most {MAX_PARAMETERS / 1e9:.0f} billion)", "fix the config.json's sizes")

    def _check_labels(self) -> None:
        if self.id2label is not None:
            if not isinstance(self.id2label, dict):
                raise ConfigError(f"config id2label must map label ids to names, got {self.id2label!r}", "fix the config.json")
            bad = [k for k in self.id2label if not _label_id(k)]
            if bad:
                raise ConfigError(f"config id2label key {bad[0]!r} is not a label id (0, 1, ...)", "fix the config.json")
            ids = {int(k): v for k, v in self.id2label.items()}
            if sorted(ids) != list(range(len(ids))) or len(ids) > MAX_LABELS:
                raise ConfigError(f"config id2label must number its labels 0 to n - 1 (n at most {MAX_LABELS:,}), "
                                  f"got ids {sorted(ids)[:5]}{' ...' if len(ids) > 5 else ''}", "fix the config.json")
            names = list(ids.values())
            if not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
                raise ConfigError("config id2label must give each label a name of its own, got "
                                  f"{[ids[i] for i in sorted(ids)][:10]}", "fix the config.json")
            self.id2label = ids
        if self.label2id is not None and (not isinstance(self.label2id, dict)
                                          or not all(isinstance(k, str) and _is_int(v) for k, v in self.label2id.items())):
            raise ConfigError(f"config label2id must map label names to ids, got {self.label2id!r}", "fix the config.json")

    def _check_extra(self) -> None:
        """The family keys (``extra``) that size or regularise a module, as the family declares them
        (``Family.extra_sizes``, ``Family.dropout_keys``)."""
        if not isinstance(self.extra, dict):
            raise ConfigError(f"config extra must be an object, got {type(self.extra).__name__}")
        fam = self.family
        for size in fam.extra_sizes:
            v = self.extra.get(size.key)
            if v is None or (_is_int(v) and v in size.unset):
                continue
            ceiling = CEILINGS[size.bound]
            if not _is_int(v) or not 1 <= v <= ceiling:
                raise ConfigError(f"config {size.key} must be a positive integer of at most {ceiling:,}, got {v!r}",
                                  "fix the config.json")
        probabilities = (fam.classifier_dropout_key, *fam.dropout_keys)
        for k, v in self.extra.items():
            if "dropout" in k and (_is_number(v) or k in probabilities):
                if v is not None:
                    _check_probability(k, v)

    def parameter_estimate(self) -> int:
        """About how many parameters the config makes (embeddings, layers, the MLM head): what a
        config whose checkpoint has no header to compare it with (pytorch_model.bin) is held to."""
        E, H, F = self.family.embedding_size(self), self.hidden_size, self.intermediate_size
        rows = self.vocab_size + self.type_vocab_size + (self.max_position_embeddings if self.family.positions != "none" else 0)
        layer = 4 * H * H + 3 * H * F  # attention's four projections; the MLP's two (three: ModernBERT's GeGLU)
        return rows * E + self.num_hidden_layers * layer + self.vocab_size + H * E

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
        if known.get("id2label") is None and any(isinstance(a, str) and a.endswith(LABELLED_HEADS)
                                                      for a in known.get("architectures") or []):
            # transformers leaves out id2label when it is its default: num_labels (default 2) of LABEL_i
            n = extra.pop("num_labels", 2)
            if not _is_int(n) or not 1 <= n <= MAX_LABELS:
                raise ConfigError(f"config num_labels must be a positive integer of at most {MAX_LABELS:,}, got {n!r}",
                                  "fix the config.json")
            known["id2label"] = {i: f"LABEL_{i}" for i in range(n)}
            known["label2id"] = {f"LABEL_{i}": i for i in range(n)}
        return cls(**known, extra=extra)

    def save(self, path: str | Path) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> ModelConfig:
        """config.json of a model directory (or the file itself), every field checked; of a directory
        also against the shapes its weights' headers declare, so that nothing is built on a config
        that does not describe its weights (checkpoint.check_weights)."""
        p = Path(path)
        model_dir = p if p.is_dir() else None
        if model_dir is not None:
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
            config = cls.from_dict(d)
        except ConfigError as e:
            raise ConfigError(f"{p}: {e.message}", e.hint) from None
        except (TypeError, ValueError, AttributeError) as e:
            raise ConfigError(f"{p}: not a valid config.json ({e})") from None
        if model_dir is not None:
            from mlmkit.rundir.weights import check_weights

            check_weights(model_dir, config)
        return config


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
