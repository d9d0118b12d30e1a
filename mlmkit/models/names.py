"""transformers' names, as a family maps them onto mlmkit's (BERT's): the head classes (``HEADS``; a
family's are its prefix + the same suffix), the config keys that carry special tokens' ids
(``CLS_SEP_IDS``), ``Renamer``, which renames parameter prefixes both ways, and ``FamilyNames``:
the names half of the Family interface (models/config.py's ``Family`` subclasses it), how a family's
transformers classes and parameters map onto mlmkit's, both ways.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch

from mlmkit.registry import HFConfig

StateDict = dict[str, torch.Tensor]
"""A model's parameters by name (a state dict), in mlmkit's names or a family's."""

# transformers' head classes, as BERT names them; a family's are its prefix + the same suffix
HEADS = ("ForPreTraining", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
         "ForQuestionAnswering", "Model")
# Family.config_token_ids of the configs that carry bos / eos / cls / sep ids (RoBERTa's, ModernBERT's):
# bos and cls are the cls token, eos and sep the sep token
CLS_SEP_IDS = {"bos_token_id": "cls", "eos_token_id": "sep", "cls_token_id": "cls", "sep_token_id": "sep"}
# the heads whose config.json has labels (id2label, else transformers' default of num_labels)
LABELLED_HEADS = ("ForSequenceClassification", "ForTokenClassification")


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


class FamilyNames:
    """How a family's transformers names map onto mlmkit's (BERT's): its head classes by model_type,
    its parameter names both ways, and the checkpoints of another model_type it claims. BERT's by
    default; models/config.py's ``Family`` is this and the rest of what a family declares."""

    class_prefixes: dict[str, str] = {"bert": "Bert"}
    prefix = "bert"  # the backbone's attribute in transformers' head classes
    bare_roots: tuple[str, ...] = ("embeddings", "encoder", "pooler")  # keys of a backbone saved on its own
    renames: tuple[tuple[str, str], ...] = ()
    # whether its pretraining run has next-sentence prediction (BERT only; without it the run is the
    # family's *ForMaskedLM)
    nsp = False

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

    def to_family(self, sd: StateDict) -> StateDict:
        """A state dict under mlmkit's (BERT) names -> under this family's transformers names."""
        rename = Renamer([*self.head_renames(set(sd), to_family=True), *self.renames])
        return {rename(k, to_family=True): v for k, v in sd.items()}

    def from_family(self, sd: StateDict) -> StateDict:
        """A transformers state dict of this family (with or without the backbone's prefix, e.g. a
        bare RobertaModel) -> mlmkit's names."""
        sd = {(f"{self.prefix}.{k}" if k.split(".", 1)[0] in self.bare_roots else k): v
              for k, v in sd.items()}
        rename = Renamer([*self.head_renames(set(sd), to_family=False), *self.renames])
        return {rename(k, to_family=False): v for k, v in sd.items()}

    def claims(self, config: HFConfig) -> bool:
        """Whether a config.json that names another model_type is this family's checkpoint (the
        published jina-embeddings-v3 says "xlm-roberta", and its keys tell it apart): it is read as
        this family's, and a run made from it names this family's model_type. None by default."""
        return False
