"""What each HTTP route answers, as pydantic models: /openapi.json (/docs) publishes them beside the
request bodies (schemas.py). The routes write their bodies themselves (orjson, vectors from their
numpy buffers), so an answer is never validated twice. No torch.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

from mlmkit.files import JSONObject
from mlmkit.serve.schemas import RerankDocument


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="The vector, or its little-endian float32 bytes in "
                                                     "base64.")


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: Usage


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankResponse(BaseModel):
    object: Literal["rerank"] = "rerank"
    results: list[RerankResult] = Field(description="Best first.")
    model: str
    usage: Usage


class EmbedResponse(RootModel[list[list[float]]]):
    """A vector an input, in input order."""


class SparseValue(BaseModel):
    index: int
    value: float


class EmbedSparseResponse(RootModel[list[list[SparseValue]]]):
    """An input's vocabulary entries and their weights, in input order."""


class TEIRank(BaseModel):
    index: int
    score: float
    text: str | None = None


class TEIRerankResponse(RootModel[list[TEIRank]]):
    """The texts best first."""


class LabelScore(BaseModel):
    label: str | None
    score: float


class TEIPredictResponse(RootModel[list[list[LabelScore]] | list[LabelScore]]):
    """Each input's labels best first (one input: its list alone)."""


class Token(BaseModel):
    id: int
    text: str
    special: bool
    start: int
    stop: int


class TokenizeResponse(RootModel[list[list[Token]]]):
    """Each input's tokens as the model sees them."""


class Hit(BaseModel):
    model_config = ConfigDict(extra="allow")  # a chunked index's hits name their chunk too

    id: str
    score: float


class SearchResult(BaseModel):
    hits: list[Hit] = Field(description="Best first.")


class SearchResponse(BaseModel):
    object: Literal["search"] = "search"
    index: str
    model: str
    results: list[SearchResult] = Field(description="A result per query, in order.")
    usage: Usage
    hybrid: list[str] | None = None
    fusion: str | None = None


class PredictResponse(BaseModel):
    results: list[JSONObject] = Field(description="A result per input, in input order: a line of "
                                                      "`mlmkit predict`'s JSON lines.")
    warnings: list[str] | None = Field(None, description="The inputs that were truncated.")


class ModelInfo(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    task: str
    labels: list[str] | None
    max_length: int
    options: list[str]
    source: str | None


class ModelCard(ModelInfo):
    """A model in OpenAI's list shape, with mlmkit's fields."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
    models: list[ModelInfo]


class Status(BaseModel):
    status: str
    models: list[str] | None = None
    loading: list[str] | None = None


class ErrorBody(BaseModel):
    """Every answer other than 200."""

    error: str
    hint: str | None = None
    request_id: str
