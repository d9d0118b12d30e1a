"""The qa task's readers (mlmkit_tasks/qa_data.py): SQuAD v1 and v2, JSON lines with both answer
forms, and their errors naming the file, line, question id and field."""

from __future__ import annotations

import json

import pytest
from qa_helpers import jsonl, read, write

from mlmkit.errors import DataFormatError

SQUAD_V1 = {"version": "1.1", "data": [
    {"title": "T", "paragraphs": [{"context": "Paris is the capital of France.", "qas": [
        {"id": "a1", "question": "What is the capital?", "answers": [
            {"text": "Paris", "answer_start": 0}, {"text": "Paris", "answer_start": 0}]},
        {"id": "a2", "question": "Of what?", "answers": [{"text": "France", "answer_start": 24}]}]}]},
    {"title": "U", "paragraphs": [{"context": "Rex is a dog.", "qas": [
        {"id": "b1", "question": "Who is a dog?", "answers": [{"text": "Rex", "answer_start": 0}]}]}]},
]}


def test_read_squad_v1(tmp_path):
    ex = read(write(tmp_path / "train.json", json.dumps(SQUAD_V1)))
    assert [e["id"] for e in ex] == ["a1", "a2", "b1"]
    assert ex[1] == {"id": "a2", "question": "Of what?", "context": "Paris is the capital of France.",
                     "answers": [{"text": "France", "answer_start": 24}], "is_impossible": False}
    assert len(ex[0]["answers"]) == 2 and ex[2]["context"] == "Rex is a dog."


def test_read_squad_v2_impossible(tmp_path):
    doc = {"version": "v2.0", "data": [{"title": "T", "paragraphs": [{"context": "Rex is a dog.", "qas": [
        {"id": "i", "question": "Who is a cat?", "answers": [], "is_impossible": True,
         "plausible_answers": [{"text": "Rex", "answer_start": 0}]},
        {"id": "p", "question": "Who is a dog?", "answers": [{"text": "Rex", "answer_start": 0}],
         "is_impossible": False}]}]}]}
    ex = read(write(tmp_path / "dev.json", json.dumps(doc)))
    assert [(e["id"], e["is_impossible"], e["answers"]) for e in ex] == [
        ("i", True, []), ("p", False, [{"text": "Rex", "answer_start": 0}])]


def test_read_jsonl_both_answer_forms(tmp_path):
    rows = [
        {"id": "x", "question": "Who?", "context": "Rex barks.",
         "answers": {"text": ["Rex"], "answer_start": [0]}},
        {"question": "What?", "context": "Rex barks.", "answers": [{"text": "barks", "answer_start": 4}]},
        {"id": 7, "question": "Why?", "context": "Rex barks.", "answers": {"text": [], "answer_start": []}},
    ]
    ex = read(jsonl(tmp_path / "d.jsonl", ["", *rows]))
    assert [(e["id"], e["answers"], e["is_impossible"]) for e in ex] == [
        ("x", [{"text": "Rex", "answer_start": 0}], False),
        ("3", [{"text": "barks", "answer_start": 4}], False),  # no id: the line number
        ("7", [], True),
    ]


@pytest.mark.parametrize(
    ("rows", "pattern"),
    [
        ([{"id": "x", "question": "q", "context": "the dog barks",
           "answers": {"text": ["dog"], "answer_start": [0]}}],
         r"d\.jsonl, line 1, field 'answers\[0\]\.answer_start': question 'x': answer 'dog' is not at "
         r"answer_start 0; "
         r"the context there reads 'the' \(it occurs at 4\)"),
        ([{"question": "q", "context": "abc", "answers": []}, "{'question': 1}"],
         r"d\.jsonl, line 2: malformed JSON"),
        ([{"question": "q", "answers": [{"text": "a", "answer_start": 0}]}],
         r"line 1, field 'context': missing \"context\""),
        ([{"question": "q", "context": "abc", "answers": [{"text": "zz", "answer_start": 1}]}],
         r"line 1, field 'answers\[0\]\.answer_start':.*reads 'bc' \(it does not occur in the context at "
         r"all\)"),
        ([{"question": "q", "context": "abc", "answers": [{"text": "a"}]}], r"line 1, field 'answers\[0\]'"),
        ([{"question": "q", "context": "abc", "answers": {"text": ["a"], "answer_start": [0, 1]}}],
         r"field 'answers': \"answers\" has 1 texts but 2 answer_start"),
        ([{"question": "q", "context": "abc", "answers": [{"text": "a", "answer_start": "0"}]}],
         r"answer_start must be a non-negative integer"),
        ([{"question": "q", "context": "abc"}], r"line 1, field 'answers': missing \"answers\""),
    ],
)
def test_jsonl_errors(tmp_path, rows, pattern):
    with pytest.raises(DataFormatError, match=pattern):
        read(jsonl(tmp_path / "d.jsonl", rows))


def test_squad_errors_name_question_id_and_field(tmp_path):
    doc = json.loads(json.dumps(SQUAD_V1))
    doc["data"][1]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] = 3
    with pytest.raises(DataFormatError,
                       match=r"train\.json, field 'data\[1\]\.paragraphs\[0\]\.qas\[0\]\.answers\[0\]\."
                       r"answer_start': question 'b1': answer 'Rex' is not at answer_start 3; the context "
                       r"there reads ' is'"):
        read(write(tmp_path / "train.json", json.dumps(doc)))
    del doc["data"][0]["paragraphs"][0]["qas"][1]["question"]
    with pytest.raises(DataFormatError, match=r"qas\[1\]\.question': question 'a2': missing \"question\""):
        read(write(tmp_path / "train.json", json.dumps(doc)))
    with pytest.raises(DataFormatError, match=r"train\.json, line 3: malformed JSON"):
        read(write(tmp_path / "train.json", '{"data": [\n{"title": "x",\n "paragraphs": [}]}'))
    with pytest.raises(DataFormatError, match=r"field 'data'"):
        read(write(tmp_path / "train.json", '{"version": "1.1"}'))
