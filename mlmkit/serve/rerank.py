"""Reranking, POST /v1/rerank as infinity and Cohere shape it, and what TEI's /rerank shares with it
(tei.py): which model reranks, and each document's relevance.

Reranking runs a cross-encoder: a classification bundle with one output (what sentence-transformers'
CrossEncoder saves: ms-marco-MiniLM, bge-reranker), each (query, document) pair one input; or a
colbert bundle: the query and the documents each one input, of its kind, ranked by MaxSim. No torch.
"""

from __future__ import annotations

from typing import TypedDict

from mlmkit.contract import Input, Prediction
from mlmkit.files import JSONObject
from mlmkit.retrieval.reranking import late_interaction, maxsim_of, ranked, relevance
from mlmkit.serve.http import HTTPError
from mlmkit.serve.responses import RerankResponse
from mlmkit.serve.routes import Answer, Call, Model, Models, Route, pick_model, usage
from mlmkit.serve.schemas import RerankRequest


class RerankState(TypedDict):
    documents: list[str]
    late: bool  # a late-interaction model: the query's token vectors against each document's
    raw: bool  # the logits as they are, not under the model's activation
    top_n: int | None
    back: bool  # the documents' texts in the answer


def cross_encoder(models: Models, requested: str | None, route: str) -> str:
    """A sequence classifier with one label (its logit: the relevance), else a 422 saying what it is."""
    name = pick_model(models, requested, ("logits",), route)
    labels = list(models[name].pipe.meta.labels or ())
    if len(labels) != 1:
        raise HTTPError(422, f"model '{name}' has {len(labels)} labels; {route} needs a cross-encoder "
                             "(one relevance score)",
                        "export a one-label sequence classifier (a sentence-transformers CrossEncoder, "
                        "bge-reranker ...)")
    return name


def reranker(models: Models, requested: str | None, route: str) -> str:
    """A cross-encoder (cross_encoder's), or a late-interaction model (token vectors: MaxSim ranks)."""
    late = [n for n, m in models.items() if late_interaction(m.pipe)]
    if requested is not None and requested in late:
        return requested
    if requested is None and late:
        cross = [n for n, m in models.items()
                 if "logits" in m.pipe.meta.outputs and len(m.pipe.meta.labels or ()) == 1]
        if len(late) + len(cross) > 1:
            raise HTTPError(422, f"{route}: say which model (\"model\": NAME)",
                            f"the rerankers: {', '.join(late + cross)}")
        return late[0]
    return cross_encoder(models, requested, route)


def rerank_call(model: str, query: str, docs: list[str], models: Models, raw: bool, top_n: int | None = None,
                back: bool = False) -> Call[RerankState]:
    """The call that scores ``docs`` for ``query``: a (query, document) pair an input for a cross-encoder;
    the query and each document, of their kinds, for a late-interaction model."""
    late = late_interaction(models[model].pipe)
    state: RerankState = {"documents": docs, "late": late, "raw": raw, "top_n": top_n, "back": back}
    inputs: list[Input]
    if late:
        inputs = [{"text": query, "input_type": "query"},
                  *({"text": d, "input_type": "document"} for d in docs)]
    else:
        inputs = [{"text": query, "text_pair": d} for d in docs]
    return Call(model, inputs, state)


def rerank_scores(call: Call[RerankState], results: list[Prediction], model: Model) -> list[float]:
    """Each document's relevance: MaxSim (late interaction), or the cross-encoder's as ``relevance``
    gives it."""
    if call.state["late"]:
        return maxsim_of(results[0], results[1:])
    return relevance(results, call.state["raw"], model.pipe.meta)


class Rerank(Route[RerankRequest, RerankState]):
    path = "/v1/rerank"
    summary = ("Rerank documents for a query (infinity / Cohere shape): "
               "{model, query, documents, top_n, return_documents}.")
    request, response = RerankRequest, RerankResponse

    def call(self, request: RerankRequest, models: Models) -> Call[RerankState]:
        name = reranker(models, request.model, self.path)
        return rerank_call(name, request.query, request.documents, models, raw=bool(request.raw_scores),
                           top_n=request.top_n, back=bool(request.return_documents))

    def answer(self, call: Call[RerankState], results: list[Prediction], model: Model) -> Answer:
        scores = rerank_scores(call, results, model)
        docs = call.state["documents"]
        out: list[JSONObject] = [{"index": i, "relevance_score": scores[i],
                                  **({"document": {"text": docs[i]}} if call.state["back"] else {})}
                                 for i in ranked(scores, call.state["top_n"])]
        return {"object": "rerank", "results": out, "model": call.model, "usage": usage(call)}


ROUTES = (Rerank(),)
