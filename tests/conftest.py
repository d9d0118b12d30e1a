"""Shared fixtures: tiny configs and a tiny base model directory for fine-tuning tests."""

from __future__ import annotations

import os
import random
from collections.abc import Iterable
from pathlib import Path

import pytest
import torch

from mlmkit.cli.common import err as cli_stderr
from mlmkit.models.config import ModelConfig
from mlmkit.models.core import BertForPreTraining
from mlmkit.rundir.checkpoint import save_run
from mlmkit.rundir.meta import RunMeta
from mlmkit.text.tokenizer import train_tokenizer


def tiny_config(vocab_size: int, **kw) -> ModelConfig:
    base = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                max_position_embeddings=512, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    base.update(kw)
    return ModelConfig(vocab_size=vocab_size, **base)


def make_base_model(out: Path, texts: Iterable[str], vocab_size: int = 400, seed: int = 0, **cfg) -> Path:
    """A randomly initialised BertForPreTraining run directory whose tokenizer is trained on ``texts``."""
    tok = train_tokenizer(list(texts), vocab_size=vocab_size, min_frequency=1)
    torch.manual_seed(seed)
    config = tiny_config(tok.get_vocab_size(), **cfg)
    config.architectures = ["BertForPreTraining"]
    save_run(BertForPreTraining(config), out, config=config, tokenizer=tok,
             meta=RunMeta(task="pretraining", max_length=128))
    return out


@pytest.fixture
def base_model_factory(tmp_path: Path):
    def make(texts: Iterable[str], name: str = "base", **kw) -> Path:
        return make_base_model(tmp_path / name, texts, **kw)

    return make


# rich sizes the CLI's stderr console once, at import, from COLUMNS (80 without a terminal) and breaks
# a longer word, such as a path, across lines: tests compare messages that name tmp paths whole, and
# the paths are longer under pytest-xdist (.../popen-gw1/...).
cli_stderr.width = 1000

# Tiny models gain nothing from a second thread, and on 2 shared cores two threads per process
# oversubscribe them (tests that spawn processes, other jobs): one thread is several times faster here.
torch.set_num_threads(1)
# and so do the mlmkit processes the tests start (the quickstart, sweeps, servers' model threads): torch
# reads these at its import, and a child with two threads beside the other worker oversubscribes the cores.
# onnxruntime keeps to OMP_NUM_THREADS too (runtime/engines.thread_budget): at its default of one thread
# a core, the registry, family and pipeline modules took 10-16% longer in two workers (2026-12-08,
# docs/performance.md "Threads across processes"). The tokenizers' thread pool is held to one as well.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
# Bundles run in fp32 on onnxruntime unless a test asks for another precision: the default (auto) would
# run them in bf16 on a CPU with bf16 units, where the parity tests hold fp32 to PyTorch at 1e-4 and a
# bf16 gate would be measured at every load. tests/runtime/test_precision.py tests auto, on this machine and
# with the CPU's bf16 units forced on and off; the test processes inherit the setting.
os.environ.setdefault("MLMKIT_PRECISION", "fp32")


@pytest.fixture(autouse=True)
def _seed_and_threads():
    random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture
def one_thread():
    """One torch thread for the test, whatever set it otherwise: runs compared bit for bit, and tiny
    models, which gain nothing from a second thread (on a shared 2-core machine a spinning OpenMP pool
    makes each step up to 10x slower)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Corpus shards go to the test's tmp dir, never to the user's cache."""
    monkeypatch.setenv("MLMKIT_CACHE", str(tmp_path / "cache"))


# ---- the Python API with flat keyword arguments, as the CLI builds it ---------------------------
def run_pretrain(corpus: list[Path], out: Path, **kw):
    from mlmkit.args import PretrainArgs
    from mlmkit.train.pretrain import pretrain

    return pretrain(PretrainArgs.from_flat(corpus=list(corpus), out=out, **kw))


def run_finetune(task: str, model: Path, train: Path, out: Path, **kw):
    from mlmkit.args import FinetuneArgs
    from mlmkit.train.finetune import finetune

    return finetune(FinetuneArgs.from_flat(task=task, model=model, train_file=train, out=out, **kw))


