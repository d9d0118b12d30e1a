"""text-embeddings-inference's routes: POST /embed, /embed_sparse (SPLADE), /rerank, /predict
(classification) and /tokenize, in TEI's shapes.

No field is accepted and ignored: ``truncate`` and ``truncation_direction`` are read (inputs longer
than the model are always cut at the right, so asking otherwise is refused, schemas.py), and
``prompt_name`` puts one of the model's prompts before each input. No torch.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, TypedDict

import numpy as np

from mlmkit.contract import Input, Prediction
from mlmkit.files import JSONObject
from mlmkit.retrieval.reranking import ranked
from mlmkit.serve.http import HTTPError
from mlmkit.serve.rerank import RerankState, rerank_call, rerank_scores, reranker
from mlmkit.serve.responses import (
    EmbedResponse,
    EmbedSparseResponse,
    TEIPredictResponse,
    TEIRerankResponse,
    TokenizeResponse,
)
from mlmkit.serve.routes import (
    Answer,
    Call,
    Model,
    Models,
    NoState,
    Route,
    pick_model,
    prompt,
    truncate_dimensions,
)
from mlmkit.serve.schemas import (
    EmbedRequest,
    EmbedSparseRequest,
    TEIPredictRequest,
    TEIRerankRequest,
    TokenizeRequest,
    pair,
)


class EmbedState(TypedDict):
    normalize: bool
    dimensions: int | None


class Embed(Route[EmbedRequest, EmbedState]):
    path = "/embed"
    summary = ("text-embeddings-inference's /embed: {inputs, normalize, truncate, dimensions, prompt_name} "
               "-> [[float]].")
    request, response = EmbedRequest, EmbedResponse
    needs = ("embedding",)

    def call(self, request: EmbedRequest, models: Models) -> Call[EmbedState]:
        name = pick_model(models, request.model, self.needs, self.path)
        state: EmbedState = {"normalize": request.normalize is not False, "dimensions": request.dimensions}
        options = prompt(models[name], name, request.prompt_name, self.path)
        return Call(name, list(request.inputs), state, options)

    def answer(self, call: Call[EmbedState], results: list[Prediction], model: Model) -> Answer:
        vectors = np.asarray([r["embedding"] for r in results], dtype=np.float32)
        return truncate_dimensions(vectors, call.state["dimensions"], normalize=call.state["normalize"])


class EmbedSparse(Route[EmbedSparseRequest, NoState]):
    path = "/embed_sparse"
    summary = "text-embeddings-inference's /embed_sparse (SPLADE): {inputs} -> [[{index, value}]]."
    request, response = EmbedSparseRequest, EmbedSparseResponse
    needs = ("indices", "values")

    def call(self, request: EmbedSparseRequest, models: Models) -> Call[NoState]:
        name = pick_model(models, request.model, self.needs, self.path)
        options = prompt(models[name], name, request.prompt_name, self.path)
        return Call(name, list(request.inputs), NoState(), options)

    def answer(self, call: Call[NoState], results: list[Prediction], model: Model) -> Answer:
        return [[{"index": i, "value": v} for i, v in zip(r["indices"], r["values"])] for r in results]


class TEIRerank(Route[TEIRerankRequest, RerankState]):
    path = "/rerank"
    summary = ("text-embeddings-inference's /rerank: {query, texts, raw_scores, return_text} "
               "-> [{index, score, text?}].")
    request, response = TEIRerankRequest, TEIRerankResponse

    def call(self, request: TEIRerankRequest, models: Models) -> Call[RerankState]:
        return rerank_call(reranker(models, request.model, self.path), request.query, request.texts, models,
                           raw=bool(request.raw_scores), back=bool(request.return_text))

    def answer(self, call: Call[RerankState], results: list[Prediction], model: Model) -> Answer:
        scores = rerank_scores(call, results, model)
        docs = call.state["documents"]
        return [{"index": i, "score": scores[i], **({"text": docs[i]} if call.state["back"] else {})}
                for i in ranked(scores, None)]


class PredictState(TypedDict):
    single: bool  # one input sent on its own: its answer is its list alone


class TEIPredict(Route[TEIPredictRequest, PredictState]):
    path = "/predict"
    summary = ("text-embeddings-inference's /predict (classification): {inputs, raw_scores} "
               "-> [[{label, score}]].")
    request, response = TEIPredictRequest, TEIPredictResponse
    needs = ("logits",)

    def call(self, request: TEIPredictRequest, models: Models) -> Call[PredictState]:
        name = pick_model(models, request.model, self.needs, self.path)
        if request.raw_scores:
            raise HTTPError(422, f"{self.path}: raw_scores is not supported; scores are the model's "
                                 "probabilities", "leave 'raw_scores' out")
        raw = request.inputs
        # as TEI reads it: a text, or [text, pair], is one input; any other list is a batch of those
        single = isinstance(raw, str) or pair(raw)
        items = [raw] if single else raw
        inputs: list[Input] = [x if isinstance(x, str) else {"text": x[0], "text_pair": x[1]} for x in items]
        return Call(name, inputs, PredictState(single=single))

    def answer(self, call: Call[PredictState], results: list[Prediction], model: Model) -> Answer:
        labels = list(model.pipe.meta.labels or ())
        out: list[list[JSONObject]] = []
        for r in results:
            probs = r.get("probabilities")
            if isinstance(probs, dict):
                scores = sorted(({"label": k, "score": float(v)} for k, v in probs.items()),
                                key=lambda s: -s["score"])
            elif "score" in r and len(labels) == 1:  # regression: the value itself
                scores = [{"label": labels[0], "score": float(r["score"])}]
            else:
                scores = [{"label": r.get("label"), "score": float(r.get("score", 0.0))}]
            out.append(scores)
        return out[0] if call.state["single"] else out


class TokenizeState(TypedDict):
    special: bool  # the model's special tokens added
    prompt: str  # the prompt put before each input


class TEITokenize(Route[TokenizeRequest, TokenizeState]):
    """Tokens of each input as the model sees them: its prompt first, clipped at its max length (as every
    other route clips), so a 9 MB text costs what the max length uses (text/truncation.py's clip_text).
    The model itself does not run (``runs_model``); the tokenizing runs off the event loop (``offload``),
    with a copy of the model's tokenizer (truncation is a setting of the tokenizer, which the model's
    batches share)."""

    path = "/tokenize"
    summary = ("text-embeddings-inference's /tokenize: {inputs, add_special_tokens} "
               "-> [[{id, text, special, start, stop}]], each input's tokens as the model sees them, "
               "at most its max length.")
    request, response = TokenizeRequest, TokenizeResponse
    runs_model = False
    offload = True

    def __init__(self) -> None:
        # each pipeline's copy of its tokenizer
        self.copies: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self.lock = threading.Lock()

    def call(self, request: TokenizeRequest, models: Models) -> Call[TokenizeState]:
        name = pick_model(models, request.model, (), self.path)
        wanted = request.prompt_name
        prompt(models[name], name, wanted, self.path)  # one the model has
        prefix = models[name].pipe.meta.options.get(f"{wanted}_prompt", "") if wanted else ""
        state: TokenizeState = {"special": request.add_special_tokens is not False, "prompt": prefix}
        return Call(name, list(request.inputs), state)

    def answer(self, call: Call[TokenizeState], results: list[Prediction], model: Model) -> Answer:
        from mlmkit.text.truncation import clip_text, tokenizer_settings

        n = model.pipe.max_length
        with self.lock:  # one at a time: the copy's truncation setting is shared too
            tok = self.copies.get(model.pipe)
            if tok is None:
                tok = type(model.pipe.tokenizer).from_str(model.pipe.tokenizer.to_str())
                self.copies[model.pipe] = tok
            texts = [clip_text(call.state["prompt"] + str(t), tok, n) for t in call.inputs]  # prompt first
            with tokenizer_settings(tok, max_length=n):
                encs = tok.encode_batch(texts, add_special_tokens=call.state["special"])
        return [[{"id": i, "text": t, "special": bool(m), "start": a, "stop": b}
                 for i, t, m, (a, b) in zip(enc.ids, enc.tokens, enc.special_tokens_mask, enc.offsets)]
                for enc in encs]


ROUTES = (Embed(), EmbedSparse(), TEIRerank(), TEIPredict(), TEITokenize())
