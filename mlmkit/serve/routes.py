"""The request shapes other servers' clients send, as thin adapters over mlmkit's per-model queue.

A route turns its body into one call of a served model (which model, its inputs, its options) and
that call's results into its own response shape; app.py does everything else for every route alike
(body limits, API keys, backpressure, the queue, errors, metrics). Registered in ROUTES:

    POST /v1/embeddings   OpenAI's embeddings API (the `openai` client, LangChain, LlamaIndex ...)
    POST /v1/rerank       reranking as infinity and Cohere shape it
    POST /embed           text-embeddings-inference's
    POST /embed_sparse    text-embeddings-inference's SPLADE vectors
    POST /rerank          text-embeddings-inference's
    POST /predict         text-embeddings-inference's classification route
    POST /tokenize        text-embeddings-inference's (the model's tokenizer only)
    POST /v1/search       the top k documents of an index served with --index (mlmkit index), for query
                          texts (embedded by the index's bundle) or query vectors (no model run)

Reranking runs a cross-encoder: a classification bundle with one output (what sentence-transformers'
CrossEncoder saves: ms-marco-MiniLM, bge-reranker), each (query, document) pair one input; or a
colbert bundle: the query and the documents each one input, of its kind, ranked by MaxSim.

No torch here, nor FastAPI: a route is plain data in, plain data out (numpy arrays among it: the
server writes them as JSON lists, from their buffers).
"""

from __future__ import annotations

import base64
import json
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mlmkit.files import JSONObject
from mlmkit.registry import Options, Prediction
from mlmkit.retrieval.exact import leading_dimensions
from mlmkit.retrieval.reranking import late_interaction, maxsim_of, ranked, relevance
from mlmkit.serve.http import HTTPError


@dataclass
class Call:
    model: str
    inputs: list[Any]
    options: Options = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)  # what the route needs again to answer (each route its own)
    tokens: int = 0  # what the model ran on, for ``usage``: set by the server with the results
    size: int | None = None  # how many inputs the request holds when they are not the model's (query vectors)


def pick_model(models: Mapping[str, Any], requested: Any, needs: tuple[str, ...], route: str) -> str:
    """The model a request names, or the only one whose graph has the outputs the route reads (an
    "embedding", "logits" ...: any task's bundle with them fits); a 404 / 422 naming the fitting ones."""
    fitting = [n for n, m in models.items() if set(needs) <= set(m.pipe.meta.outputs)]
    what = f"models with {' and '.join(repr(x) for x in needs)} output{'s' if len(needs) > 1 else ''}"
    if requested is not None:
        if not isinstance(requested, str) or requested not in models:
            raise HTTPError(404, f"no model named {requested!r}", f"the {what}: {', '.join(fitting) or 'none'}")
        if requested not in fitting:
            raise HTTPError(422, f"model '{requested}' is a {models[requested].pipe.task} model; {route} needs one with "
                                 f"{' and '.join(repr(x) for x in needs)}", f"the {what}: {', '.join(fitting) or 'none'}")
        return requested
    if len(fitting) != 1:
        raise HTTPError(422, f"{route}: say which model (\"model\": NAME)" if fitting else f"{route}: no model served fits",
                        f"the {what}: {', '.join(fitting) or 'none'}")
    return fitting[0]


def _texts(value: Any, field_name: str, route: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(x, str) for x in value):
        return list(value)
    hint = f'send "{field_name}": "a text" or ["a text", ...]'
    if isinstance(value, list) and value and all(isinstance(x, (int, list)) for x in value):
        raise HTTPError(422, f"{route}: token ids as {field_name} are not accepted", hint + " (texts; the server tokenizes)")
    raise HTTPError(422, f"{route}: '{field_name}' must be a text or a non-empty list of texts", hint)


def _object(body: Any, route: str, allowed: set[str]) -> JSONObject:
    if not isinstance(body, dict):
        raise HTTPError(422, f"{route}: the body must be a JSON object, got {type(body).__name__}")
    extra = sorted(set(body) - allowed)
    if extra:
        raise HTTPError(422, f"{route}: unknown field(s) {', '.join(extra)}", f"its fields: {', '.join(sorted(allowed))}")
    return body


