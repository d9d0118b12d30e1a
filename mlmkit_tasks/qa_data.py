"""The qa task's data: SQuAD JSON and JSON lines of questions read into examples, each checked."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NoReturn, TypedDict

from mlmkit.taskkit import DataFormatError, Example, Record

Fail = Callable[[str, str], NoReturn]
"""How a reader reports a bad question record: ``fail(message, field)`` raises the DataFormatError
naming it."""


class Answer(TypedDict):
    """A gold answer of an example: its text and where it starts in the context (checked by
    question_example)."""

    text: str
    answer_start: int


def answers_from(raw: Any, fail: Fail) -> list[Answer]:
    """A list of {"text", "answer_start"} from either the SQuAD list form or the HF columnar form."""
    if isinstance(raw, dict):
        texts, starts = raw.get("text"), raw.get("answer_start")
        if not isinstance(texts, list) or not isinstance(starts, list):
            fail('"answers" must hold the lists "text" and "answer_start"', "answers")
        if len(texts) != len(starts):
            fail(f'"answers" has {len(texts)} texts but {len(starts)} answer_start values', "answers")
        return [{"text": t, "answer_start": s} for t, s in zip(texts, starts)]
    if isinstance(raw, list):
        for k, a in enumerate(raw):
            if not isinstance(a, dict) or "text" not in a or "answer_start" not in a:
                fail('each answer needs "text" and "answer_start"', f"answers[{k}]")
        return [{"text": a["text"], "answer_start": a["answer_start"]} for a in raw]
    fail('"answers" must be a list of {"text", "answer_start"} or {"text": [...], "answer_start": [...]}',
         "answers")


def question_example(rec: Mapping[str, Any], fail: Fail, default_id: str) -> Example:
    """Validate one question record and return the example dict; ``fail(message, field)`` raises."""
    for key in ("question", "context"):
        if key not in rec:
            fail(f'missing "{key}"', key)
        if not isinstance(rec[key], str):
            fail(f'"{key}" must be a string, got {type(rec[key]).__name__}', key)
    qid = str(rec.get("id", default_id))
    context = rec["context"]
    flag = rec.get("is_impossible")
    if flag is not None and not isinstance(flag, bool):
        fail(f'"is_impossible" must be true or false, got {flag!r}', "is_impossible")
    if "answers" not in rec or rec["answers"] is None:
        if flag is not True:
            fail('missing "answers" (use [] with "is_impossible": true for a question without an answer)',
                 "answers")
        answers: list[Answer] = []
    else:
        answers = answers_from(rec["answers"], fail)
    impossible = bool(flag) if flag is not None else not answers
    if impossible:
        answers = []  # SQuAD 2.0 keeps its guesses in "plausible_answers"; the gold is ""
    elif not answers:
        fail('no answers although "is_impossible" is false', "answers")
    for k, a in enumerate(answers):
        text, start = a["text"], a["answer_start"]
        if not isinstance(text, str) or not text:
            fail(f"question '{qid}': the answer text must be a non-empty string, got {text!r}",
                 f"answers[{k}].text")
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            fail(f"question '{qid}': answer_start must be a non-negative integer, got {start!r}",
                 f"answers[{k}].answer_start")
        found = context[start : start + len(text)]
        if found != text:
            where = context.find(text)
            hint = f"it occurs at {where}" if where >= 0 else "it does not occur in the context at all"
            fail(
                f"question '{qid}': answer {text!r} is not at answer_start {start}; the context there reads "
                f"{found!r} ({hint})",
                f"answers[{k}].answer_start",
            )
    return {"id": qid, "question": rec["question"], "context": context, "answers": answers,
            "is_impossible": impossible}


def read_records(records: Iterable[Record]) -> list[Example]:
    """Examples of JSON-lines records {"id", "question", "context", "answers"}."""
    out = []
    for rec in records:

        def fail(msg: str, field: str | None = None, rec: Record = rec) -> NoReturn:
            raise rec.error(msg, field, "fix that line of the file")

        if not isinstance(rec.data, dict):
            got = type(rec.data).__name__
            fail(f'expected a JSON object {{"id", "question", "context", "answers"}}, got {got}')
        out.append(question_example(rec.data, fail, default_id=str(rec.line)))
    return out


def read_squad(path: Path, doc: Any) -> list[Example]:
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise DataFormatError(path, 'a SQuAD file is an object with a "data" list', field="data",
                              hint="or use JSON lines")
    out = []
    for i, article in enumerate(doc["data"]):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise DataFormatError(path, 'each article needs a "paragraphs" list',
                                  field=f"data[{i}].paragraphs")
        for j, para in enumerate(paragraphs):
            where = f"data[{i}].paragraphs[{j}]"
            if not isinstance(para, dict) or not isinstance(para.get("context"), str):
                raise DataFormatError(path, 'each paragraph needs a "context" string',
                                      field=f"{where}.context")
            if not isinstance(para.get("qas"), list):
                raise DataFormatError(path, 'each paragraph needs a "qas" list', field=f"{where}.qas")
            for k, qa in enumerate(para["qas"]):
                at = f"{where}.qas[{k}]"
                if not isinstance(qa, dict):
                    raise DataFormatError(path, "each question must be an object", field=at)
                if "id" not in qa:
                    raise DataFormatError(path, 'question without "id"', field=f"{at}.id")

                def fail(msg: str, field: str | None = None, at: str = at, qid: Any = qa["id"]) -> NoReturn:
                    if f"question '{qid}'" not in msg:
                        msg = f"question '{qid}': {msg}"
                    raise DataFormatError(path, msg, field=f"{at}.{field}" if field else at,
                                          hint="fix the data file")

                out.append(question_example({**qa, "context": para["context"]}, fail,
                                            default_id=str(qa["id"])))
    return out
