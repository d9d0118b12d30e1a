"""BEIR directories (mlmkit/text/beir.py): a split read with titles and its unjudged queries counted,
and bad data one error naming its file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlmkit.errors import DataFormatError
from mlmkit.text.beir import read_split


def _beir(tmp: Path, corpus=None, queries=None, qrels=None) -> Path:
    d = tmp / "beir"
    (d / "qrels").mkdir(parents=True)
    corpus = corpus if corpus is not None else ['{"_id": "d1", "title": "Cats", "text": "purr"}',
                                                '{"_id": "d2", "text": "dogs bark"}',
                                                '{"_id": "d3", "text": "fish swim"}']
    queries = queries if queries is not None else ['{"_id": "q1", "text": "what purrs"}',
                                                   '{"_id": "q2", "text": "who barks"}',
                                                   '{"_id": "q3", "text": "nothing"}']
    (d / "corpus.jsonl").write_text("\n".join(corpus) + "\n")
    (d / "queries.jsonl").write_text("\n".join(queries) + "\n")
    for split, rows in (qrels
                        or {"test": ["q1\td1\t1", "q2\td2\t2", "q3\td3\t0"], "dev": ["q2\td2\t1"]}).items():
        (d / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n")
    return d


def test_a_beir_split_is_read_with_titles_and_its_unjudged_queries_counted(tmp_path):
    d = _beir(tmp_path)
    s = read_split(d, training=False)
    assert s.split == "test" and s.corpus["d1"] == "Cats purr" and s.corpus["d2"] == "dogs bark"
    assert s.queries == {"q1": "what purrs", "q2": "who barks"} and s.skipped == {"no relevant document": 1}
    assert read_split(f"{d}:dev", training=False).queries == {"q2": "who barks"}
    with pytest.raises(DataFormatError,
                       match=r"qrels/train\.tsv: no such split.*here: dev, test|no train\.tsv"):
        read_split(d, training=True)


@pytest.mark.parametrize("edit, match", [
    (dict(qrels={"test": ["q1\td9\t1"]}), r"qrels/test\.tsv, line 2: document 'd9' is not in corpus\.jsonl"),
    (dict(qrels={"test": ["q1\td1\t1", "q7\td1\t1"]}),
     r"qrels/test\.tsv, line 3: query 'q7' is not in queries\.jsonl"),
    (dict(qrels={"test": ["q1\td1\tmany"]}),
     r"qrels/test\.tsv, line 2, field 'score': the score must be a number"),
    (dict(corpus=['{"_id": "d1", "text": "a"}', '{"_id": "d1", "text": "b"}']),
     r"corpus\.jsonl, line 2, field '_id': the id 'd1' again \(first on line 1\)"),
    (dict(corpus=['{"_id": "d1", "text": "a"}', '{"_id": "d2", "text": "b"']),
     r"corpus\.jsonl, line 2: malformed JSON"),
    (dict(corpus=[]), r"corpus\.jsonl: no documents"),
    (dict(qrels={"test": ["q1\td1\t0"]}), r"qrels/test\.tsv: no query with a relevant document"),
])
def test_bad_beir_data_is_one_error_naming_file_and_line(tmp_path, edit, match):
    d = _beir(tmp_path, **edit)
    with pytest.raises(DataFormatError, match=match):
        read_split(d, training=False)