def _flag(b: Mapping[str, Any], name: str, route: str, default: bool = False) -> bool:
    """A true / false field (JSON's booleans only: "false", "0" or 0 are no answer, not true)."""
    value = b.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise HTTPError(422, f"{route}: '{name}' must be true or false, got {value!r}")
    return value


def _truncation(b: Mapping[str, Any], route: str) -> None:
    """TEI's truncate / truncation_direction: inputs longer than the model are cut at the right, always;
    asking for anything else is refused, not ignored."""
    if not _flag(b, "truncate", route, default=True):
        raise HTTPError(422, f"{route}: truncate false is not supported; inputs longer than the model are truncated",
                        "leave 'truncate' out or set it true")
    if b.get("truncation_direction") not in (None, "Right", "right"):
        raise HTTPError(422, f"{route}: only truncation_direction Right is supported, got {b.get('truncation_direction')!r}")


def _prompt(model: Any, name: str, prompt: Any, route: str) -> Options:
    """TEI's prompt_name: the pipeline option for a prompt the model has (none given: {})."""
    if prompt is None:
        return {}
    named = _prompt_names(model)
    if prompt not in named:
        raise HTTPError(422, f"{route}: model '{name}' has no prompt named {prompt!r}", f"its prompts: {', '.join(named) or 'none'}")
    return _input_type(model, prompt) if prompt in INPUT_TYPES else {"prompt_name": prompt}


def _positive(value: Any, name: str, route: str) -> int | None:
    """A positive whole-number field (dimensions, top_n, top_k, rescore), None when absent; else a 422."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise HTTPError(422, f"{route}: '{name}' must be a positive whole number, got {value!r}")
    return value


def truncate_dimensions(vectors: np.ndarray, n: int | None, normalize: bool) -> np.ndarray:
    """The first ``n`` components (Matryoshka embeddings), L2-normalised again when ``normalize``."""
    if n is not None and n > vectors.shape[1]:
        raise HTTPError(422, f"'dimensions' {n} is more than the model's {vectors.shape[1]}")
    return leading_dimensions(vectors, n, normalize)


INPUT_TYPES = ("query", "document")
"""What an embedding request may declare its inputs to be: the embedding task's prompts by name."""


def _prompt_names(model: Any) -> list[str]:
    """The prompts an embedding bundle has (TEI's prompt_name), by name: query and document, and the
    named prompts a sentence-transformers model brought (EmbeddingGemma's Clustering ...)."""
    options = model.pipe.meta.options
    try:
        named = list(json.loads(options.get("prompts") or "{}"))
    except ValueError:
        named = []
    return [k for k in INPUT_TYPES if options.get(f"{k}_prompt")] + named


def _input_type(model: Any, kind: str | None) -> Options:
    """The pipeline option for a declared input type (none declared: the inputs as they are)."""
    if kind is None:
        return {}
    if "input_type" not in model.pipe.option_names:
        raise HTTPError(422, f"a {model.pipe.task} model has no query or document prompts", "leave the input type out")
    return {"input_type": kind}


def _usage(call: Call) -> dict[str, int]:
    """OpenAI's usage: the tokens the model ran on (the pipeline counted them; nothing tokenized again)."""
    return {"prompt_tokens": call.tokens, "total_tokens": call.tokens}


