"""Tiny task runs for the tests that need every kind of model: ``build_runs`` makes a randomly
initialised base model (its tokenizer trained on ``corpus()``, a word salad of WORDS and NAMES) and an
untrained head of each built-in task on it (``make_task_run``), with each task's labels, max length and
options from ``TASK_SETUP`` (tests/exporter/test_export.py checks that it names every registered
task); ``sentence`` draws one text from the same words."""

from __future__ import annotations

import random
from pathlib import Path

import torch
from conftest import make_base_model, run_export

from mlmkit.registry import TaskContext, get_task
from mlmkit.rundir.checkpoint import load_state_dict, load_weights, save_run
from mlmkit.rundir.config import load_config
from mlmkit.rundir.meta import RunMeta
from mlmkit.text.tokenizer import load_tokenizer

NAMES = "john mary paris london berlin anna peter rome".split()
WORDS = ("the a cat dog sat on mat went to city in big small red blue house river near old new man woman "
         "and with from saw that this very good bad happy sad day night").split()
TAG_LABELS = ["B-LOC", "B-PER", "I-LOC", "I-PER", "O"]
TASK_SETUP = {  # task -> (labels, max_length, options)
    "classification": (["neg", "pos"], 32, {}),
    "tagging": (TAG_LABELS, 24, {}),
    "qa": (None, 64, {"doc_stride": 24, "max_question_length": 16}),
    "embedding": (None, 32, {"pooling": "mean", "normalize": True}),
    "sparse-embedding": (None, 32, {"max_terms": 32}),
    "rerank": (["score"], 32, {}),
    "colbert": (None, 32, {"dim": 16, "query_length": 12}),
}


def corpus(n: int = 300, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS + NAMES) for _ in range(rng.randint(4, 14))) + " ." for _ in range(n)]


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS + NAMES) for _ in range(n))


def make_task_run(base: Path, task_name: str, out: Path, head_std: float = 0.5) -> Path:
    """An untrained task model on ``base``; the head gets a large init so its outputs are not flat."""
    labels, max_length, options = TASK_SETUP[task_name]
    task = get_task(task_name)
    cfg = load_config(base)
    if labels:
        cfg.id2label = dict(enumerate(labels))
        cfg.label2id = {v: k for k, v in cfg.id2label.items()}
    cfg.architectures = [task.hf_architecture]
    torch.manual_seed(1)
    net = task.build_model(cfg, TaskContext(max_length, task.resolve_options(options),
                                            tuple(labels) if labels else None,
                                            tokenizer=load_tokenizer(base)))
    head = tuple(k for k in net.state_dict() if not k.startswith(("bert.embeddings", "bert.encoder")))
    load_weights(net, load_state_dict(base), allow_missing=head)
    for name, p in net.named_parameters():
        if not name.startswith("bert.") and p.dim() == 2:
            torch.nn.init.normal_(p, std=head_std)
    meta = RunMeta(task=task_name, labels=tuple(labels) if labels else None, max_length=max_length,
                   options=task.resolve_options(options))
    save_run(net, out, config=cfg, tokenizer=load_tokenizer(base), meta=meta)
    return out


def build_runs(root: Path) -> dict[str, Path]:
    base = make_base_model(root / "base", corpus())
    runs = {"fill-mask": base}
    for name in TASK_SETUP:
        runs[name] = make_task_run(base, name, root / name)
    return runs


def export_all(runs: dict[str, Path], root: Path) -> dict[str, Path]:
    """Each of ``runs`` exported with the defaults into ``root``/KIND: kind -> its bundle."""
    for kind, run in runs.items():
        run_export(run, root / kind)
    return {kind: root / kind for kind in runs}
