"""Model families on one encoder core, and the registry: config.json's model_type -> its family.

Adding a family is one module declaring a ``Family`` subclass (config.py has the interface) and one
entry in FAMILIES below. Everything else (tasks, export, runtime, serving) sees BERT-shaped models.
"""

from __future__ import annotations

from mlmkit.models import (
    bert,
    deberta,
    distilbert,
    electra,
    eurobert,
    gemma3,
    gte,
    jina,
    modernbert,
    mpnet,
    nomic_bert,
    qwen3,
    roberta,
)
from mlmkit.models.config import BY_MODEL_TYPE, Family, family_for, register

FAMILIES: tuple[Family, ...] = (bert.family, roberta.family, distilbert.family, electra.family,
                                modernbert.family,
                                deberta.family, gte.family, mpnet.family, qwen3.family,
                                nomic_bert.family, jina.family, gemma3.family, eurobert.family)
register(*FAMILIES)

__all__ = ["BY_MODEL_TYPE", "FAMILIES", "Family", "family_for"]
