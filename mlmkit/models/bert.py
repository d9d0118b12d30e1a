"""BERT: the core as it is (its names are mlmkit's own), with next-sentence prediction."""

from __future__ import annotations

from mlmkit.models.config import Family


class Bert(Family):
    """Everything as the base class (post-LN layers, absolute positions, two token types), and what
    only BERT has: next-sentence prediction in pretraining."""

    pretrains = True
    nsp = True


family = Bert()