class OpenAIEmbeddings:
    method, path = "POST", "/v1/embeddings"
    summary = "OpenAI's embeddings API: {model, input, encoding_format, dimensions, input_type}."
    needs = ("embedding",)

    def parse(self, body: Any, models: Mapping[str, Any]) -> Call:
        b = _object(body, self.path, {"model", "input", "encoding_format", "dimensions", "user", "input_type"})
        fmt = b.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise HTTPError(422, f"{self.path}: encoding_format must be float or base64, got {fmt!r}")
        kind = b.get("input_type")
        if kind is not None and kind not in INPUT_TYPES:
            raise HTTPError(422, f"{self.path}: input_type must be {' or '.join(INPUT_TYPES)}, got {kind!r}",
                            "it picks the model's query or document prompt")
        name = pick_model(models, b.get("model"), self.needs, self.path)
        return Call(name, _texts(b.get("input"), "input", self.path), _input_type(models[name], kind),
                    state={"format": fmt, "dimensions": _positive(b.get("dimensions"), "dimensions", self.path)})

    def respond(self, call: Call, results: list[Prediction], model: Any) -> Any:
        vectors = np.asarray([r["embedding"] for r in results], dtype=np.float32)
        vectors = truncate_dimensions(vectors, call.state["dimensions"], normalize=call.state["dimensions"] is not None)
        data = []
        for i, v in enumerate(vectors):
            emb: Any = base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") if call.state["format"] == "base64" else v
            data.append({"object": "embedding", "index": i, "embedding": emb})
        return {"object": "list", "data": data, "model": call.model, "usage": _usage(call)}


class TEIEmbed:
    method, path = "POST", "/embed"
    summary = "text-embeddings-inference's /embed: {inputs, normalize, truncate, dimensions, prompt_name} -> [[float]]."
    needs = ("embedding",)

    def parse(self, body: Any, models: Mapping[str, Any]) -> Call:
        b = _object(body, self.path, {"inputs", "normalize", "truncate", "truncation_direction", "dimensions", "model",
                                      "prompt_name"})
        _truncation(b, self.path)
        name = pick_model(models, b.get("model"), self.needs, self.path)
        normalize = _flag(b, "normalize", self.path, default=True)
        return Call(name, _texts(b.get("inputs"), "inputs", self.path), _prompt(models[name], name, b.get("prompt_name"), self.path),
                    state={"normalize": normalize, "dimensions": _positive(b.get("dimensions"), "dimensions", self.path)})

    def respond(self, call: Call, results: list[Prediction], model: Any) -> Any:
        vectors = np.asarray([r["embedding"] for r in results], dtype=np.float32)
        return truncate_dimensions(vectors, call.state["dimensions"], normalize=call.state["normalize"])


class TEIPredict:
    method, path = "POST", "/predict"
    summary = "text-embeddings-inference's /predict (classification): {inputs, raw_scores} -> [[{label, score}]]."
    needs = ("logits",)

    def parse(self, body: Any, models: Mapping[str, Any]) -> Call:
        b = _object(body, self.path, {"inputs", "raw_scores", "truncate", "truncation_direction", "model"})
        _truncation(b, self.path)
        name = pick_model(models, b.get("model"), self.needs, self.path)
        if _flag(b, "raw_scores", self.path):
            raise HTTPError(422, f"{self.path}: raw_scores is not supported; scores are the model's probabilities",
                            "leave 'raw_scores' out")
        raw = b.get("inputs")
        # as TEI reads it: a text, or [text, pair], is one input; any other list is a batch of those
        single = isinstance(raw, str) or (isinstance(raw, list) and len(raw) == 2 and all(isinstance(x, str) for x in raw))
        items = [raw] if single else raw
        if not isinstance(items, list) or not items:
            raise HTTPError(422, f"{self.path}: 'inputs' must be a text, a [text, pair] list, or a list of those")
        inputs: list[Any] = []
        for x in items:
            if isinstance(x, str):
                inputs.append(x)
            elif isinstance(x, list) and len(x) == 2 and all(isinstance(t, str) for t in x):
                inputs.append({"text": x[0], "text_pair": x[1]})
            else:
                raise HTTPError(422, f"{self.path}: each input must be a text or a [text, pair] list")
        return Call(name, inputs, state={"single": single})

    def respond(self, call: Call, results: list[Prediction], model: Any) -> Any:
        labels = list(model.pipe.meta.labels or ())
        out = []
        for r in results:
            probs = r.get("probabilities")
            if isinstance(probs, dict):
                scores = sorted(({"label": k, "score": float(v)} for k, v in probs.items()), key=lambda s: -s["score"])
            elif "score" in r and len(labels) == 1:  # regression: the value itself
                scores = [{"label": labels[0], "score": float(r["score"])}]
            else:
                scores = [{"label": r.get("label"), "score": float(r.get("score", 0.0))}]
            out.append(scores)
        return out[0] if call.state["single"] else out


