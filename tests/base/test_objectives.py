"""The loss registry (mlmkit.objectives) and its classes (mlmkit.train.losses)."""

from __future__ import annotations

import pytest
import torch

from mlmkit.errors import ConfigError
from mlmkit.models.pooled import PairBatch
from mlmkit.objectives import LOSSES, Loss, get_loss, losses, register_loss
from mlmkit.registry import get_task
from mlmkit.train.losses import (
    LOSS_CLASSES,
    EmbeddingLoss,
    MultipleNegativesRankingLoss,
    RankLoss,
    build_loss,
    loss_class,
    register,
)


def _triplets(n: int = 4) -> tuple[torch.Tensor, PairBatch]:
    torch.manual_seed(0)
    part = torch.tensor([0, 1, 2] * n)
    return torch.randn(3 * n, 8), PairBatch(torch.arange(n).repeat_interleave(3), part, torch.arange(3 * n),
                                             torch.rand(3 * n))


def test_every_registered_loss_builds_and_computes_a_finite_loss():
    E, batch = _triplets()
    for name, loss in losses("embedding").items():
        if name == "mse-distill":
            batch.target = torch.randn(len(E), 8)
        built = build_loss(loss, scale=20.0)
        assert isinstance(built, EmbeddingLoss) and built.name == name
        assert torch.isfinite(built(E, batch)), name
    s, y, group = torch.randn(6), torch.tensor([1.0, 0, 0, 1, 0, 0]), torch.tensor([0, 0, 0, 1, 1, 1])
    for name, loss in losses("rank").items():
        built = build_loss(loss, max_label=1.0)
        assert isinstance(built, RankLoss) and built.name == name
        assert torch.isfinite(built(s, y, group)), name
    assert {k: set(v) for k, v in LOSS_CLASSES.items()} == {k: set(v) for k, v in LOSSES.items()}


def test_a_loss_is_constructed_with_the_options_it_takes():
    mnrl = build_loss(get_loss("embedding", "mnrl"), scale=7.0, symmetric=True, max_label=3.0)
    assert isinstance(mnrl, MultipleNegativesRankingLoss) and (mnrl.scale, mnrl.symmetric) == (7.0, True)
    cached = loss_class(get_loss("embedding", "cached-mnrl"))
    assert issubclass(cached, MultipleNegativesRankingLoss) and cached.name == "cached-mnrl"


def test_the_tasks_options_offer_the_registry_s_names():
    def choices(task: str) -> tuple[str, ...]:
        return next(o for o in get_task(task).options if o.name == "loss").choices or ()

    assert choices("embedding") == ("auto", *losses("embedding"))
    assert choices("rerank") == tuple(losses("rank"))
    sparse = choices("sparse-embedding")
    assert set(sparse) <= set(losses("embedding")) and "mnrl" in sparse
    assert get_loss("rank", "listnet").listwise and not get_loss("rank", "bce").listwise


def test_an_unknown_name_is_an_error_naming_the_choices():
    with pytest.raises(ConfigError, match="embedding loss 'mnlr' is not one mlmkit knows") as err:
        get_loss("embedding", "mnlr")
    assert "cached-mnrl" in str(err.value)


def test_a_name_is_declared_once_and_a_plugin_adds_its_own():
    with pytest.raises(ValueError, match="registered already"):
        register_loss(Loss("embedding", "mnrl", "another mnrl"))
    with pytest.raises(ValueError, match="kind"):
        Loss("vision", "x", "no such kind")

    class HingeTestLoss(RankLoss):
        name = "hinge-test"

        def __init__(self, margin: float = 1.0) -> None:
            self.margin = margin

        def __call__(self, s: torch.Tensor, y: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.margin - s[y > 0].mean() + s[y <= 0].mean())

    with pytest.raises(ValueError, match="is declared"):  # a class of an undeclared name
        register(HingeTestLoss)
    mine = Loss("rank", "hinge-test", "a plugin's pairwise hinge")
    register_loss(mine)
    try:
        with pytest.raises(ConfigError, match="'hinge-test' has no implementation"):
            build_loss(mine)
        register(HingeTestLoss)

        class OtherHinge(HingeTestLoss):
            pass

        with pytest.raises(ValueError, match="implemented already by"):
            register(OtherHinge)
        built = build_loss(mine, margin=2.0, max_label=1.0)
        assert float(built(torch.tensor([2.0, 0.0]), torch.tensor([1.0, 0.0]), torch.zeros(2))) == 0.0
    finally:
        LOSSES["rank"].remove("hinge-test")
        if "hinge-test" in LOSS_CLASSES["rank"]:
            LOSS_CLASSES["rank"].remove("hinge-test")
