"""transformers' names, as a family maps them onto mlmkit's (BERT's): the head classes (``HEADS``; a
family's are its prefix + the same suffix), the config keys that carry special tokens' ids
(``CLS_SEP_IDS``), and ``Renamer``, which renames parameter prefixes both ways. The Family
interface that uses them is models/config.py's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

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
