"""Property-based tests (hypothesis): arbitrary Unicode text, empty fields, control characters, invalid
bytes and lengths from 0 to 100k go through the readers, masking and the tasks' runtime side; the only
exceptions allowed are the project's own (which the CLI turns into one line and exit status 2). JSON
records with any strings (lone surrogates too, escaped or raw) and any numbers (5,000-digit integers)
go through every JSON reader: each is a record of data or a DataFormatError naming its line."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mlmkit.errors import DataFormatError, MlmkitError
from mlmkit.files import json_line
from mlmkit.registry import TaskContext, get_task
from mlmkit.taskkit import clip_text, iter_records
from mlmkit.text.records import stdin_inputs
from mlmkit.text.tokenizer import special_ids, train_tokenizer
from mlmkit.train.corpus.files import iter_documents
from mlmkit.train.masking import mask_tokens

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
# texts from empty to 100k characters: any Unicode (control characters, zero-width spaces, combining
# marks, surrogate-free), short ones and long repetitions of short ones
ANY_TEXT = st.one_of(
    st.text(max_size=200),
    st.builds(lambda t, n: t * n, st.text(min_size=1, max_size=20), st.integers(1, 5_000)),
)
PRINTABLE = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=200)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(["the cat sat on the mat near paris", "who is john ? john is a man ."] * 5,
                           vocab_size=80, min_frequency=1)


def write(tmp: Path, name: str, data: bytes) -> Path:
    p = tmp / name
    p.write_bytes(data)
    return p


# ---- readers ------------------------------------------------------------------------------------------
NESTED = b"[" * 100_000  # json's recursion limit, reached from data


@SETTINGS
@given(data=st.one_of(ANY_TEXT.map(lambda t: t.encode("utf-8")), st.binary(max_size=300)),
       suffix=st.sampled_from([".txt", ".jsonl", ".csv", ".tsv"]))
@example(data=NESTED, suffix=".jsonl")
@example(data=b'"a\x00b"\n{"text": "\\u0000"}\n\xff\n', suffix=".jsonl")
@example(data=b"text,label\n\"open quote,x\n", suffix=".csv")
def test_record_readers_read_anything_or_say_why(tmp_path_factory, data: bytes, suffix: str) -> None:
    p = write(tmp_path_factory.mktemp("r"), "in" + suffix, data)
    try:
        records = list(iter_records(p))
    except MlmkitError as e:
        assert str(p) in str(e)  # the error names the file
        return
    for r in records:
        assert r.line is None or r.line >= 1
        assert isinstance(r.data, (str, dict))


@SETTINGS
@given(data=st.one_of(ANY_TEXT.map(lambda t: t.encode("utf-8")), st.binary(max_size=300)),
       name=st.sampled_from(["classification:d.csv", "classification:d.tsv", "classification:d.jsonl",
                             "tagging:d.conll", "tagging:d.jsonl", "qa:d.json", "qa:d.jsonl"]))
@example(data=NESTED, name="qa:d.json")
@example(data=NESTED, name="classification:d.jsonl")
@example(data=b'{"data": [{"paragraphs": [{"context": "x", "qas": [{"id": 1}]}]}]}', name="qa:d.json")
def test_task_readers_read_anything_or_say_why(tmp_path_factory, data: bytes, name: str) -> None:
    task_name, file = name.split(":")
    task = get_task(task_name)
    p = write(tmp_path_factory.mktemp("t"), file, data)
    try:
        examples = task.read(p, task.resolve_options())
    except MlmkitError:
        return
    assert isinstance(examples, list)


@SETTINGS
@given(rows=st.lists(st.fixed_dictionaries({"text": PRINTABLE,
                                            "label": st.sampled_from(["a", "b", "", " "])}), max_size=8))
def test_classification_rows_with_empty_fields(tmp_path_factory, rows: list[dict]) -> None:
    task = get_task("classification")
    p = tmp_path_factory.mktemp("c") / "d.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    try:
        examples = task.read(p, task.resolve_options())
    except MlmkitError as e:
        assert "d.jsonl" in str(e)
        return
    assert all(e["text"].strip() and e["label"].strip() for e in examples)


# ---- JSON records with any strings and numbers --------------------------------------------------------
ANY_STRING = st.lists(st.integers(0, 0x10FFFF).map(chr), max_size=20).map("".join)  # lone surrogates included
# NaN and Infinity as Python writes them
NUMBER = st.one_of(st.integers().map(str), st.floats().map(json.dumps),
                   # beyond Python's 4300 digits
                   st.integers(4000, 6000).map(lambda n: "-" * (n % 2) + "9" * n))
SCALAR = st.one_of(st.sampled_from(["null", "true", "false"]), NUMBER,
                   ANY_STRING.map(json.dumps),  # escaped: "\\ud800"
                   ANY_STRING.map(lambda t: json.dumps(t, ensure_ascii=False)))  # raw: not UTF-8 once written
VALUE = st.recursive(SCALAR, lambda kids: st.one_of(
    st.lists(kids, max_size=3).map(lambda xs: "[" + ",".join(xs) + "]"),
    st.lists(st.tuples(ANY_STRING.map(json.dumps), kids), max_size=3).map(
        lambda kv: "{" + ",".join(f"{k}: {v}" for k, v in kv) + "}")), max_leaves=6)
RECORD = st.tuples(st.one_of(ANY_STRING.map(json.dumps), VALUE), VALUE, VALUE).map(
    lambda t: f'{{"text": {t[0]}, "label": {t[1]}, "id": {t[2]}}}')


def assert_data(v: Any) -> None:
    """A value a reader may hand on: every string UTF-8 (no surrogates), every integer printable."""
    if isinstance(v, str):
        v.encode("utf-8")
    elif isinstance(v, int):
        str(v)
    elif isinstance(v, list):
        for x in v:
            assert_data(x)
    elif isinstance(v, dict):
        for k, x in v.items():
            assert_data(k)
            assert_data(x)


@SETTINGS
@given(lines=st.lists(RECORD, min_size=1, max_size=4))
@example(lines=['{"text": "\\ud800", "label": 1, "id": 2}'])
@example(lines=['{"text": "ok", "label": "a", "id": ' + "7" * 5000 + "}",
                '{"text": "\\ud83d\\ude00", "label": "b", "id": 1}'])
@example(lines=['{"text": "\udc80", "label": "a", "id": 1}'])  # raw: the file holds bytes that are not UTF-8
def test_json_records_with_any_strings_and_numbers_are_data_or_name_their_line(tmp_path_factory,
                                                                               lines: list[str]) -> None:
    p = tmp_path_factory.mktemp("j") / "d.jsonl"
    data = ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
    p.write_bytes(data)
    skipping = {"records": lambda: iter_records(p, skip=True),
                "stdin bytes": lambda: stdin_inputs(io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"),
                                                    skip=True),
                # raw surrogates, as a str
                "stdin text": lambda: stdin_inputs(io.StringIO("\n".join(lines) + "\n"), skip=True)}
    for read in skipping.values():
        items = list(read())
        assert len(items) == len(lines)  # a record or an error for each line, in its place
        for n, item in enumerate(items, start=1):
            if isinstance(item, DataFormatError):
                assert item.line == n and f"line {n}" in str(item)
            else:
                assert item.line == n
                assert_data(item.data)
                # it can be written out
                json_line(item.data if isinstance(item.data, dict) else {"text": item.data})
    task = get_task("classification")
    stopping = [lambda: list(iter_records(p)), lambda: task.read(p, task.resolve_options()),
                lambda: list(iter_documents(p))]
    for read in stopping:
        try:
            got = read()
        except DataFormatError as e:
            assert "d.jsonl" in str(e) and (e.line is None or 1 <= e.line <= len(lines))
            continue
        except MlmkitError as e:
            assert "d.jsonl" in str(e)
            continue
        assert_data(got)


# ---- masking ----------------------------------------------------------------------------------------
@settings(max_examples=80, deadline=None)
@given(B=st.integers(1, 4), T=st.integers(1, 64), seed=st.integers(0, 2**31 - 1), p=st.floats(0.01, 0.99),
       whole=st.booleans())
def test_masking_any_batch(B: int, T: int, seed: int, p: float, whole: bool) -> None:
    V = 50
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, T), generator=g)  # specials (0-4) anywhere, even everywhere
    specials = torch.arange(5)
    cont = torch.zeros(V, dtype=torch.bool)
    cont[20:30] = True
    out, labels = mask_tokens(ids, mask_id=4, special_ids=specials, vocab_size=V, mask_prob=p, generator=g,
                              continuation=cont, whole_word=whole)
    assert out.shape == labels.shape == ids.shape
    chosen = labels != -100
    assert not torch.isin(ids[chosen], specials).any()  # specials never selected
    assert torch.equal(labels[chosen], ids[chosen]) and torch.equal(out[~chosen], ids[~chosen])
    replaced = chosen & (out != 4) & (out != ids)
    assert not torch.isin(out[replaced], specials).any()  # a random token is never a special one
    eligible = ~torch.isin(ids, specials)
    assert bool(chosen.any(1)[eligible.any(1)].all())  # every row with something to mask has a mask


# ---- the runtime side of the tasks --------------------------------------------------------------------
@SETTINGS
@given(text=ANY_TEXT)
def test_tagging_any_text_round_trips_its_offsets(tok, text: str) -> None:
    task = get_task("tagging")
    ctx = TaskContext(max_length=16, options=task.resolve_options(), labels=("B-X", "I-X", "O"))
    ex = task.from_input(text, ctx.options)
    assert all(text[a:b] == w for w, (a, b) in zip(ex["tokens"], ex["offsets"]))
    if len(ex["tokens"]) > 2_000:  # the rest is linear and covered by test_reliability; keep this quick
        return
    feats = task.featurize([ex], tok, ctx, training=False)
    rng = np.random.default_rng(0)
    out = {"probabilities": [rng.dirichlet(np.ones(3), size=len(f["input_ids"])) for f in feats]}
    (pred,) = task.postprocess(out, feats, [ex], ctx)
    assert len(pred["tags"]) == len(ex["tokens"])
    assert all(text[e["start"]:e["end"]] == e["text"] for e in pred["entities"])


@SETTINGS
@given(question=PRINTABLE, context=ANY_TEXT)
def test_qa_any_context_answers_with_a_span_of_it(tok, question: str, context: str) -> None:
    task = get_task("qa")
    ctx = TaskContext(max_length=32,
                      options=task.resolve_options({"doc_stride": 8, "max_question_length": 8}))
    ex = task.from_input({"question": question, "context": context}, ctx.options)
    if len(context) > 20_000:
        context = context[:20_000]
        ex["context"] = context
    try:
        feats = task.featurize([ex], tok, ctx, training=False)
    except MlmkitError:
        return
    rng = np.random.default_rng(1)
    out = {k: [rng.normal(size=len(f["input_ids"])) for f in feats] for k in ("start_logits", "end_logits")}
    (pred,) = task.postprocess(out, feats, [ex], ctx)
    assert pred["start"] == -1 or context[pred["start"]:pred["end"]] == pred["answer"]


@SETTINGS
@given(text=ANY_TEXT)
def test_classification_any_text(tok, text: str) -> None:
    task = get_task("classification")
    ctx = TaskContext(max_length=16, options=task.resolve_options(), labels=("a", "b"))
    try:
        ex = task.from_input(text, ctx.options)
    except MlmkitError:
        assert not text.strip()  # only an empty text is refused
        return
    (f,) = task.featurize([ex], tok, ctx, training=False)
    assert 2 <= len(f["input_ids"]) <= 16


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(text=ANY_TEXT, max_tokens=st.integers(1, 40))
# \x0c is removed by BERT's normaliser, not a separator
@example(text="AAA\x0c" + "A" * 60 + " H", max_tokens=1)
@example(text="x\u2028" * 200, max_tokens=3)
@example(text="[PAD]", max_tokens=1)
@example(text="A\x1f\x1f" * 101, max_tokens=1)  # characters the normaliser drops: a word past WordPiece's 100
@example(text="A" + " " * 1000 + "B", max_tokens=2)  # whitespace makes no tokens
def test_clipping_keeps_the_tokens_the_max_length_uses(tok, text: str, max_tokens: int) -> None:
    clipped = clip_text(text, tok, max_tokens)
    assert text.startswith(clipped)
    whole = tok.encode(text, add_special_tokens=False).ids
    part = tok.encode(clipped, add_special_tokens=False).ids
    assert part[:max_tokens] == whole[:max_tokens]
    assert (len(part) > max_tokens) == (len(whole) > max_tokens)  # truncation still shows
    # a literal [PAD] is the token, as in transformers
    assert special_ids(tok).pad not in part or "[PAD]" in text


# ---- route bodies: any JSON is a call or a 4xx naming what is wrong --------------------------------
class _Pipe:
    def __init__(self, task: str, outputs: tuple[str, ...], labels: list[str] | None = None,
                 **options: Any) -> None:
        self.task, self.option_names = task, {"input_type"} if task == "embedding" else set()
        self.meta = SimpleNamespace(outputs={o: () for o in outputs}, labels=labels, options=options)


class _Model:
    def __init__(self, pipe: _Pipe, indexes: dict[str, Any] | None = None) -> None:
        self.pipe, self.indexes = pipe, indexes or {}


class _Index:  # what POST /v1/search reads of an index before it searches
    count, dims, kind = 100, 4, "dense"


FAKE_MODELS = {"emb": _Model(_Pipe("embedding", ("embedding",), query_prompt="query: "), {"docs": _Index()}),
               "rr": _Model(_Pipe("rerank", ("logits",), ["score"])),
               "splade": _Model(_Pipe("sparse-embedding", ("indices", "values")))}
JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2, 10**9), st.floats(),
                              st.text(max_size=6)),
                    lambda inner: st.one_of(st.lists(inner, max_size=3),
                                            st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                    max_leaves=8)


def _body(route: Any) -> Any:
    """Bodies with the route's own fields (each of any JSON value, or a fitting one) and stray ones."""
    import re

    fields = sorted(set(re.findall(r"[{,] ?([a-z_]+)", route.summary))
                    | {"model", "truncate", "truncation_direction"})
    good = {"input": st.just(["a text"]), "inputs": st.just("a text"), "query": st.just("q"),
            "documents": st.just(["d"]),
            "texts": st.just(["d"]), "model": st.sampled_from(sorted(FAKE_MODELS)), "index": st.just("docs"),
            "vector": st.just([0.5, 0.5, 0.5, 0.5]), "top_k": st.integers(1, 100)}
    value = {f: st.one_of(JSON, good.get(f, JSON)) for f in fields}
    return st.one_of(JSON, st.fixed_dictionaries({}, optional=value))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_route_parses_any_body_or_answers_4xx(data: Any) -> None:
    from mlmkit.serve.catalog import routes
    from mlmkit.serve.http import HTTPError
    from mlmkit.serve.routes import Call

    for route in routes():
        body = data.draw(_body(route), label=route.path)
        try:
            call = route.parse(body, FAKE_MODELS)
        except HTTPError as e:
            assert 400 <= e.status < 500 and e.message.startswith((route.path, "no model named",
                                                                   "model '")), e.message
            continue
        assert isinstance(call, Call) and call.model in FAKE_MODELS and (call.inputs or call.size)