def cross_encoder(models: Mapping[str, Any], requested: Any, route: str) -> str:
    """A sequence classifier with one label (its logit: the relevance), else a 422 saying what it is."""
    name = pick_model(models, requested, ("logits",), route)
    labels = list(models[name].pipe.meta.labels or ())
    if len(labels) != 1:
        raise HTTPError(422, f"model '{name}' has {len(labels)} labels; {route} needs a cross-encoder (one relevance score)",
                        "export a one-label sequence classifier (a sentence-transformers CrossEncoder, bge-reranker ...)")
    return name


def reranker(models: Mapping[str, Any], requested: Any, route: str) -> str:
    """A cross-encoder (cross_encoder's), or a late-interaction model (token vectors: MaxSim ranks)."""
    late = [n for n, m in models.items() if late_interaction(m.pipe)]
    if requested is not None and requested in late:
        return str(requested)
    if requested is None and late:
        cross = [n for n, m in models.items() if "logits" in m.pipe.meta.outputs and len(m.pipe.meta.labels or ()) == 1]
        if len(late) + len(cross) > 1:
            raise HTTPError(422, f"{route}: say which model (\"model\": NAME)", f"the rerankers: {', '.join(late + cross)}")
        return late[0]
    return cross_encoder(models, requested, route)


def _rerank_call(route: str, model: str, query: Any, documents: Any, models: Mapping[str, Any]) -> Call:
    if not isinstance(query, str) or not query.strip():
        raise HTTPError(422, f"{route}: 'query' must be a non-empty text")
    docs = [d.get("text") if isinstance(d, dict) else d for d in documents] if isinstance(documents, list) else None
    if not docs or not all(isinstance(d, str) for d in docs):
        raise HTTPError(422, f"{route}: the documents must be a non-empty list of texts")
    if late_interaction(models[model].pipe):  # the query's token vectors and each document's, then MaxSim
        inputs: list[Any] = [{"text": query, "input_type": "query"}, *({"text": d, "input_type": "document"} for d in docs)]
        return Call(model, inputs, state={"documents": docs, "late": True})
    return Call(model, [{"text": query, "text_pair": d} for d in docs], state={"documents": docs, "late": False})


def _rerank_scores(call: Call, results: list[Prediction], raw: bool, model: Any) -> list[float]:
    """Each document's relevance: MaxSim (late interaction), or the cross-encoder's as ``relevance`` gives it."""
    if call.state["late"]:
        return maxsim_of(results[0], results[1:])
    return relevance(results, raw, model.pipe.meta)


class Rerank:
    method, path = "POST", "/v1/rerank"
    summary = "Rerank documents for a query (infinity / Cohere shape): {model, query, documents, top_n, return_documents}."

    def parse(self, body: Any, models: Mapping[str, Any]) -> Call:
        b = _object(body, self.path, {"model", "query", "documents", "top_n", "return_documents", "raw_scores"})
        top_n = _positive(b.get("top_n"), "top_n", self.path)
        call = _rerank_call(self.path, reranker(models, b.get("model"), self.path), b.get("query"), b.get("documents"), models)
        call.state.update(top_n=top_n, documents_back=_flag(b, "return_documents", self.path), raw=_flag(b, "raw_scores", self.path))
        return call

    def respond(self, call: Call, results: list[Prediction], model: Any) -> Any:
        scores = _rerank_scores(call, results, call.state["raw"], model)
        docs = call.state["documents"]
        out = [{"index": i, "relevance_score": scores[i], **({"document": {"text": docs[i]}} if call.state["documents_back"] else {})}
               for i in ranked(scores, call.state["top_n"])]
        return {"object": "rerank", "results": out, "model": call.model, "usage": _usage(call)}


