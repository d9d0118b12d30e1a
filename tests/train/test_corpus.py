"""Reading corpus files (mlmkit/train/corpus/files.py): .txt, .txt.gz and JSON lines alike, their line
ends and blank lines, and errors naming the line and field (the corpus package's other modules:
test_shards.py, test_instances.py, test_workers.py; PretrainData: test_data.py)."""

from __future__ import annotations

import gzip
import json

import pytest
from corpus_helpers import DOCS, write_txt

from mlmkit.errors import DataFormatError
from mlmkit.train.corpus.files import iter_documents


def test_reads_txt_txt_gz_and_jsonl_alike(tmp_path):
    txt = write_txt(tmp_path / "c.txt")
    gz = write_txt(tmp_path / "c.txt.gz", opener=gzip.open)
    jl = tmp_path / "c.jsonl"
    jl.write_text("".join(json.dumps({"text": "\n".join(d), "id": i}) + "\n" for i, d in enumerate(DOCS)),
                  encoding="utf-8")
    for p in (txt, gz, jl):
        assert list(iter_documents(p)) == DOCS, p


def test_txt_tolerates_crlf_several_blank_lines_and_no_trailing_newline(tmp_path):
    p = tmp_path / "c.txt"
    p.write_bytes(b"\r\n\r\nFirst sentence here.\r\nSecond one, caf\xc3\xa9.\r\n\r\n\r\n  \r\n"
                  b"Another document.\nWith two lines.\nAnd three.")
    assert list(iter_documents(p)) == DOCS


def test_jsonl_text_without_newlines_is_split_on_sentence_ends(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps({"text": "One here. Two there! Three?"}) + "\n\n" + json.dumps({"text": "Alone"})
                 + "\n")
    assert list(iter_documents(p)) == [["One here.", "Two there!", "Three?"], ["Alone"]]


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b'{"text": "ok"}\n{"text": broken\n', r"c\.jsonl, line 2: malformed JSON"),
        (b'{"text": "ok"}\n{"body": "no text"}\n', r"line 2, field 'text'"),
        (b'{"text": ["a list"]}\n', r"line 1, field 'text': must be a string"),
    ],
)
def test_bad_jsonl_names_line_and_field(tmp_path, content, match):
    p = tmp_path / "c.jsonl"
    p.write_bytes(content)
    with pytest.raises(DataFormatError, match=match):
        list(iter_documents(p))


def test_non_utf8_names_the_line(tmp_path):
    p = tmp_path / "c.txt"
    p.write_bytes(b"fine\nalso fine\nbad \xff\xfe byte\n")
    with pytest.raises(DataFormatError, match=r"c\.txt, line 3: .*not UTF-8") as e:
        list(iter_documents(p))
    assert e.value.line == 3 and e.value.hint
