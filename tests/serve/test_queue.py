"""The model queue of `mlmkit serve` (mlmkit/serve/queue.py), in-process: an internal error fails only
its own request; its batch neighbours get their answers."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi")


def test_an_internal_error_fails_only_its_own_request() -> None:
    """In-process (the fault is injected into one pipeline): a request whose inputs make the model
    raise gets a 500 with a request id, its batch neighbours their answers, and the app goes on."""
    from fastapi.testclient import TestClient

    from mlmkit.args import ServeArgs
    from mlmkit.serve.app import create_app
    from mlmkit.serve.queue import Metrics, Model

    class Pipe:
        task, max_length, meta, providers, batch_size, pad_id, input_names = ("echo", 8, {}, ["CPU"], 4, 0,
                                                                              ["input_ids"])
        option_names = ()
        calls: list[int] = []

        def check(self, inputs: list[Any], options: dict[str, Any]) -> None:
            pass

        def run_batch(self, feed: dict[str, Any]) -> None:
            pass

        def __call__(self, items: list[Any], errors: dict | None = None,
                     tokens: list | None = None) -> list[dict[str, Any]]:
            self.calls.append(len(items))
            time.sleep(0.05)
            if "boom" in items:
                raise RuntimeError("injected fault")
            return [{"echo": x} for x in items]

    args = ServeArgs(bundles=["x"], max_wait_ms=200)
    app = create_app({"echo": Model("echo", Pipe(), args, Metrics())}, args)
    with TestClient(app) as http:
        results: dict[str, Any] = {}

        def send(text: str) -> None:
            results[text] = http.post("/v1/models/echo/predict", json={"inputs": [text]})

        threads = [threading.Thread(target=send, args=(t,)) for t in ("a", "boom", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert (results["a"].json() == {"results": [{"echo": "a"}]} and results["b"].json()
                == {"results": [{"echo": "b"}]})
        bad = results["boom"]
        assert bad.status_code == 500 and bad.json()["request_id"] == bad.headers["x-request-id"]
        assert Pipe.calls[0] == 3  # the three were one call, then retried one by one
        assert http.post("/v1/models/echo/predict",
                         json={"inputs": ["c"]}).json() == {"results": [{"echo": "c"}]}
