"""A third-party mlmkit task plugin, kept outside the mlmkit package on purpose: sentence-pair
regression. The tests install it as a distribution named ``pairreg`` (a dist-info directory with an
``mlmkit.tasks`` entry point) and fine-tune and evaluate with it without touching the core.
"""

from .task import PairRegression, task

__all__ = ["PairRegression", "task"]
