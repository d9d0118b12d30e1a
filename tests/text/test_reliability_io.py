"""Hostile input, the I/O side: outputs a job owns (a lock; streams written through, never replaced),
bounded inputs (.gz that inflates without end, a line past the ceiling never read whole), JSON
strings and numbers that are no data (lone surrogates, 5,000-digit integers), id columns of any Arrow
type, and a token shard replaced so that a kill never leaves nothing at --out. (Clipping without
whitespace: test_truncation.py; the record ceiling in every format: test_readers.py; a long line cut
in pieces: tests/train/test_pieces.py.)

Most tests drive jobs.batch with a stand-in pipeline (no bundle, no model); a few run the CLI on a
tiny classification bundle (one module-scoped export)."""

from __future__ import annotations

import base64
import datetime
import decimal
import gzip
import io
import json
import logging
import os
import random
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import make_base_model, run_export
from task_runs import corpus, make_task_run, sentence
from typer.testing import CliRunner

from mlmkit.cli import app
from mlmkit.errors import ConfigError, DataFormatError, MlmkitError
from mlmkit.files import JSONDataError, parse_json
from mlmkit.jobs.batch import batch
from mlmkit.registry import get_task
from mlmkit.taskkit import Record, iter_records
from mlmkit.text.records import iter_inputs, stdin_inputs
from mlmkit.text.tokenizer import save_tokenizer, train_tokenizer
from mlmkit.train.corpus import files as corpus_files
from mlmkit.train.corpus import shards as corpus_shards

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
runner = CliRunner()
ENV = {"COLUMNS": "1000"}


class Echo:
    """A pipeline stand-in: one result per record, the length of its text."""

    def __init__(self) -> None:
        self.calls = 0

    def identity(self) -> dict[str, Any]:
        return {"bundle": "echo"}

    def __call__(self, items: list[Any], first: int, errors: Any = None,
                 **options: Any) -> list[dict[str, Any]]:
        self.calls += 1
        return [{"n": len(x["text"] if isinstance(x, dict) else x)} for x in items]


def texts(n: int, source: str = "in.txt") -> list[Record]:
    return [Record(source, i, f"text number {i}") for i in range(1, n + 1)]


def run(items: Any, **kw: Any) -> list[Any]:
    return list(batch(Echo(), items, options={}, window=kw.pop("window", 2), **kw))


def one_error_line(r) -> str:
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.output, r.stderr
    return lines[0]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("io")
    base = make_base_model(root / "base", corpus())
    run_export(make_task_run(base, "classification", root / "clf"), root / "bundle")
    return root / "bundle"


@pytest.fixture(scope="module")
def tok():
    lines = ["the cat sat on the mat", "我们在北京学习中文", "日本語の文章です", "who is john ?"] * 5
    return train_tokenizer(lines, vocab_size=120, min_frequency=1)


def mlmkit(*args: Any, **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlmkit", *map(str, args)], capture_output=True, text=True,
                          timeout=120, **kw)


# ---- 1. outputs are owned -------------------------------------------------------------------------
HOLDER = r"""
import sys, time
from pathlib import Path
from mlmkit.jobs.batch import batch
from mlmkit.taskkit import Record

class Slow:
    def identity(self):
        return {"bundle": "slow"}
    def __call__(self, items, first, errors=None, **options):
        time.sleep(0.15)
        return [{"n": len(x), "job": "first"} for x in items]

items = [Record("first.txt", i, f"text {i}") for i in range(1, 21)]
for _ in batch(Slow(), items, options={}, window=2, output=Path(sys.argv[1])):
    pass
"""


def test_a_second_job_with_the_same_output_is_refused_naming_the_first(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    first = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stderr=subprocess.PIPE, text=True)
    lock = tmp_path / ".out.jsonl.job" / ".mlmkit.lock"
    deadline = time.monotonic() + 60
    while not lock.exists() and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.01)
    assert lock.exists(), first.stderr.read() if first.stderr else ""
    second = Echo()
    with pytest.raises(ConfigError, match=f"is being written by another job.*process {first.pid}"):
        list(batch(second, texts(6, "second.txt"), options={}, window=2, output=out))
    assert second.calls == 0  # refused before any work
    assert first.wait(60) == 0, first.stderr.read() if first.stderr else ""
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 20 and {r["job"] for r in rows} == {"first"}  # the first job's output, whole, unmixed
    assert not (tmp_path / ".out.jsonl.job").exists()


