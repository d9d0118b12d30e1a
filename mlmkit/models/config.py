"""The model config and the family it is read through: what a model is, before any weights.

``ModelConfig`` holds BERT's field names whatever the family (hidden_size, num_hidden_layers ...).
config.json written by mlmkit is the Hugging Face config of the model's family (BertConfig,
RobertaConfig, DistilBertConfig ...): ``transformers.AutoConfig`` reads it, and a Hugging Face
config.json reads back here. The family (``Family``, below) renames fields and architectures on the
way in and out; keys mlmkit does not use are kept in ``extra`` and written back. Reading and writing
config.json files (and checking them against a directory's weights) is rundir/config.py's; the
checks every field goes through (ceilings, labels, probabilities) are models/checks.py's, and
transformers' head names and the parameter renamer models/names.py's, importable from here too, with
``FamilyNames``: the half of ``Family`` that maps a family's class and parameter names.

What a model family declares: how its config.json, parameter names and architectures map onto
mlmkit's one core (BERT's names and fields, core.py and blocks.py), which inputs it takes, which
blocks differ, and whether and how it pretrains. Everything mlmkit knows of a family is declared
here, in its module: rundir/, train/, exporter/ and text/ ask the family, never test its name.

A family is a subclass of ``Family`` in its own module, registered in models/__init__.py
(``register``); ``family_for`` finds one by config.json's model_type. The base class is BERT's blocks
and names, so a family states only what it does differently; what only BERT has (next-sentence
prediction) and what a family opts into (``pretrains``) are off in the base and on in bert.py. What
each hook declares, and which family uses it: docs/families.md, "The Family hooks". The size presets
a new model is made at are models/presets.py's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch
from torch import nn

from mlmkit.errors import ConfigError
from mlmkit.models.checks import (
    ACT,
    CEILINGS,
    MAX_LABELS,
    MAX_PARAMETERS,
    ExtraSize,
    check_extra,
    check_fields,
    checked_labels,
    is_int,
)
from mlmkit.models.names import CLS_SEP_IDS, HEADS, LABELLED_HEADS, FamilyNames, Renamer, StateDict
from mlmkit.registry import HFConfig
from mlmkit.text.tokenizer import BRACKETS
from mlmkit.typed import Registry

LayerArgs = dict[str, Any]
"""The keyword arguments every layer call of a forward gets (Family.layer_context: what the layers
share, computed once per forward: rotary angles, masks, relative positions)."""

__all__ = [
    # what a config.json may hold (mlmkit/models/checks.py) and transformers' names (mlmkit/models/names.py)
    "ACT", "CEILINGS", "MAX_PARAMETERS", "MAX_LABELS", "ExtraSize", "HEADS", "LABELLED_HEADS", "CLS_SEP_IDS",
    "Renamer",
    # the config, the family interface, the registry of families (the size presets: models/presets.py)
    "ModelConfig", "Family", "StateDict", "LayerArgs", "BY_MODEL_TYPE", "register", "family_for",
]


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
    extra: HFConfig = field(default_factory=dict)  # HF keys we do not use, round-tripped

    def __post_init__(self) -> None:
        """Every field's type and range, checked before anything is built on them: a config.json is
        input, and a size of 10^9 would otherwise be found out by the allocator (256 GB)."""
        if not isinstance(self.model_type, str):
            raise ConfigError(f"config model_type must be a name, got {self.model_type!r}",
                              "fix the config.json")
        key = self.family.config_aliases.get  # the field as the family's config.json names it
        check_fields(vars(self), lambda k: key(k, k))
        self.id2label = checked_labels(self.id2label, self.label2id)
        fam = self.family
        check_extra(self.extra, fam.extra_sizes, (fam.classifier_dropout_key, *fam.dropout_keys))
        self.family.check(self)
        # RoBERTa's positions count from it
        if self.pad_token_id is not None or self.family.positions == "padding_offset":
            if not is_int(self.pad_token_id) or not 0 <= self.pad_token_id < self.vocab_size:
                raise ConfigError(f"config pad_token_id must be a token id from 0 to {self.vocab_size - 1}, "
                                  f"got {self.pad_token_id!r}", "fix the config.json")
        params = self.parameter_estimate()
        if params > MAX_PARAMETERS:
            raise ConfigError(f"config sizes make a model of about {params / 1e9:.0f} billion parameters, "
                              "beyond any "
                              f"encoder (at most {MAX_PARAMETERS / 1e9:.0f} billion)",
                              "fix the config.json's sizes")

    def parameter_estimate(self) -> int:
        """About how many parameters the config makes (embeddings, layers, the MLM head): what a
        config whose checkpoint has no header to compare it with (pytorch_model.bin) is held to."""
        E, H, F = self.family.embedding_size(self), self.hidden_size, self.intermediate_size
        rows = self.vocab_size + self.type_vocab_size + (self.max_position_embeddings if self.family.positions
                                                         != "none" else 0)
        # attention's four projections; the MLP's two (three: ModernBERT's GeGLU)
        layer = 4 * H * H + 3 * H * F
        return rows * E + self.num_hidden_layers * layer + self.vocab_size + H * E

    @property
    def family(self) -> Family:
        """The model family (Family, below; one module per family in models/) of this config's model_type."""
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

    def to_dict(self) -> HFConfig:
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
    def from_dict(cls, d: HFConfig) -> ModelConfig:
        """A config.json of any supported family (its own key names) -> the canonical fields."""
        claimed = next((f for f in BY_MODEL_TYPE.values() if f.claims(d)), None)
        if claimed is not None:  # a family's own checkpoint under another model_type (jina's "xlm-roberta")
            was, archs = d.get("model_type"), d.get("architectures")
            # XLMRobertaModel -> BertModel -> JinaEmbeddingsV3Model
            if isinstance(archs, list) and isinstance(was, str) and was in BY_MODEL_TYPE:
                archs = [BY_MODEL_TYPE[was].canonical_architecture(a, was) if isinstance(a, str) else a
                         for a in archs]
            d = {**d, "model_type": claimed.model_types[0],
                 **({"architectures": archs} if archs is not None else {})}
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
            if not is_int(n) or not 1 <= n <= MAX_LABELS:
                raise ConfigError(f"config num_labels must be a positive integer of at most {MAX_LABELS:,}, "
                                  f"got {n!r}",
                                  "fix the config.json")
            known["id2label"] = {i: f"LABEL_{i}" for i in range(n)}
            known["label2id"] = {f"LABEL_{i}": i for i in range(n)}
        return cls(**known, extra=extra)


