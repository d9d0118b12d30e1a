"""Property-based tests (hypothesis): arbitrary Unicode text, empty fields, control characters, invalid
bytes and lengths from 0 to 100k go through the readers, masking and the tasks' runtime side; the only
exceptions allowed are the project's own (which the CLI turns into one line and exit status 2)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mlmkit.batching import bucket_batches
from mlmkit.errors import MlmkitError
from mlmkit.masking import mask_tokens
from mlmkit.registry import TaskContext, get_task
from mlmkit.taskkit import clip_text, iter_records
from mlmkit.tokenizer import special_ids, train_tokenizer

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
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
@given(rows=st.lists(st.fixed_dictionaries({"text": PRINTABLE, "label": st.sampled_from(["a", "b", "", " "])}), max_size=8))
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
    ctx = TaskContext(max_length=32, options=task.resolve_options({"doc_stride": 8, "max_question_length": 8}))
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


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(text=ANY_TEXT, max_tokens=st.integers(1, 40))
@example(text="AAA\x0c" + "A" * 60 + " H", max_tokens=1)  # \x0c is removed by BERT's normaliser, not a separator
@example(text="x\u2028" * 200, max_tokens=3)
@example(text="[PAD]", max_tokens=1)
def test_clipping_keeps_the_tokens_the_max_length_uses(tok, text: str, max_tokens: int) -> None:
    clipped = clip_text(text, tok, max_tokens)
    assert text.startswith(clipped)
    whole = tok.encode(text, add_special_tokens=False).ids
    part = tok.encode(clipped, add_special_tokens=False).ids
    assert part[:max_tokens] == whole[:max_tokens]
    assert (len(part) > max_tokens) == (len(whole) > max_tokens)  # truncation still shows
    assert special_ids(tok).pad not in part or "[PAD]" in text  # a literal [PAD] is the token, as in transformers


@SETTINGS
@given(st.lists(st.integers(1, 512), max_size=300), st.integers(1, 64), st.one_of(st.none(), st.integers(1, 4096)))
def test_bucket_batches_cover_every_index_once_within_limits(lengths, batch_size, max_tokens):
    batches = bucket_batches(lengths, batch_size, max_tokens)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(b and len(b) <= batch_size for b in batches)
    if max_tokens is not None:  # rows x longest within the budget, unless one row alone is over it
        assert all(len(b) == 1 or len(b) * max(lengths[i] for i in b) <= max_tokens for b in batches)
    order = [lengths[i] for b in batches for i in b]
    assert order == sorted(order, reverse=True)  # longest first: similar lengths share a batch
