"""Batch inference at any size: streaming readers, windows, Parquet in and out with ids, bad records
skipped into an errors file, resumable jobs (SIGKILL, then --resume, gives the same bytes), worker
processes, and Ray Data (local mode)."""

from __future__ import annotations

import csv
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import run_export
from task_runs import build_runs, sentence
from typer.testing import CliRunner

from mlmkit.cli import app
from mlmkit.errors import DataFormatError
from mlmkit.jobs.batch import windows
from mlmkit.text.records import input_files, iter_inputs, stdin_inputs

runner = CliRunner()
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("jobs")
    runs = build_runs(root / "runs")
    run_export(runs["classification"], root / "clf")
    return root / "clf"


def cli(*args: str | Path, **kw):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "1000"}, **kw)


def rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"id": f"r{i}", "text": sentence(rng, rng.randint(1, 30))} for i in range(n)]


def jsonl(p: Path, data: list[dict]) -> Path:
    p.write_text("".join(json.dumps(r) + "\n" for r in data))
    return p


# ---- readers ---------------------------------------------------------------------------------------
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


def test_windows_cover_the_input_in_order_and_resume_past_finished_ones() -> None:
    ws = list(windows(range(10), 4))
    assert [(w.index, w.first, w.items) for w in ws] == [(0, 1, [0, 1, 2, 3]), (1, 5, [4, 5, 6, 7]),
                                                         (2, 9, [8, 9])]
    assert [w.index for w in windows(range(10), 4, skip=2)] == [2]


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


@pytest.mark.parametrize("suffix", [".jsonl", pytest.param(".parquet", marks=pytest.mark.slow),
                                    # the writers differ, the resume does not
                                    pytest.param(".csv", marks=pytest.mark.slow)])
def test_a_killed_job_resumes_to_the_same_bytes(tmp_path: Path, bundle: Path, suffix: str) -> None:
    f = jsonl(tmp_path / "in.jsonl", rows(3000, seed=1))
    whole, cut = tmp_path / f"whole{suffix}", tmp_path / f"cut{suffix}"
    cmd = [sys.executable, "-m", "mlmkit", "classify", str(bundle), "--input", str(f), "--window", "100",
           "--threads", "1"]
    assert subprocess.run([*cmd, "--output", str(whole)], capture_output=True).returncode == 0
    proc = subprocess.Popen([*cmd, "--output", str(cut)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    progress = tmp_path / f".cut{suffix}.job" / "progress.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # kill it once a few windows are done, mid-window
        if progress.exists() and json.loads(progress.read_text())["windows"] >= 3:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not cut.exists()  # no output file: the job did not finish
    r = subprocess.run([*cmd, "--output", str(cut)], capture_output=True, text=True)
    # never silently redone
    assert r.returncode == 2 and "an unfinished job" in r.stderr and "--resume" in r.stderr
    r = subprocess.run([*cmd, "--output", str(cut), "--resume"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert cut.read_bytes() == whole.read_bytes()
    assert not (tmp_path / f".cut{suffix}.job").exists()
    r = subprocess.run([*cmd, "--output", str(cut), "--resume"], capture_output=True, text=True)
    assert r.returncode == 2 and "no unfinished job" in r.stderr


def test_resume_refuses_another_input(tmp_path: Path, bundle: Path) -> None:
    f = jsonl(tmp_path / "in.jsonl", rows(50))
    job = tmp_path / ".o.jsonl.job"
    job.mkdir()
    (job / "progress.json").write_text(json.dumps({"what": {"inputs": [["elsewhere", 1, 1]]}, "windows": 1,
                                                   "records": 10,
                                                   "results": 10, "errors": 0}))
    r = cli("classify", bundle, "--input", f, "--output", tmp_path / "o.jsonl", "--resume")
    assert r.exit_code == 2 and "was for other" in " ".join(r.stderr.split())


@pytest.mark.parametrize("damage, field", [({"windows": "3"}, "windows"), ({"records": None}, "records"),
                                           ({"windows": -1}, "windows"), ({"what": []}, "what"),
                                           ({"counts": {"short": "x"}}, "counts.short"),
                                           ("drop-results", "results")])
def test_a_damaged_progress_file_is_one_line_naming_its_field(tmp_path: Path, bundle: Path, damage: Any,
                                                              field: str) -> None:
    f = jsonl(tmp_path / "in.jsonl", rows(50))
    job = tmp_path / ".o.jsonl.job"
    job.mkdir()
    good = {"what": {}, "windows": 1, "records": 10, "results": 10, "errors": 0, "counts": {}}
    bad = {k: v for k, v in good.items() if k != "results"} if damage == "drop-results" else {**good,
                                                                                              **damage}
    (job / "progress.json").write_text(json.dumps(bad))
    r = cli("classify", bundle, "--input", f, "--output", tmp_path / "o.jsonl", "--resume")
    said = " ".join(r.stderr.split())
    assert r.exit_code == 2 and (f"'{field}' is not" in said
                                 or f"no '{field}'" in said) and "progress.json" in said, said
    assert "Traceback" not in r.stderr


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


# ---- Ray Data -------------------------------------------------------------------------------------
@pytest.mark.slow  # 26 s: starts a Ray cluster
def test_ray_data_matches_the_local_results(tmp_path: Path, bundle: Path) -> None:
    ray = pytest.importorskip("ray")
    from mlmkit.jobs.ray import predict

    data = rows(200)
    shards = tmp_path / "shards"
    shards.mkdir()
    for k in range(2):
        part = data[k * 100 : (k + 1) * 100]
        pq.write_table(pa.table({"id": [r["id"] for r in part], "text": [r["text"] for r in part]}),
                       shards / f"p{k}.parquet")
    local = [json.loads(x)
             for x in cli("classify", bundle, "--input", shards, "--id-column", "id").stdout.splitlines()]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        out = predict(ray.data.read_parquet(str(shards)), bundle, concurrency=1, threads=1,
                      keep=["id"]).take_all()
        by_id = {o["id"]: o for o in out}
        assert sorted(by_id) == sorted(r["id"] for r in data)
        for x in local:  # Ray cuts its own batches: other padding, float noise only
            got = by_id[x["id"]]
            assert got["label"] == x["label"] and abs(got["score"] - x["score"]) < 1e-5, (got, x)
        def ray_job(out: Path) -> Any:
            return cli("predict", bundle, "--input", str(shards / "*.parquet"), "--output", out, "--engine",
                       "ray",
                       "--id-column", "id")

        for _ in range(2):  # the second job replaces the first one's shards, whole
            r = ray_job(tmp_path / "out")
            assert r.exit_code == 0, (r.output, r.exception)
            written = pq.read_table(tmp_path / "out").to_pylist()
            assert sorted(o["id"] for o in written) == sorted(r["id"] for r in data)
        # no job lock, no shards left beside
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []
        mine = tmp_path / "mine"
        mine.mkdir()
        (mine / "notes.txt").write_text("keep me")
        r = ray_job(mine)  # a directory of other files: refused before any work, nothing lost
        assert r.exit_code == 2 and "notes.txt" in r.output and (mine / "notes.txt").read_text() == "keep me"
        lock = tmp_path / ".out.job" / ".mlmkit.lock"  # another live process holds the output
        lock.parent.mkdir()
        lock.write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname(), "since": "now"}))
        r = ray_job(tmp_path / "out")
        assert r.exit_code == 2 and "being written by another job" in r.output
        assert sorted(o["id"] for o in pq.read_table(tmp_path / "out").to_pylist()) == sorted(r["id"]
                                                                                              for r in data)
    finally:
        ray.shutdown()
