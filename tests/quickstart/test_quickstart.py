"""`mlmkit quickstart` end to end on a reduced setting (5 pretraining steps, 300 retrieval documents):
every stage runs, offline, and leaves its runs and bundles behind. (So, seeds 0-2 left the classifier at
0.99-1.0 and the embedding model's nDCG@10 0.086-0.101 above the pretrained encoder's; at 20 steps and 400
documents, seed 2's classifier had 0.67 and seed 1's margin was 0.053.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path


def test_quickstart_runs_every_stage(tmp_path: Path, stdlib_docstrings: Path) -> None:
    out = tmp_path / "qs"
    # the standard library's docstrings, parsed once a session
    shutil.copytree(stdlib_docstrings, tmp_path / "cache")
    env = {**os.environ, "MLMKIT_CACHE": str(tmp_path / "cache"), "COLUMNS": "200"}
    r = subprocess.run([sys.executable, "-m", "mlmkit", "quickstart", "--out", str(out), "--pretrain-steps",
                        "5", "--retrieval-documents", "300"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    for stage in ("1. corpus", "2. tokenizer + tiny BERT pretrained for 5 steps", "3. sentiment classifier",
                  "4. ONNX export and onnxruntime inference", "fill-mask (onnxruntime)",
                  "classify (onnxruntime)"):
        assert stage in r.stdout, stage
    assert (out / "corpus.txt").stat().st_size > 100_000
    assert json.loads((out / "pretrain" / "mlmkit.json").read_text())["final_metrics"]["step"] == 5
    for bundle, task in (("fill-mask", "fill-mask"), ("classifier", "classification")):
        meta = json.loads((out / "exports" / bundle / "mlmkit.json").read_text())
        assert meta["task"] == task and meta["parity"]["max_abs_diff"]
    # the shipped sentiment set is easy: even on a barely pretrained encoder the classifier beats chance (1/3)
    clf = json.loads((out / "classifier" / "mlmkit.json").read_text())["final_metrics"]
    assert clf["eval_accuracy"] > 0.6, clf
    # the embedding model learns the retrieval set: its nDCG@10 above the pretrained encoder's
    assert "5. embedding model fine-tuned" in r.stdout and (out / "embedding" / "modules.json").is_file()
    emb = json.loads((out / "embedding" / "mlmkit.json").read_text())["final_metrics"]
    zero = float(re.search(r"pretrained encoder, mean pooling\D*([0-9.]+)", r.stdout).group(1))
    assert emb["eval_ndcg@10"] > zero + 0.05, (zero, emb)
    # the cheaper classifier: a 1-layer student of it and both int8, side by side
    assert "6. the classifier made cheaper" in r.stdout and "student int8" in r.stdout
    assert json.loads((out / "student" / "mlmkit.json").read_text())["distill"]["layer_map"] == [0]
