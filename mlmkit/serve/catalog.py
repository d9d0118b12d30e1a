"""The routes the server mounts: the built-in ones, by API (openai.py, rerank.py, tei.py, search.py),
registered here in the one route registry (routes.ROUTES), beside any a plugin adds with
routes.register."""

from __future__ import annotations

from typing import Any

from mlmkit.serve import openai, rerank, search, tei
from mlmkit.serve.routes import ROUTES, Route, register

BUILT_IN: tuple[Route[Any, Any], ...] = (*openai.ROUTES, *rerank.ROUTES, *tei.ROUTES, *search.ROUTES)
register(*BUILT_IN)


def routes() -> tuple[Route[Any, Any], ...]:
    """Every route served: the built-in ones first, then the ones registered after them."""
    return (*BUILT_IN, *(r for r in ROUTES.values() if r not in BUILT_IN))
