"""What a model family declares: how its config.json, parameter names and architectures map onto
mlmkit's one core (BERT's names and fields, core.py), which inputs it takes, which blocks differ, and
whether and how it pretrains. Everything mlmkit knows of a family is declared here, in its module:
rundir/, train/, export/ and text/ ask the family, never test its name.

A family is a subclass of ``Family`` in its own module, registered in models/__init__.py. The base
class is BERT's blocks and names, so a family states only what it does differently; what only BERT
has (next-sentence prediction) and what a family opts into (``pretrains``) are off in the base and
on in bert.py:

    config_aliases   canonical field -> the family's config.json key (DistilBERT: hidden_size -> dim)
    extra_sizes      the family's own config keys that size a module, checked with the canonical sizes
                     (rundir/config.py); ``dropout_keys`` the ones read as probabilities
    renames          (BERT name, family name) prefix pairs, "{n}" standing for a layer index, tried in
                     order both ways; ``head_renames`` adds the pairs that depend on which head a
                     state dict holds (RoBERTa's classifier.dense / out_proj exist only on a sequence head)
    class_prefixes   model_type -> the prefix of its transformers classes (RobertaForMaskedLM ...);
                     without ``nsp`` a pretraining run is the family's *ForMaskedLM (``architecture``)
    token_types      whether its graphs take token_type_ids (``uses_token_types`` where a config decides)
    positions        "absolute", "padding_offset" (RoBERTa) or "none" (rotary, inside the layers:
                     models/rotary.py)
    pretrains        whether `mlmkit pretrain --arch` makes it: its presets (``preset_overrides``,
                     ``preset_extra``, ``max_length``, ``config_token_ids``), tokenizer (``tokenizer_kind``,
                     ``special_tokens``, a convention of text/tokenizer.py) and ``nsp``
    layer()          its block (BERT's post-LN layer unless the family has its own); its attention
                     subclasses core.Attention, which the exporter switches to the form it fuses
    embeddings()     its embeddings (core.BertEmbeddings unless the family has its own)
    encoder_modules() / layer_context()
                     state the encoder holds for all its layers, and what it hands each layer on
                     every forward (DeBERTa's relative position embeddings); none for BERT
    check() / shape_mismatch()
                     what a config must hold for its blocks to run, and what the weights' shapes must
                     agree with beyond the modules check_weights builds (rundir/weights.py)
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mlmkit.text.tokenizer import BRACKETS

# transformers' head classes, as BERT names them; a family's are its prefix + the same suffix
HEADS = ("ForPreTraining", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
         "ForQuestionAnswering", "Model")
# Family.config_token_ids of the configs that carry bos / eos / cls / sep ids (RoBERTa's, ModernBERT's):
# bos and cls are the cls token, eos and sep the sep token
CLS_SEP_IDS = {"bos_token_id": "cls", "eos_token_id": "sep", "cls_token_id": "cls", "sep_token_id": "sep"}


class Renamer:
    """Prefix pairs (a, b) with "{n}" for a layer index, applied a -> b or b -> a; the first pair whose
    side matches a whole leading part of the key (up to a dot or the end) wins."""

    def __init__(self, pairs: Iterable[tuple[str, str]]) -> None:
        self.pairs = [(self._compile(a), a, self._compile(b), b) for a, b in pairs]

    @staticmethod
    def _compile(prefix: str) -> re.Pattern[str]:
        return re.compile("^" + re.escape(prefix).replace(r"\{n\}", r"(\d+)") + r"(?=\.|$)")

    def __call__(self, key: str, *, to_family: bool) -> str:
        for ra, a, rb, b in self.pairs:
            src, dst = (ra, b) if to_family else (rb, a)
            m = src.match(key)
            if m:
                return (dst.replace("{n}", m.group(1)) if m.groups() else dst) + key[m.end():]
        return key


@dataclass(frozen=True)
class ExtraSize:
    """A family key of config.json (kept in ``ModelConfig.extra``) that sizes a module: checked with
    the canonical sizes before anything is built, as a whole number from 1 up to the ceiling of the
    canonical field ``bound`` (rundir/config.py, CEILINGS), or one of ``unset`` (DeBERTa's -1 / 0:
    "as max_position_embeddings", "no buckets"). A config.json is input: a typo of 10^9 would
    otherwise be found by the allocator."""

    key: str
    bound: str = "hidden_size"
    unset: tuple[int, ...] = ()


class Family:
    name = "bert"
    model_types: tuple[str, ...] = ("bert",)
    class_prefixes: dict[str, str] = {"bert": "Bert"}
    prefix = "bert"  # the backbone's attribute in transformers' head classes
    bare_roots: tuple[str, ...] = ("embeddings", "encoder", "pooler")  # keys of a backbone saved on its own
    config_aliases: dict[str, str] = {}
    config_defaults: dict[str, Any] = {}  # canonical fields transformers' config class defaults differently
    renames: tuple[tuple[str, str], ...] = ()
    token_types = True
    positions = "absolute"
    # pretraining: whether `mlmkit pretrain --arch` makes this family (tested presets), with
    # next-sentence prediction (BERT only; without it the run is the family's *ForMaskedLM), and the
    # positions a new model gets at least (a rotary family has no table and keeps its long context)
    pretrains = False
    nsp = False
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
    tied: tuple[str, ...] = ("cls.predictions.decoder.weight",)  # canonical keys never stored
    # what onnxruntime's BERT fusions produce for this family's graphs: op -> count per layer (or for
    # the graph when the op is listed in FUSED_ONCE); measured, see README "Model families"
    fusions: dict[str, int] = {"Attention": 1, "SkipLayerNormalization": 2, "EmbedLayerNormalization": 1}
    # how the family tokenizes by default (tokenizer train --kind, pretrain --arch): the kind, and the
    # (pad, unk, cls, sep, mask) names of one of text/tokenizer.py's CONVENTIONS, which also say how
    # a pair is framed ([CLS] A [SEP] B [SEP] here)
    tokenizer_kind = "wordpiece"
    special_tokens: tuple[str, ...] = BRACKETS.tokens

    # ---- config ----------------------------------------------------------------------------
    def embedding_size(self, config: Any) -> int:
        return config.hidden_size

    def pooler_act(self, config: Any) -> str:
        return "tanh"

    def mlm_act(self, config: Any) -> str:
        return config.hidden_act

    def head_bias(self, config: Any) -> bool:
        return True

    def sequence_pool(self, config: Any) -> str:
        return "cls"

    def uses_token_types(self, config: Any) -> bool:
        """Whether this config's model takes token_type_ids (``token_types``, unless the family's
        configs decide it: DeBERTa's by type_vocab_size)."""
        return self.token_types

    def pooler_dropout(self, config: Any) -> float:
        """Dropout on the pooled vector before the pooler's dense layer (DeBERTa's ContextPooler); 0: none."""
        return 0.0

    def check(self, config: Any) -> None:
        """Raise ConfigError for a config this family's blocks cannot run."""

    def shape_mismatch(self, config: Any, shapes: dict[str, tuple[int, ...]]) -> tuple[str, Any, str] | None:
        """Where the weights' ``shapes`` (mlmkit's names, from their headers) contradict ``config`` in
        a module check_weights cannot build on the meta device (a table computed from config values:
        DeBERTa's relative positions): (the config.json field, its value, what the weights have);
        None where they agree. Called by rundir/weights.check_weights before anything is built."""
        return None

    def max_tokens(self, config: Any) -> int:
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

    def preset_overrides(self, hidden: int, intermediate: int) -> dict[str, Any]:
        """Canonical fields a size preset sets differently for this family."""
        return {}

    def preset_extra(self) -> dict[str, Any]:
        """Family config keys (config.json's own) a new model of this family is made with."""
        return {}

    # ---- blocks ------------------------------------------------------------------------------
    def layer(self, config: Any, index: int) -> nn.Module:
        from mlmkit.models.core import BertLayer

        return BertLayer(config, index)

    def embeddings(self, config: Any) -> nn.Module:
        """Its embeddings: forward(input_ids, token_type_ids=None) -> (B, T, H)."""
        from mlmkit.models.core import BertEmbeddings

        return BertEmbeddings(config)

    def encoder_modules(self, config: Any) -> dict[str, nn.Module]:
        """Modules the encoder holds beside its layers, shared by all of them: name -> module,
        registered on core.BertEncoder under that name (so ``bert.encoder.<name>.*`` in state dicts)."""
        return {}

    def layer_context(self, encoder: nn.Module, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        """Once per forward, before the first layer: (the first layer's input, the keyword arguments
        every layer takes beside ``(x, mask, queries)``), from the embeddings ``x`` (B, T, H), the
        (B, 1, 1, T) additive padding mask and the ``encoder_modules`` on ``encoder``. BERT's: (x, {})."""
        return x, {}

    # ---- names -------------------------------------------------------------------------------
    def architecture(self, canonical: str, model_type: str) -> str:
        """BertForSequenceClassification -> this family's class name for ``model_type``. A pretraining
        run of a family without NSP has no NSP head: it is the family's *ForMaskedLM."""
        if canonical == "BertForPreTraining" and not self.nsp:
            canonical = "BertForMaskedLM"
        for suffix in HEADS:
            if canonical == "Bert" + suffix:
                return self.class_prefixes[model_type] + suffix
        return canonical

    def canonical_architecture(self, name: str, model_type: str) -> str:
        prefix = self.class_prefixes[model_type]
        for suffix in HEADS:
            if name == prefix + suffix:
                return "Bert" + suffix
        return name

    def head_renames(self, keys: set[str], *, to_family: bool) -> tuple[tuple[str, str], ...]:
        """Pairs that apply only to some heads; ``keys`` are the state dict's (canonical when
        ``to_family``, else the family's)."""
        return ()

    def to_family(self, sd: dict[str, Any]) -> dict[str, Any]:
        """A state dict under mlmkit's (BERT) names -> under this family's transformers names."""
        rename = Renamer([*self.head_renames(set(sd), to_family=True), *self.renames])
        return {rename(k, to_family=True): v for k, v in sd.items()}

    def from_family(self, sd: dict[str, Any]) -> dict[str, Any]:
        """A transformers state dict of this family (with or without the backbone's prefix, e.g. a
        bare RobertaModel) -> mlmkit's names."""
        sd = {(f"{self.prefix}.{k}" if k.split(".", 1)[0] in self.bare_roots else k): v for k, v in sd.items()}
        rename = Renamer([*self.head_renames(set(sd), to_family=False), *self.renames])
        return {rename(k, to_family=False): v for k, v in sd.items()}
