"""The models a server holds: per-model dynamic batching on a worker thread, warm-up, and the metrics
(prometheus-client). No torch.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import queue
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mlmkit.args import ServeArgs
from mlmkit.errors import ConfigError, MlmkitError
from mlmkit.files import JSONObject
from mlmkit.registry import Options, Prediction
from mlmkit.runtime.prediction import truncations_counted
from mlmkit.serve.http import HTTPError

if TYPE_CHECKING:
    from mlmkit.retrieval.index.store import StoredIndex

log = logging.getLogger("mlmkit")

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def model_names(specs: Sequence[str], what: str = "bundle") -> dict[str, Path]:
    """{name: path} from PATH or NAME=PATH specs (bundles, or indexes); names are URL-safe and distinct."""
    out: dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or Path(spec).exists():  # a path that holds "=" is a path
            name, path = Path(spec).resolve().name, spec
        if not NAME.match(name):
            raise ConfigError(f"{what} name '{name}' (from {spec}) is not URL-safe",
                              "name it with letters, digits, '.', '_' or '-': NAME=PATH")
        if name in out:
            raise ConfigError(f"two {what}s are named '{name}'", "name them apart: NAME=PATH")
        out[name] = Path(path)
    return out


# ---- dynamic batching ----------------------------------------------------------------------------
@dataclass
class _Request:
    inputs: list[Any]
    options: Options
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
        self.indexes: dict[str, StoredIndex] = {}  # by name: what POST /v1/search searches with this model
        # by index name: BM25 over its documents' texts (--corpus), for "hybrid": "bm25"
        self.bm25: dict[str, Any] = {}

    def describe(self) -> JSONObject:
        m = self.pipe.meta
        return {"name": self.name, "task": self.pipe.task,
                "labels": list(m.labels) if m.labels is not None else None,
                "max_length": self.pipe.max_length, "options": list(self.pipe.option_names),
                "source": m.source,
                "precision": m.precision,
                "providers": self.pipe.providers, "computes_in": self.pipe.precision}

    async def predict(self, inputs: list[Any], options: Options,
                      request: Any = None) -> tuple[list[Prediction], int]:
        """The results of ``inputs`` and the tokens the model ran on, queued for the next merged call; a
        429 when the queue is full, a 503 after --request-timeout; a client that disconnects
        (``request``'s) leaves the queue."""
        with self.lock:
            if self.waiting and self.waiting + len(inputs) > self.max_queue:
                self.metrics.rejected.labels(self.name, "queue_full").inc()
                raise HTTPError(429, f"model '{self.name}' has {self.waiting} inputs waiting (--max-queue "
                                     f"{self.max_queue})",
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
            raise HTTPError(503, f"the request waited over --request-timeout {self.args.request_timeout:g} s "
                                 "for model "
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
        # a graph that wants other inputs than a plain batch: real requests may still work
        except Exception as e:
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
            tokens: list[int] = []
            results = self.pipe(items, errors=bad, tokens=tokens, **reqs[0].options)
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
                i, why = wrong[0]
                _resolve(r, error=ConfigError(f"input {i + 1}: {why}"))
            else:
                _resolve(r, results=(results[at : at + n], sum(tokens[at : at + n])))
            at += n


def _resolve(r: _Request, *, results: tuple[list[Prediction], int] | None = None,
             error: BaseException | None = None) -> None:
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
        self.queue_seconds = Histogram("mlmkit_queue_seconds",
                                       "Time from a request's arrival in the queue to its call.",
                                       ["model"], buckets=TIME_BUCKETS, registry=r)
        self.inference_seconds = Histogram("mlmkit_inference_seconds", "Time of one merged pipeline call.",
                                           ["model"],
                                           buckets=TIME_BUCKETS, registry=r)
        self.request_seconds = Histogram("mlmkit_request_seconds", "Time to answer a prediction request.",
                                         ["model"],
                                         buckets=TIME_BUCKETS, registry=r)
        self.in_flight = Gauge("mlmkit_requests_in_flight", "Requests being answered.", registry=r)
        self.rejected = Counter("mlmkit_rejected", "Requests turned away: queue_full (429) or timeout (503).",
                                ["model", "reason"], registry=r)
        self.dropped = Counter("mlmkit_dropped",
                               "Queued requests left out of their call (the client hung up or timed "
                               "out): no inference done for them.", ["model"], registry=r)
        self.unauthorized = Counter("mlmkit_unauthorized", "Requests without a valid API key (401).",
                                    registry=r)
        self.disconnected = Counter("mlmkit_client_disconnects",
                                    "Requests whose client hung up before its answer "
                                    "(mid-body or while queued; status 499).",
                                    registry=r)
        self.recent_seconds_per_input: dict[str, float] = {}


# ---- running it -----------------------------------------------------------------------------------
def load_models(args: ServeArgs) -> dict[str, Model]:
    """Every bundle loaded and checked, and each --search-index given to the model whose bundle built it (a
    bad one is an error before the server starts)."""
    from mlmkit.retrieval.index import served_indexes
    from mlmkit.runtime.pipeline import Pipeline

    metrics = Metrics()
    bundles = model_names(args.bundles)
    models = {name: Model(name, Pipeline.load(path, device=args.device, threads=args.threads,
                                              batch_size=args.batch_size,
                                              batch_tokens=args.batch_tokens, spin=False,
                                              precision=args.precision,
                                              min_agreement=args.min_agreement),
                          args, metrics)
              for name, path in bundles.items()}
    for name, (model, ix) in served_indexes(model_names(args.index, "index"), bundles,
                                            memory=not args.mmap_index).items():
        models[model].indexes[name] = ix
    for name, path in corpus_names(args.corpus, models).items():
        from mlmkit.retrieval.index.hybrid import BM25Ranker, corpus_texts, same_corpus

        owner = next(m for m in models.values() if name in m.indexes)
        lexical = BM25Ranker(*corpus_texts(path), name=f"--corpus {path}")
        same_corpus((f"index '{name}'", owner.indexes[name].id_hashes), (lexical.name, lexical.id_hashes()))
        owner.bm25[name] = lexical
    return models


def reload_indexes(models: dict[str, Model]) -> None:
    """Each served index whose manifest changed on disk opened again and swapped in whole (a search in
    flight keeps the one it began with); one that cannot be keeps being served as loaded
    (retrieval/index/identity.reloaded)."""
    from mlmkit.retrieval.index.identity import reloaded

    for m in models.values():
        for name, ix in list(m.indexes.items()):
            new = reloaded(ix, m.pipe.path)
            if new is not ix:
                m.indexes[name] = new


def corpus_names(specs: Sequence[str], models: dict[str, Model]) -> dict[str, Path]:
    """--corpus NAME=FILE (or FILE, with one index served): each the texts of a served index's documents."""
    served = [n for m in models.values() for n in m.indexes]
    out: dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or Path(spec).exists():
            if len(served) != 1:
                raise ConfigError(f"--corpus {spec}: say which index's documents it holds",
                                  "--corpus NAME=FILE, NAME a --search-index's")
            name, path = served[0], spec
        if name not in served:
            raise ConfigError(f"--corpus {spec}: no index named '{name}' is served",
                              f"the indexes: {', '.join(served) or 'none'}")
        if not Path(path).is_file():
            raise ConfigError(f"--corpus {spec}: {path} is not a file",
                              "give the documents the index was built from")
        out[name] = Path(path)
    return out
