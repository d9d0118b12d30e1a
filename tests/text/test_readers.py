"""The readers of every data format (mlmkit/text/readers.py): a record over the ceiling is a bad record
in every format, and a document read whole has a ceiling too."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from mlmkit.errors import DataFormatError
from mlmkit.taskkit import Record, iter_records
from mlmkit.text.records import iter_inputs, stdin_inputs

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def test_a_record_over_the_ceiling_is_a_bad_record_in_every_format(tmp_path: Path) -> None:
    big = "x" * 5000
    files = {"a.txt": f"one\n{big}\nthree\n",
             "a.jsonl": f'{{"text": "one"}}\n{{"text": "{big}"}}\n{{"text": "three"}}\n',
             "a.csv": f"text\none\n{big}\nthree\n", "a.tsv": f"text\none\n{big}\nthree\n"}
    for name, content in files.items():
        p = tmp_path / name
        p.write_text(content)
        with pytest.raises(DataFormatError, match=rf"{name}, line \d: a line of more than 1,000 bytes"):
            list(iter_records(p, max_bytes=1000))
        items = list(iter_records(p, skip=True, max_bytes=1000))
        assert [type(x).__name__ for x in items] == ["Record", "DataFormatError", "Record"], (name, items)
        assert [x.data if isinstance(x.data, str) else x.data["text"] for x in items
                if isinstance(x, Record)] == ["one", "three"]
    pq.write_table(pa.table({"text": ["one", big, "three"], "id": [1, 2, 3]}), tmp_path / "a.parquet")
    with pytest.raises(DataFormatError,
                       match="a.parquet, row 2, field 'text': a value of more than 1,000 bytes"):
        list(iter_inputs(tmp_path / "a.parquet", max_bytes=1000))
    items = list(iter_inputs(tmp_path / "a.parquet", skip=True, max_bytes=1000))
    assert [x.data["id"] if isinstance(x, Record) else "bad" for x in items] == [1, "bad", 3]
    data = f"one\n{big}\nthree\n".encode()
    for stream in (io.StringIO(data.decode()), io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")):
        items = list(stdin_inputs(stream, skip=True, max_bytes=1000))
        assert [x.data if isinstance(x, Record) else x.line for x in items] == ["one", 2, "three"]
    bad_utf8 = io.TextIOWrapper(io.BytesIO(b"ok\n\xff\xfe\n"), encoding="utf-8")
    with pytest.raises(DataFormatError, match="<stdin>, line 2: not valid UTF-8"):
        list(stdin_inputs(bad_utf8))


def test_a_document_read_whole_has_a_ceiling_too(tmp_path: Path) -> None:
    from mlmkit.errors import DataFormatError
    from mlmkit.text.readers import DOCUMENT_BYTES, read_text

    squad = tmp_path / "train.json"
    squad.write_text('{"version": "v2.0", "data": []}\n')
    assert read_text(squad) == '{"version": "v2.0", "data": []}\n'
    with pytest.raises(DataFormatError, match="more than 16 bytes in one document") as e:
        read_text(squad, max_bytes=16)
    assert "train.json" in str(e.value) and ".jsonl" in (e.value.hint or "")
    assert DOCUMENT_BYTES >= 1 << 30  # SQuAD 2.0's 40 MB, and far more, still reads
