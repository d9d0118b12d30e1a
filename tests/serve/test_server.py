"""`mlmkit serve`: the real server in a subprocess on a free port, spoken to over HTTP with httpx.

Every task's bundle answers as `mlmkit predict` does; each bad request gets its status and a message
that says what is wrong, and /metrics counts it; 32 concurrent clients sending single texts get
their own answers while the server merges them into batches; SIGTERM lets a request in flight
finish while new ones get 503 (an internal error failing only its own request: test_queue.py).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from serve_process import Server
from task_runs import sentence
from typer.testing import CliRunner

from mlmkit.cli import app as cli_app

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
runner = CliRunner()
LIMITS = ["--max-inputs", "64", "--max-body-bytes", "65536", "--max-wait-ms", "20", "--access-log"]


@pytest.fixture(scope="module")
def bundles(task_bundles) -> dict[str, Path]:
    names = {"fill-mask": "mlm", "classification": "clf", "tagging": "ner", "qa": "qa", "embedding": "emb"}
    return {name: task_bundles[kind] for kind, name in names.items()}


@pytest.fixture(scope="module")
def server(bundles, tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("log"), *(f"{k}={v}" for k, v in bundles.items()), *LIMITS)
    yield s
    s.stop()


def inputs_for(name: str) -> list[Any]:
    rng = random.Random(7)
    if name == "qa":
        return [{"question": sentence(rng, 4), "context": sentence(rng, n)} for n in (6, 20, 90)]
    texts = [sentence(rng, n) for n in (3, 12, 60)]
    if name == "mlm":
        texts = [t.replace(t.split()[1], "[MASK]", 1) for t in texts] + ["no mask here"]
    if name == "clf":
        texts.append({"text": sentence(rng, 5), "text_pair": sentence(rng, 7)})
    return texts


def close(a: Any, b: Any, path: str = "") -> None:
    """Equal, numbers within 1e-4 (merged batches pad differently: float noise only)."""
    if isinstance(a, float) or isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-4), (path, a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), (path, a.keys(), b.keys())
        for k in a:
            close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), (path, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            close(x, y, f"{path}[{i}]")
    else:
        assert a == b, (path, a, b)


# ---- results -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["mlm", "clf", "ner", "qa", "emb"])
def test_every_task_answers_as_mlmkit_predict(server: Server, bundles, tmp_path: Path, name: str) -> None:
    inputs = inputs_for(name)
    f = tmp_path / "in.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in inputs))
    r = runner.invoke(cli_app, ["predict", str(bundles[name]), "--input", str(f)])
    assert r.exit_code == 0, r.output
    expected = [json.loads(x) for x in r.stdout.splitlines()]
    got = server.post(name, {"inputs": inputs})
    assert got.status_code == 200, got.text
    body = got.json()
    close(body["results"], expected)
    assert got.headers["x-request-id"]
    cut = [i + 1 for i, x in enumerate(expected) if x.get("truncated")]
    assert [int(w.split(":")[0].split()[1]) for w in body.get("warnings", [])] == cut
    if name == "clf":  # (tagging and QA window long texts: nothing is cut)
        assert cut, "a 60-word text is longer than the test bundle's max length: the notice must come back"


def test_options_reach_the_task(server: Server) -> None:
    r = server.post("mlm", {"inputs": ["the [MASK] is here"], "options": {"top_k": 2}})
    assert r.status_code == 200, r.text
    assert [len(m["candidates"]) for m in r.json()["results"][0]["masks"]] == [2]
    r = server.post("mlm", {"inputs": ["the [MASK] is here"], "options": {"top_k": 99}})
    assert r.status_code == 422 and "--top-k 99" in r.json()["error"]


def test_models_health_ready_metrics_and_docs(server: Server, bundles) -> None:
    models = {m["name"]: m for m in httpx.get(server.url + "/v1/models").json()["models"]}
    assert sorted(models) == sorted(bundles)
    assert models["clf"]["task"] == "classification" and models["clf"]["labels"] == ["neg", "pos"]
    assert "threshold" in models["clf"]["options"] and models["mlm"]["options"] == ["candidates", "top_k"]
    assert (models["ner"]["max_length"] == 24 and models["mlm"]["task"] == "fill-mask"
            and models["emb"]["source"])
    # the test process sets MLMKIT_PRECISION=fp32 (conftest.py), which the server inherits
    assert models["clf"]["precision"] == "fp32" and models["clf"]["computes_in"] == "fp32"
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    assert httpx.get(server.url + "/ready").json()["status"] == "ready"
    spec = httpx.get(server.url + "/openapi.json").json()
    assert "/v1/models/{name}/predict" in spec["paths"] and httpx.get(server.url + "/docs").status_code == 200
    assert "mlmkit_requests_in_flight" in httpx.get(server.url + "/metrics").text
    # --access-log: each request a line, the query string's values left out (a key sent there is never logged)
    assert httpx.get(server.url + "/health?api_key=s3cr3t-k3y&flag").status_code == 200
    time.sleep(0.2)
    log = server.log.read_text()
    assert '"GET /health?api_key=***&*** HTTP/1.1" 200' in log and "s3cr3t" not in log, log[-2000:]


# ---- bad requests ------------------------------------------------------------------------------------
BAD = [  # (model, body, status, words in the error)
    ("clf", b'{"inputs": ["a", }', 400, "malformed JSON"),
    ("clf", b"\xff\xfe", 400, "not UTF-8"),
    ("clf", b'["a"]', 422, "must be a JSON object"),
    ("clf", {"texts": ["a"]}, 422, "unknown field(s) in the body: texts"),
    ("clf", {"inputs": "a"}, 422, "'inputs' must be a list"),
    ("clf", {"inputs": ["a"], "options": [1]}, 422, "'options' must be an object"),
    ("clf", {"inputs": [["a", "b"]]}, 422, "input 1"),
    ("clf", {"inputs": ["a", ""]}, 422, "input 2"),
    ("qa", {"inputs": ["a question without a context"]}, 422, "input 1"),
    ("clf", {"inputs": ["a"], "options": {"no_such": 1}}, 422, "unknown option(s) for model 'clf': no_such"),
    ("clf", {"inputs": ["a"], "options": {"threshold": "high"}}, 422, "threshold"),
    ("nope", {"inputs": ["a"]}, 404, "no model named 'nope'"),
    ("clf", {"inputs": ["a"] * 65}, 413, "65 inputs in one request; the limit is 64"),
    ("clf", {"inputs": ["a" * 70000]}, 413, "over 65536 bytes"),
]


def test_bad_requests_get_a_status_and_a_message_and_are_counted(server: Server) -> None:
    before = {s: server.metric("mlmkit_requests_total", model="clf", status=s) for s in ("400", "413", "422")}
    for model, body, status, words in BAD:
        r = server.post(model, body)
        assert r.status_code == status, (body, r.status_code, r.text)
        err = r.json()
        assert words in err["error"], (body, err)
        assert err["request_id"] == r.headers["x-request-id"]
    assert server.metric("mlmkit_requests_total", model="clf", status="400") - before["400"] == 2
    assert server.metric("mlmkit_requests_total", model="clf", status="413") - before["413"] == 2
    assert server.metric("mlmkit_requests_total", model="clf", status="422") - before["422"] == 8
    assert server.metric("mlmkit_requests_total", model="-", status="404") >= 1
    r = httpx.get(server.url + "/v2/nothing")
    assert r.status_code == 404 and "endpoints" in r.json()["hint"]
    assert server.post("clf", {"inputs": ["still serving"]}).status_code == 200


# ---- dynamic batching --------------------------------------------------------------------------------
def test_concurrent_single_text_clients_get_their_own_answers_in_batches(server: Server) -> None:
    rng = random.Random(3)
    texts = [sentence(rng, rng.randint(2, 20)) for _ in range(32 * 4)]
    whole = (server.post("clf", {"inputs": texts[:64]}).json()["results"]
             + server.post("clf", {"inputs": texts[64:]}).json()["results"])
    calls_before = server.metric("mlmkit_batch_inputs_count", model="clf")
    singles_before = server.metric("mlmkit_batch_inputs_bucket", model="clf", le="1.0")

    async def client(k: int, http: httpx.AsyncClient) -> list[tuple[int, dict]]:
        got = []
        for i in range(k, len(texts), 32):  # each client: its texts one request at a time
            r = await http.post(f"{server.url}/v1/models/clf/predict", json={"inputs": [texts[i]]})
            assert r.status_code == 200, r.text
            got.append((i, r.json()["results"][0]))
        return got

    async def main() -> list[tuple[int, dict]]:
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=64)) as http:
            parts = await asyncio.gather(*(client(k, http) for k in range(32)))
        return [x for p in parts for x in p]

    answers = asyncio.run(main())
    assert len(answers) == len(texts)
    for i, res in answers:
        close(res, whole[i], f"text {i}")
    calls = server.metric("mlmkit_batch_inputs_count", model="clf") - calls_before
    singles = server.metric("mlmkit_batch_inputs_bucket", model="clf", le="1.0") - singles_before
    assert calls < len(texts) and singles < calls, (calls, singles)  # calls merged several requests


# ---- shutdown ------------------------------------------------------------------------------------------
def test_sigterm_lets_the_request_in_flight_finish_and_turns_new_ones_away(bundles, tmp_path: Path) -> None:
    s = Server(tmp_path, f"clf={bundles['clf']}", "--max-inputs", "100000", "--max-body-bytes", "100000000",
               "--threads", "1",
               "--max-batch-size", "100000")
    try:
        rng = random.Random(5)
        big = [sentence(rng, 30) for _ in range(12_000)]
        got: dict[str, Any] = {}
        slow = threading.Thread(target=lambda: got.setdefault("r", s.post("clf", {"inputs": big})))
        slow.start()
        deadline = time.monotonic() + 30
        while s.metric("mlmkit_queue_seconds_count", model="clf") < 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # the big request is in its call
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        late = s.post("clf", {"inputs": ["too late"]})
        assert late.status_code == 503 and "shutting down" in late.json()["error"]
        slow.join(timeout=120)
        assert got["r"].status_code == 200 and len(got["r"].json()["results"]) == len(big)
        assert s.proc.wait(timeout=60) == 0
    finally:
        s.stop()


def test_only_loopback_addresses_count_as_this_machine_alone() -> None:
    """`serve` warns when it listens beyond this machine without an API key: which hosts are loopback."""
    from mlmkit.serve.server import loopback

    assert all(loopback(h) for h in ("127.0.0.1", "127.8.0.3", "::1", "[::1]", "localhost"))
    assert not any(loopback(h) for h in ("0.0.0.0", "::", "10.0.0.5", "192.168.1.2", "example.internal"))
