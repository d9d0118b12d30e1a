"""The routes' request and response models (mlmkit/serve/schemas.py): a body of a wrong type, or with
a field the route does not read, is one 4xx line naming the field in mlmkit's error shape (never
FastAPI's list of validation errors), and /openapi.json documents each route's models. In process:
an app around a fake embedding pipeline (no bundle, no subprocess)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("fastapi")

from mlmkit.serve.catalog import routes  # noqa: E402
from mlmkit.serve.http import HTTPError  # noqa: E402
from mlmkit.serve.routes import Route  # noqa: E402
from mlmkit.serve.schemas import PredictRequest  # noqa: E402


class Pipe:
    """An embedding model's pipeline, as far as the server reads it: a vector of the text's length."""

    task, max_length, providers, batch_size, pad_id = "embedding", 8, ["CPU"], 4, 0
    input_names = ["input_ids"]
    option_names = ("input_type",)
    meta = SimpleNamespace(outputs={"embedding": ()}, labels=None, options={"query_prompt": "query: "},
                           source="fake", precision="fp32")
    precision = "fp32"

    def check(self, inputs: list[Any], options: dict[str, Any]) -> None:
        pass

    def run_batch(self, feed: dict[str, Any]) -> None:
        pass

    def __call__(self, items: list[Any], errors: dict | None = None, tokens: list | None = None,
                 **options: Any) -> list[dict[str, Any]]:
        if tokens is not None:
            tokens.extend(len(str(x)) for x in items)
        return [{"embedding": [float(len(str(x))), 1.0, 0.0]} for x in items]


@pytest.fixture(scope="module")
def http():
    from fastapi.testclient import TestClient

    from mlmkit.args import ServeArgs
    from mlmkit.serve.app import create_app
    from mlmkit.serve.queue import Metrics, Model

    args = ServeArgs(bundles=["x"], max_wait_ms=1)
    app = create_app({"emb": Model("emb", Pipe(), args, Metrics())}, args)
    with TestClient(app) as client:
        deadline = time.monotonic() + 10
        while client.get("/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.01)
        yield client


WRONG = [  # (path, body, the error's words): a 422 each, one line naming the field
    ("/embed", {"inputs": 5}, "/embed: 'inputs' must be a text or a non-empty list of texts"),
    ("/embed", {"inputs": [1, 2]}, "/embed: token ids as inputs are not accepted"),
    ("/embed", {"inputs": "a", "normalize": "false"}, "/embed: 'normalize' must be true or false, got 'fal"),
    ("/embed", {"inputs": "a", "dimensions": 0}, "/embed: 'dimensions' must be a positive whole number, got"),
    ("/embed", {"inputs": "a", "dimensions": 2.0}, "'dimensions' must be a positive whole number, got 2.0"),
    ("/embed", {"inputs": "a", "model": 3}, "/embed: 'model' must be a text, got 3"),
    ("/embed", {"inputs": "a", "truncate": False}, "/embed: truncate false is not supported"),
    ("/embed", {}, "/embed: 'inputs' is missing"),
    ("/embed", ["a"], "/embed: the body must be a JSON object, got list"),
    ("/v1/embeddings", {"input": "a", "encoding_format": "hex"},
     "/v1/embeddings: encoding_format must be float or base64, got 'hex'"),
    ("/v1/embeddings", {"input": "a", "input_type": 1}, "/v1/embeddings: input_type must be query or docu"),
    ("/v1/rerank", {"query": "", "documents": ["d"]}, "/v1/rerank: 'query' must be a non-empty text"),
    ("/v1/rerank", {"query": "q", "documents": "d"}, "/v1/rerank: 'documents' must be a non-empty list"),
    ("/v1/rerank", {"query": "q", "documents": ["d"], "top_n": True}, "'top_n' must be a positive whole"),
    ("/rerank", {"query": "q", "texts": ["d"], "return_text": 1}, "/rerank: 'return_text' must be true or"),
    ("/predict", {"inputs": [["a", "b", "c"]]}, "/predict: each input must be a text or a [text, pair] list"),
    ("/tokenize", {"inputs": "a", "add_special_tokens": "yes"}, "'add_special_tokens' must be true or false"),
    ("/v1/search", {"query": "a", "top_k": "3"}, "/v1/search: 'top_k' must be a positive whole number"),
    ("/v1/search", {"query": "a", "weights": [1, "x"]}, "/v1/search: 'weights' must be a list of numbers"),
    ("/v1/search", {"vector": [[0.1], "x"]}, "/v1/search: 'vector' must be a list of numbers"),
    ("/v1/search", {"query": "a", "where": 5}, "/v1/search: 'where' must be a condition"),
    ("/v1/models/emb/predict", {"inputs": "a"}, "'inputs' must be a list of texts or records"),
    ("/v1/models/emb/predict", {"inputs": ["a"], "options": [1]}, "'options' must be an object"),
]


@pytest.mark.parametrize("path, body, words", WRONG, ids=[f"{w[0]} {sorted(w[1])}" for w in WRONG])
def test_a_wrong_type_is_one_4xx_line_naming_the_field(http, path: str, body: Any, words: str) -> None:
    r = http.post(path, json=body)
    assert r.status_code == 422, r.text
    err = r.json()
    assert set(err) <= {"error", "hint", "request_id"} and err["request_id"] == r.headers["x-request-id"], err
    assert words in err["error"] and "\n" not in err["error"], err


@pytest.mark.parametrize("route", routes(), ids=lambda r: r.path)
def test_an_unknown_field_is_refused_with_the_route_s_fields(http, route: Route[Any, Any]) -> None:
    r = http.post(route.path, json={"nope": 1, "other": 2})
    assert r.status_code == 422, r.text
    err = r.json()
    assert err["error"] == f"{route.path}: unknown field(s) nope, other", err
    assert err["hint"] == f"its fields: {', '.join(sorted(route.request.model_fields))}", err
    r = http.post("/v1/models/emb/predict", json={"inputs": ["a"], "texts": ["b"]})
    assert r.status_code == 422 and r.json()["error"] == "unknown field(s) in the body: texts", r.text


def test_a_route_s_parse_raises_the_http_error_the_app_writes() -> None:
    embed = {r.path: r for r in routes()}["/embed"]
    with pytest.raises(HTTPError) as e:
        embed.parse({"inputs": "a", "normalize": 0}, {})
    assert (e.value.status, e.value.message) == (422, "/embed: 'normalize' must be true or false, got 0")
    long = "x" * 10_000  # a refused value is quoted short: the error stays one short line
    with pytest.raises(HTTPError) as e:
        embed.parse({"inputs": "a", "prompt_name": 5, "model": [long]}, {})
    assert len(e.value.message) < 200, e.value.message


def test_good_bodies_are_answered_through_their_models(http) -> None:
    r = http.post("/embed", json={"inputs": ["ab", "abcd"], "normalize": False})
    assert r.status_code == 200 and r.json() == [[2.0, 1.0, 0.0], [4.0, 1.0, 0.0]], r.text
    r = http.post("/v1/embeddings", json={"input": "abc", "input_type": "query", "model": "emb", "user": "u"})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "list" and body["data"][0]["index"] == 0, r.text
    assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    r = http.post("/v1/models/emb/predict", json={"inputs": ["a"], "options": None})
    assert r.status_code == 200 and r.json() == {"results": [{"embedding": [1.0, 1.0, 0.0]}]}, r.text
    assert http.get("/health").json() == {"status": "ok"}
    models = http.get("/v1/models").json()
    assert models["models"][0]["name"] == "emb" and models["data"][0]["id"] == "emb"


def test_openapi_documents_each_route_s_request_and_response_models(http) -> None:
    spec = http.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    documented = {r.path: r.request for r in routes()} | {"/v1/models/{name}/predict": PredictRequest}
    assert len(documented) >= 9
    for path, model in documented.items():
        op = spec["paths"][path]["post"]
        ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        name = ref.rsplit("/", 1)[1]
        assert name == model.__name__, (path, ref)
        schema = schemas[name]
        assert set(schema["properties"]) == set(model.model_fields), (path, schema)
        assert schema["additionalProperties"] is False, (path, schema)
        answer = op["responses"]["200"]["content"]["application/json"]["schema"]
        assert "$ref" in answer or answer.get("type"), (path, answer)
        assert op["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    embed = schemas["EmbedRequest"]["properties"]
    assert embed["normalize"]["anyOf"][0]["type"] == "boolean"
    assert embed["dimensions"]["anyOf"][0]["minimum"] == 1
    assert schemas["EmbeddingsResponse"]["properties"]["usage"]["$ref"].endswith("/Usage")
    for path in ("/health", "/ready", "/v1/models"):
        answer = spec["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert "$ref" in answer, (path, answer)
    assert http.get("/docs").status_code == 200


def test_every_route_is_registered_once_with_its_models() -> None:
    from mlmkit.serve.routes import register

    paths = [r.path for r in routes()]
    assert paths == ["/v1/embeddings", "/v1/rerank", "/embed", "/embed_sparse", "/rerank", "/predict",
                     "/tokenize", "/v1/search"]
    assert all(r.request.__name__.endswith("Request") and r.response is not None for r in routes())
    with pytest.raises(ValueError, match="route /embed is registered twice"):
        register(routes()[2])