# ---- the family interface ----------------------------------------------------------------------
class Family(FamilyNames):
    """What a model family declares (docs/families.md, "The Family hooks"); BERT's by default. Its
    transformers names (classes, parameters) are the base class's, models/names.py's FamilyNames."""

    name = "bert"
    model_types: tuple[str, ...] = ("bert",)
    config_aliases: dict[str, str] = {}
    config_defaults: HFConfig = {}  # canonical fields transformers' config class defaults differently
    token_types = True
    positions = "absolute"
    # pretraining: whether `mlmkit pretrain --arch` makes this family (tested presets; ``nsp``, on
    # FamilyNames, says whether with next-sentence prediction), and the positions a new model gets at
    # least (a rotary family has no table and keeps its long context)
    pretrains = False
    max_length = 512
    # config.json key -> the special token (text.tokenizer.SpecialIds field) whose id a new model of this
    # family writes there: the ids transformers' config class of the family carries (BERT's: none)
    config_token_ids: dict[str, str] = {}
    extra_sizes: tuple[ExtraSize, ...] = ()
    # family keys read as dropout probabilities besides ``classifier_dropout_key``, checked even when
    # they are not numbers (a key named *dropout* is checked when it is one)
    dropout_keys: tuple[str, ...] = ()
    final_norm = False
    pooler_norm = False
    token_head = False  # a transform (dense, act, norm) before per-token classifiers
    classifier_dropout_key = "classifier_dropout"
    # what onnxruntime's BERT fusions produce for this family's graphs: op -> count per layer (or for
    # the graph when the op is listed in FUSED_ONCE); measured, see docs/families.md
    fusions: dict[str, int] = {"Attention": 1, "SkipLayerNormalization": 2, "EmbedLayerNormalization": 1}
    # how the family tokenizes by default (tokenizer train --kind, pretrain --arch): the kind, and the
    # (pad, unk, cls, sep, mask) names of one of text/tokenizer.py's CONVENTIONS, which also say how
    # a pair is framed ([CLS] A [SEP] B [SEP] here)
    tokenizer_kind = "wordpiece"
    special_tokens: tuple[str, ...] = BRACKETS.tokens

    # ---- config ----------------------------------------------------------------------------
    def embedding_size(self, config: ModelConfig) -> int:
        return config.hidden_size

    def pooler_act(self, config: ModelConfig) -> str:
        return "tanh"

    def mlm_act(self, config: ModelConfig) -> str:
        return config.hidden_act

    def head_bias(self, config: ModelConfig) -> bool:
        return True

    def sequence_pool(self, config: ModelConfig) -> str:
        """How the sequence head pools the token states (blocks.BertPooler): "cls" (the first token),
        "mean" (over the real tokens), "last" (the last real token that is not the padding id: a
        decoder's head, transformers' GenericForSequenceClassification) or "late" (the pooler's dense
        and activation at every token, then the mean: EuroBERT's)."""
        return "cls"

    def pooler_dense(self, config: ModelConfig) -> bool:
        """Whether the pooled vector goes through a dense layer and ``pooler_act`` before the
        classifier (BERT's pooler); False: the classifier reads the pooled token state itself (a
        decoder's ``score`` layer)."""
        return True

    def classifier_bias(self, config: ModelConfig, per_token: bool) -> bool:
        """Whether the label head's output layer has a bias (the sequence head when not ``per_token``;
        transformers' GenericForSequenceClassification's ``score`` has none)."""
        return True

    def mlm_transform(self, config: ModelConfig) -> bool:
        """Whether the MLM head has BERT's transform (dense, activation, LayerNorm) before the decoder;
        False: the decoder reads the encoder's output (EuroBERT's ``lm_head``)."""
        return True

    def decoder_bias(self, config: ModelConfig) -> bool:
        """Whether the MLM decoder adds a bias (``cls.predictions.bias``)."""
        return True

    def ties_decoder(self, config: ModelConfig) -> bool:
        """Whether the MLM decoder's weight is the word embeddings (core.tie_decoder); False: a
        matrix of its own, stored (``tie_word_embeddings`` false)."""
        return True

    def norm(self, config: ModelConfig, size: int) -> nn.Module | None:
        """The family's normalisation of ``size`` features where it is not the core's LayerNorm
        (RMSNorm ...): the encoder's final norm (blocks.family_norm); None: LayerNorm."""
        return None

    def uses_token_types(self, config: ModelConfig) -> bool:
        """Whether this config's model takes token_type_ids (``token_types``, unless the family's
        configs decide it: DeBERTa's by type_vocab_size)."""
        return self.token_types

    def pooler_dropout(self, config: ModelConfig) -> float:
        """Dropout on the pooled vector before the pooler's dense layer (DeBERTa's ContextPooler); 0: none."""
        return 0.0

    def check(self, config: ModelConfig) -> None:
        """Raise ConfigError for a config this family's blocks cannot run."""

    def shape_mismatch(self, config: ModelConfig, shapes: dict[str, tuple[int, ...]]) -> tuple[str, Any,
                                                                                               str] | None:
        """Where the weights' ``shapes`` (mlmkit's names, from their headers) contradict ``config`` in
        a module check_weights cannot build on the meta device (a table computed from config values:
        DeBERTa's relative positions): (the config.json field, its value, what the weights have);
        None where they agree. Called by rundir/weights.check_weights before anything is built."""
        return None

    def max_tokens(self, config: ModelConfig) -> int:
        """The longest input its positions allow: RoBERTa's start at padding_idx + 1."""
        if self.positions == "padding_offset":
            return config.max_position_embeddings - config.pad_token_id - 1
        return config.max_position_embeddings

    def positions_for(self, tokens: int) -> int:
        """max_position_embeddings of a new model for inputs of up to ``tokens`` (a pretraining
        preset's): at least ``max_length``; RoBERTa's table has padding_idx + 1 more rows."""
        tokens = max(tokens, self.max_length)
        pad = int(self.config_defaults.get("pad_token_id", 0))
        return tokens + pad + 1 if self.positions == "padding_offset" else tokens

    def preset_overrides(self, hidden: int, intermediate: int) -> HFConfig:
        """Canonical fields a size preset sets differently for this family."""
        return {}

    def preset_extra(self) -> HFConfig:
        """Family config keys (config.json's own) a new model of this family is made with."""
        return {}

    # ---- blocks ------------------------------------------------------------------------------
    def layer(self, config: ModelConfig, index: int) -> nn.Module | None:
        """Its block ``index``: forward(x, mask, queries=None, **layer_context) -> (B, T, H); None: the
        core's post-LN BertLayer (blocks.make_layer)."""
        return None

    def embeddings(self, config: ModelConfig) -> nn.Module | None:
        """Its embeddings: forward(input_ids, token_type_ids=None) -> (B, T, H); None: the core's
        BertEmbeddings (blocks.make_embeddings)."""
        return None

    def encoder_modules(self, config: ModelConfig) -> dict[str, nn.Module]:
        """Modules the encoder holds beside its layers, shared by all of them: name -> module,
        registered on blocks.BertEncoder under that name (so ``bert.encoder.<name>.*`` in state dicts)."""
        return {}

    def layer_context(self, encoder: nn.Module, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor,
                                                                                              LayerArgs]:
        """Once per forward, before the first layer: (the first layer's input, the keyword arguments
        every layer takes beside ``(x, mask, queries)``), from the embeddings ``x`` (B, T, H), the
        (B, 1, 1, T) additive padding mask and the ``encoder_modules`` on ``encoder``. BERT's: (x, {})."""
        return x, {}

    # ---- weights ---------------------------------------------------------------------------
    def fold_weights(self, config: ModelConfig, sd: StateDict) -> StateDict:
        """A state dict under mlmkit's names (``from_family``'s) -> the one ``config``'s model loads:
        what a checkpoint holds beyond the model folded into it, as the config says (jina-embeddings-v3's
        task adapters merged into the weights they adapt). Called by rundir/checkpoint.load_state_dict
        after the renaming; BERT's: the state dict as it is."""
        return sd


# ---- the registry: config.json's model_type -> its family -------------------------------------------
BY_MODEL_TYPE: Registry[Family] = Registry("model_type",
                                           "mlmkit runs the families listed by docs/families.md")


def register(*families: Family) -> None:
    """Make ``families`` the ones of their model types (models/__init__.py registers the built-in ones)."""
    for fam in families:
        for t in fam.model_types:
            BY_MODEL_TYPE.add(t, fam)


def family_for(model_type: str) -> Family:
    """The family of a config.json's model_type; a clear error for one mlmkit does not run."""
    if model_type not in BY_MODEL_TYPE:
        raise ConfigError(f"model_type '{model_type}' is not supported",
                          f"mlmkit runs these model types: {', '.join(BY_MODEL_TYPE)}")
    return BY_MODEL_TYPE[model_type]

