"""The routes that speak other servers' request shapes, and their one registry.

A route turns its body (checked against its request model, schemas.py) into one call of a served
model (which model, its inputs, its options), and that call's results into its own answer; app.py
does everything else for every route alike (body limits, API keys, backpressure, the queue, errors,
metrics). The routes, by the API whose clients send them:

    POST /v1/embeddings   OpenAI's embeddings API (openai.py: the `openai` client, LangChain ...)
    POST /v1/rerank       reranking as infinity and Cohere shape it (rerank.py)
    POST /embed, /embed_sparse, /rerank, /predict, /tokenize
                          text-embeddings-inference's (tei.py)
    POST /v1/search       the top k documents of an index served with --search-index (search.py)

``routes()`` is the registry app.py mounts: the built-in routes, registered on first use, and any a
caller registers (``register``). A route is a ``Route``: its path, request and response models, the
outputs its model needs, ``call`` and ``answer``. No torch here, nor FastAPI: a route is plain data in,
plain data out (numpy arrays among it: the server writes them as JSON lists, from their buffers).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypedDict, TypeVar, cast

import numpy as np
from pydantic import BaseModel

from mlmkit.contract import Input, Options, Prediction
from mlmkit.files import JSONObject
from mlmkit.retrieval.exact import leading_dimensions
from mlmkit.serve.http import HTTPError
from mlmkit.serve.queue import Model
from mlmkit.serve.schemas import Body, checked
from mlmkit.typed import Registry

Models = Mapping[str, Model]
"""The served models by name (queue.py's)."""
Answer = JSONObject | list[JSONObject] | list[list[JSONObject]] | np.ndarray
"""What a route answers: JSON's objects and lists, numpy arrays among them (written from their buffers)."""
S = TypeVar("S")
Q = TypeVar("Q", bound=Body)


class NoState(TypedDict):
    """The state of a route that needs nothing of its request again to answer."""


@dataclass
class Call(Generic[S]):
    """One call of a served model, as a route asks for it."""

    model: str
    inputs: list[Input]
    state: S  # what the route needs again to answer (each route its own TypedDict)
    options: Options = field(default_factory=dict)
    tokens: int = 0  # what the model ran on, for ``usage``: set by the server with the results
    size: int | None = None  # how many inputs the request holds when they are not the model's (query vectors)


class Route(Generic[Q, S]):
    """A route: its path and summary, its request and response models (schemas.py), the outputs a model
    it calls needs (``needs``), whether it runs one (``runs_model``; /tokenize does not) and whether its
    answer is made off the event loop (``offload``: work that would hold it, such as a search)."""

    method: ClassVar[str] = "POST"
    path: ClassVar[str]
    summary: ClassVar[str]
    request: ClassVar[type[Body]]
    response: ClassVar[type[BaseModel]]
    needs: ClassVar[tuple[str, ...]] = ()
    runs_model: ClassVar[bool] = True
    offload: ClassVar[bool] = False

    def parse(self, body: object, models: Models) -> Call[S]:
        """The call a JSON body asks for, or the 4xx that says what is wrong with it."""
        return self.call(cast(Q, checked(self.request, body, self.path)), models)

    def call(self, request: Q, models: Models) -> Call[S]:
        """The model call a checked request asks for (the checks that need the served models here)."""
        raise NotImplementedError

    def answer(self, call: Call[S], results: list[Prediction], model: Model) -> Answer:
        """The route's answer to ``call`` from its ``results`` (none when the route runs no model)."""
        raise NotImplementedError


# ---- the registry ---------------------------------------------------------------------------------
ROUTES: Registry[Route[Any, Any]] = Registry("route")
"""Every served route by path: the built-in ones (catalog.py registers them), then any added with
``register``; app.py mounts them all."""


def register(*routes: Route[Any, Any]) -> None:
    """Add ``routes`` to the ones served; a path registered twice is an error naming both."""
    for r in routes:
        if r.path in ROUTES:
            raise ValueError(f"route {r.path} is registered twice: {type(ROUTES[r.path]).__name__} "
                             f"and {type(r).__name__}")
        ROUTES.add(r.path, r)


# ---- what the routes share ------------------------------------------------------------------------
def pick_model(models: Models, requested: str | None, needs: tuple[str, ...], route: str) -> str:
    """The model a request names, or the only one whose graph has the outputs the route reads (an
    "embedding", "logits" ...: any task's bundle with them fits; no ``needs``: any model); a 404 / 422
    naming the fitting ones."""
    fitting = [n for n, m in models.items() if set(needs) <= set(m.pipe.meta.outputs)]
    outputs = " and ".join(repr(x) for x in needs)
    kind = f" with {outputs} output{'s' if len(needs) > 1 else ''}" if needs else ""
    what = f"the models{kind}: {', '.join(fitting) or 'none'}"
    if requested is not None:
        if requested not in models:
            raise HTTPError(404, f"no model named {requested!r}", what)
        if requested not in fitting:
            task = models[requested].pipe.task
            raise HTTPError(422, f"model '{requested}' is a {task} model; {route} needs one with {outputs}",
                            what)
        return requested
    if len(fitting) != 1:
        raise HTTPError(422, f"{route}: say which model (\"model\": NAME)" if fitting
                        else f"{route}: no model served fits", what)
    return fitting[0]


def usage(call: Call[Any]) -> dict[str, int]:
    """OpenAI's usage: the tokens the model ran on (the pipeline counted them; nothing tokenized again)."""
    return {"prompt_tokens": call.tokens, "total_tokens": call.tokens}


def truncate_dimensions(vectors: np.ndarray, n: int | None, normalize: bool) -> np.ndarray:
    """The first ``n`` components (Matryoshka embeddings), L2-normalised again when ``normalize``."""
    if n is not None and n > vectors.shape[1]:
        raise HTTPError(422, f"'dimensions' {n} is more than the model's {vectors.shape[1]}")
    return leading_dimensions(vectors, n, normalize)


INPUT_TYPES = ("query", "document")
"""What an embedding request may declare its inputs to be: the embedding task's prompts by name."""


def prompt_names(model: Model) -> list[str]:
    """The prompts an embedding bundle has (TEI's prompt_name), by name: query and document, and the
    named prompts a sentence-transformers model brought (EmbeddingGemma's Clustering ...)."""
    options = model.pipe.meta.options
    try:
        named = list(json.loads(options.get("prompts") or "{}"))
    except ValueError:
        named = []
    return [k for k in INPUT_TYPES if options.get(f"{k}_prompt")] + named


def input_type(model: Model, kind: str | None) -> Options:
    """The pipeline option for a declared input type (none declared: the inputs as they are)."""
    if kind is None:
        return {}
    if "input_type" not in model.pipe.option_names:
        raise HTTPError(422, f"a {model.pipe.task} model has no query or document prompts",
                        "leave the input type out")
    return {"input_type": kind}


def prompt(model: Model, name: str, wanted: str | None, route: str) -> Options:
    """TEI's prompt_name: the pipeline option for a prompt the model has (none given: {})."""
    if wanted is None:
        return {}
    named = prompt_names(model)
    if wanted not in named:
        raise HTTPError(422, f"{route}: model '{name}' has no prompt named {wanted!r}",
                        f"its prompts: {', '.join(named) or 'none'}")
    return input_type(model, wanted) if wanted in INPUT_TYPES else {"prompt_name": wanted}