class TEIRerank:
    method, path = "POST", "/rerank"
    summary = "text-embeddings-inference's /rerank: {query, texts, raw_scores, return_text} -> [{index, score, text?}]."

    def parse(self, body: Any, models: Mapping[str, Any]) -> Call:
        b = _object(body, self.path, {"query", "texts", "raw_scores", "return_text", "truncate", "truncation_direction", "model"})
        _truncation(b, self.path)
        call = _rerank_call(self.path, reranker(models, b.get("model"), self.path), b.get("query"), b.get("texts"), models)
        call.state.update(raw=_flag(b, "raw_scores", self.path), text=_flag(b, "return_text", self.path))
        return call

    def respond(self, call: Call, results: list[Prediction], model: Any) -> Any:
        scores = _rerank_scores(call, results, call.state["raw"], model)
        docs = call.state["documents"]
        return [{"index": i, "score": scores[i], **({"text": docs[i]} if call.state["text"] else {})} for i in ranked(scores, None)]


class TEIEmbedSparse:
    method, path = "POST", "/embed_sparse"
    summary = "text-embeddings-inference's /embed_sparse (SPLADE): {inputs} -> [[{index, value}]]."
    needs = ("indices", "values")

    def parse(self, body: Any, models: Mapping[str, Any]) -> Call:
        b = _object(body, self.path, {"inputs", "truncate", "truncation_direction", "model", "prompt_name"})
        _truncation(b, self.path)
        name = pick_model(models, b.get("model"), self.needs, self.path)
        return Call(name, _texts(b.get("inputs"), "inputs", self.path), _prompt(models[name], name, b.get("prompt_name"), self.path))

    def respond(self, call: Call, results: list[Prediction], model: Any) -> Any:
        return [[{"index": i, "value": v} for i, v in zip(r["indices"], r["values"])] for r in results]


class TEITokenize:
    """Tokens of each input as the model sees them: its prompt first, clipped at its max length (as every
    other route clips), so a 9 MB text costs what the max length uses (text/truncation.py's clip_text).
    The model itself does not run (``runs_model``); the tokenizing runs off the event loop (``offload``),
    with a copy of the model's tokenizer (truncation is a setting of the tokenizer, which the model's
    batches share)."""

    method, path = "POST", "/tokenize"
    summary = ("text-embeddings-inference's /tokenize: {inputs, add_special_tokens} -> [[{id, text, special, start, stop}]], "
               "each input's tokens as the model sees them, at most its max length.")
    runs_model = False
    offload = True
    copies: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
    lock = threading.Lock()

    def parse(self, body: Any, models: Mapping[str, Any]) -> Call:
        b = _object(body, self.path, {"inputs", "add_special_tokens", "model", "prompt_name"})
        name = b.get("model")
        if name is None and len(models) == 1:
            name = next(iter(models))
        if not isinstance(name, str) or name not in models:
            raise HTTPError(404 if name is not None else 422, f"{self.path}: say which model (\"model\": NAME)"
                            if name is None else f"no model named {name!r}", f"the models: {', '.join(models)}")
        prompt = b.get("prompt_name")
        _prompt(models[name], name, prompt, self.path)  # one the model has
        prefix = models[name].pipe.meta.options.get(f"{prompt}_prompt", "") if prompt else ""
        return Call(name, _texts(b.get("inputs"), "inputs", self.path),
                    state={"special": _flag(b, "add_special_tokens", self.path, default=True), "prompt": prefix})

    def respond(self, call: Call, results: list[Prediction], model: Any) -> Any:
        from mlmkit.text.truncation import clip_text, tokenizer_settings

        out = []
        n = model.pipe.max_length
        with self.lock:  # one at a time: the copy's truncation setting is shared too
            tok = self.copies.get(model.pipe)
            if tok is None:
                tok = self.copies[model.pipe] = type(model.pipe.tokenizer).from_str(model.pipe.tokenizer.to_str())
            texts = [clip_text(call.state["prompt"] + t, tok, n) for t in call.inputs]  # its prompt first
            with tokenizer_settings(tok, max_length=n):
                encs = tok.encode_batch(texts, add_special_tokens=call.state["special"])
        for enc in encs:
            out.append([{"id": i, "text": t, "special": bool(m), "start": a, "stop": b}
                        for i, t, m, (a, b) in zip(enc.ids, enc.tokens, enc.special_tokens_mask, enc.offsets)])
        return out


