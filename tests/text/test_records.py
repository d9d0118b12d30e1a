"""Batch inputs, streamed (mlmkit/text/records.py): the records of every format, files, globs and
stdin, and bad records that keep their place when skipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlmkit.errors import DataFormatError
from mlmkit.text.records import input_files, iter_inputs, stdin_inputs

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def jsonl(p: Path, data: list[dict]) -> Path:
    p.write_text("".join(json.dumps(r) + "\n" for r in data))
    return p


def test_streaming_readers_give_the_records_of_every_format(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes("\ufefffirst text\r\n\r\n  \nsecond, with comma\nno newline at the "
                                     "end".encode())
    (tmp_path / "b.jsonl").write_text('{"text": "x", "text_pair": "y"}\n\n"plain"\r\n')
    (tmp_path / "c.csv").write_bytes(
        '\ufefftext,other\r\n"a, b\nand a second line",1\r\n\r\nc,2\r\n'.encode())
    (tmp_path / "d.tsv").write_text('question\tcontext\nwho "is\tsomeone "quoted\n')
    pq.write_table(pa.table({"text": ["p", "q"], "n": [1, 2]}), tmp_path / "e.parquet")
    got = {f.name: [r.data for r in iter_inputs(f)] for f in input_files(tmp_path)}
    assert got == {
        "a.txt": ["first text", "second, with comma", "no newline at the end"],
        "b.jsonl": [{"text": "x", "text_pair": "y"}, "plain"],
        "c.csv": [{"text": "a, b\nand a second line", "other": "1"}, {"text": "c", "other": "2"}],
        "d.tsv": [{"question": 'who "is', "context": 'someone "quoted'}],
        "e.parquet": [{"text": "p", "n": 1}, {"text": "q", "n": 2}],
    }
    assert [r.line for r in iter_inputs(tmp_path / "c.csv")] == [2, 5]  # a record's first line
    assert len(list(iter_inputs(str(tmp_path / "*.txt")))) == 3  # a glob of shards
    with pytest.raises(DataFormatError, match="no file matches"):
        list(iter_inputs(str(tmp_path / "*.nothing")))


def test_bad_records_keep_their_place_when_skipped(tmp_path: Path) -> None:
    f = jsonl(tmp_path / "x.jsonl", [{"text": "a"}])
    f.write_text('{"text": "a"}\n{oops\n[1]\n"b"\n')
    items = list(iter_inputs(f, skip=True))
    assert [type(x).__name__ for x in items] == ["Record", "DataFormatError", "DataFormatError", "Record"]
    assert ("line 2: malformed JSON" in str(items[1])
            and "line 3: expected an object or a string" in str(items[2]))
    with pytest.raises(DataFormatError, match="line 2"):
        list(iter_inputs(f))
    import io

    assert [r.data for r in stdin_inputs(io.StringIO('"a"\n{"text": "b"}\n'))] == ["a", {"text": "b"}]
    assert [r.data for r in stdin_inputs(io.StringIO('"quoted" text\nplain\n'))] == ['"quoted" text', "plain"]
