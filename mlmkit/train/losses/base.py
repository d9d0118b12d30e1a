"""The two interfaces of a loss, and the registry of the loss classes by kind and public name.

A loss is a class, constructed with its options (``scale``, ``margin``, ``temperature`` ...) and
called on a batch: an ``EmbeddingLoss`` on the batch's embeddings and its PairBatch, a ``RankLoss``
on a cross-encoder's scores of each query's candidates. A class the user can name carries the name
and kind it is declared under in the torch-free registry (mlmkit.objectives: what it trains on, the
tasks' ``loss`` choices), and ``register`` makes it the implementation of that name, as ``register``
makes a task (mlmkit.registry) or a family (mlmkit.models.config) the one of its name.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F

from mlmkit.errors import ConfigError
from mlmkit.models.pooled import PairBatch
from mlmkit.objectives import LOSSES, Loss
from mlmkit.typed import Registry

Similarity = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(a (n, H), b (m, H)) -> (n, m): every row of ``a`` against every row of ``b``."""


class RegisteredLoss:
    """What every loss class has: the ``kind`` and ``name`` it is declared under in mlmkit.objectives
    (a wrapper such as MatryoshkaLoss, which no user names, keeps the empty name)."""

    kind: ClassVar[str] = ""
    name: ClassVar[str] = ""


class EmbeddingLoss(RegisteredLoss):
    """A loss of a batch's embeddings ``E`` (F, H), one row per feature, and its ``PairBatch``."""

    kind: ClassVar[str] = "embedding"

    def __call__(self, E: torch.Tensor, b: PairBatch) -> torch.Tensor:
        raise NotImplementedError


class RankLoss(RegisteredLoss):
    """A loss of scores (n,), their gold labels (n,) and group (n,): the query of each candidate, 0..
    within the batch."""

    kind: ClassVar[str] = "rank"

    def __call__(self, s: torch.Tensor, y: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


# ---- the registry: kind -> the loss's public name -> its class ---------------------------------------
LOSS_CLASSES: dict[str, Registry[type[RegisteredLoss]]] = {kind: Registry(f"{kind} loss") for kind in LOSSES}
"""The loss classes by kind, each kind a registry of the classes by the loss's declared name."""


def register(*classes: type[RegisteredLoss]) -> None:
    """Make ``classes`` the implementations of their names (each declared first with
    mlmkit.objectives.register_loss); a name another class implements already is an error."""
    for cls in classes:
        if cls.name not in LOSSES.get(cls.kind, {}):
            raise ValueError(f"{cls.__name__}: no {cls.kind or 'kind-less'} loss named {cls.name!r} is "
                             "declared (mlmkit.objectives.register_loss)")
        if cls.name in LOSS_CLASSES[cls.kind] and LOSS_CLASSES[cls.kind][cls.name] is not cls:
            raise ValueError(f"the {cls.kind} loss {cls.name!r} is implemented already by "
                             f"{LOSS_CLASSES[cls.kind][cls.name].__qualname__}")
        LOSS_CLASSES[cls.kind].add(cls.name, cls)


def loss_class(loss: Loss) -> type[RegisteredLoss]:
    """The class registered for the declared ``loss``; a ConfigError where none is."""
    classes = LOSS_CLASSES.get(loss.kind)
    if classes is None or loss.name not in classes:
        raise ConfigError(f"the {loss.kind} loss {loss.name!r} has no implementation",
                          "import the module that registers its class before the model is built")
    return classes[loss.name]


def build_loss(loss: Loss, **options: object) -> RegisteredLoss:
    """The declared ``loss``'s class, constructed with those of ``options`` it takes (a head passes
    what it has, ``scale``, ``similarity``, ``max_label`` ...; a loss ignores the rest)."""
    cls = loss_class(loss)
    takes = inspect.signature(cls).parameters
    factory: Callable[..., RegisteredLoss] = cls
    return factory(**{k: v for k, v in options.items() if k in takes})


def embedding_loss(loss: Loss, **options: object) -> EmbeddingLoss:
    """``build_loss`` of an embedding loss."""
    built = build_loss(loss, **options)
    if not isinstance(built, EmbeddingLoss):
        raise TypeError(f"{type(built).__name__} is not an EmbeddingLoss")
    return built


def rank_loss(loss: Loss, **options: object) -> RankLoss:
    """``build_loss`` of a rank loss."""
    built = build_loss(loss, **options)
    if not isinstance(built, RankLoss):
        raise TypeError(f"{type(built).__name__} is not a RankLoss")
    return built


# ---- helpers of the embedding losses ----------------------------------------------------------------
def rows(b: PairBatch, part: int) -> torch.Tensor:
    """Indices of the features of column ``part``, ordered by example (one per example)."""
    idx = (b.part == part).nonzero().squeeze(1)
    return idx[torch.argsort(b.example[idx], stable=True)]


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T


def dot_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b.T


def similarity_of(dot: bool, similarity: Similarity | None) -> Similarity:
    """``similarity`` where given, else the dot product with ``dot``, else the cosine."""
    return similarity if similarity is not None else dot_product if dot else cosine