class Search:
    """An index's top k for query texts (embedded as queries by the bundle that built the index) or for
    query vectors (the model does not run). The search itself runs off the event loop (``offload``), one
    at a time, so that its memory stays one search's (retrieval/index/search.py: QUERY_BLOCK x (CHUNK + k) scores)."""

    method, path = "POST", "/v1/search"
    summary = ("Search an index (mlmkit serve --index): {index, query, vector, top_k, rescore, hybrid, fusion, weights} -> "
               "{results: [{hits: [{id, score}]}]}: query texts or vectors, a result per query, hits best first; "
               "\"hybrid\": \"bm25\" (with --corpus) or other indexes' names fuses their rankings.")
    offload = True
    searching = threading.Lock()

    def parse(self, body: Any, models: Mapping[str, Any]) -> Call:
        b = _object(body, self.path, {"index", "query", "vector", "top_k", "rescore", "hybrid", "fusion", "weights", "where",
                                      "chunk_agg"})
        served = {n: (m, ix) for m, model in models.items() for n, ix in model.indexes.items()}
        if not served:
            raise HTTPError(404, f"{self.path}: no index is served", "start the server with --index PATH (built by mlmkit index)")
        name = b.get("index")
        if name is None and len(served) == 1:
            name = next(iter(served))
        if not isinstance(name, str) or name not in served:
            raise HTTPError(404 if name is not None else 422, f"{self.path}: no index named {name!r}" if name is not None
                            else f"{self.path}: say which index (\"index\": NAME)", f"the indexes: {', '.join(served)}")
        model, ix = served[name]
        top_k = _positive(b.get("top_k"), "top_k", self.path) or 10
        if top_k > ix.count:
            raise HTTPError(422, f"{self.path}: top_k {top_k} is past index '{name}''s {ix.count:,} documents",
                            f"ask for {ix.count} or fewer")
        rescore = _positive(b.get("rescore"), "rescore", self.path)
        if rescore is not None and rescore < top_k:
            raise HTTPError(422, f"{self.path}: rescore {rescore} is below top_k {top_k}", "rescore at least top_k candidates")
        state = {"name": name, "index": ix, "top_k": top_k, "rescore": rescore, "where": _conditions(b.get("where"), self.path),
                 "chunk_agg": _chunk_agg(b.get("chunk_agg", "max"), ix, b.get("hybrid") is not None, self.path)}
        if (b.get("query") is None) == (b.get("vector") is None):
            raise HTTPError(422, f"{self.path}: send 'query' (a text or a list of texts) or 'vector' (a list of numbers, "
                                 "or a list of those), one of the two")
        if b.get("vector") is not None and ix.kind in ("sparse", "multivector"):
            what = "sparse (an inverted index)" if ix.kind == "sparse" else "multi-vector (a vector a token)"
            raise HTTPError(422, f"{self.path}: index '{name}' is {what}: send 'query' texts, not 'vector'")
        if b.get("hybrid") is not None:
            state.update(self._hybrid(b, name, models, served))
            if b.get("vector") is not None:
                raise HTTPError(422, f"{self.path}: a hybrid search ranks query texts with each retriever: send 'query', not 'vector'")
        if b.get("vector") is not None:
            state["vectors"] = _vectors(b["vector"], ix.dims, self.path)
            return Call(model, [], state=state, size=len(state["vectors"]))
        from mlmkit.retrieval.index import as_input

        return Call(model, _texts(b.get("query"), "query", self.path), as_input(models[model].pipe, "query"), state=state)

    def _hybrid(self, b: JSONObject, name: str, models: Mapping[str, Any], served: dict[str, Any]) -> dict[str, Any]:
        """A hybrid search's partners ("bm25": the index's --corpus; other served indexes by name), fusion and weights."""
        import asyncio

        from mlmkit.args import check_weights
        from mlmkit.errors import MlmkitError
        from mlmkit.retrieval.index.hybrid import FUSIONS

        wanted = [b["hybrid"]] if isinstance(b["hybrid"], str) else b["hybrid"]
        if not isinstance(wanted, list) or not wanted or not all(isinstance(x, str) for x in wanted):
            raise HTTPError(422, f"{self.path}: 'hybrid' must be \"bm25\", an index's name, or a list of those")
        partners: list[tuple[str, Any]] = []
        for other in wanted:
            if other == "bm25":
                lexical = models[served[name][0]].bm25.get(name)
                if lexical is None:
                    raise HTTPError(422, f"{self.path}: no BM25 for index '{name}': the server has no --corpus for it",
                                    f"start the server with --corpus {name}=FILE (the documents the index was built from)")
                partners.append(("bm25", lexical))
            elif other in served and other != name:
                partners.append((other, served[other]))
            else:
                raise HTTPError(422, f"{self.path}: hybrid {other!r} is neither bm25 nor another served index",
                                f"the indexes: {', '.join(n for n in served if n != name) or 'none but this one'}")
        fusion = b.get("fusion", "rrf")
        if fusion not in FUSIONS:
            raise HTTPError(422, f"{self.path}: 'fusion' must be one of {', '.join(FUSIONS)}, got {fusion!r}")
        weights = b.get("weights")
        if weights is not None and (not isinstance(weights, list) or not all(isinstance(w, (int, float)) and not isinstance(w, bool)
                                                                             for w in weights)):
            raise HTTPError(422, f"{self.path}: 'weights' must be a list of numbers, one a retriever (this index first)")
        try:
            weights = check_weights(weights, len(partners) + 1)
        except MlmkitError as e:
            raise HTTPError(422, f"{self.path}: {e.message}", e.hint) from None
        return {"partners": partners, "fusion": fusion, "weights": weights, "loop": asyncio.get_running_loop(), "models": models}

    def respond(self, call: Call, results: list[Prediction], model: Any) -> Any:
        from mlmkit.errors import MlmkitError
        from mlmkit.retrieval.index import as_queries, hits, search_vectors
        from mlmkit.retrieval.index.filters import rows as filtered

        st = call.state
        q = st.get("vectors")
        if q is None:
            q = as_queries(st["index"], results)
        try:
            where = filtered(st["index"], st["where"])
            if st.get("partners"):
                found = self._fused(call, q, results, where)
            else:
                with self.searching:
                    rows, scores = search_vectors(st["index"], q, st["top_k"], rescore=st["rescore"], where=where,
                                                  chunk_agg=st["chunk_agg"])
                found = hits(st["index"], rows, scores)
        except MlmkitError as e:
            raise HTTPError(422, f"{self.path}: {e.message}", e.hint) from None
        body = {"object": "search", "index": st["name"], "model": call.model, "results": [{"hits": h} for h in found],
                "usage": _usage(call)}
        if st.get("partners"):
            body.update(hybrid=[n for n, _ in st["partners"]], fusion=st["fusion"])
        return body

    def _fused(self, call: Call, q: Any, results: list[Prediction], where: Any) -> list[list[dict[str, Any]]]:
        """Each query's hits fused from this index's ranking and its partners' (retrieval/index/hybrid.py): a
        partner index of another model has the queries embedded by that model, through its queue;
        ``where``: this index's rows a filter keeps, whose ids the partners keep."""
        import asyncio

        from mlmkit.retrieval.index import as_input, as_queries
        from mlmkit.retrieval.index.hybrid import DEPTH, fuse, ranking_of, rows_of_ids, same_corpus

        st = call.state
        depth, texts = max(st["top_k"], DEPTH), call.inputs
        vectors: list[Any] = []
        for other, partner in st["partners"]:
            if other != "bm25":
                owner, ix = partner
                got = results if owner == call.model else asyncio.run_coroutine_threadsafe(
                    st["models"][owner].predict(texts, as_input(st["models"][owner].pipe, "query")), st["loop"]).result()[0]
                vectors.append(as_queries(ix, got))
        only = None if where is None else set(st["index"].ids(np.flatnonzero(where)))
        with self.searching:
            each = [ranking_of(st["index"], q, depth, st["rescore"], where)]
            for other, partner in st["partners"]:
                if other == "bm25":
                    each.append(partner.rank(texts, depth, only))
                    continue
                same_corpus((f"index '{st['name']}'", st["index"].id_hashes), (f"index '{other}'", partner[1].id_hashes))
                each.append(ranking_of(partner[1], vectors.pop(0), depth, None, None if only is None else rows_of_ids(partner[1], only)))
        return [[{"id": d, "score": s} for d, s in fuse(parts, st["fusion"], st["weights"], st["top_k"])] for parts in zip(*each)]


