"""OpenAI's embeddings API, POST /v1/embeddings: what the `openai` client, LangChain, LlamaIndex and
the vector databases send. Vectors in input order, as floats or base64 (little-endian float32);
``dimensions`` keeps the first N components, normalised again (Matryoshka models); ``input_type``
puts the model's query or document prompt before the inputs. No torch.
"""

from __future__ import annotations

import base64
from typing import TypedDict

import numpy as np

from mlmkit.contract import Prediction
from mlmkit.files import JSONObject
from mlmkit.serve.responses import EmbeddingsResponse
from mlmkit.serve.routes import (
    Answer,
    Call,
    Model,
    Models,
    Route,
    input_type,
    pick_model,
    truncate_dimensions,
    usage,
)
from mlmkit.serve.schemas import EmbeddingsRequest


class EmbeddingsState(TypedDict):
    format: str
    dimensions: int | None


class OpenAIEmbeddings(Route[EmbeddingsRequest, EmbeddingsState]):
    path = "/v1/embeddings"
    summary = "OpenAI's embeddings API: {model, input, encoding_format, dimensions, input_type}."
    request, response = EmbeddingsRequest, EmbeddingsResponse
    needs = ("embedding",)

    def call(self, request: EmbeddingsRequest, models: Models) -> Call[EmbeddingsState]:
        name = pick_model(models, request.model, self.needs, self.path)
        state: EmbeddingsState = {"format": request.encoding_format or "float",
                                  "dimensions": request.dimensions}
        return Call(name, list(request.input), state, input_type(models[name], request.input_type))

    def answer(self, call: Call[EmbeddingsState], results: list[Prediction], model: Model) -> Answer:
        n = call.state["dimensions"]
        vectors = np.asarray([r["embedding"] for r in results], dtype=np.float32)
        vectors = truncate_dimensions(vectors, n, normalize=n is not None)
        data: list[JSONObject] = []
        for i, v in enumerate(vectors):
            emb: str | np.ndarray = v
            if call.state["format"] == "base64":  # little-endian float32, as OpenAI sends it
                emb = base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
            data.append({"object": "embedding", "index": i, "embedding": emb})
        return {"object": "list", "data": data, "model": call.model, "usage": usage(call)}


ROUTES = (OpenAIEmbeddings(),)