def test_two_cli_jobs_on_one_output_one_wins_whole(tmp_path: Path, bundle: Path) -> None:
    inputs = []
    for k in range(2):
        f = tmp_path / f"in{k}.jsonl"
        f.write_text("".join(json.dumps({"text": sentence(random.Random(k * 100 + i), 8), "src": k}) + "\n"
                             for i in range(3000)))
        inputs.append(f)
    options = ["--id-column", "src", "--window", "25", "--threads", "1"]
    refs = []
    for k, f in enumerate(inputs):
        r = runner.invoke(app, ["classify", str(bundle), "--input", str(f), "--output",
                                str(tmp_path / f"ref{k}.jsonl"),
                                *options], env=ENV)
        assert r.exit_code == 0, r.output
        refs.append((tmp_path / f"ref{k}.jsonl").read_bytes())
    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "mlmkit", "classify", str(bundle), "--output", str(out), *options]
    procs = [subprocess.Popen([*cmd, "--input", str(inputs[0])], stderr=subprocess.PIPE, text=True)]
    time.sleep(0.1)
    procs.append(subprocess.Popen([*cmd, "--input", str(inputs[1])], stderr=subprocess.PIPE, text=True))
    codes = [p.wait(180) for p in procs]
    errs = [p.stderr.read() if p.stderr else "" for p in procs]
    assert sorted(codes) == [0, 2], (codes, errs)
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    line = " ".join(errs[loser].split())
    assert "is being written by another job" in line and f"process {procs[winner].pid}" in line, errs[loser]
    assert "Traceback" not in errs[loser]
    assert out.read_bytes() == refs[winner]  # one job's results, byte for byte: nothing of the other's


def test_stream_outputs_are_written_through_never_replaced(tmp_path: Path, capsys) -> None:
    fifo = tmp_path / "out.jsonl"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    run(texts(5), output=fifo)
    reader.join(10)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # still the FIFO, not a file renamed over it
    assert [json.loads(x)["n"] for x in got[0].splitlines()] == [len(r.data) for r in texts(5)]
    assert not list(tmp_path.glob(".*"))  # no job directory, no temporary file
    run(texts(3), output=Path("/dev/null"))  # a character device: written to, never replaced
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    run(texts(3), output=Path("-"))
    assert len(capsys.readouterr().out.splitlines()) == 3
    with pytest.raises(ConfigError, match="cannot resume"):
        run(texts(3), output=fifo, resume=True, inputs=[])
    parquet_fifo = tmp_path / "out.parquet"
    os.mkfifo(parquet_fifo)
    with pytest.raises(ConfigError, match="only JSON lines"):
        run(texts(3), output=parquet_fifo)


