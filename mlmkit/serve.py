"""`mlmkit serve`: bundles behind HTTP, with dynamic batching (FastAPI on uvicorn, `pip install 'mlmkit[serve]'`).

    mlmkit serve exports/clf exports/ner qa=exports/squad --port 8000
    curl -s localhost:8000/v1/models/clf/predict -d '{"inputs": ["a fine film"]}'

Each bundle is mounted under its name (its directory's name, or NAME=PATH). Endpoints:

- ``POST /v1/models/{name}/predict``: ``{"inputs": [...], "options": {...}}``, inputs in the CLI's
  shapes (texts, {"text", "text_pair"} records, {"question", "context"} records), options the task's
  runtime options; answers ``{"results": [...]}`` in input order, each result the object a line of
  `mlmkit predict`'s JSON lines holds, and ``"warnings"`` when an input was truncated.
- ``POST /v1/embeddings`` (OpenAI's shape), ``POST /embed`` and ``POST /predict`` (text-embeddings-inference's):
  adapters over the same queue (routes.py).
- ``GET /v1/models`` (mlmkit's fields, and OpenAI's list shape), ``GET /health`` (alive), ``GET /ready``
  (every model loaded and warmed up, not shutting down), ``GET /metrics`` (Prometheus), ``GET /docs`` (OpenAPI).

API keys (``--api-key``, repeatable, or MLMKIT_API_KEY): every route but the probes /health and /ready
(and /metrics with --public-metrics) needs ``Authorization: Bearer KEY``, else 401; keys are compared in constant time
and never logged. Backpressure: more than --max-queue inputs waiting for a model is a 429 with
Retry-After at once; a request still queued after --request-timeout seconds is a 503 and leaves the
queue; a client that hangs up before its turn leaves the queue too (nothing is computed for it).

Dynamic batching: a request is checked on arrival (a bad input or option is a 4xx at once, never
its neighbours' problem), then queued for its model. One thread per model takes what is queued
(waiting up to --max-wait-ms after the first request for more, up to --max-batch-size inputs)
and runs it as one pipeline call, length-bucketed into onnxruntime batches; requests with other
options go in their own call. onnxruntime runs off the event loop, with its own threads. A call
that fails is retried request by request, so only the request at fault fails.

Errors are JSON, ``{"error": ..., "hint": ..., "request_id": ...}``: 400 malformed JSON, 401 no or a
wrong API key, 404 an unknown model, 413 a body over --max-body-bytes or more than --max-inputs inputs,
422 a wrong input shape or option, 429 a full queue, 503 while loading or shutting down or after
--request-timeout, 500 an internal error (logged with its
traceback and the request id; the server goes on). SIGTERM (or Ctrl-C): new requests get 503,
requests in flight finish (up to --drain-seconds), then the server stops; a second signal stops it at once.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import queue
import re
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .args import ServeArgs
from .errors import ConfigError, MlmkitError
from .evaluation import truncations_counted
from .routes import ROUTES, Call, HTTPError

try:  # at module level: FastAPI reads the handlers' annotations from this module's names
    from fastapi import Request
    from fastapi.responses import JSONResponse, Response
except ImportError:  # no [serve] extra: serve() says what to install
    Request = JSONResponse = Response = Any  # type: ignore[misc,assignment]

log = logging.getLogger("mlmkit")

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def model_names(specs: Sequence[str]) -> dict[str, Path]:
    """{name: bundle path} from PATH or NAME=PATH specs; names are URL-safe and distinct."""
    out: dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or Path(spec).exists():  # a path that holds "=" is a path
            name, path = Path(spec).resolve().name, spec
        if not NAME.match(name):
            raise ConfigError(f"model name '{name}' (from {spec}) is not URL-safe",
                              "name it with letters, digits, '.', '_' or '-': NAME=PATH")
        if name in out:
            raise ConfigError(f"two bundles are named '{name}'", "name them apart: NAME=PATH")
        out[name] = Path(path)
    return out


# ---- dynamic batching ----------------------------------------------------------------------------
@dataclass
class _Request:
    inputs: list[Any]
    options: dict[str, Any]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    queued: float


class Model:
    """One bundle: its pipeline, its queue, and the thread that merges queued requests into calls."""

    def __init__(self, name: str, pipe: Any, args: ServeArgs, metrics: Metrics) -> None:
        self.name, self.pipe, self.args, self.metrics = name, pipe, args, metrics
        self.queue: queue.Queue[_Request | None] = queue.Queue()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, name=f"mlmkit-{name}", daemon=True)
        self.waiting = 0  # inputs queued and not yet taken into a call
        self.lock = threading.Lock()
        self.max_queue = args.max_queue or 4 * args.max_batch_size

    def describe(self) -> dict[str, Any]:
        m = self.pipe.meta
        return {"name": self.name, "task": self.pipe.task, "labels": m.get("labels"), "max_length": self.pipe.max_length,
                "options": list(self.pipe.option_names), "source": m.get("source"), "precision": m.get("precision"),
                "providers": self.pipe.providers}

    async def predict(self, inputs: list[Any], options: dict[str, Any], request: Any = None) -> list[dict[str, Any]]:
        """The results of ``inputs``, queued for the next merged call; a 429 when the queue is full, a 503
        after --request-timeout; a client that disconnects (``request``'s) leaves the queue."""
        with self.lock:
            if self.waiting and self.waiting + len(inputs) > self.max_queue:
                self.metrics.rejected.labels(self.name, "queue_full").inc()
                raise HTTPError(429, f"model '{self.name}' has {self.waiting} inputs waiting (--max-queue {self.max_queue})",
                                "retry after the Retry-After seconds, or send to another replica")
            self.waiting += len(inputs)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.queue.put(_Request(inputs, options, fut, loop, time.monotonic()))
        watch = asyncio.create_task(_hang_up(request, fut)) if request is not None else None
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.args.request_timeout)
        except asyncio.CancelledError:
            if fut.cancelled() and watch is not None and watch.done():  # the client hung up: nobody to answer
                raise HTTPError(499, "the client closed the connection before its answer") from None
            raise
        except asyncio.TimeoutError:
            fut.cancel()  # the model's thread skips it
            self.metrics.rejected.labels(self.name, "timeout").inc()
            raise HTTPError(503, f"the request waited over --request-timeout {self.args.request_timeout:g} s for model "
                                 f"'{self.name}'", "retry later, or send to another replica") from None
        finally:
            if watch is not None:
                watch.cancel()

    def retry_after(self) -> int:
        """Seconds a client turned away should wait: the queue at the recent pace, at least 1."""
        per_input = self.metrics.recent_seconds_per_input.get(self.name, 0.01)
        return max(1, math.ceil(self.waiting * per_input))

    def stop(self) -> None:
        self.queue.put(None)

    def _serve(self) -> None:
        try:
            warm_up(self.pipe)
        except Exception as e:  # a graph that wants other inputs than a plain batch: real requests may still work
            log.warning("model %s: the warm-up run failed (%s); serving it anyway", self.name, e)
        self.ready.set()
        wait = self.args.max_wait_ms / 1000
        with truncations_counted():  # each response says which of its inputs were truncated; the log does not
            self._loop(wait)

    def _loop(self, wait: float) -> None:
        while True:
            first = self.queue.get()
            if first is None:
                return
            batch, n = [first], len(first.inputs)
            while n < self.args.max_batch_size:
                left = first.queued + wait - time.monotonic()
                try:
                    r = self.queue.get(timeout=left) if left > 0 else self.queue.get_nowait()
                except queue.Empty:
                    break
                if r is None:
                    self.queue.put(None)  # stop after this batch
                    break
                batch.append(r)
                n += len(r.inputs)
            with self.lock:
                self.waiting -= sum(len(r.inputs) for r in batch)
            groups: dict[str, list[_Request]] = {}
            for r in batch:
                if not r.future.done():
                    groups.setdefault(json.dumps(r.options, sort_keys=True, default=str), []).append(r)
                elif r.future.cancelled():  # a client that hung up or timed out: nothing computed for it
                    self.metrics.dropped.labels(self.name).inc()
            for reqs in groups.values():
                self._run(reqs)

    def _run(self, reqs: list[_Request]) -> None:
        """One pipeline call for requests with the same options; if it fails, each request alone."""
        start = time.monotonic()
        items = [x for r in reqs for x in r.inputs]
        for r in reqs:
            self.metrics.queue_seconds.labels(self.name).observe(start - r.queued)
        try:
            bad: dict[int, MlmkitError] = {}
            results = self.pipe(items, errors=bad, **reqs[0].options)
        except Exception as e:
            if len(reqs) > 1:
                for r in reqs:
                    self._run([r])
            else:
                _resolve(reqs[0], error=e)
            return
        self.metrics.batch_inputs.labels(self.name).observe(len(items))
        took = time.monotonic() - start
        self.metrics.inference_seconds.labels(self.name).observe(took)
        self.metrics.recent_seconds_per_input[self.name] = took / max(1, len(items))
        at = 0
        for r in reqs:
            n = len(r.inputs)
            wrong = [(i, bad[at + i]) for i in range(n) if at + i in bad]
            if wrong:  # checked on arrival, so not expected: the input at fault is named
                i, e = wrong[0]
                _resolve(r, error=ConfigError(f"input {i + 1}: {e}"))
            else:
                _resolve(r, results=results[at : at + n])
            at += n


