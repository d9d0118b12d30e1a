"""The same corpus and queries give byte-identical `mlmkit search --json`, `mlmkit mine` and `mlmkit
evaluate` outputs whichever of numpy's CPU-specific kernels run (docs/retrieval.md, "Ties"): the built-in
retrieval set has many equal BM25 scores, so a ranking whose order of equal scores were left to the
selection kernel would differ here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest_plugins = ["index_fixtures"]

SCRIPT = r"""
import json, os, sys
from pathlib import Path
from typer.testing import CliRunner
from mlmkit.cli import app

bundle, index, beir, out = (Path(a) for a in sys.argv[1:5])
os.chdir(out)  # the outputs named alike in both runs (mine says its --out)
runner = CliRunner()
queries = [json.loads(line)["text"] for line in open(beir / "queries.jsonl")][:12]
calls = {
    "search": ["search", str(index), *queries, "--top-k", "40", "--json"],
    "search-hybrid": ["search", str(index), *queries, "--top-k", "40", "--hybrid", "bm25", "--corpus",
                      str(beir / "corpus.jsonl"), "--json"],
    "mine-bm25": ["mine", str(beir), "--out", "bm25.jsonl", "--negatives", "8", "--with-scores"],
    "mine-index": ["mine", str(beir), "--retriever", str(index), "--out", "index.jsonl",
                   "--negatives", "8", "--with-scores"],
    "evaluate": ["evaluate", str(bundle), "--data", str(beir), "--json"],
    "evaluate-hybrid": ["evaluate", str(index), "--data", str(beir), "--hybrid", "bm25", "--json"],
}
said = {}
for name, argv in calls.items():
    r = runner.invoke(app, argv, env={"COLUMNS": "1000"})
    assert r.exit_code == 0, (name, r.output)
    said[name] = r.stdout
for f in sorted(Path().glob("*.jsonl")):
    said[f.name] = f.read_text()
print(json.dumps(said))
"""


def test_search_mine_and_evaluate_are_byte_identical_with_numpys_kernels_on_and_off(setup, beir, tmp_path):
    pytest.importorskip("bm25s")
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    dispatched = [f for f in __cpu_dispatch__ if __cpu_features__.get(f)]
    if not dispatched:
        pytest.skip("numpy dispatches to no kernel beyond its baseline on this CPU")
    said = []
    for i, off in enumerate(("", " ".join(dispatched))):
        out = tmp_path / str(i)
        out.mkdir()
        env = {**os.environ, "NPY_DISABLE_CPU_FEATURES": off, "MLMKIT_CACHE": str(tmp_path / f"cache{i}")}
        argv = [str(setup["bundle"]), str(setup["root"] / "beir-ix"), str(beir), str(out)]
        r = subprocess.run([sys.executable, "-c", SCRIPT, *argv], capture_output=True, text=True, env=env,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        said.append(json.loads(r.stdout.splitlines()[-1]))
    assert said[0].keys() == said[1].keys() and len(said[0]) == 8
    for name in said[0]:
        assert said[0][name] == said[1][name], name
    hits = [json.loads(line)["hits"] for line in said[0]["search"].splitlines()]
    scores = [[h["score"] for h in row] for row in hits]
    assert any(a == b for row in scores for a, b in zip(row, row[1:])), "no equal scores: nothing tested"