def test_a_symlinked_output_replaces_its_target_and_stays_a_link(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "results.jsonl"
    target.write_text("old\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    run(texts(4), output=link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert len(target.read_text().splitlines()) == 4
    assert not list(tmp_path.glob("**/.*"))
    dangling = tmp_path / "new.jsonl"
    dangling.symlink_to(tmp_path / "real" / "new-target.jsonl")
    run(texts(2), output=dangling)
    assert (dangling.is_symlink() and len((tmp_path / "real" / "new-target.jsonl").read_text().splitlines())
            == 2)


def test_an_output_that_is_a_directory_is_refused_before_any_work(tmp_path: Path) -> None:
    pipe = Echo()
    with pytest.raises(ConfigError, match="is a directory"):
        list(batch(pipe, texts(4), options={}, output=tmp_path))
    assert pipe.calls == 0 and not list(tmp_path.iterdir())


def test_cli_streams_to_stdout_and_dev_stdout(tmp_path: Path, bundle: Path) -> None:
    f = tmp_path / "in.txt"
    f.write_text("".join(f"{sentence(random.Random(i), 6)}\n" for i in range(30)))
    for target in ("-", "/dev/stdout"):
        r = mlmkit("classify", bundle, "--input", f, "--output", target, "--threads", "1")
        assert r.returncode == 0, r.stderr
        assert [set(json.loads(x)) >= {"label", "score"} for x in r.stdout.splitlines()] == [True] * 30


# ---- 2. bounded inputs ------------------------------------------------------------------------------
READ_CORPUS = ("from pathlib import Path\nfrom mlmkit.errors import DataFormatError\n"
               "try:\n    list(mlmkit.train.corpus.files.iter_documents(Path(sys.argv[1])))\n"
               "except DataFormatError as e:\n    print('ERROR', e)\n")
"""peak_mb's code that reads the corpus file of argv[1], printing the error it meets."""


def peak_mb(code: str, *args: Any) -> tuple[float, str]:
    """Peak resident memory growth (MB) of ``code`` in a fresh process, and what it printed."""
    wrapped = ("import sys\n"
               "def hwm():\n    return int(next(x.split()[1] for x in open('/proc/self/status') if "
               "x.startswith('VmHWM'))) / 1024\n"
               "import mlmkit.train.corpus.files, mlmkit.text.records, pyarrow\nbefore = hwm()\n" + code +
               "\nprint('PEAK', hwm() - before)\n")
    r = subprocess.run([sys.executable, "-c", wrapped, *map(str, args)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return float(r.stdout.split("PEAK")[-1]), r.stdout


def test_a_gz_corpus_that_inflates_to_one_endless_line_stops_at_the_ceiling(tmp_path: Path) -> None:
    member = gzip.compress(b'{"text": "' + b"a" * (8 << 20), compresslevel=9)  # 8 MB of one line, ~8 KB
    p = tmp_path / "bomb.jsonl.gz"
    p.write_bytes(member * 64)  # gzip members concatenate: 512 MB inflated, in half a MB
    assert p.stat().st_size < 1 << 20
    grew, out = peak_mb(READ_CORPUS, p)
    assert "ERROR" in out and "bomb.jsonl.gz, line 1: a line of more than 67,108,864 bytes" in out, out
    assert grew < 100, grew  # the 512 MB line is never held (the old reader held it, then its text: > 1 GB),
    # and the ceiling is held once (readline of 64 MB held its pieces and their join: 130 MB), 2026-12-04


def test_a_line_past_the_ceiling_is_refused_holding_the_ceiling_once(tmp_path: Path) -> None:
    """A 200 MB line of a plain corpus: refused at the 64 MB ceiling, the peak about the ceiling (it was
    187 MB: readline held the ceiling twice), and the lines after it come as before."""
    p = tmp_path / "huge.txt"
    with open(p, "wb") as f:
        for _ in range(200):
            f.write(b"word " * 200_000)
        f.write(b"\nthe next line\n")
    grew, out = peak_mb(READ_CORPUS, p)
    assert "huge.txt, line 1: a line of more than 67,108,864 bytes" in out, out
    assert grew < 90, grew  # 64 MB held once (95 MB with the process, 2026-12-04; 159 before)
    from mlmkit.files import bounded_lines

    with open(p, "rb") as f:
        assert [x if x is None else bytes(x) for x in bounded_lines(f, 64 << 20)] == [None,
                                                                                      b"the next line\n"]
    with open(p, "rb") as f:  # a line under the ceiling comes whole, whatever its length
        assert len(next(bounded_lines(f, 300 << 20))) == 200_000_000 + 1


def test_a_long_line_over_the_ceiling_is_never_read_whole(tmp_path: Path) -> None:
    p = tmp_path / "in.jsonl"
    with open(p, "wb") as f:
        f.write(b'{"text": "first"}\n{"text": "')
        for _ in range(16):
            f.write(b"b" * (4 << 20))  # a 64 MB line
        f.write(b'"}\n{"text": "last"}\n')
    code = ("from mlmkit.text.records import iter_inputs\n"
            "items = list(iter_inputs(sys.argv[1], skip=True, max_bytes=4 << 20))\n"
            "print([type(x).__name__ for x in items])\n")
    grew, out = peak_mb(code, p)
    assert "['Record', 'DataFormatError', 'Record']" in out, out
    assert grew < 40, grew  # a few times the 4 MB ceiling, never the 64 MB line


def test_blank_lines_in_a_gz_corpus_are_read_past_quickly_and_not_silently(tmp_path: Path, monkeypatch,
                                                                           caplog) -> None:
    """A small .gz of millions of newlines: read past a buffer at a time (a line at a time ran ~110k
    lines/s, minutes of "0 of 17 MB read"), the log saying the lines and the text inflated, and the
    line numbers after the run still right."""
    import re
    import time

    p = tmp_path / "blank.txt.gz"
    p.write_bytes(gzip.compress(b"one two\n" + b"\n" * 20_000_000 + b"\r\n" + b"a sentence at last\n", 1))
    monkeypatch.setattr(corpus_files, "QUIET_LOG", 0.0)
    monkeypatch.setattr(logging.getLogger("mlmkit"), "propagate", True)  # (the CLI's setup turns it off)
    t0 = time.perf_counter()
    with caplog.at_level(logging.INFO, logger="mlmkit"):
        assert list(corpus_files.iter_documents(p)) == [["one two"], ["a sentence at last"]]
    assert time.perf_counter() - t0 < 10  # 0.2 s here; 3 minutes a line at a time
    said = [r.getMessage() for r in caplog.records if "blank" in r.getMessage()]
    assert said and re.search(r"line [\d,]+, the last [\d,]+ of them blank \(\d+ MB of text; \d+ of the "
                              r"file's \d+ MB read\)",
                              said[-1]), said[-3:]
    # a run: its first
    assert list(corpus_files._open_lines(p)) == [(1, "one two"), (2, ""), (20_000_003, "a sentence at last")]


def test_a_long_corpus_line_and_a_document_without_end_tokenize_as_the_whole(tmp_path: Path, tok,
                                                                             monkeypatch) -> None:
    long_line = " ".join(["the cat sat on the mat"] * 20_000)  # 460 KB: tokenized in pieces
    p = tmp_path / "c.txt"
    p.write_text("who is john ?\n" + long_line + "\n" + "\n".join(["the mat"] * 50)
                 + "\n\nanother document here\n")
    c = corpus_shards.tokenize_corpus([p], tok, tmp_path / "a")
    assert c.num_docs == 2 and len(c.sent_offsets) - 1 == 53
    got = c.tokens[c.sent_offsets[1] : c.sent_offsets[2]].tolist()
    assert got == tok.encode(long_line, add_special_tokens=False).ids
    monkeypatch.setattr(corpus_files, "DOCUMENT_PART", 3)  # the first document in parts of 3 sentences
    monkeypatch.setattr(corpus_files, "PENDING_CHARS", 1000)
    monkeypatch.setattr(corpus_shards, "PENDING_CHARS", 1000)
    parts = corpus_shards.tokenize_corpus([p], tok, tmp_path / "b")
    for k in ("tokens", "sent_offsets", "doc_offsets"):
        assert getattr(parts, k).tolist() == getattr(c, k).tolist(), k


# ---- 3. JSON strings and numbers that are no data ---------------------------------------------------
LONE = '{"text": "bad \\ud800 here"}'
HUGE = '{"text": "fine", "n": ' + "7" * 5000 + "}"


def test_parse_json_refuses_lone_surrogates_and_huge_integers_as_malformed_json() -> None:
    for text, msg in ((LONE, "lone surrogate \\ud800 in a string"),
                      ('["\\uDC00"]', "lone surrogate \\udc00 in a string"),
                      ('"\\ud83d x"', "lone surrogate \\ud83d in a string"), (HUGE, "integer of 5000 digits"),
                      ('"raw \udc80"', "lone surrogate \\udc80 in a string")):
        with pytest.raises(JSONDataError) as e:
            parse_json(text)
        assert isinstance(e.value, json.JSONDecodeError) and isinstance(e.value, ValueError)
        assert e.value.msg == msg and e.value.lineno == 1 and e.value.colno >= 1
    assert parse_json('"\\ud83d\\ude00 ok"') == "\U0001f600 ok"  # a pair is one character
    assert parse_json('"\\\\ud800"') == "\\ud800"  # an escaped backslash, then letters
    assert parse_json("1" * 4000) == int("1" * 4000)


def test_lone_surrogates_and_huge_integers_are_bad_records_in_every_reader(tmp_path: Path, tok) -> None:
    good = '{"text": "good one", "label": "pos"}'
    p = tmp_path / "d.jsonl"
    for bad, msg in ((LONE, "lone surrogate"),
                     (HUGE.replace("}", ', "label": "pos"}'), "integer of 5000 digits")):
        p.write_text(f"{good}\n{bad}\n{good}\n")
        with pytest.raises(DataFormatError, match=f"d.jsonl, line 2: malformed JSON \\({msg}"):
            list(iter_records(p))
        assert [type(x).__name__ for x in iter_records(p, skip=True)] == ["Record", "DataFormatError",
                                                                          "Record"]
        with pytest.raises(DataFormatError, match=f"<stdin>, line 2: malformed JSON \\({msg}"):
            list(stdin_inputs(io.StringIO(p.read_text())))
        task = get_task("classification")
        with pytest.raises(DataFormatError, match=f"d.jsonl, line 2: malformed JSON \\({msg}"):
            task.read(p, task.resolve_options())
        with pytest.raises(DataFormatError, match=f"d.jsonl, line 2: malformed JSON \\({msg}"):
            list(corpus_files.iter_documents(p))
    # the first line is JSON (with no data): not a reason to read text
    first_bad = io.StringIO(f"{LONE}\n{good}\n")
    items = list(stdin_inputs(first_bad, skip=True))
    assert isinstance(items[0], DataFormatError) and items[1].data["text"] == "good one"
    squad = tmp_path / "d.json"
    squad.write_text('{"data": [{"paragraphs": [{"context": "x \\udfff", "qas": []}]}]}')
    with pytest.raises(DataFormatError, match="d.json, line 1: malformed JSON: lone surrogate \\\\udfff"):
        get_task("qa").read(squad, get_task("qa").resolve_options())


def test_cli_skips_or_names_a_record_with_a_lone_surrogate(tmp_path: Path, bundle: Path) -> None:
    f = tmp_path / "in.jsonl"
    f.write_text(f'{{"text": "good one"}}\n{LONE}\n{HUGE}\n{{"text": "good two"}}\n')
    line = one_error_line(runner.invoke(app, ["classify", str(bundle), "--input", str(f)], env=ENV))
    assert "in.jsonl, line 2: malformed JSON (lone surrogate \\ud800 in a string" in line
    r = runner.invoke(app, ["classify", str(bundle), "--input", str(f), "--output", str(tmp_path / "o.jsonl"),
                            "--on-error", "skip"], env=ENV)
    assert r.exit_code == 0, r.output
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 2
    errs = [json.loads(x) for x in (tmp_path / "o.jsonl.errors.jsonl").read_text().splitlines()]
    assert [e["line"] for e in errs] == [2, 3] and "integer of 5000 digits" in errs[1]["error"]


# ---- 4. id columns of any Arrow type ---------------------------------------------------------------
ID_TYPES = {
    "timestamp": (pa.timestamp("ns", tz="UTC"), [1_714_564_800_000_000_001, 1_714_564_800_500_000_000, None],
                  ["2024-05-01T12:00:00.000000001+00:00", "2024-05-01T12:00:00.500000+00:00", None]),
    "date": (pa.date32(), [datetime.date(2024, 5, 1), datetime.date(1999, 12, 31), datetime.date(2000, 1, 1)],
             ["2024-05-01", "1999-12-31", "2000-01-01"]),
    "decimal": (pa.decimal128(10, 2),
                [decimal.Decimal("1.50"), decimal.Decimal("-12345678.25"), decimal.Decimal("0.00")],
                ["1.50", "-12345678.25", "0.00"]),
    "binary": (pa.binary(), [b"\x00\xff", b"id", b""], ["AP8=", "aWQ=", ""]),
    "duration": (pa.duration("s"), [90, 0, 3600], ["PT90S", "PT0S", "PT3600S"]),
    "time": (pa.time64("us"), [datetime.time(12, 30), datetime.time(0, 0, 1), datetime.time(23, 59)],
             ["12:30:00", "00:00:01", "23:59:00"]),
    "list": (pa.list_(pa.int32()), [[1, 2], [], [3]], [[1, 2], [], [3]]),
    "struct": (pa.struct([("a", pa.int64()), ("b", pa.string())]),
               [{"a": 1, "b": "x"}, {"a": 2, "b": None}, None],
               [{"a": 1, "b": "x"}, {"a": 2, "b": None}, None]),
}


@pytest.mark.parametrize("kind", sorted(ID_TYPES))
def test_id_columns_of_any_arrow_type_keep_their_type(tmp_path: Path, kind: str) -> None:
    arrow_type, values, as_json = ID_TYPES[kind]
    f = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": pa.array(values, arrow_type), "text": ["one", "two two", "three"]}), f)
    # windows of 2: a final join of two parts
    run(iter_inputs(f), output=tmp_path / "o.parquet", id_column="id")
    got = pq.read_table(tmp_path / "o.parquet")
    assert got.schema.field("id").type == arrow_type
    assert got.column("id").equals(pq.read_table(f).column("id"))
    run(iter_inputs(f), output=tmp_path / "o.jsonl", id_column="id")
    rows = [json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == as_json and [r["n"] for r in rows] == [3, 7, 5]
    if kind == "binary":
        assert base64.b64decode(rows[0]["id"]) == b"\x00\xff"


def test_an_id_whose_type_changes_is_caught_at_the_first_window_that_differs(tmp_path: Path) -> None:
    f = tmp_path / "in.jsonl"
    f.write_text("".join(json.dumps({"id": i, "text": "t"}) + "\n" for i in (1, 2, 3, 4))
                 + '{"id": "x5", "text": "t"}\n'
                 + '{"id": 6, "text": "t"}\n')
    out = tmp_path / "o.parquet"
    pipe = Echo()
    with pytest.raises(DataFormatError,
                       match=r"in.jsonl, line 5, field 'id': an id of type str \('x5'\) where the ids "
                             r"before it are int64") as e:
        list(batch(pipe, iter_inputs(f), options={}, window=2, output=out, id_column="id", inputs=[f]))
    assert pipe.calls == 3 and not out.exists()  # at window 3, not after all of them at the join
    assert json.loads((tmp_path / ".o.parquet.job" / "progress.json").read_text())["windows"] == 2
    assert "delete" in (e.value.hint or "")  # how to get out, since the same input fails the same way
    # resumed: the same record, at once, not a join that never ends
    with pytest.raises(DataFormatError, match="line 5"):
        list(batch(Echo(), iter_inputs(f), options={}, window=2, output=out, id_column="id", inputs=[f],
                   resume=True))
    skipped = tmp_path / "s.parquet"
    run(iter_inputs(f, skip=True), output=skipped, id_column="id", skip=True, errors=tmp_path / "e.jsonl")
    assert pq.read_table(skipped).column("id").to_pylist() == [1, 2, 3, 4, 6]
    assert [json.loads(x)["line"] for x in (tmp_path / "e.jsonl").read_text().splitlines()] == [5]
    mixed = tmp_path / "m.jsonl"  # ints then floats: one column of doubles, as Parquet widens
    mixed.write_text("".join(json.dumps({"id": v, "text": "t"}) + "\n" for v in (1, 2, 2.5)))
    run(iter_inputs(mixed), output=tmp_path / "m.parquet", id_column="id")
    assert pq.read_table(tmp_path / "m.parquet").column("id").to_pylist() == [1.0, 2.0, 2.5]


def test_parquet_shards_whose_id_types_differ_name_the_shard(tmp_path: Path) -> None:
    d = tmp_path / "shards"
    d.mkdir()
    pq.write_table(pa.table({"id": pa.array([1, 2, 3], pa.int64()), "text": ["a", "b", "c"]}),
                   d / "a.parquet")
    pq.write_table(pa.table({"id": ["x", "y"], "text": ["d", "e"]}), d / "b.parquet")
    with pytest.raises(DataFormatError, match="b.parquet, row 1, field 'id'"):
        run(iter_inputs(d), output=tmp_path / "o.parquet", id_column="id", window=10)
    run(iter_inputs(d), output=tmp_path / "o.jsonl", id_column="id", window=10)  # JSON lines hold both
    assert [json.loads(x)["id"] for x in (tmp_path / "o.jsonl").read_text().splitlines()] == [1, 2, 3, "x",
                                                                                              "y"]


def test_cli_carries_a_timestamp_id_into_parquet_and_json_lines(tmp_path: Path, bundle: Path) -> None:
    f = tmp_path / "in.parquet"
    pq.write_table(pa.table({"ts": pa.array([0, 86_400_000_000], pa.timestamp("us")),
                             "text": ["the cat", "a dog"]}), f)
    for out in ("o.parquet", "o.jsonl"):
        r = runner.invoke(app, ["classify", str(bundle), "--input", str(f), "--output", str(tmp_path / out),
                                "--id-column", "ts"], env=ENV)
        assert r.exit_code == 0, r.output
    assert pq.read_table(tmp_path / "o.parquet").schema.field("ts").type == pa.timestamp("us")
    rows = [json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [x["ts"] for x in rows] == ["1970-01-01T00:00:00", "1970-01-02T00:00:00"]


# ---- 5. a token shard is replaced, never lost -------------------------------------------------------
KILL = r"""
import os, signal, sys
from pathlib import Path
import mlmkit.train.corpus.shards as c
from mlmkit.text.tokenizer import load_tokenizer

def die(*args):
    os.kill(os.getpid(), signal.SIGKILL)

if sys.argv[4] == "swap":
    c._exchange = die  # killed at the instant the new shard would go in
else:  # a file system that cannot swap: killed between moving the old one aside and moving the new one in
    c._exchange = lambda a, b: False
    real = os.rename
    def rename(src, dst):
        real(src, dst)
        if str(dst).endswith(".old"):
            die()
    c.os.rename = rename
c.tokenize_to([sys.argv[2]], load_tokenizer(sys.argv[1]), sys.argv[3])
"""


@pytest.mark.parametrize("where", ["swap", "move aside"])
def test_a_tokenize_killed_while_replacing_a_shard_leaves_the_old_one(tmp_path: Path, tok,
                                                                      where: str) -> None:
    save_tokenizer(tok, tmp_path / "tok")
    old_corpus, new_corpus = tmp_path / "old.txt", tmp_path / "new.txt"
    old_corpus.write_text("the cat sat\non the mat\n\nwho is john ?\n")
    new_corpus.write_text("我们在北京\n\n学习中文\n")
    shard = tmp_path / "shard"
    before = corpus_shards.tokenize_to([old_corpus], tok, shard)
    tokens = before.tokens.tolist()
    r = subprocess.run([sys.executable, "-c", KILL, str(tmp_path / "tok"), str(new_corpus), str(shard),
                        where],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, r.stderr
    if where == "move aside":
        assert not shard.exists()  # the instant the old shard is aside: the next load puts it back
    again = corpus_shards.open_shard(shard, tok)  # what `pretrain --shard` does
    assert again.tokens.tolist() == tokens
    after = corpus_shards.tokenize_to([new_corpus], tok, shard)  # and the next tokenize replaces it
    assert after.tokens.tolist() == corpus_shards.tokenize_corpus([new_corpus], tok,
                                                                  tmp_path / "cache").tokens.tolist()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # nothing hidden left


def test_a_second_tokenize_to_the_same_out_is_refused(tmp_path: Path, tok) -> None:
    c = tmp_path / "c.txt"
    c.write_text("the cat sat\n\nwho is john ?\n")
    lock_dir = tmp_path / ".shard.lock"
    lock_dir.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (lock_dir / ".mlmkit.lock").write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(),
                                                           "since": "now"}))
        with pytest.raises(MlmkitError, match=f"in use by process {holder.pid}"):
            corpus_shards.tokenize_to([c], tok, tmp_path / "shard")
        assert not (tmp_path / "shard").exists()
    finally:
        holder.kill()
        holder.wait()


# ---- a task's from_input errors name the file and line ---------------------------------------------
def test_a_bad_input_record_names_its_file_and_line_not_its_number(bundle: Path, tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "fine"}\n\n{"body": "no text field here"}\n', encoding="utf-8")
    r = CliRunner().invoke(app, ["classify", str(bundle), "--input", str(src), "--output",
                                 str(tmp_path / "o.jsonl")])
    line = one_error_line(r)
    assert f"{src}, line 3" in line and "'text'" in line and "input 2" not in line
    assert not (tmp_path / "o.jsonl").exists()
    r = CliRunner().invoke(app, ["classify", str(bundle), "--input", str(src), "--output",
                                 str(tmp_path / "o.jsonl"),
                                 "--on-error", "skip"])
    assert r.exit_code == 0, r.output
    bad = [json.loads(x) for x in (tmp_path / "o.jsonl.errors.jsonl").read_text().splitlines()]
    assert [(b["source"], b["line"]) for b in bad] == [(str(src), 3)] and f"{src}, line 3" in bad[0]["error"]


def test_a_null_value_is_named_null_not_missing(tmp_path: Path) -> None:
    """A Parquet row whose label is null has the field: the error says its value is null."""
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    pq.write_table(pa.table({"text": ["a fine film", "dull"], "label": ["pos", None]}),
                   tmp_path / "d.parquet")
    task = get_task("classification")
    with pytest.raises(DataFormatError, match=r"row 2, field 'label': its value is null.*give it a value"):
        task.read(tmp_path / "d.parquet", task.resolve_options({}))
    rec = next(iter_inputs(tmp_path / "d.parquet"))
    assert rec.line_text("text") == "a fine film"
