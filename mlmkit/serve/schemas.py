"""What each HTTP route takes and answers, as pydantic models: the request bodies are checked
against them on arrival, and /openapi.json (/docs) publishes both.

A body is checked strictly, as JSON reads it: true and false only for a flag ("false" or 0 is no
answer), a whole number only where one is asked for, no field unknown to the route (``extra="forbid"``).
A body that fails is one 4xx in mlmkit's error shape, one line naming the field (``checked``), never
FastAPI's list of validation errors. Null is a field left out. Checks that need a served model (its
prompts, its labels, an index's size) are the routes' own (openai.py, tei.py, rerank.py, search.py).

The answers' models are responses.py's. No torch.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar, cast

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    ValidationInfo,
)
from pydantic.json_schema import models_json_schema
from pydantic_core import ErrorDetails, PydanticCustomError

from mlmkit.contract import Input
from mlmkit.files import JSONObject
from mlmkit.serve.http import HTTPError

B = TypeVar("B", bound="Body")
QUOTE = "'"
SHOWN = 60
"""How many characters of a refused value a message quotes."""


# ---- what a field refuses, in one line --------------------------------------------------------------
def refuse(message: str, hint: str | None = None) -> PydanticCustomError:
    """A field's own error: its one-line message (naming the field) and how to fix the request."""
    return PydanticCustomError("mlmkit", "{message}", {"message": message, "hint": hint or ""})


def _texts(value: object, info: ValidationInfo) -> list[str]:
    """A text or a non-empty list of texts, as a list (token ids are refused: the server tokenizes)."""
    name = info.field_name
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(x, str) for x in value):
        return list(value)
    hint = f'send "{name}": "a text" or ["a text", ...]'
    if isinstance(value, list) and value and all(isinstance(x, (int, list)) for x in value):
        raise refuse(f"token ids as {name} are not accepted", hint + " (texts; the server tokenizes)")
    raise refuse(f"'{name}' must be a text or a non-empty list of texts", hint)


def _strings(what: str) -> PlainValidator:
    """A text or a list of texts (at least one), as a list; else ``what`` the field must be."""
    def check(value: object, info: ValidationInfo) -> list[str]:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items or not all(isinstance(x, str) for x in items):
            raise refuse(f"'{info.field_name}' must be {what}")
        return items

    return PlainValidator(check, json_schema_input_type=str | list[str])


def _nonempty(value: str) -> str:
    if not value.strip():
        raise refuse("'query' must be a non-empty text")
    return value


def _documents(value: object, info: ValidationInfo) -> list[str]:
    """Texts, or {"text": ...} objects (Cohere's documents), as the texts."""
    docs = [d.get("text") if isinstance(d, dict) else d for d in value] if isinstance(value, list) else None
    if not docs or not all(isinstance(d, str) for d in docs):
        raise refuse(f"'{info.field_name}' must be a non-empty list of texts")
    return [d for d in docs if isinstance(d, str)]