BOOLEAN_FIELDS = {  # route -> (a body it accepts, its true / false fields)
    "/embed": ({"inputs": "x", "model": "emb"}, ("normalize", "truncate")),
    "/predict": ({"inputs": "x", "model": "rr"}, ("raw_scores", "truncate")),
    "/v1/rerank": ({"query": "q", "documents": ["d"], "model": "rr"}, ("return_documents", "raw_scores")),
    "/rerank": ({"query": "q", "texts": ["d"], "model": "rr"}, ("raw_scores", "return_text", "truncate")),
    "/embed_sparse": ({"inputs": "x", "model": "splade"}, ("truncate",)),
    "/tokenize": ({"inputs": "x", "model": "emb"}, ("add_special_tokens",)),
}


@pytest.mark.parametrize("value", ["false", "0", 0, 1, "true", [], {}])
def test_a_boolean_field_takes_json_booleans_only(value: Any) -> None:
    """"false" or "0" read as true by truthiness would turn on what the client turned off."""
    from mlmkit.serve.catalog import routes as registered
    from mlmkit.serve.http import HTTPError

    routes = {r.path: r for r in registered()}
    for path, (body, names) in BOOLEAN_FIELDS.items():
        routes[path].parse(body, FAKE_MODELS)  # the body itself is fine
        for name in names:
            with pytest.raises(HTTPError, match=f"{path}: '{name}' must be true or false"):
                routes[path].parse({**body, name: value}, FAKE_MODELS)