def _resolve(r: _Request, *, results: list[dict[str, Any]] | None = None, error: BaseException | None = None) -> None:
    def done() -> None:
        if not r.future.done():
            r.future.set_exception(error) if error is not None else r.future.set_result(results)

    try:
        r.loop.call_soon_threadsafe(done)
    except RuntimeError:  # the event loop has closed: the server is gone, and so is the client
        pass


async def _hang_up(request: Any, fut: asyncio.Future) -> None:
    """Cancel ``fut`` when the client disconnects (its body is read: what comes next is the disconnect)."""
    while not fut.done():
        message = await request.receive()
        if message["type"] == "http.disconnect":
            fut.cancel()
            return


WARM_UP_TOKENS = 512  # a long-context model (ModernBERT's 8,192) warms up at this length, not its whole


def warm_up(pipe: Any) -> None:
    """Run the graph on a short and a long batch once, so the first request is not the slow one."""
    for rows, length in ((1, 8), (pipe.batch_size, min(pipe.max_length, WARM_UP_TOKENS))):
        feed = {name: (np.ones if name == "attention_mask" else np.zeros)((rows, length), dtype=np.int64)
                for name in pipe.input_names}
        feed["input_ids"][:] = pipe.pad_id
        pipe.run_batch(feed)


class Metrics:
    """Prometheus metrics of one server (its own registry: two apps in one process do not clash)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("mlmkit_requests", "Prediction requests answered, by model and HTTP status.",
                                ["model", "status"], registry=r)
        self.inputs = Counter("mlmkit_inputs", "Inputs predicted, by model.", ["model"], registry=r)
        self.batch_inputs = Histogram("mlmkit_batch_inputs", "Inputs per merged pipeline call.", ["model"],
                                      buckets=BATCH_BUCKETS, registry=r)
        self.queue_seconds = Histogram("mlmkit_queue_seconds", "Time from a request's arrival in the queue to its call.",
                                       ["model"], buckets=TIME_BUCKETS, registry=r)
        self.inference_seconds = Histogram("mlmkit_inference_seconds", "Time of one merged pipeline call.", ["model"],
                                           buckets=TIME_BUCKETS, registry=r)
        self.request_seconds = Histogram("mlmkit_request_seconds", "Time to answer a prediction request.", ["model"],
                                         buckets=TIME_BUCKETS, registry=r)
        self.in_flight = Gauge("mlmkit_requests_in_flight", "Requests being answered.", registry=r)
        self.rejected = Counter("mlmkit_rejected", "Requests turned away: queue_full (429) or timeout (503).",
                                ["model", "reason"], registry=r)
        self.dropped = Counter("mlmkit_dropped", "Queued requests left out of their call (the client hung up or timed "
                                                 "out): no inference done for them.", ["model"], registry=r)
        self.unauthorized = Counter("mlmkit_unauthorized", "Requests without a valid API key (401).", registry=r)
        self.disconnected = Counter("mlmkit_client_disconnects", "Requests whose client hung up before its answer "
                                                                 "(mid-body or while queued; status 499).", registry=r)
        self.recent_seconds_per_input: dict[str, float] = {}


# ---- the app --------------------------------------------------------------------------------------
PREDICT_BODY = {
    "required": True,
    "content": {"application/json": {"schema": {
        "type": "object", "required": ["inputs"], "additionalProperties": False,
        "properties": {
            "inputs": {"type": "array", "description": "Texts, or records: {text, text_pair}, {question, context}, "
                                                       "or the fields the task reads.",
                       "items": {"anyOf": [{"type": "string"}, {"type": "object"}]}},
            "options": {"type": "object", "description": "The task's runtime options by name, e.g. {\"top_k\": 3} "
                                                        "(GET /v1/models lists each model's)."},
        }},
        "example": {"inputs": ["a fine film", {"text": "first", "text_pair": "second"}]}}},
}


def create_app(models: dict[str, Model], args: ServeArgs) -> Any:
    """The ASGI app serving loaded ``models`` (their threads are started and stopped with it)."""
    from fastapi import FastAPI
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from . import __version__

    metrics = next(iter(models.values())).metrics if models else Metrics()
    state = {"draining": False, "in_flight": 0}

    async def lifespan(app: Any):  # noqa: ANN202
        for m in models.values():
            m.thread.start()
        yield
        for m in models.values():
            m.stop()
        for m in models.values():
            m.thread.join(timeout=args.drain_seconds)

    app = FastAPI(title="mlmkit", version=__version__, lifespan=lifespan,
                  description="BERT bundles exported by `mlmkit export`, served with dynamic batching.")
    app.state.mlmkit = state
    app.state.models = models

    def error(status: int, message: str, hint: str | None, request_id: str, headers: dict[str, str] | None = None) -> JSONResponse:
        body = {"error": message, **({"hint": hint} if hint else {}), "request_id": request_id}
        return JSONResponse(body, status_code=status, headers={"X-Request-ID": request_id, **(headers or {})})

    app.add_middleware(_Guard, state=state, metrics=metrics, error=error, keys=api_keys(args),
                       public=("/health", "/ready", "/metrics") if args.public_metrics else ("/health", "/ready"))

    @app.exception_handler(HTTPError)
    async def http_error(request: Request, e: HTTPError) -> JSONResponse:
        if e.status == 499:  # the client hung up: nobody reads the answer
            metrics.disconnected.inc()
        return error(e.status, e.message, e.hint, request.state.rid, e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def starlette_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        rid = getattr(request.state, "rid", uuid.uuid4().hex[:16])
        hint = "the endpoints: POST /v1/models/{name}/predict, GET /v1/models, /health, /ready, /metrics, /docs"
        return error(e.status_code, str(e.detail).lower(), hint if e.status_code in (404, 405) else None, rid)

    @app.get("/health", summary="Liveness: the process answers.")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready", summary="Readiness: every model loaded and warmed up, and not shutting down.")
    async def ready() -> Any:
        waiting = [n for n, m in models.items() if not m.ready.is_set()]
        if waiting or state["draining"]:
            return JSONResponse({"status": "shutting down" if state["draining"] else "loading", "loading": waiting},
                                status_code=503)
        return {"status": "ready", "models": list(models)}

    @app.get("/v1/models", summary="The models served: name, task, labels, max_length, source (and OpenAI's list).")
    async def list_models() -> dict[str, Any]:
        described = [m.describe() for m in models.values()]
        openai = [{"id": d["name"], "object": "model", "created": started, "owned_by": "mlmkit", **d} for d in described]
        return {"object": "list", "data": openai, "models": described}

    @app.get("/metrics", summary="Prometheus metrics.")
    async def prometheus() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    started = int(time.time())

    async def answer(name: str, model: Model, inputs: list[Any], options: dict[str, Any], request: Request,
                     respond: Any) -> Response:
        """What every route does with its call: checks, the queue, metrics; ``respond`` shapes the results."""
        start = time.monotonic()
        status = "500"
        try:
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
            try:
                results = await model.predict(inputs, options, request) if inputs else []
            except MlmkitError as e:
                raise HTTPError(422, e.message, e.hint) from None
            except HTTPError as e:
                if e.status == 429:
                    e.headers["Retry-After"] = str(model.retry_after())
                raise
            body = respond(results)
            status = "200"
            metrics.inputs.labels(name).inc(len(inputs))
            return Response(json.dumps(body, ensure_ascii=False), media_type="application/json")
        except HTTPError as e:
            status = str(e.status)
            raise
        finally:
            metrics.requests.labels(name, status).inc()
            metrics.request_seconds.labels(name).observe(time.monotonic() - start)

    @app.post("/v1/models/{name}/predict", summary="Predict: one result per input, in input order.",
              openapi_extra={"requestBody": PREDICT_BODY})
    async def predict(name: str, request: Request) -> Response:
        model = models.get(name)
        if model is None:
            metrics.requests.labels("-", "404").inc()
            raise HTTPError(404, f"no model named '{name}'", f"the models: {', '.join(models)} (GET /v1/models)")
        try:
            inputs, options = _inputs_and_options(await _read_json(request, args), args)
        except HTTPError as e:
            metrics.requests.labels(name, str(e.status)).inc()
            raise

        def respond(results: list[dict[str, Any]]) -> dict[str, Any]:
            body: dict[str, Any] = {"results": results}
            cut = [i + 1 for i, r in enumerate(results) if r.get("truncated")]
            if cut:
                body["warnings"] = [f"input {i}: longer than {model.pipe.max_length} tokens, truncated (or windowed) as "
                                    "the command line does" for i in cut]
            return body

        return await answer(name, model, inputs, options, request, respond)

    for route in ROUTES:  # other servers' request shapes, over the same queue (routes.py)
        app.add_api_route(route.path, _route_handler(route, models, args, metrics, answer), methods=[route.method],
                          summary=route.summary)
    return app


def _route_handler(route: Any, models: dict[str, Model], args: ServeArgs, metrics: Metrics, answer: Any) -> Any:
    async def handler(request: Request) -> Response:
        try:
            call: Call = route.parse(await _read_json(request, args), models)
            if len(call.inputs) > args.max_inputs:
                raise HTTPError(413, f"{len(call.inputs)} inputs in one request; the limit is {args.max_inputs}",
                                "split them over several requests, or start the server with a larger --max-inputs")
        except HTTPError as e:
            metrics.requests.labels("-", str(e.status)).inc()
            raise
        model = models[call.model]
        if not getattr(route, "runs_model", True):  # e.g. /tokenize: the tokenizer only, no queue
            return Response(json.dumps(route.respond(call, [], model), ensure_ascii=False), media_type="application/json")
        return await answer(call.model, model, call.inputs, call.options, request,
                            lambda results: route.respond(call, results, model))

    handler.__name__ = "route_" + route.path.strip("/").replace("/", "_")
    return handler


def api_keys(args: ServeArgs) -> tuple[bytes, ...]:
    """The keys a request may present: --api-key (repeatable), else MLMKIT_API_KEY; none: no check."""
    import os

    keys = list(args.api_key) or ([os.environ["MLMKIT_API_KEY"]] if os.environ.get("MLMKIT_API_KEY") else [])
    return tuple(k.encode("utf-8") for k in keys)


class _Guard:
    """Around every request (plain ASGI, lighter than Starlette's BaseHTTPMiddleware, which runs each
    request through extra tasks and streams): a request id (the client's X-Request-ID, else a new one) in the response headers
    and in every error; 503 while draining (but /health and /metrics); the requests in flight
    counted; an exception that escaped a handler becomes a 500 with the id, logged with its traceback."""

    def __init__(self, app: Any, state: dict[str, Any], metrics: Metrics, error: Any, keys: tuple[bytes, ...] = (),
                 public: tuple[str, ...] = ("/health",)) -> None:
        self.app, self.state, self.metrics, self.error = app, state, metrics, error
        self.keys, self.public = keys, public

    def authorized(self, scope: dict[str, Any]) -> bool:
        """No keys configured, a public path, or ``Authorization: Bearer KEY`` with one of the keys (each
        compared in constant time, all of them always)."""
        if not self.keys or scope["path"] in self.public:
            return True
        given = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = given.partition(b" ")
        ok = False
        for key in self.keys:
            ok |= hmac.compare_digest(token.strip(), key)
        return ok and scheme.lower() == b"bearer"

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        rid = given[:128] or uuid.uuid4().hex[:16]
        scope.setdefault("state", {})["rid"] = rid
        if not self.authorized(scope):
            self.metrics.unauthorized.inc()
            reply = self.error(401, "a valid API key is needed", "send the header Authorization: Bearer KEY", rid,
                               {"WWW-Authenticate": "Bearer"})
            return await reply(scope, receive, send)
        if self.state["draining"] and scope["path"] not in ("/health", "/metrics"):
            reply = self.error(503, "the server is shutting down", "send the request to another replica, or retry later", rid)
            return await reply(scope, receive, send)
        started = False

        async def send_with_id(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", []))
                if not any(k.lower() == b"x-request-id" for k, _ in headers):  # the error replies have it already
                    message["headers"] = [*headers, (b"x-request-id", rid.encode("latin-1"))]
            await send(message)

        self.state["in_flight"] += 1
        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("request %s (%s %s) failed", rid, scope.get("method"), scope.get("path"))
            if not started:
                reply = self.error(500, "internal error", f"the server log has the traceback under request id {rid}", rid)
                await reply(scope, receive, send)
        finally:
            self.state["in_flight"] -= 1
            self.metrics.in_flight.dec()


async def _read_json(request: Request, args: ServeArgs) -> Any:
    """The request body as JSON, within --max-body-bytes, or the 4xx that says what is wrong with it."""
    from .files import parse_json

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
        return parse_json(b"".join(chunks).decode("utf-8"))
    except UnicodeDecodeError:
        raise HTTPError(400, "the request body is not UTF-8", "send UTF-8 JSON") from None
    except json.JSONDecodeError as e:
        raise HTTPError(400, f"malformed JSON: {e.msg} at line {e.lineno}, column {e.colno}", "send a JSON object") from None
    except (ValueError, RecursionError) as e:  # an integer of thousands of digits, JSON nested too deep
        raise HTTPError(400, f"unreadable JSON: {str(e).splitlines()[0][:200]}", "send ordinary JSON numbers and strings") from None


def _inputs_and_options(data: Any, args: ServeArgs) -> tuple[list[Any], dict[str, Any]]:
    """mlmkit's own body: its inputs and options, or the 4xx that says what is wrong with it."""
    shape = 'send {"inputs": [...]} (and "options": {...} if any)'
    if not isinstance(data, dict):
        raise HTTPError(422, f"the body must be a JSON object, got {type(data).__name__}", shape)
    extra = sorted(set(data) - {"inputs", "options"})
    if extra:
        raise HTTPError(422, f"unknown field(s) in the body: {', '.join(extra)}", shape)
    inputs, options = data.get("inputs"), data.get("options", {})
    if not isinstance(inputs, list):
        raise HTTPError(422, "'inputs' must be a list of texts or records", shape)
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise HTTPError(422, "'options' must be an object of the task's option names and values", shape)
    if len(inputs) > args.max_inputs:
        raise HTTPError(413, f"{len(inputs)} inputs in one request; the limit is {args.max_inputs}",
                        "split them over several requests, or start the server with a larger --max-inputs")
    return inputs, options


# ---- running it -----------------------------------------------------------------------------------
def load_models(args: ServeArgs) -> dict[str, Model]:
    """Every bundle loaded and checked (a bad one is an error before the server starts)."""
    from .runtime import Pipeline

    metrics = Metrics()
    return {name: Model(name, Pipeline.load(path, device=args.device, threads=args.threads, batch_size=args.batch_size,
                                                  batch_tokens=args.batch_tokens, spin=False),
                        args, metrics)
            for name, path in model_names(args.bundles).items()}


def serve(args: ServeArgs) -> None:
    """Load the bundles and serve them until SIGTERM or Ctrl-C (see the module docstring)."""
    try:
        import uvicorn
    except ImportError:
        raise ConfigError("`mlmkit serve` needs FastAPI and uvicorn", "pip install 'mlmkit[serve]'") from None
    sock = listen(args.host, args.port)  # before the models load: a busy port is one line, at once
    try:
        models = load_models(args)
    except BaseException:
        sock.close()
        raise
    app = create_app(models, args)
    tls = {"ssl_keyfile": str(args.ssl_keyfile), "ssl_certfile": str(args.ssl_certfile)} if args.ssl_keyfile else {}
    config = uvicorn.Config(app, host=args.host, port=args.port, access_log=args.access_log, log_level="info",
                            timeout_graceful_shutdown=args.drain_seconds, log_config=None,
                            timeout_keep_alive=args.timeout_keep_alive, h11_max_incomplete_event_size=HEADER_BYTES,
                            http=header_timeout_protocol(args.header_timeout), **tls)
    server = _draining_server(config, app.state.mlmkit, args.drain_seconds)
    ours = logging.getLogger("mlmkit")
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):  # uvicorn's lines go where mlmkit's go
        logging.getLogger(name).handlers[:] = ours.handlers
        logging.getLogger(name).setLevel(ours.level)
        logging.getLogger(name).propagate = False
    log.info("serving %s on %s://%s:%d (GET /docs for the API)", ", ".join(models), "https" if tls else "http",
             args.host, args.port)
    server.run(sockets=[sock])


