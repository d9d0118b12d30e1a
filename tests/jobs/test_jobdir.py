"""Resumable batch jobs (mlmkit/jobs/jobdir.py): a SIGKILLed job resumed with --resume gives the same
bytes, and a job directory that is for another input or whose progress.json is damaged is refused in
one line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hostile import cli
from jobs_helpers import bundle_fixture, jsonl, rows  # noqa: F401  (the fixture `bundle`)

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


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