def run_export(run: Path, out: Path, **kw):
    """Export ``run`` to ``out``; the bundle's description as its mlmkit.json holds it
    (BundleMeta.to_json)."""
    from mlmkit.args import ExportArgs
    from mlmkit.exporter.bundle import export

    return export(ExportArgs(run=run, out=out, **kw)).to_json()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests first: with the suite spread over worker processes, one started last would
    run on alone at the end."""
    first = ("test_quickstart.py", "test_two_processes_share_one_sqlite_study",
             "test_learns_the_generated_language",
             "test_learns_to_answer_and_loads_in_transformers",
             "test_two_process_cpu_run_writes_one_checkpoint",
             "test_mnrl_under_torchrun_sees_every_ranks_negatives",
             "test_cached_mnrl_under_torchrun_equals_one_process",
             "test_evaluation_under_torchrun_is_spread_and_equals_one_process",
             "test_colbert_under_torchrun_sees_every_ranks_negatives")
    items.sort(key=lambda item: not any(name in item.nodeid for name in first))


@pytest.fixture(scope="session")
def stdlib_docstrings(tmp_path_factory) -> Path:
    """A cache directory holding the standard library's parsed docstrings (stdlib_corpus.definitions):
    copied into a test's own $MLMKIT_CACHE, a subprocess that builds the built-in sets reads them
    instead of parsing the standard library again (about 4 s)."""
    import json

    from mlmkit.files import atomic_write_text
    from mlmkit.quickstart.stdlib_corpus import cached_definitions, definitions

    cache = tmp_path_factory.mktemp("stdlib-docstrings")
    atomic_write_text(cached_definitions(cache), json.dumps(definitions()))
    return cache


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A run of every task kind (tests/task_runs.py's ``build_runs``), built once a worker for the modules
    that only read them (tests/exporter/, tests/runtime/, tests/train/test_distill.py ...); a module with a
    ``runs`` fixture of its own uses that."""
    from task_runs import build_runs

    return build_runs(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="session")
def task_bundles(runs, tmp_path_factory) -> dict[str, Path]:
    """Each of ``runs`` exported with the defaults (task_runs.export_all), once a worker, for the modules
    that only read or serve them (tests/runtime/, tests/serve/, the flag walker): kind -> its bundle.
    A test that changes a bundle copies it first."""
    from task_runs import export_all

    return export_all(runs, tmp_path_factory.mktemp("task-bundles"))


@pytest.fixture(scope="session")
def classification_bundle(runs, tmp_path_factory) -> Path:
    """The classification run of ``runs`` exported, once a worker (tests/jobs/, as ``bundle``)."""
    out = tmp_path_factory.mktemp("jobs") / "clf"
    run_export(runs["classification"], out)
    return out


PROMPTS = {"query_prompt": "query: ", "document_prompt": "passage: "}
"""The prompts of the ``retrieval`` fixture's fine-tuned run, as e5's."""


# not module: the torchrun tests run first (pytest_collection_modifyitems), the rest later
@pytest.fixture(scope="session")
def retrieval(tmp_path_factory):
    """An embedding model fine-tuned on the built-in retrieval set (500 documents, 60 steps), for the
    tests of the embedding task (tests/tasks/test_retrieval.py) and of mining
    (tests/retrieval/test_mining.py): its base, run, BEIR directory, final metrics and the set's counts."""
    import json

    from mlmkit.quickstart.retrieval_set import write_retrieval_set

    tmp = tmp_path_factory.mktemp("retrieval")
    beir = tmp / "set"
    counts = write_retrieval_set(beir, max_documents=500)
    texts = [json.loads(line)["text"] for f in ("corpus.jsonl", "queries.jsonl") for line in open(beir / f)]
    torch.manual_seed(0)
    base = make_base_model(tmp / "base", texts, vocab_size=1500)
    run = tmp / "run"
    metrics = run_finetune("embedding", base, beir, run, eval_file=beir, steps=60, lr=1e-3, batch_size=64,
                           max_length=48, eval_every=1000, progress=False, options=PROMPTS)
    return {"tmp": tmp, "beir": beir, "base": base, "run": run, "metrics": metrics, "counts": counts}