HEADER_BYTES = 64 * 1024
"""Largest request head (request line and headers) a client may send."""


def header_timeout_protocol(seconds: float) -> type:
    """uvicorn's HTTP protocol (httptools when installed, else h11) closing a connection whose client
    takes more than ``seconds`` to send a request's head: on a new connection, and when the next
    request on a kept-alive one begins. uvicorn's own keep-alive timeout covers idle connections."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base

    class HeadTimeout(base):  # type: ignore[misc, valid-type]
        _timer: Any = None
        _armed_for: Any = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._timer is None and (self.cycle is None or self.cycle.response_complete):
                self._arm()  # the next request's head begins
            super().data_received(data)
            if self._timer is not None and self.cycle is not None and self.cycle is not self._armed_for:
                self._disarm()  # its head is complete: a request cycle has begun

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._armed_for = self.cycle
            self._timer = self.loop.call_later(seconds, self._expire)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _expire(self) -> None:
            self._timer = None
            if self.cycle is self._armed_for and not self.transport.is_closing():
                log.debug("closing a connection that sent no complete request head in %.0f s", seconds)
                self.transport.close()

    return HeadTimeout


def listen(host: str, port: int) -> Any:
    """A listening socket on ``host``:``port``, or one line saying why there is none (exit 2)."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ConfigError(f"--port {port}: {host}:{port} is already in use (another server?)",
                              "choose another --port, or stop what listens there") from None
        if e.errno in (errno.EACCES, errno.EPERM):
            raise ConfigError(f"--port {port}: not permitted to listen on {host}:{port}", "use a port above 1023") from None
        raise ConfigError(f"--host {host} --port {port}: cannot listen there ({e.strerror})", "check the address") from None
    sock.set_inheritable(True)
    return sock


def _draining_server(config: Any, state: dict[str, Any], drain: float) -> Any:
    """uvicorn's server, draining first: on the first signal new requests get 503 and those in flight
    finish (up to ``drain`` seconds), then uvicorn's own shutdown; a second signal stops it at once."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if state["draining"]:
                self.should_exit = self.force_exit = True
                return
            state["draining"] = True
            log.info("shutting down: new requests get 503; %d in flight may finish", state["in_flight"])
            threading.Thread(target=self._drain, daemon=True).start()

        def _drain(self) -> None:
            deadline = time.monotonic() + drain
            while state["in_flight"] > 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            self.should_exit = True

    return DrainingServer(config)
