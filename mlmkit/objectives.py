"""The loss registry: every training loss by kind and name, declared once, without torch.

A loss is a named object (``Loss``), like a task or a model family: the name a user gives
(``--option loss=NAME``), what it trains on and how a batch is embedded for it. Its implementation
is a torch class (mlmkit.train.losses: MultipleNegativesRankingLoss, CoSENTLoss ...) that carries
the same kind and name and is registered there under them; this side never imports it, so a task's
option choices, its data checks and the CLI's help read the registry at the speed of a bundle's start.

Two kinds, each with its own interface on the torch side:

- ``embedding``: a batch's embeddings and its PairBatch (which example and column each text is) ->
  the loss (mnrl, cosent ...): the embedding task, SPLADE, static tables;
- ``rank``: a cross-encoder's scores of a query's candidates, their labels and their query -> the
  loss (bce, listwise ...): the rerank task.

A plugin declares a loss of its own with ``register_loss`` (from mlmkit.taskkit) and registers its
class with ``mlmkit.model.register_loss_class``; the built-in ones are declared below.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlmkit.typed import Registry

KINDS = ("embedding", "rank")
DATA = ("rows", "scored", "texts")
"""What an embedding loss trains on: rows (anchor, positive, negatives ...; with the teacher's scores
for margin-mse), scored pairs, plain texts."""


@dataclass(frozen=True)
class Loss:
    """One loss: ``name`` as users give it (its class in mlmkit.train.losses, or a plugin's, is
    registered under it), what it trains on and how the batch is embedded for it."""

    kind: str
    name: str
    description: str
    data: tuple[str, ...] = ("rows",)  # embedding losses: the kinds of training data it reads
    cached: bool = False  # embedded in mini-batches (GradCache): large batches in small memory
    in_batch: bool = False  # its negatives are the batch's other texts (no text twice in a batch)
    listwise: bool = False  # rank losses: over a query's candidates (not each pair alone)
    teacher_scores: bool = False  # embedding losses: rows with the teacher's score of each candidate

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"loss {self.name!r}: kind {self.kind!r} is not one of {KINDS}")
        if unknown := set(self.data) - set(DATA):
            raise ValueError(f"loss {self.name!r}: data {sorted(unknown)} not among {DATA}")


LOSSES: dict[str, Registry[Loss]] = {kind: Registry(f"{kind} loss", "see `mlmkit tasks` for each task's "
                                                    "losses") for kind in KINDS}
"""kind -> the registry of that kind's losses by name (register_loss adds to it)."""


def register_loss(*losses: Loss) -> None:
    """Add ``losses`` to the registry; a name taken by another loss of its kind is an error (the same
    declaration twice is not)."""
    for loss in losses:
        if LOSSES[loss.kind].in_order().get(loss.name) != loss:
            LOSSES[loss.kind].add(loss.name, loss)


def losses(kind: str) -> dict[str, Loss]:
    """The registered losses of ``kind``, by name, in registration order (a task option's choices)."""
    return LOSSES[kind].in_order()


def get_loss(kind: str, name: str) -> Loss:
    """The ``kind`` loss ``name``; an unknown name is a ConfigError listing the names there are."""
    return LOSSES[kind].get(name)


register_loss(
    Loss("embedding", "mnrl", "in-batch and hard negatives (InfoNCE)", in_batch=True),
    Loss("embedding", "cached-mnrl", "mnrl in mini-batches (GradCache)", cached=True, in_batch=True),
    Loss("embedding", "cosent", "scored pairs: cosines ordered as the scores", data=("scored",)),
    Loss("embedding", "margin-mse", "rows with teacher scores: the teacher's margins (TAS-B)",
         teacher_scores=True),
    Loss("embedding", "kl-distill", "rows with teacher scores: the softmax of the teacher's scores over "
         "each query's candidates (ColBERTv2)", teacher_scores=True),
    Loss("embedding", "mse-distill", "a teacher's embeddings, a projection where the sizes differ",
         data=("rows", "scored", "texts")),
    Loss("rank", "bce", "pointwise: binary cross-entropy of each pair against label / max_label"),
    Loss("rank", "mnrl", "each relevant candidate against the query's irrelevant ones", listwise=True),
    Loss("rank", "listnet", "the softmax of the scores against that of the labels", listwise=True),
    Loss("rank", "lambda", "LambdaRank: pairs weighted by their swap's change of NDCG", listwise=True),
)
