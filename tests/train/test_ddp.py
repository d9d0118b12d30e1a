"""A 2-process CPU run under torchrun (gloo): it completes, only rank 0 writes, one checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hostile import word_corpus

from mlmkit.files import read_json
from mlmkit.rundir.checkpoint import load_state_dict
from mlmkit.text.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return word_corpus(tmp_path_factory.mktemp("ddp") / "corpus.txt", 40, words=(4, 10), sentences=(3, 6))


def torchrun(tmp_path: Path, *args: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MLMKIT_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "mlmkit.cli", "pretrain", *args]
    # its own process group, so that a hang is cleaned up with every worker torchrun started
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("torchrun did not finish within 180 s")
    assert proc.returncode == 0, err[-3000:]


def check_run(out: Path, steps: int) -> list[dict]:
    (ck,) = (out / "checkpoints").iterdir()  # exactly one checkpoint
    assert ck.name == f"step-{steps:07d}"
    state = read_json(ck / "state" / "trainer.json")
    assert state["world"] == 2 and state["step"] == steps
    # the position counts this rank's micro-batches (rank r takes batch micro * 2 + r)
    assert state["micro"] == steps
    sd = load_state_dict(out)
    assert sd["bert.embeddings.word_embeddings.weight"].shape[0] == load_tokenizer(out).get_vocab_size()
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in recs if "loss" in r]
    assert train_steps == sorted(set(train_steps)) and train_steps[-1] == steps  # written once, by rank 0
    return recs


def test_two_process_cpu_run_writes_one_checkpoint(corpus, tmp_path):
    out = tmp_path / "run"
    torchrun(tmp_path, str(corpus), "--out", str(out), "--vocab-size", "100", "--steps", "4",
             "--batch-size", "4", "--seq-len", "32", "--save-every", "100", "--eval-every", "100")
    recs = check_run(out, 4)
    assert "eval_nsp_accuracy" in recs[-1]
    assert read_json(out / "mlmkit.json")["final_metrics"]["step"] == 4


def test_ranks_draw_disjoint_batches_from_one_shard(corpus, tmp_path):
    """Rank r of w makes only batches micro * w + r, and together they are the single process's batches."""
    import torch

    from mlmkit.text.tokenizer import train_tokenizer
    from mlmkit.train.corpus.shards import tokenize_corpus
    from mlmkit.train.data import PretrainData, batch_seed

    tok = train_tokenizer(corpus.read_text().split("\n"), vocab_size=100, min_frequency=1)
    data = PretrainData(tokenize_corpus([corpus], tok, tmp_path / "cache"), tok, max_len=32, batch_size=4,
                        seed=0)
    world, epoch = 2, 0
    per_rank = [[data.batch(epoch, m * world + r, batch_seed(0, epoch, m * world + r))["input_ids"]
                 for m in range(3)]
                for r in range(world)]
    single = [data.batch(epoch, i, batch_seed(0, epoch, i))["input_ids"] for i in range(6)]
    assert all(torch.equal(per_rank[i % world][i // world], single[i]) for i in range(6))
    rows = [tuple(x.tolist()) for b in single for x in b]
    assert len(set(rows)) == len(rows)  # no sequence twice within the epoch's first batches


@pytest.mark.slow  # 13 s; test_two_process_cpu_run_writes_one_checkpoint covers DDP in make test
def test_two_process_mlm_only(corpus, tmp_path):
    # without NSP the pooler and NSP head take no part in the loss: DDP must not wait for their gradients
    out = tmp_path / "run"
    torchrun(tmp_path, str(corpus), "--out", str(out), "--vocab-size", "100", "--steps", "3", "--no-nsp",
             "--batch-size", "4", "--seq-len", "32", "--save-every", "100", "--eval-every", "100")
    recs = check_run(out, 3)
    assert "eval_mlm_accuracy" in recs[-1] and "eval_nsp_accuracy" not in recs[-1]
