"""`mlmkit serve`: bundles behind HTTP, with dynamic batching (FastAPI on uvicorn,
`pip install 'mlmkit[serve]'`).

    mlmkit serve exports/clf exports/ner qa=exports/squad --port 8000
    curl -s localhost:8000/v1/models/clf/predict -d '{"inputs": ["a fine film"]}'

Each bundle is mounted under its name (its directory's name, or NAME=PATH). Endpoints:

- ``POST /v1/models/{name}/predict``: ``{"inputs": [...], "options": {...}}``, inputs in the CLI's
  shapes (texts, {"text", "text_pair"} records, {"question", "context"} records), options the task's
  runtime options; answers ``{"results": [...]}`` in input order, each result the object a line of
  `mlmkit predict`'s JSON lines holds, and ``"warnings"`` when an input was truncated.
- the other servers' shapes, registered in routes.py: ``POST /v1/embeddings`` (OpenAI's, openai.py),
  ``POST /v1/rerank`` (rerank.py), ``POST /embed``, ``/embed_sparse``, ``/rerank``, ``/predict`` and
  ``/tokenize`` (text-embeddings-inference's, tei.py), ``POST /v1/search`` (an index served with
  ``--search-index``, search.py): adapters over the same queue.
- ``GET /v1/models`` (mlmkit's fields, and OpenAI's list shape), ``GET /health`` (alive), ``GET /ready``
  (every model loaded and warmed up, not shutting down), ``GET /metrics`` (Prometheus), ``GET /docs``
  (OpenAPI: each route's request and response model, schemas.py).

API keys, request ids and draining: guard.py. Backpressure: more than --max-queue inputs waiting for
a model is a 429 with Retry-After at once; a request still queued after --request-timeout seconds is
a 503 and leaves the queue; a client that hangs up before its turn leaves it too (queue.py).

Dynamic batching: a request is checked on arrival (a bad input or option is a 4xx at once, never
its neighbours' problem), then queued for its model. One thread per model takes what is queued
(waiting up to --max-wait-ms after the first request for more, up to --max-batch-size inputs)
and runs it as one pipeline call: its inputs sorted by length and cut into onnxruntime batches
where padding would cost more than one more run (batching.bucket_batches); requests with other
options go in their own call, off the event loop; one that fails is retried request by request.
Response bodies are written by orjson (vectors from their numpy buffers); ``usage`` counts the
tokens the pipeline ran on (nothing is tokenized twice).

Errors are JSON, ``{"error": ..., "hint": ..., "request_id": ...}``, their statuses as
docs/serving.md's Errors lists them (a body that its route's model refuses: a 422, one line naming
the field). SIGTERM (or Ctrl-C): new requests get 503, requests in flight finish (up to
--drain-seconds), then the server stops; a second signal stops it at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

from mlmkit.args import ServeArgs
from mlmkit.contract import Input, Options, Prediction
from mlmkit.errors import MlmkitError
from mlmkit.files import JSONObject
from mlmkit.serve.catalog import routes
from mlmkit.serve.guard import Guard, ServerState, api_keys
from mlmkit.serve.http import HTTPError
from mlmkit.serve.queue import Metrics, Model, reload_indexes
from mlmkit.serve.responses import ErrorBody, ModelsResponse, PredictResponse, Status
from mlmkit.serve.routes import Answer, Call, Route
from mlmkit.serve.schemas import Body, PredictRequest, checked, request_schemas

try:  # at module level: FastAPI reads the handlers' annotations from this module's names
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError:  # no [serve] extra: serve() says what to install
    FastAPI = Request = JSONResponse = Response = StarletteHTTPException = Any

log = logging.getLogger("mlmkit")
RELOAD_SECONDS = 1.0
"""How often a server with --search-index looks at its indexes' manifests (a stat each) for a change to
load."""
ERRORS: dict[int | str, JSONObject] = {
    code: {"model": ErrorBody, "description": said} for code, said in (
        (401, "No or a wrong API key."), (413, "A body over --max-body-bytes, or over --max-inputs inputs."),
        (422, "A body its route refuses (one line naming the field), or a wrong input or option."),
        (429, "The model's queue is full (Retry-After says when to try again)."),
        (503, "Loading, shutting down, or queued past --request-timeout."))}
"""The error answers every route documents (the JSON error shape, ``_error``)."""


# ---- the app --------------------------------------------------------------------------------------
def create_app(models: dict[str, Model], args: ServeArgs, keys: tuple[bytes, ...] | None = None) -> FastAPI:
    """The ASGI app serving loaded ``models`` (their threads are started and stopped with it);
    ``keys``: the API keys (read from ``args`` when not given)."""
    from mlmkit import __version__

    service = _Service(models, args)
    app = FastAPI(title="mlmkit", version=__version__, lifespan=service.lifespan,
                  description="BERT bundles exported by `mlmkit export`, served with dynamic batching.")
    app.state.mlmkit = service.state
    app.state.models = models
    app.add_middleware(Guard, state=service.state, metrics=service.metrics, error=_error,
                       keys=api_keys(args) if keys is None else keys,
                       public=("/health", "/ready", "/metrics") if args.public_metrics
                       else ("/health", "/ready"))
    _add_routes(app, service)
    return app


def _add_routes(app: FastAPI, service: _Service) -> None:
    """The error handlers and every route, in the order FastAPI matches them (mlmkit's, then the
    registry's, routes.py), each with its request and response models on /openapi.json."""
    app.add_exception_handler(HTTPError, service.http_error)
    app.add_exception_handler(StarletteHTTPException, service.starlette_error)
    app.get("/health", summary="Liveness: the process answers.", response_model=Status)(service.health)
    app.get("/ready", summary="Readiness: every model loaded and warmed up, and not shutting down.",
            response_model=Status,
            responses={503: {"model": Status, "description": "Loading or shutting down."}})(service.ready)
    app.get("/v1/models", summary="The models served: name, task, labels, max_length, source "
                                  "(and OpenAI's list).", response_model=ModelsResponse)(service.list_models)
    app.get("/metrics", summary="Prometheus metrics.", response_class=Response)(service.prometheus)
    app.post("/v1/models/{name}/predict", summary="Predict: one result per input, in input order.",
             response_model=PredictResponse, responses={**ERRORS, 404: {"model": ErrorBody}},
             openapi_extra=_request_body(PredictRequest))(service.predict)
    served = routes()
    for route in served:  # other servers' request shapes, over the same queue (routes.py)
        app.add_api_route(route.path, _route_handler(route, service), methods=[route.method],
                          summary=route.summary, response_model=route.response, responses=ERRORS,
                          openapi_extra=_request_body(route.request))
    _publish(app, [PredictRequest, *(r.request for r in served)])


def _request_body(model: type[Body]) -> JSONObject:
    """A route's request body on /openapi.json: its model (read by the route itself: body limits,
    strict JSON), by reference to the components ``_publish`` adds."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def _publish(app: FastAPI, requests: list[type[Body]]) -> None:
    """The request models' schemas among /openapi.json's components (FastAPI adds the response models'
    itself; the requests it never parses)."""
    made = app.openapi

    def openapi() -> JSONObject:
        if app.openapi_schema is None:
            spec = made()
            schemas = spec.setdefault("components", {}).setdefault("schemas", {})
            for name, schema in request_schemas(requests).items():
                schemas.setdefault(name, schema)
        return app.openapi_schema

    app.openapi = openapi


def _error(status: int, message: str, hint: str | None, request_id: str,
           headers: dict[str, str] | None = None) -> JSONResponse:
    """An error reply in mlmkit's shape, {"error", "hint", "request_id"}, with the id in its headers too."""
    body = {"error": message, **({"hint": hint} if hint else {}), "request_id": request_id}
    return JSONResponse(body, status_code=status, headers={"X-Request-ID": request_id, **(headers or {})})


class _Service:
    """What the app's handlers share: the models, the metrics, the draining state the middleware and the
    server read (``state``), and when the app was made (OpenAI's ``created``).

    The route methods have no docstrings on purpose: FastAPI would publish them as the routes' OpenAPI
    descriptions; each route's summary (in _add_routes) says what it does."""

    def __init__(self, models: dict[str, Model], args: ServeArgs) -> None:
        """The shared state, set before any route can answer (``started`` among it)."""
        self.models, self.args = models, args
        self.metrics = next(iter(models.values())).metrics if models else Metrics()
        self.state: ServerState = {"draining": False, "in_flight": 0}
        self.started = int(time.time())  # set with the rest, before any route that reads it exists

    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        """The models' threads run while the app does, and with --search-index a watch on the indexes'
        manifests (reload_indexes, every RELOAD_SECONDS); at shutdown each gets --drain-seconds to
        finish."""
        for m in self.models.values():
            m.thread.start()
        indexed = any(m.indexes for m in self.models.values())
        watch = asyncio.create_task(self._watch_indexes()) if indexed else None
        yield
        if watch is not None:
            watch.cancel()
        for m in self.models.values():
            m.stop()
        for m in self.models.values():
            m.thread.join(timeout=self.args.drain_seconds)

    async def _watch_indexes(self) -> None:
        """An index changed on disk (mlmkit index --delete, --upsert, --compact) served as it is now,
        opened in a worker thread and swapped in whole; requests keep being answered meanwhile."""
        while True:
            await asyncio.sleep(RELOAD_SECONDS)
            try:
                await asyncio.to_thread(reload_indexes, self.models)
            except Exception:  # never the watch's end: the next pass tries again
                log.exception("reloading the served indexes failed")

    async def http_error(self, request: Request, e: HTTPError) -> JSONResponse:
        """Our HTTPError as its JSON reply (a client that hung up is counted: nobody reads the reply)."""
        if e.status == 499:  # the client hung up: nobody reads the answer
            self.metrics.disconnected.inc()
        return _error(e.status, e.message, e.hint, request.state.rid, e.headers)

    async def starlette_error(self, request: Request, e: StarletteHTTPException) -> JSONResponse:
        """Starlette's own errors (an unknown path, a wrong method) in mlmkit's error shape."""
        rid = getattr(request.state, "rid", uuid.uuid4().hex[:16])
        hint = ("the endpoints: POST /v1/models/{name}/predict, GET /v1/models, /health, /ready, /metrics, "
                "/docs")
        return _error(e.status_code, str(e.detail).lower(), hint if e.status_code in (404, 405) else None,
                      rid)

    async def health(self) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def ready(self) -> JSONResponse:
        waiting = [n for n, m in self.models.items() if not m.ready.is_set()]
        draining = self.state["draining"]
        if waiting or draining:
            return JSONResponse({"status": "shutting down" if draining else "loading", "loading": waiting},
                                status_code=503)
        return JSONResponse({"status": "ready", "models": list(self.models)})

    async def list_models(self) -> Response:
        described = [m.describe() for m in self.models.values()]
        openai = [{"id": d["name"], "object": "model", "created": self.started, "owned_by": "mlmkit", **d}
                  for d in described]
        return Response(encoded({"object": "list", "data": openai, "models": described}),
                        media_type="application/json")

    async def prometheus(self) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def predict(self, name: str, request: Request) -> Response:
        model = self.models.get(name)
        if model is None:
            self.metrics.requests.labels("-", "404").inc()
            raise HTTPError(404, f"no model named '{name}'",
                            f"the models: {', '.join(self.models)} (GET /v1/models)")
        try:
            inputs, options = _inputs_and_options(await _read_json(request, self.args), self.args)
        except HTTPError as e:
            self.metrics.requests.labels(name, str(e.status)).inc()
            raise
        return await self.answer(name, model, inputs, options, request,
                                 lambda results, tokens: _predict_body(results, model.pipe.max_length))

    async def answer(self, name: str, model: Model, inputs: list[Input], options: Options,
                     request: Request, respond: Callable[[list[Prediction], int], Answer],
                     offload: bool = False) -> Response:
        """What every route does with its call: checks, the queue, metrics; ``respond`` shapes the results
        (in a worker thread with ``offload``: work that would hold the event loop, such as a search)."""
        start = time.monotonic()
        status = "500"
        try:
            _check_call(name, model, inputs, options)
            try:
                results, tokens = await model.predict(inputs, options, request) if inputs else ([], 0)
            except MlmkitError as e:
                raise HTTPError(422, e.message, e.hint) from None
            except HTTPError as e:
                if e.status == 429:
                    e.headers["Retry-After"] = str(model.retry_after())
                raise
            body = await asyncio.to_thread(respond, results, tokens) if offload else respond(results, tokens)
            status = "200"
            self.metrics.inputs.labels(name).inc(len(inputs))
            return Response(encoded(body), media_type="application/json")
        except HTTPError as e:
            status = str(e.status)
            raise
        finally:
            self.metrics.requests.labels(name, status).inc()
            self.metrics.request_seconds.labels(name).observe(time.monotonic() - start)


def _check_call(name: str, model: Model, inputs: list[Input], options: Options) -> None:
    """A call's checks before it is queued (the model loaded, its options known, its inputs well formed):
    a bad request is its own 4xx at once, never its batch neighbours' problem."""
    if not model.ready.is_set():
        raise HTTPError(503, f"model '{name}' is still loading", "retry when GET /ready says ready")
    unknown = sorted(set(options) - set(model.pipe.option_names))
    if unknown:
        raise HTTPError(422, f"unknown option(s) for model '{name}': {', '.join(unknown)}",
                        f"its options: {', '.join(model.pipe.option_names) or 'none'}")
    try:
        model.pipe.check(inputs, options)
    except MlmkitError as e:
        raise HTTPError(422, e.message, e.hint) from None


def _predict_body(results: list[Prediction], max_length: int) -> JSONObject:
    """The predict route's answer: the results, and a warning for each input that was truncated."""
    body: JSONObject = {"results": results}
    cut = [i + 1 for i, r in enumerate(results) if r.get("truncated")]
    if cut:
        body["warnings"] = [f"input {i}: longer than {max_length} tokens, truncated (or windowed) as "
                            "the command line does" for i in cut]
    return body


def _route_handler(route: Route[Any, Any], service: _Service) -> Callable[[Request], Awaitable[Response]]:
    """The FastAPI handler of a registered route: its body read and checked, its call queued (or, for a
    route that runs no model, answered at once), its answer written."""
    models, args, metrics = service.models, service.args, service.metrics

    async def handler(request: Request) -> Response:
        try:
            call: Call[Any] = route.parse(await _read_json(request, args), models)
            size = len(call.inputs) if call.size is None else call.size
            if size > args.max_inputs:
                raise HTTPError(413, f"{size} inputs in one request; the limit is {args.max_inputs}",
                                "split them over several requests, or start the server with a larger "
                                "--max-inputs")
        except HTTPError as e:
            metrics.requests.labels("-", str(e.status)).inc()
            raise
        model = models[call.model]
        if not route.runs_model:  # e.g. /tokenize: the tokenizer only, no queue
            def body() -> bytes:
                return encoded(route.answer(call, [], model))

            written = await asyncio.to_thread(body) if route.offload else body()
            return Response(written, media_type="application/json")

        def respond(results: list[Prediction], tokens: int) -> Answer:
            return route.answer(replace(call, tokens=tokens), results, model)

        return await service.answer(call.model, model, call.inputs, call.options, request, respond,
                                    route.offload)

    handler.__name__ = "route_" + route.path.strip("/").replace("/", "_")
    return handler


def encoded(body: Answer) -> bytes:
    """A response body as JSON (UTF-8 as is), by orjson: numpy arrays are written from their buffers
    (a vector's 384 floats in ~10 us; ``tolist()`` and ``json.dumps`` took ~250 us), float32 values
    in their shortest form, which reads back to the same float32; NaN as null."""
    import orjson

    return orjson.dumps(body, default=_plain, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


def _plain(v: object) -> object:
    """What orjson leaves to us: numpy arrays it cannot read in place (a column slice, float16)."""
    import numpy as np

    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"{type(v).__name__} is not JSON serializable")


async def _read_json(request: Request, args: ServeArgs) -> object:
    """The request body as JSON, within --max-body-bytes, or the 4xx that says what is wrong with it."""
    from mlmkit.files import parse_json

    limit = args.max_body_bytes
    declared = request.headers.get("content-length", "")
    too_big = HTTPError(413, f"the request body is over {limit} bytes",
                        "send fewer inputs per request, or start the server with a larger --max-body-bytes")
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    from starlette.requests import ClientDisconnect

    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_big
            chunks.append(chunk)
    except ClientDisconnect:  # not an error of the server's: counted, never logged with a traceback
        raise HTTPError(499, "the client closed the connection while sending its request") from None
    try:
        return parse_json(b"".join(chunks).decode("utf-8"), strict=True)
    except UnicodeDecodeError:
        raise HTTPError(400, "the request body is not UTF-8", "send UTF-8 JSON") from None
    except json.JSONDecodeError as e:
        raise HTTPError(400, f"malformed JSON: {e.msg} at line {e.lineno}, column {e.colno}",
                        "send a JSON object") from None
    except (ValueError, RecursionError) as e:  # an integer of thousands of digits, JSON nested too deep
        raise HTTPError(400, f"unreadable JSON: {str(e).splitlines()[0][:200]}",
                        "send ordinary JSON numbers and strings") from None


def _inputs_and_options(data: object, args: ServeArgs) -> tuple[list[Input], Options]:
    """mlmkit's own body (schemas.PredictRequest): its inputs and options, or the 4xx that says what is
    wrong with it."""
    body = checked(PredictRequest, data, None)
    if len(body.inputs) > args.max_inputs:
        raise HTTPError(413, f"{len(body.inputs)} inputs in one request; the limit is {args.max_inputs}",
                        "split them over several requests, or start the server with a larger --max-inputs")
    return body.inputs, body.options or {}
