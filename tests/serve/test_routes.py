"""`mlmkit serve` for the clients retrieval stacks already run: the `openai` client's embeddings
(float, base64, dimensions), text-embeddings-inference's /embed and /predict, API keys, and
backpressure (429 with Retry-After on a full queue, 503 after --request-timeout, a client that hangs
up leaves the queue). A real server in a subprocess on a free loopback port."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_export
from serve_process import Server
from typer.testing import CliRunner

from mlmkit.cli import app as cli_app
from mlmkit.runtime.pipeline import Pipeline

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
KEY = "test-key-0123"
TEXTS = ["a fine film", "the plot was dull and the acting poor", "good", "a story of a king and his horse"]


@pytest.fixture(scope="module")
def bundles(task_bundles) -> dict[str, Path]:
    return {"emb": task_bundles["embedding"], "clf": task_bundles["classification"]}


@pytest.fixture(scope="module")
def server(bundles, tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("log"), *(f"{k}={v}" for k, v in bundles.items()), "--api-key", KEY,
               "--api-key", "second-key", "--max-wait-ms", "5")
    yield s
    s.stop()


def auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_openai_client_gets_the_vectors_mlmkit_embed_writes(server: Server, bundles, tmp_path: Path) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY)
    got = client.embeddings.create(model="emb", input=TEXTS)
    assert [d.index for d in got.data] == list(range(len(TEXTS))) and got.model == "emb"
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS) + "\n")
    r = CliRunner().invoke(cli_app, ["embed", str(bundles["emb"]), "--input", str(src), "--output",
                                     str(tmp_path / "v.npy")])
    assert r.exit_code == 0, r.output
    want = np.load(tmp_path / "v.npy")
    np.testing.assert_allclose(np.array([d.embedding for d in got.data]), want, atol=1e-6)
    # usage: the tokens the model ran on, counted by the pipeline (special tokens included)
    counted = sum(len(e.ids) for e in Pipeline.load(bundles["emb"]).tokenizer.encode_batch(TEXTS))
    assert got.usage.prompt_tokens == got.usage.total_tokens == counted > 2 * len(TEXTS)
    one = client.embeddings.create(model="emb", input=TEXTS[1])
    np.testing.assert_allclose(one.data[0].embedding, want[1], atol=1e-6)
    # base64 (little-endian float32, as OpenAI sends it) and Matryoshka dimensions: the first N, re-normalised
    raw = httpx.post(server.url + "/v1/embeddings",
                     json={"model": "emb", "input": TEXTS, "encoding_format": "base64",
                           "dimensions": 8}, headers=auth(), timeout=30).json()
    vecs = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in raw["data"]])
    cut = want[:, :8] / np.linalg.norm(want[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose(vecs, cut, atol=1e-6)
    models = client.models.list()
    assert {m.id for m in models.data} == {"emb", "clf"}


def test_tei_embed_and_predict(server: Server, bundles) -> None:
    vecs = httpx.post(server.url + "/embed", json={"inputs": TEXTS, "normalize": True}, headers=auth(),
                      timeout=30).json()
    want = np.array([r["embedding"] for r in Pipeline.load(bundles["emb"])(TEXTS)])
    want = want / np.linalg.norm(want, axis=1, keepdims=True)
    np.testing.assert_allclose(np.array(vecs), want, atol=1e-6)
    single = httpx.post(server.url + "/embed", json={"inputs": TEXTS[0]}, headers=auth(), timeout=30).json()
    assert len(single) == 1 and len(single[0]) == want.shape[1]
    preds = httpx.post(server.url + "/predict", json={"inputs": TEXTS}, headers=auth(), timeout=30).json()
    mine = Pipeline.load(bundles["clf"])(TEXTS)
    assert [p[0]["label"] for p in preds] == [m["label"] for m in mine]
    assert all(abs(sum(s["score"] for s in p) - 1.0) < 1e-5 for p in preds)
    one = httpx.post(server.url + "/predict", json={"inputs": TEXTS[0]}, headers=auth(), timeout=30).json()
    assert isinstance(one, list) and one[0]["label"] == mine[0]["label"]
    # a route needing a model of another task, or a model that is not there: 422 / 404 naming the fitting ones
    r = httpx.post(server.url + "/v1/embeddings", json={"model": "clf", "input": "x"}, headers=auth(),
                   timeout=30)
    assert r.status_code == 422 and "emb" in r.json()["hint"]
    r = httpx.post(server.url + "/embed", json={"inputs": "x", "model": "nope"}, headers=auth(), timeout=30)
    assert r.status_code == 404


def test_api_keys(server: Server) -> None:
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200  # liveness needs no key
    for headers in ({}, auth("wrong"), {"Authorization": KEY}, {"Authorization": "Basic " + KEY}):
        r = httpx.post(server.url + "/v1/embeddings", json={"input": "x"}, headers=headers, timeout=10)
        assert (r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
                and "API key" in r.json()["error"])
        assert KEY not in r.text
    assert httpx.get(server.url + "/metrics", timeout=10).status_code == 401
    assert httpx.get(server.url + "/v1/models", headers=auth("second-key"), timeout=10).status_code == 200
    text = httpx.get(server.url + "/metrics", headers=auth(), timeout=10).text
    assert "mlmkit_unauthorized_total" in text and KEY not in text and KEY not in server.log.read_text()


def test_a_full_queue_gets_429_with_retry_after_and_the_server_goes_on(bundles, tmp_path: Path) -> None:
    s = Server(tmp_path, f"emb={bundles['emb']}", "--max-queue", "4", "--max-batch-size", "4",
               "--max-wait-ms", "0")
    try:
        statuses: list[int] = []
        retry: list[str] = []
        long = [" ".join(["a fine film with a long story"] * 12)] * 4

        def client() -> None:
            r = httpx.post(s.url + "/embed", json={"inputs": long}, timeout=60)
            statuses.append(r.status_code)
            if r.status_code == 429:
                retry.append(r.headers.get("retry-after", ""))
                assert "--max-queue" in r.json()["error"]

        threads = [threading.Thread(target=client) for _ in range(24)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert 429 in statuses and 200 in statuses and set(statuses) <= {200, 429}, statuses
        assert all(x.isdigit() and int(x) >= 1 for x in retry)
        assert httpx.post(s.url + "/embed", json={"inputs": "after the flood"}, timeout=30).status_code == 200
        assert s.metric("mlmkit_rejected_total", model="emb", reason="queue_full") == statuses.count(429)
    finally:
        s.stop()


def test_a_client_that_hangs_up_costs_no_inference(bundles, tmp_path: Path) -> None:
    """While a long call holds the model, a queued request whose client disconnects is dropped from
    the queue; one that waits past --request-timeout gets 503."""
    s = Server(tmp_path, f"emb={bundles['emb']}", "--max-batch-size", "1024", "--max-wait-ms", "0",
               "--request-timeout", "1.5")
    try:
        busy = [" ".join(["a fine film with a long story"] * 30)] * 1024

        def hold() -> None:
            t0 = time.monotonic()
            httpx.post(s.url + "/embed", json={"inputs": busy}, timeout=60)
            took.append(time.monotonic() - t0)

        took: list[float] = []
        holders = [threading.Thread(target=hold) for _ in range(2)]  # one call runs, the other waits its turn
        for h in holders:
            h.start()
            time.sleep(0.1)
        body = json.dumps({"inputs": ["gone before its turn"]}).encode()
        host, port = "127.0.0.1", s.port
        for _ in range(3):  # send a whole request, then hang up at once
            with socket.create_connection((host, port)) as sock:
                sock.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            time.sleep(0.05)
        late = httpx.post(s.url + "/embed", json={"inputs": busy[:8]}, timeout=60)  # queued behind both calls
        for h in holders:
            h.join()
        deadline = time.monotonic() + 20
        while s.metric("mlmkit_dropped_total", model="emb") < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert s.metric("mlmkit_requests_total", model="emb", status="499") == 3
        assert s.metric("mlmkit_dropped_total", model="emb") >= 3, (took, httpx.get(s.url + "/metrics").text)
        assert late.status_code in (200, 503)
        if late.status_code == 503:
            assert "--request-timeout" in late.json()["error"]
        assert httpx.post(s.url + "/embed", json={"inputs": "still serving"}, timeout=30).status_code == 200
    finally:
        s.stop()


def test_serve_refuses_bad_settings(bundles) -> None:
    r = CliRunner().invoke(cli_app, ["serve", str(bundles["emb"]), "--request-timeout", "0"])
    assert r.exit_code == 2 and "--request-timeout" in r.output
    r = CliRunner().invoke(cli_app, ["serve", str(bundles["emb"]), "--api-key", " spaced"])
    assert r.exit_code == 2 and "--api-key" in r.output
    r = CliRunner().invoke(cli_app, ["serve", str(bundles["emb"]), "--ssl-keyfile",
                                     str(bundles["emb"] / "mlmkit.json")])
    assert r.exit_code == 2 and "--ssl-certfile" in r.output


def test_tls_with_uvicorn_s_key_and_certificate(bundles, tmp_path: Path) -> None:
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a self-signed certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    s = TLSServer(tmp_path, f"emb={bundles['emb']}", "--ssl-keyfile", key, "--ssl-certfile", cert)
    try:
        r = httpx.post(s.url + "/embed", json={"inputs": "over https"}, verify=str(cert), timeout=30)
        assert r.status_code == 200 and len(r.json()) == 1
    finally:
        s.stop()


class TLSServer(Server):
    """The same subprocess, polled over https with the certificate it was given."""

    def __init__(self, tmp: Path, *args: str | Path) -> None:
        super().__init__(tmp, *args, verify=str(args[args.index("--ssl-certfile") + 1]))


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory) -> tuple[Path, Any]:
    """A one-logit BERT sequence classifier saved by transformers (what a CrossEncoder is), exported."""
    transformers = pytest.importorskip("transformers")
    from family_checkpoints import save_checkpoint

    root = tmp_path_factory.mktemp("ce")
    hf = save_checkpoint(root / "src", "bert", "ForSequenceClassification", num_labels=1)
    run_export(root / "src", root / "rerank")
    return root / "rerank", (hf, transformers.AutoTokenizer.from_pretrained(root / "src"))


DOCS = ["the film was good", "a dull plot and poor acting", "john went to paris", "very very good and great"]
QUERY = "was the film good"


def reference_logits(cross_encoder: Any) -> np.ndarray:
    import torch

    hf, tok = cross_encoder[1]
    enc = tok([QUERY] * len(DOCS), DOCS, padding=True, return_tensors="pt", return_token_type_ids=True)
    with torch.no_grad():
        return hf(**enc).logits[:, 0].numpy()


def test_rerank_routes_and_command_order_as_transformers(cross_encoder, tmp_path: Path) -> None:
    bundle = cross_encoder[0]
    logits = reference_logits(cross_encoder)
    order = list(np.argsort(-logits, kind="stable"))
    sigmoid = 1 / (1 + np.exp(-logits))
    s = Server(tmp_path, f"ce={bundle}")
    try:
        r = httpx.post(s.url + "/v1/rerank",
                       json={"query": QUERY, "documents": DOCS, "top_n": 3, "return_documents": True},
                       timeout=30).json()
        assert [x["index"] for x in r["results"]] == order[:3] and r["model"] == "ce"
        np.testing.assert_allclose([x["relevance_score"] for x in r["results"]], sigmoid[order[:3]],
                                   atol=1e-5)
        assert [x["document"]["text"] for x in r["results"]] == [DOCS[i] for i in order[:3]]
        pairs = Pipeline.load(bundle).tokenizer.encode_batch([(QUERY, d) for d in DOCS])
        assert r["usage"] == {"prompt_tokens": sum(len(e.ids) for e in pairs),
                              "total_tokens": sum(len(e.ids) for e in pairs)}
        tei = httpx.post(s.url + "/rerank",
                         json={"query": QUERY, "texts": DOCS, "raw_scores": True, "return_text": True},
                         timeout=30).json()
        assert [x["index"] for x in tei] == order and [x["text"] for x in tei] == [DOCS[i] for i in order]
        np.testing.assert_allclose([x["score"] for x in tei], logits[order], atol=1e-4)
        bad = httpx.post(s.url + "/v1/rerank", json={"query": "", "documents": DOCS}, timeout=30)
        assert bad.status_code == 422
    finally:
        s.stop()
    r = CliRunner().invoke(cli_app, ["rerank", str(bundle), *DOCS, "--query", QUERY, "--json"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["index"] for x in rows] == order
    np.testing.assert_allclose([x["score"] for x in rows], sigmoid[order], atol=1e-5)
    # the README's own example: a .txt of one document a line, as every other inference command reads it
    (tmp_path / "docs.txt").write_text("\n".join(DOCS) + "\n")
    r = CliRunner().invoke(cli_app, ["rerank", str(bundle), "--query", QUERY, "--input",
                                     str(tmp_path / "docs.txt"), "--json"])
    assert r.exit_code == 0, r.output
    assert [json.loads(line)["index"] for line in r.stdout.splitlines()] == order


def test_rerank_refuses_a_model_that_is_not_a_cross_encoder(server: Server, bundles) -> None:
    r = httpx.post(server.url + "/v1/rerank", json={"model": "clf", "query": "q", "documents": ["d"]},
                   headers=auth(), timeout=30)
    assert r.status_code == 422 and "cross-encoder" in r.json()["error"]
    r = CliRunner().invoke(cli_app, ["rerank", str(bundles["clf"]), "doc", "--query", "q"])
    assert r.exit_code == 2 and "cross-encoder" in " ".join(r.output.split())


def test_splade_sparse_vectors_equal_a_transformers_reference(tmp_path: Path) -> None:
    """A masked LM exported with --task sparse-embedding: its top terms are SPLADE's (max over real
    tokens of log(1 + relu(logit))) computed with transformers; served by /embed_sparse and `embed`."""
    import torch

    transformers = pytest.importorskip("transformers")
    from family_checkpoints import save_checkpoint

    hf = save_checkpoint(tmp_path / "src", "roberta", "ForMaskedLM")
    r = CliRunner().invoke(cli_app, ["export", str(tmp_path / "src"), "--out", str(tmp_path / "b"), "--task",
                                     "sparse-embedding", "--option", "max_terms=16"])
    assert r.exit_code == 0, r.output
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "src")
    enc = tok(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = hf(**enc).logits
    w = (torch.log1p(torch.relu(logits)) * enc["attention_mask"].unsqueeze(-1)).max(dim=1).values
    values, indices = torch.topk(w, 16, dim=-1)
    s = Server(tmp_path, f"splade={tmp_path / 'b'}")
    try:
        got = httpx.post(s.url + "/embed_sparse", json={"inputs": TEXTS}, timeout=30).json()
    finally:
        s.stop()
    for row, vals, ids in zip(got, values.numpy(), indices.numpy()):
        keep = vals > 0
        assert [e["index"] for e in row] == ids[keep].tolist()
        np.testing.assert_allclose([e["value"] for e in row], vals[keep], atol=1e-4)
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS) + "\n")
    r = CliRunner().invoke(cli_app, ["embed", str(tmp_path / "b"), "--input", str(src), "--output",
                                     str(tmp_path / "v.jsonl")])
    assert r.exit_code == 0, r.output
    lines = [json.loads(line) for line in (tmp_path / "v.jsonl").read_text().splitlines()]
    assert [x["indices"] for x in lines] == [[e["index"] for e in row] for row in got]


def test_a_sentence_transformers_sparse_encoder_directory_is_a_sparse_model(tmp_path: Path) -> None:
    from family_checkpoints import save_checkpoint

    save_checkpoint(tmp_path / "src", "bert", "ForMaskedLM")
    (tmp_path / "src" / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "",
         "type": "sentence_transformers.sparse_encoder.models.MLMTransformer"},
        {"idx": 1, "name": "1", "path": "1_SpladePooling",
         "type": "sentence_transformers.sparse_encoder.models.SpladePooling"},
    ]))
    r = CliRunner().invoke(cli_app, ["export", str(tmp_path / "src"), "--out", str(tmp_path / "b"), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "b" / "mlmkit.json").read_text())["task"] == "sparse-embedding"
    # the same masked LM without the layout: fill-mask, as before
    (tmp_path / "src" / "modules.json").unlink()
    r = CliRunner().invoke(cli_app, ["export", str(tmp_path / "src"), "--out", str(tmp_path / "m"), "--json"])
    assert (r.exit_code == 0 and json.loads((tmp_path / "m" / "mlmkit.json").read_text())["task"]
            == "fill-mask")


def test_tei_tokenize(server: Server, bundles) -> None:
    from mlmkit.text.tokenizer import load_tokenizer

    text = "a fine film, good"
    got = httpx.post(server.url + "/tokenize", json={"inputs": [text], "model": "emb"}, headers=auth(),
                     timeout=30).json()
    enc = load_tokenizer(bundles["emb"] / "tokenizer.json").encode(text)
    assert [t["id"] for t in got[0]] == enc.ids
    assert got[0][0]["special"] and got[0][-1]["special"] and not any(t["special"] for t in got[0][1:-1])
    assert all(text[t["start"]:t["stop"]] for t in got[0][1:-1])
    bare = httpx.post(server.url + "/tokenize",
                      json={"inputs": text, "model": "emb", "add_special_tokens": False},
                      headers=auth(), timeout=30).json()
    assert [t["id"] for t in bare[0]] == enc.ids[1:-1]
    # a long text: the tokens the model sees, its max length, not every token of it (a 9 MB text made a
    # 200 MB answer in a minute, on the event loop: /health waited); quickly, and /health still answers
    long = "好的电影" * 500_000  # 6 MB, no whitespace
    t0 = time.perf_counter()
    got = httpx.post(server.url + "/tokenize", json={"inputs": [long, text], "model": "emb"}, headers=auth(),
                     timeout=60).json()
    max_length = json.loads((bundles["emb"] / "mlmkit.json").read_text())["max_length"]
    assert len(got[0]) == max_length and got[0][-1]["special"] and [t["id"] for t in got[1]] == enc.ids
    assert [t["id"]
            for t in got[0][:-1]] == load_tokenizer(bundles["emb"] / "tokenizer.json").encode(
                long[:1000]).ids[:max_length - 1]
    assert time.perf_counter() - t0 < 20


# ---- hostile clients: hang-ups, silence, a busy port, odd JSON -----------------------------------
def metric(server: Server, name: str, **labels: str) -> float:
    """One Prometheus sample of a server whose /metrics needs the key."""
    import re

    for line in httpx.get(server.url + "/metrics", headers=auth(), timeout=10).text.splitlines():
        m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if m and m.group(1) == name and all(dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")).get(k) == v
                                            for k, v in labels.items()):
            return float(m.group(3))
    return 0.0


def test_a_client_hanging_up_mid_body_is_counted_not_an_error(server: Server) -> None:
    before = metric(server, "mlmkit_client_disconnects_total")
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                      + b"\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{\"input\": [\"a")
            time.sleep(0.2)
    deadline = time.monotonic() + 10
    while metric(server, "mlmkit_client_disconnects_total") < before + 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metric(server, "mlmkit_client_disconnects_total") == before + 3
    assert metric(server, "mlmkit_requests_total", model="-", status="500") == 0
    assert "Traceback" not in server.log.read_text()
    assert httpx.post(server.url + "/embed", json={"inputs": ["still fine"]}, headers=auth(),
                      timeout=30).status_code == 200


def test_odd_json_values_are_4xx(server: Server) -> None:
    for body in ('{"inputs": ["\\ud800 lone surrogate"]}',
                 '{"inputs": ["a"], "options": {"top_k": ' + "9" * 5000 + "}}"):
        r = httpx.post(server.url + "/v1/models/clf/predict", content=body,
                       headers={**auth(), "Content-Type": "application/json"},
                       timeout=30)
        assert 400 <= r.status_code < 500, (r.status_code, r.text)
    # which one counts?
    for body, said in (('{"input": "a", "input": ["b", "c"]}', "the key 'input' twice in one object"),
                       ('{"inputs": "a", "dimensions": NaN}', "NaN is not a JSON number")):
        r = httpx.post(server.url + "/embed", content=body,
                       headers={**auth(), "Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 400 and said in r.json()["error"], r.text
    assert metric(server, "mlmkit_requests_total", model="clf", status="500") == 0


def test_silent_and_slow_clients_are_cut_off_and_a_busy_port_is_one_line(bundles, tmp_path: Path) -> None:
    s = Server(tmp_path, f"clf={bundles['clf']}", "--header-timeout", "1", "--timeout-keep-alive", "1",
               "--max-connections", "40")
    try:
        big = socket.create_connection(("127.0.0.1", s.port))  # a request head of megabytes: 431, closed
        big.settimeout(5)
        try:
            big.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 2_000_000 + b"\r\n\r\n")
            answer = big.recv(100)
        # the server answered and closed while the head was still
        except (ConnectionResetError, BrokenPipeError):
            answer = None  # being sent: the kernel turns the unread rest into a reset, which can drop the 431
        assert answer is None or answer.startswith(b"HTTP/1.1 431"), answer
        big.close()
        # a large body after a small head still counts
        body = json.dumps({"inputs": ["a fine film " * 20_000]})
        assert s.post("clf", body, headers={"Content-Type": "application/json"}).status_code == 200
        idle = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(45)]  # past --max-connections
        time.sleep(0.3)
        # answered and closed, no file descriptor lost
        assert httpx.get(s.url + "/health", timeout=10).status_code == 503
        for c in idle:
            c.close()
        time.sleep(0.3)
        silent = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(30)]
        slow = socket.create_connection(("127.0.0.1", s.port))
        slow.sendall(b"POST /v1/models/clf/predict HTTP/1.1\r\nHost: x\r\n")  # a head never finished
        time.sleep(2.5)
        for c in [*silent, slow]:
            c.settimeout(5)
            assert c.recv(100) == b""  # closed by the server
            c.close()
        assert s.post("clf", {"inputs": ["a fine film"]}).status_code == 200
        # the port is taken now: a second server says so in one line, exit 2, before claiming to serve
        r = CliRunner().invoke(cli_app, ["serve", str(bundles["clf"]), "--port", str(s.port)])
        assert r.exit_code == 2, r.output
        assert "already in use" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert "serving" not in r.output
    finally:
        s.stop()
