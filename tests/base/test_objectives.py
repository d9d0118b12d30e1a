"""The loss registry (mlmkit.objectives) and its implementations (mlmkit.train.losses)."""

from __future__ import annotations

import pytest
import torch

from mlmkit.errors import ConfigError
from mlmkit.models.pooled import PairBatch
from mlmkit.objectives import LOSSES, Loss, get_loss, losses, register_loss
from mlmkit.registry import get_task
from mlmkit.train.losses import IMPLEMENTATIONS, build_loss, implements


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
        assert torch.isfinite(build_loss(loss, scale=20.0)(E, batch)), name
    s, y, group = torch.randn(6), torch.tensor([1.0, 0, 0, 1, 0, 0]), torch.tensor([0, 0, 0, 1, 1, 1])
    for name, loss in losses("rank").items():
        assert torch.isfinite(build_loss(loss, max_label=1.0)(s, y, group)), name
    assert {loss.function for kind in LOSSES.values() for loss in kind.values()} <= set(IMPLEMENTATIONS)


def test_the_tasks_options_offer_the_registry_s_names():
    def choices(task: str) -> tuple[str, ...]:
        return next(o for o in get_task(task).options if o.name == "loss").choices or ()

    assert choices("embedding") == ("auto", *losses("embedding"))
    assert choices("rerank") == tuple(losses("rank"))
    assert get_loss("rank", "listnet").listwise and not get_loss("rank", "bce").listwise


def test_an_unknown_name_is_an_error_naming_the_choices():
    with pytest.raises(ConfigError, match="no embedding loss named 'mnlr'") as err:
        get_loss("embedding", "mnlr")
    assert "cached-mnrl" in str(err.value.hint)


def test_a_name_is_declared_once_and_a_plugin_adds_its_own():
    with pytest.raises(ValueError, match="registered already"):
        register_loss(Loss("embedding", "mnrl", "cosent", "another mnrl"))
    with pytest.raises(ValueError, match="kind"):
        Loss("vision", "x", "x", "no such kind")
    mine = Loss("rank", "hinge-test", "rank_hinge_test", "a plugin's pairwise hinge")
    register_loss(mine)
    try:
        with pytest.raises(ConfigError, match="no implementation 'rank_hinge_test'"):
            build_loss(mine)

        @implements
        def rank_hinge_test(margin: float = 1.0, **_: object):
            return lambda s, y, group: torch.relu(margin - s[y > 0].mean() + s[y <= 0].mean())

        assert float(build_loss(mine)(torch.tensor([2.0, 0.0]), torch.tensor([1.0, 0.0]), torch.zeros(2))) == 0.0
    finally:
        LOSSES["rank"].pop("hinge-test")
        IMPLEMENTATIONS.pop("rank_hinge_test", None)
