"""Model families on one encoder core. The registry: config.json's model_type -> its family.

Adding a family is one module declaring a ``Family`` subclass (see family.py) and one entry in
FAMILIES below. Everything else (tasks, export, runtime, serving) sees BERT-shaped models.
"""

from __future__ import annotations

from mlmkit.errors import ConfigError
from mlmkit.models import bert, deberta, distilbert, electra, modernbert, roberta
from mlmkit.models.family import Family

FAMILIES: tuple[Family, ...] = (bert.family, roberta.family, distilbert.family, electra.family, modernbert.family,
                                deberta.family)
BY_MODEL_TYPE: dict[str, Family] = {t: f for f in FAMILIES for t in f.model_types}


def family_for(model_type: str) -> Family:
    """The family of a config.json's model_type; a clear error for one mlmkit does not run."""
    try:
        return BY_MODEL_TYPE[model_type]
    except KeyError:
        raise ConfigError(
            f"model_type '{model_type}' is not supported",
            f"mlmkit runs these model types: {', '.join(sorted(BY_MODEL_TYPE))}",
        ) from None


__all__ = ["BY_MODEL_TYPE", "FAMILIES", "Family", "family_for"]