def test_tei_truncation_and_prompt_fields_act_or_are_refused() -> None:
    from mlmkit.serve.catalog import routes as registered
    from mlmkit.serve.http import HTTPError

    routes = {r.path: r for r in registered()}
    for path in ("/embed", "/predict", "/rerank", "/embed_sparse"):
        body = BOOLEAN_FIELDS[path][0]
        routes[path].parse({**body, "truncate": True, "truncation_direction": "Right"}, FAKE_MODELS)
        with pytest.raises(HTTPError, match=f"{path}: truncate false is not supported"):
            routes[path].parse({**body, "truncate": False}, FAKE_MODELS)
        with pytest.raises(HTTPError,
                           match=f"{path}: only truncation_direction Right is supported, got 'Left'"):
            routes[path].parse({**body, "truncation_direction": "Left"}, FAKE_MODELS)
    with pytest.raises(HTTPError, match="model 'splade' has no prompt named 'query'"):
        routes["/embed_sparse"].parse({"inputs": "x", "prompt_name": "query"}, FAKE_MODELS)
    assert routes["/embed"].parse({"inputs": "x", "model": "emb", "prompt_name": "query"},
                                  FAKE_MODELS).options == \
        {"input_type": "query"}
    assert routes["/tokenize"].parse({"inputs": "x", "model": "emb", "prompt_name": "query"},
                                     FAKE_MODELS).state["prompt"] \
        == "query: "