def _tei_inputs(value: object) -> str | list[str | list[str]]:
    """TEI's /predict inputs: a text, a [text, pair] list, or a list of those."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise refuse("'inputs' must be a text, a [text, pair] list, or a list of those")
    if not all(isinstance(x, str) or pair(x) for x in items):
        raise refuse("each input must be a text or a [text, pair] list")
    return cast("str | list[str | list[str]]", value)


def pair(x: object) -> bool:
    """Whether ``x`` is a [text, pair] list."""
    return isinstance(x, list) and len(x) == 2 and all(isinstance(t, str) for t in x)


def _records(value: object) -> list[Input]:
    if not isinstance(value, list):
        raise refuse("'inputs' must be a list of texts or records")
    return value  # each input is the task's to check (Pipeline.check): its error names the input


def _vectors(value: object) -> list[list[float]]:
    """One query vector, or a list of them, as a list of rows (their size is the index's to check)."""
    rows = value if isinstance(value, list) and value and all(isinstance(v, list) for v in value) else [value]
    for row in rows:
        if not isinstance(row, list) or not all(_number(x) for x in row):
            raise refuse("'vector' must be a list of numbers or a list of such lists")
    return cast("list[list[float]]", rows)


def _weights(value: object) -> list[float]:
    if not isinstance(value, list) or not all(_number(w) for w in value):
        raise refuse("'weights' must be a list of numbers, one a retriever (this index first)")
    return value


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _truncate(value: bool | None) -> bool | None:
    if value is False:
        raise refuse("truncate false is not supported; inputs longer than the model are truncated",
                     "leave 'truncate' out or set it true")
    return value


def _direction(value: str | None) -> str | None:
    if value not in (None, "Right", "right"):
        raise refuse(f"only truncation_direction Right is supported, got {value!r}")
    return value


Texts = Annotated[list[str], PlainValidator(_texts, json_schema_input_type=str | list[str]),
                  Field(description="A text, or a list of texts (not token ids: the server tokenizes).")]
Positive = Annotated[int, Field(ge=1)]
Truncate = Annotated[bool | None, AfterValidator(_truncate),
                     Field(description="Inputs longer than the model are always cut at the right: "
                                       "true only.")]
Direction = Annotated[str | None, AfterValidator(_direction), Field(description="\"Right\" only.")]
Model = Annotated[str | None, Field(description="Which model (GET /v1/models); needed when several fit.")]
PromptName = Annotated[str | None, Field(description="A prompt of the model by name (query, document ...), "
                                                     "put before each input.")]


# ---- requests -------------------------------------------------------------------------------------
class Body(BaseModel):
    """A request body: JSON's types as they are, no field the route does not read."""

    model_config = ConfigDict(extra="forbid", strict=True)


class RerankDocument(BaseModel):
    text: str


class EmbeddingsRequest(Body):
    """POST /v1/embeddings: OpenAI's embeddings request."""

    model: Model = None
    input: Texts
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Positive | None = Field(None, description="Keep the first N components, normalised again.")
    user: str | None = None
    input_type: Literal["query", "document"] | None = Field(
        None, description="Put the model's query or document prompt before the inputs.")


class RerankRequest(Body):
    """POST /v1/rerank: infinity's and Cohere's rerank request."""

    model: Model = None
    query: Annotated[str, AfterValidator(_nonempty)]
    documents: Annotated[list[str], PlainValidator(_documents,
                                                   json_schema_input_type=list[str | RerankDocument])]
    top_n: Positive | None = None
    return_documents: bool | None = None
    raw_scores: bool | None = None


class EmbedRequest(Body):
    """POST /embed: text-embeddings-inference's."""

    inputs: Texts
    normalize: bool | None = None
    truncate: Truncate = None
    truncation_direction: Direction = None
    dimensions: Positive | None = None
    model: Model = None
    prompt_name: PromptName = None


class EmbedSparseRequest(Body):
    """POST /embed_sparse: text-embeddings-inference's (SPLADE)."""

    inputs: Texts
    truncate: Truncate = None
    truncation_direction: Direction = None
    model: Model = None
    prompt_name: PromptName = None


class TEIRerankRequest(Body):
    """POST /rerank: text-embeddings-inference's."""

    query: Annotated[str, AfterValidator(_nonempty)]
    texts: Annotated[list[str], PlainValidator(_documents, json_schema_input_type=list[str])]
    raw_scores: bool | None = None
    return_text: bool | None = None
    truncate: Truncate = None
    truncation_direction: Direction = None
    model: Model = None


class TEIPredictRequest(Body):
    """POST /predict: text-embeddings-inference's classification request."""

    inputs: Annotated[str | list[str | list[str]], PlainValidator(
        _tei_inputs, json_schema_input_type=str | list[str | list[str]])]
    raw_scores: bool | None = None
    truncate: Truncate = None
    truncation_direction: Direction = None
    model: Model = None


class TokenizeRequest(Body):
    """POST /tokenize: text-embeddings-inference's."""

    inputs: Texts
    add_special_tokens: bool | None = None
    model: Model = None
    prompt_name: PromptName = None


class SearchRequest(Body):
    """POST /v1/search: an index's top k for query texts or query vectors."""

    index: str | None = None
    query: Texts | None = None
    vector: Annotated[list[list[float]] | None, PlainValidator(
        _vectors, json_schema_input_type=list[float] | list[list[float]] | None)] = None
    top_k: Positive | None = None
    rescore: Positive | None = None
    hybrid: Annotated[list[str] | None, _strings("\"bm25\", an index's name, or a list of those")] = None
    fusion: str | None = None
    weights: Annotated[list[float] | None,
                       PlainValidator(_weights, json_schema_input_type=list[float])] = None
    where: Annotated[list[str] | None, _strings(
        "a condition (\"lang=en\", \"year>=2020\", \"id in a,b\") or a list of them")] = None
    chunk_agg: str | None = None


class PredictRequest(Body):
    """POST /v1/models/{name}/predict: mlmkit's own."""

    inputs: Annotated[list[Input],
                      PlainValidator(_records, json_schema_input_type=list[str | dict[str, Any]]),
                      Field(description="Texts, or records: {text, text_pair}, {question, context}, "
                                        "or the fields the task reads.")]
    options: JSONObject | None = Field(None, description="The task's runtime options by name, e.g. "
                                                             "{\"top_k\": 3} (GET /v1/models lists each "
                                                             "model's).")


def checked(model: type[B], body: object, route: str | None) -> B:
    """``body`` as ``model``, or the one-line 4xx saying what is wrong with it (``route``: the path its
    messages start with; None: mlmkit's own predict route, whose messages say "in the body")."""
    try:
        return model.model_validate(body, strict=True)
    except ValidationError as e:
        raise refusal(e.errors(include_url=False), model, route) from None


def refusal(errors: list[ErrorDetails], model: type[Body], route: str | None) -> HTTPError:
    """The first thing wrong with a body, as one 422 naming the field: unknown fields first."""
    at = f"{route}: " if route else ""
    fields = ", ".join(sorted(model.model_fields))
    hint = f"its fields: {fields}" if route else 'send {"inputs": [...]} (and "options": {...} if any)'
    extra = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
    if extra:
        where = "" if route else "in the body: "
        return HTTPError(422, f"{at}unknown field(s) {where}{', '.join(extra)}", hint)
    e = next((e for e in errors if e["type"] == "mlmkit"), errors[0])
    if not e["loc"]:
        return HTTPError(422, f"{at}the body must be a JSON object, got {type(e['input']).__name__}", hint)
    if e["type"] == "mlmkit":
        ctx = e.get("ctx") or {}
        return HTTPError(422, at + ctx["message"], ctx.get("hint") or None)
    name, got = str(e["loc"][0]), _shown(e["input"])
    said = {
        "missing": f"'{name}' is missing",
        "bool_type": f"'{name}' must be true or false, got {got}",
        "int_type": f"'{name}' must be a positive whole number, got {got}",
        "greater_than_equal": f"'{name}' must be a positive whole number, got {got}",
        "string_type": f"'{name}' must be a text, got {got}",
        "dict_type": f"'{name}' must be an object (names and values), got {got}",
        "literal_error": f"{name} must be {str((e.get('ctx') or {}).get('expected')).replace(QUOTE, '')}, "
                         f"got {got}",
    }.get(e["type"])
    if said is None:
        where = ".".join(str(x) for x in e["loc"])
        said = f"'{where}': {e['msg'][:1].lower()}{e['msg'][1:]}, got {got}"
    field = model.model_fields.get(name)
    return HTTPError(422, at + said, hint if e["type"] == "missing" else field and field.description)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN else text[:SHOWN] + "..."


def request_schemas(models: list[type[Body]]) -> dict[str, JSONObject]:
    """The request models' JSON schemas (and those they use), by name, as OpenAPI's components."""
    _, top = models_json_schema([(m, "validation") for m in models],
                                ref_template="#/components/schemas/{model}")
    return top.get("$defs", {})
