"""Batch inference at any size, the command: Parquet in and out with ids, bad records skipped into
an errors file, worker processes, memory that does not grow with the input (resumable jobs:
test_jobdir.py; windows: test_windows.py; Ray Data: test_ray.py; the readers: tests/text/test_records.py)."""

from __future__ import annotations

import csv
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hostile import cli
from jobs_helpers import bundle_fixture, jsonl, rows  # noqa: F401  (the fixture `bundle`)
from task_runs import sentence

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


# ---- the command -----------------------------------------------------------------------------------
def test_parquet_in_and_out_with_ids_equals_json_lines(tmp_path: Path, bundle: Path) -> None:
    data = rows(300)
    pq.write_table(pa.table({"id": [r["id"] for r in data], "text": [r["text"] for r in data]}),
                   tmp_path / "in.parquet")
    r = cli("classify", bundle, "--input", tmp_path / "in.parquet", "--output", tmp_path / "out.parquet",
            "--id-column", "id",
            "--window", "64")
    assert r.exit_code == 0, r.output
    out = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [o["id"] for o in out] == [d["id"] for d in data]  # input order, ids carried
    ref = [json.loads(x) for x in cli("classify", bundle, "--input",
                                      jsonl(tmp_path / "in.jsonl", data)).stdout.splitlines()]
    assert [o["label"] for o in out] == [x["label"] for x in ref]
    assert all(abs(o["score"] - x["score"]) < 1e-6 for o, x in zip(out, ref))
    assert json.loads(out[0]["probabilities"]) == pytest.approx(ref[0]["probabilities"])  # nested: JSON text
    r = cli("classify", bundle, "--input", tmp_path / "in.parquet", "--output", tmp_path / "out.csv",
            "--id-column", "id")
    assert r.exit_code == 0, r.output
    with open(tmp_path / "out.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [(t["id"], t["label"]) for t in table] == [(o["id"], o["label"]) for o in out]
    assert json.loads(table[0]["probabilities"]) == pytest.approx(ref[0]["probabilities"])
    r = cli("classify", bundle, "--input", tmp_path / "in.jsonl", "--id-column", "missing")
    assert r.exit_code == 2 and "no id column 'missing'" in " ".join(r.stderr.split())


def test_a_field_only_some_windows_have_is_null_in_the_others(tmp_path: Path, bundle: Path) -> None:
    f = jsonl(tmp_path / "in.jsonl",
              [{"text": "short one"}, {"text": "short two"}, {"text": "word " * 400}, {"text": "end"}])
    r = cli("classify", bundle, "--input", f, "--output", tmp_path / "o.parquet", "--window", "2")
    assert r.exit_code == 0, r.output
    out = pq.read_table(tmp_path / "o.parquet").to_pylist()
    assert [o.get("truncated") for o in out] == [None, None, True, None]


def test_bad_records_are_skipped_into_an_errors_file(tmp_path: Path, bundle: Path) -> None:
    f = tmp_path / "in.jsonl"
    f.write_text('{"text": "good one"}\n{oops\n{"text": ""}\n{"sentence": "no text"}\n{"text": "good two"}\n')
    r = cli("classify", bundle, "--input", f)
    assert r.exit_code == 2 and "in.jsonl, line 2: malformed JSON" in " ".join(r.stderr.split())
    r = cli("classify", bundle, "--input", f, "--output", tmp_path / "o.jsonl", "--on-error", "skip")
    assert r.exit_code == 0, r.output
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 2
    errs = [json.loads(x) for x in (tmp_path / "o.jsonl.errors.jsonl").read_text().splitlines()]
    assert [e["line"] for e in errs] == [2, 3,
                                         4] and "skipped 3 bad records: see" in " ".join(r.stderr.split())
    assert "empty text" in errs[1]["error"] and "no field 'text'" in errs[2]["error"]
    r = cli("classify", bundle, "--input", f, "--on-error", "skip")  # to stdout: a count and the first error
    assert (r.exit_code == 0 and len(r.stdout.splitlines()) == 2
            and "skipped 3 bad records" in " ".join(r.stderr.split()))


def test_workers_give_the_same_output_as_one_process(tmp_path: Path, bundle: Path) -> None:
    f = jsonl(tmp_path / "in.jsonl", rows(500))
    for w in ("1", "2"):
        r = cli("classify", bundle, "--input", f, "--output", tmp_path / f"o{w}.jsonl", "--workers", w,
                "--window", "64")
        assert r.exit_code == 0, r.output
    assert (tmp_path / "o1.jsonl").read_bytes() == (tmp_path / "o2.jsonl").read_bytes()


def test_memory_does_not_grow_with_the_input(tmp_path: Path, bundle: Path) -> None:
    """Peak resident memory classifying 5,000 and 40,000 rows in a fresh process: the same, within
    noise (the reader streams, a window at a time). benchmarks/batch_scale.py measures 1M rows."""
    peaks = {}
    for n in (5_000, 40_000):
        f = tmp_path / f"in{n}.txt"
        rng = random.Random(n)
        with open(f, "w") as fh:
            for _ in range(n):
                fh.write(sentence(rng, rng.randint(2, 12)) + "\n")
        code = ("import sys\nfrom mlmkit.cli import main\nsys.argv = ['mlmkit', 'classify', sys.argv[1], "
                "'--input', sys.argv[2], "
                "'--output', sys.argv[3], '--window', '1024']\ntry:\n    main()\nexcept SystemExit:\n    "
                "pass\n"
                "print(next(x.split()[1] for x in open('/proc/self/status') if x.startswith('VmHWM')))")
        r = subprocess.run([sys.executable, "-c", code, str(bundle), str(f), str(tmp_path / f"o{n}.jsonl")],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        peaks[n] = int(r.stdout.split()[-1]) / 1024
        assert len((tmp_path / f"o{n}.jsonl").read_text().splitlines()) == n
    assert peaks[40_000] < 1.1 * peaks[5_000] + 8, peaks  # MB