def _conditions(value: Any, route: str) -> list[Any]:
    """'where': a condition or a list of them, as `mlmkit search --where` takes them (filters.py); else a 422."""
    from mlmkit.errors import MlmkitError
    from mlmkit.retrieval.index.filters import parse

    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(x, str) for x in items):
        raise HTTPError(422, f"{route}: 'where' must be a condition (\"lang=en\", \"year>=2020\", \"id in a,b\") or a list of them")
    if any(x.split(" in ", 1)[-1].lstrip().startswith("@") for x in items if " in " in x):
        raise HTTPError(422, f"{route}: 'where' takes its values inline: \"FIELD in A,B\" (no @FILE on the server)")
    try:
        return parse(items)
    except MlmkitError as e:
        raise HTTPError(422, f"{route}: {e.message}", e.hint) from None


def _chunk_agg(value: Any, ix: Any, hybrid: bool, route: str) -> str:
    """"chunk_agg" (max, mean, sum-top-N) for a chunked index, not with "hybrid"; else a 422."""
    from mlmkit.errors import MlmkitError
    from mlmkit.retrieval.index.search import chunk_aggregation

    if value == "max":
        return value
    try:
        chunk_aggregation(value if isinstance(value, str) else repr(value))
    except MlmkitError as e:
        raise HTTPError(422, f"{route}: 'chunk_agg' {e.message.removeprefix('--chunk-agg ')}", e.hint) from None
    if not ix.chunked or hybrid:
        raise HTTPError(422, f"{route}: 'chunk_agg' {value} ranks a chunked index's documents alone: "
                             + ("this index is not chunked" if not ix.chunked else "not with 'hybrid'"))
    return str(value)


def _vectors(value: Any, dims: int, route: str) -> np.ndarray:
    """One query vector, or a list of them, as a (Q, dims) float32 array of finite values; else a 422."""
    rows = value if isinstance(value, list) and value and all(isinstance(v, list) for v in value) else [value]
    for i, row in enumerate(rows):
        if not isinstance(row, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in row):
            raise HTTPError(422, f"{route}: 'vector' must be a list of numbers or a list of such lists")
        if len(row) != dims:
            raise HTTPError(422, f"{route}: query vector {i + 1} has {len(row)} values; the index holds {dims}-dimensional vectors",
                            "embed queries with the index's bundle, or send its dimensions")
    with np.errstate(over="ignore"):
        x = np.asarray(rows, dtype=np.float32)
    if not np.isfinite(x).all():
        raise HTTPError(422, f"{route}: a query vector holds a value that is not a finite float32 (NaN, infinite or too large)")
    return x


ROUTES: tuple[Any, ...] = (OpenAIEmbeddings(), Rerank(), TEIEmbed(), TEIEmbedSparse(), TEIRerank(), TEIPredict(), TEITokenize(), Search())
