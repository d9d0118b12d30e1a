"""Batch inference through Ray Data (mlmkit/jobs/ray.py), local mode: the same results as the local
job, and `--engine ray` writing its output directory."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest
from hostile import cli
from jobs_helpers import bundle_fixture, rows  # noqa: F401  (the fixture `bundle`)

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


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
