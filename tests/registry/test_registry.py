"""The task registry: entry-point discovery and its errors, a third-party plugin installed from outside
the package and driven through the whole CLI, and the contract checked on every discovered task
(timm-style parametrisation): forward, backward, evaluation, the torch-free runtime side, export with
the parity gate and serving (the contract's members, defaults and refusals: test_contract.py)."""

from __future__ import annotations

import ast
import json
import math
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import run_export, run_finetune, tiny_config
from contract_helpers import Minimal
from typer.testing import CliRunner

from mlmkit import registry
from mlmkit.cli import app
from mlmkit.errors import ConfigError, TaskError
from mlmkit.models import FAMILIES
from mlmkit.models.presets import preset
from mlmkit.registry import REQUIRED, Plugin, TaskContext, per_token
from mlmkit.rundir.checkpoint import save_run
from mlmkit.rundir.meta import RunMeta
from mlmkit.runtime import prediction
from mlmkit.runtime.pipeline import Pipeline
from mlmkit.text.batching import pad_features
from mlmkit.text.tokenizer import special_ids, train_tokenizer
from mlmkit.train.finetune import TaskEvaluator, torch_forward

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
BUILTINS = ("classification", "colbert", "embedding", "fill-mask", "qa", "rerank", "sparse-embedding",
            "tagging")


def squash(text: str) -> str:
    """CLI output with rich's line wrapping undone."""
    return " ".join(text.split())


# ---- installing fake distributions -------------------------------------------------------------
def install_distribution(site: Path, name: str, entry_points: dict[str, str], version: str = "0.1") -> Path:
    """What pip leaves behind for a package that declares [project.entry-points."mlmkit.tasks"]."""
    d = site / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                                encoding="utf-8")
    eps = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (d / "entry_points.txt").write_text(f"[mlmkit.tasks]\n{eps}", encoding="utf-8")
    return d


FAKE_TASK = '''
class FakeTask:
    name = "{name}"
    description = "a fake task"
    metrics = ("score",)
    outputs = {{"score": ("batch",)}}

    def read(self, path, options): return []
    def featurize(self, examples, tokenizer, ctx, *, training): return []
    def build_model(self, config): raise NotImplementedError
    def postprocess(self, outputs, features, examples, ctx): return []
    def compute_metrics(self, predictions, examples, ctx): return {{"score": 0.0}}


task = FakeTask()
'''


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An empty site directory on sys.path; the registry forgets its plugins before and after, and the
    modules imported from here are dropped, so no other test sees what a test installs."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    before = set(sys.modules)
    registry.reset()
    yield site
    registry.reset()
    for name in set(sys.modules) - before:
        f = getattr(sys.modules[name], "__file__", None) or ""
        if f.startswith((str(tmp_path), str(PLUGINS))):
            del sys.modules[name]


@pytest.fixture
def pairreg(site: Path, monkeypatch: pytest.MonkeyPatch):
    """The sentence-pair regression plugin (tests/plugins/pairreg) installed as distribution "pairreg"."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    install_distribution(site, "pairreg", {"pairreg": "pairreg.task:task"})
    registry.reset()
    return registry.get_task("pairreg")


# ---- discovery ---------------------------------------------------------------------------------
def pyproject_task_entry_points() -> dict[str, str]:
    """[project.entry-points."mlmkit.tasks"] of pyproject.toml (tomllib is 3.11+; the project supports
    3.10)."""
    section = re.search(r'^\[project\.entry-points\."mlmkit\.tasks"\]\n(.*?)(?=^\[|\Z)',
                        (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M | re.S)
    assert section, "pyproject.toml declares no mlmkit.tasks entry points"
    return dict(re.findall(r'^\s*([\w-]+)\s*=\s*"([^"]+)"', section.group(1), re.M))


def test_builtin_tasks_are_registered_through_entry_points_like_any_plugin() -> None:
    registry.reset()
    reg = registry.tasks()
    declared = pyproject_task_entry_points()
    assert set(declared) == set(BUILTINS)
    assert set(BUILTINS) <= set(reg)
    for name in BUILTINS:
        p = reg[name]
        assert p.distribution == "mlmkit"
        assert p.entry_point == declared[name] == f"mlmkit_tasks.{name.replace('-', '_')}:task"
        assert isinstance(p.task, registry.Task)
        assert p.name == name and p.metrics, f"{name} declares no metrics"


def test_core_never_imports_a_task() -> None:
    """No module under mlmkit/ imports a task, by import statement or by name (importlib), and none
    names a built-in task in its code (the CLI's command names aside: `mlmkit qa` is a command; so are
    output names, which the serving routes read from any task's graph: "embedding" is one)."""
    import typer

    registry.reset()
    outputs = {name for p in registry.tasks().values() for name in p.outputs}
    commands = set(typer.main.get_command(app).commands) | outputs
    for src in sorted((ROOT / "mlmkit").rglob("*.py")):
        tree = ast.parse(src.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module or ""] if node.level == 0 else []
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                mods = [node.value] if node.value.startswith("mlmkit_tasks") else []
                # a string that is a built-in task's name is the core special-casing it (docstrings aside)
                named = (node.value in BUILTINS and node.value not in commands
                         and "quickstart" not in src.parts)
                assert not named, f"{src.name}:{node.lineno} names '{node.value}'"
            else:
                continue
            bad = [m for m in mods if m.split(".")[0] in ("mlmkit_tasks", "tasks")]
            assert not bad, f"{src.name}:{node.lineno} imports {bad[0]}"


def test_unknown_task_lists_the_registered_ones() -> None:
    registry.reset()
    with pytest.raises(TaskError, match=r"unknown task 'ner'; registered tasks: classification, colbert, "
                                        r"embedding, fill-mask, qa, rerank, sparse-embedding, tagging") as e:
        registry.get_task("ner")
    assert "mlmkit tasks" in (e.value.hint or "")


def test_cli_unknown_task_exits_2_with_the_list(tmp_path: Path) -> None:
    registry.reset()
    res = CliRunner().invoke(app, ["finetune", "nosuchtask", "--model", str(tmp_path), "--train", "t.jsonl",
                                   "--out", "o"])
    assert res.exit_code == 2, res.output
    assert len(res.stderr.strip().splitlines()) == 1, f"not one line: {res.stderr!r}"
    msg = squash(res.stderr)
    assert ("unknown task 'nosuchtask'; registered tasks: classification, colbert, embedding, fill-mask, qa, "
            "rerank, sparse-embedding, tagging") in msg
    assert "Traceback" not in res.output


def test_duplicate_name_across_distributions_breaks_only_that_name(site: Path) -> None:
    (site / "alpha_tasks.py").write_text(FAKE_TASK.format(name="dup"), encoding="utf-8")
    (site / "beta_tasks.py").write_text(FAKE_TASK.format(name="dup"), encoding="utf-8")
    install_distribution(site, "alpha-tasks", {"dup": "alpha_tasks:task"})
    install_distribution(site, "beta-tasks", {"dup": "beta_tasks:task"})
    assert "dup" not in registry.tasks() and set(BUILTINS) <= set(registry.tasks())
    with pytest.raises(TaskError, match=r"the dup task is broken: task 'dup' is registered twice") as e:
        registry.get_task("dup")
    msg = str(e.value)
    for part in ("alpha_tasks:task", "from alpha-tasks", "beta_tasks:task", "from beta-tasks"):
        assert part in msg
    assert registry.get_task("classification").distribution == "mlmkit"


def test_plugin_reusing_a_builtin_name_is_ignored(site: Path, caplog: pytest.LogCaptureFixture) -> None:
    (site / "copycat.py").write_text(FAKE_TASK.format(name="classification"), encoding="utf-8")
    install_distribution(site, "copycat", {"classification": "copycat:task"})
    with caplog.at_level("WARNING", logger="mlmkit"):
        assert registry.get_task("classification").distribution == "mlmkit"
    assert "from copycat is ignored: the name is mlmkit's own task" in caplog.text


def test_register_refuses_to_overwrite() -> None:
    registry.reset()
    try:
        with pytest.raises(TaskError, match=r"task 'qa' is already registered by mlmkit"):
            registry.register(type("Clash", (Minimal,), {"name": "qa"})())
        assert registry.get_task("qa").entry_point == "mlmkit_tasks.qa:task"
        assert (registry.register(Minimal()).name == "minimal" and registry.get_task("minimal").task.name
                == "minimal")
    finally:
        registry.reset()


def test_read_is_given_the_record_ceiling_where_it_takes_one(caplog: pytest.LogCaptureFixture) -> None:
    """--max-record-bytes reaches a task's read as ``max_bytes`` (no process-wide state); a task whose
    read takes none reads with the default ceiling, and a ceiling it cannot honour is said in the log."""
    got: list[dict] = []

    class Ceiling(Minimal):
        name = "ceiling"

        def read(self, path, options, *, max_bytes):
            got.append({"max_bytes": max_bytes})
            return []

    registry.reset()
    try:
        registry.register(Ceiling())
        registry.register(Minimal())
        registry.get_task("ceiling").read(Path("x"), {}, training=True, max_bytes=40)
        assert got == [{"max_bytes": 40}]
        with caplog.at_level("WARNING", logger="mlmkit"):
            # the default: nothing to say
            assert registry.get_task("minimal").read(Path("x"), {}, training=True) == []
        assert "max_bytes" not in caplog.text
        with caplog.at_level("WARNING", logger="mlmkit"):
            registry.get_task("minimal").read(Path("x"), {}, max_bytes=40)
        said = "the minimal task's read takes no max_bytes: x is read with the default record ceiling"
        assert said in caplog.text
    finally:
        registry.reset()


def test_plugin_failing_to_import_breaks_only_itself(site: Path) -> None:
    (site / "broken_plugin.py").write_text("import a_dependency_that_is_not_installed\ntask = None\n",
                                           encoding="utf-8")
    install_distribution(site, "broken-plugin", {"broken": "broken_plugin:task"})
    assert registry.get_task("classification").name == "classification"
    with pytest.raises(TaskError) as e:
        registry.get_task("broken")
    msg = str(e.value)
    assert "task plugin 'broken' (broken_plugin:task, from broken-plugin) failed to load" in msg
    assert "ModuleNotFoundError" in msg and "a_dependency_that_is_not_installed" in msg
    res = CliRunner().invoke(app, ["tasks", "--json"])  # listed as broken, the others as ever
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in map(json.loads, res.stdout.splitlines())}
    assert set(BUILTINS) <= set(rows) and "ModuleNotFoundError" in rows["broken"]["broken"]
    assert rows["broken"]["package"] == "broken-plugin"
    res = CliRunner().invoke(app, ["finetune", "broken", "--model", "m", "--train", "t.jsonl", "--out", "o"])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.output


@pytest.mark.parametrize("source,reason", [
    ("import sys\nsys.exit(0)\n", r"it called sys.exit\(0\) on import"),
    ("raise KeyboardInterrupt\n", r"KeyboardInterrupt"),
    ("class T:\n    def __init__(self):\n        raise RuntimeError('no config here')\n",
     r"RuntimeError: no config here"),
    (FAKE_TASK.format(name="bad") + "task.outputs = ['logits']\n", r"failed to load: (ValueError|TypeError)"),
    (FAKE_TASK.format(name="bad") + "task.options = ('text_column',)\n",
     r"options must be TaskOption objects"),
])
def test_a_misbehaving_plugin_breaks_only_itself(site: Path, source: str, reason: str) -> None:
    target = "bad_plugin:T" if "class T" in source else "bad_plugin:task"
    (site / "bad_plugin.py").write_text(source, encoding="utf-8")
    install_distribution(site, "bad-plugin", {"bad": target})
    assert set(BUILTINS) <= set(registry.tasks())
    with pytest.raises(TaskError, match=reason):
        registry.get_task("bad")
    res = CliRunner().invoke(app, ["tasks"])
    assert res.exit_code == 0 and "broken" in res.stdout


def test_plugin_lacking_required_members_is_broken(site: Path) -> None:
    (site / "halfdone.py").write_text("class T:\n    name = 'half'\n    def read(self, path, options): "
                                      "return []\n\ntask = T()\n")
    install_distribution(site, "halfdone", {"half": "halfdone:task"})
    with pytest.raises(TaskError,
                       match=r"task plugin 'half' from halfdone lacks description, metrics, outputs, "
                             r"featurize, build_model, postprocess, compute_metrics"):
        registry.get_task("half")


def test_entry_point_name_must_be_the_task_name(site: Path) -> None:
    """A run records the task's name and is loaded back by it: the two names cannot differ."""
    (site / "misnamed.py").write_text(FAKE_TASK.format(name="regression"), encoding="utf-8")
    install_distribution(site, "misnamed", {"pair-regression": "misnamed:task"})
    with pytest.raises(TaskError, match=r"task plugin 'pair-regression' \(misnamed:task, from misnamed\) "
                                        r"calls itself 'regression'"):
        registry.get_task("pair-regression")


def test_tasks_json_lists_options_for_every_task() -> None:
    registry.reset()
    res = CliRunner().invoke(app, ["tasks", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in map(json.loads, res.stdout.splitlines())}
    assert set(rows) == set(BUILTINS)
    qa = {o["name"]: o for o in rows["qa"]["options"]}
    assert qa["doc_stride"] == {"name": "doc_stride", "flag": "--doc-stride", "type": "int", "default": 128,
                                "help": "Overlap of context windows, in tokens."}
    tagging = {o["name"]: o for o in rows["tagging"]["options"]}
    assert tagging["scheme"]["choices"] == ["auto", "iob1", "iob2",
                                            "bioes"] and tagging["label_all_tokens"]["type"] == "bool"
    assert rows["classification"]["command"] == "classify"


# ---- a third-party plugin, installed without touching the core ---------------------------------
def test_third_party_plugin_is_discovered_and_listed(pairreg: Plugin) -> None:
    assert pairreg.name == "pairreg" and type(pairreg.task).__module__ == "pairreg.task"
    assert (pairreg.distribution, pairreg.entry_point) == ("pairreg", "pairreg.task:task")
    assert set(BUILTINS) <= set(registry.tasks())  # the built-ins are still there
    # it implements the required members, its option and from_input: everything else is a default
    own = {k for k in vars(type(pairreg.task)) if not k.startswith("_")}
    assert own == set(REQUIRED) | {"options", "from_input"}

    res = CliRunner().invoke(app, ["tasks", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in map(json.loads, res.stdout.splitlines())}
    assert sorted(rows) == sorted(registry.tasks())
    assert rows["pairreg"] == {
        "name": "pairreg", "description": pairreg.description, "formats": [],
        "metrics": ["pearson", "spearman"],
        "package": "pairreg", "command": None, "trainable": True,
        "options": [{"name": "score_field", "flag": "--option score_field=VALUE", "type": "str",
                     "default": "score",
                     "help": "The JSON field holding the gold score."}],
    }
    assert {rows[n]["package"] for n in BUILTINS} == {"mlmkit"}


COLOURS = "red blue green black white pink gray brown gold teal".split()
WARM = set(COLOURS[:5])


def pair_rows(n: int, rng: random.Random, field: str = "score") -> list[dict[str, Any]]:
    """score = share of 'warm' colours over both sentences: a function of the pair a small model can learn."""
    rows = []
    for _ in range(n):
        a, b = rng.sample(COLOURS, 4), rng.sample(COLOURS, 4)
        rows.append({"text": " ".join(a), "text_pair": " ".join(b), field: sum(w in WARM for w in a + b) / 8})
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def jsonl(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_third_party_plugin_through_the_whole_cli(pairreg: Plugin, base_model_factory: Any,
                                                  tmp_path: Path) -> None:
    """finetune -> evaluate -> export (parity gate) -> predict -> evaluate the bundle, all from the
    command line, the plugin's own option set there: the gold scores live in a field named 'similarity'."""
    rng = random.Random(0)
    train = write_jsonl(tmp_path / "train.jsonl", pair_rows(256, rng, "similarity"))
    test_rows = pair_rows(100, rng, "similarity")
    test = write_jsonl(tmp_path / "test.jsonl", test_rows)
    base = base_model_factory([" ".join(COLOURS)] * 4)
    run, bundle = tmp_path / "run", tmp_path / "bundle"
    cli = CliRunner()

    # without the option the reader looks for "score" and says so, naming file, line and field
    r = cli.invoke(app,
                   ["finetune", "pairreg", "--model", str(base), "--train", str(train), "--out", str(run)])
    assert r.exit_code == 2 and "train.jsonl, line 1, field 'score': missing" in squash(r.stderr), r.output
    r = cli.invoke(app,
                   ["finetune", "pairreg", "--model", str(base), "--train", str(train), "--out", str(run),
                    "--option", "score_field=similarity", "--epochs", "8", "--batch-size", "16", "--lr",
                    "3e-3"])
    assert r.exit_code == 0, r.output
    meta = json.loads((run / "mlmkit.json").read_text())
    assert (meta["task"], meta["labels"], meta["options"]) == ("pairreg", None, {"score_field": "similarity"})

    r = cli.invoke(app, ["evaluate", str(run), "--data", str(test), "--predictions",
                         str(tmp_path / "p.jsonl"), "--json"])
    assert r.exit_code == 0, r.output
    torch_metrics = json.loads(r.stdout)
    assert torch_metrics["pearson"] > 0.8 and torch_metrics["spearman"] > 0.8, torch_metrics  # it learned
    torch_preds = jsonl((tmp_path / "p.jsonl").read_text())
    mse = sum((p["score"] - t["similarity"]) ** 2 for p, t in zip(torch_preds, test_rows)) / len(test_rows)
    var = sum((t["similarity"] - 0.5) ** 2 for t in test_rows) / len(test_rows)
    assert mse < 0.25 * var, (mse, var)  # not just correlated: close to the scores

    r = cli.invoke(app, ["export", str(run), "--out", str(bundle), "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["task"] == "pairreg" and summary["parity"]["max_abs_diff"]["score"] <= 1e-4
    assert summary["parity"]["top1_agreement"] is None  # a regression makes no choice to agree on
    assert summary["fused_operators"]["Attention"] == 2

    r = cli.invoke(app, ["predict", str(bundle), "--input", str(test)])
    assert r.exit_code == 0, r.output
    onnx_preds = jsonl(r.stdout)
    assert len(onnx_preds) == len(test_rows)
    assert max(abs(a["score"] - b["score"]) for a, b in zip(onnx_preds, torch_preds)) < 1e-4
    r = cli.invoke(app, ["predict", str(bundle), "red blue green black\tpink gray brown gold"])
    assert r.exit_code == 0 and set(jsonl(r.stdout)[0]) == {"score"}

    r = cli.invoke(app, ["evaluate", str(bundle), "--data", str(test), "--json"])  # the saved option applies
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == pytest.approx(torch_metrics, abs=1e-4)
    r = cli.invoke(app, ["predict", str(bundle), "a text", "--option", "nonsense=1"])
    assert (r.exit_code == 2 and "--option nonsense is not an option of task 'pairreg' (its options: "
                                 "--option score_field=VALUE)" in squash(r.stderr))
    r = cli.invoke(app, ["classify", str(bundle), "a text"])
    assert r.exit_code == 2 and "use `mlmkit predict" in squash(r.stderr)


def test_third_party_plugin_is_gone_after_its_test() -> None:
    registry.reset()
    assert "pairreg" not in registry.tasks()
    assert "pairreg" not in sys.modules


# ---- the Task contract, on every discovered task -----------------------------------------------
def squad_paragraph(context: str, qas: list[tuple[str, str, str]]) -> dict[str, Any]:
    return {"context": context, "qas": [
        {"id": i, "question": q, "answers": [{"text": a, "answer_start": context.index(a)}]}
        for i, q, a in qas
    ]}


SAMPLES: dict[str, dict[str, Any]] = {
    "embedding": {
        "file": "sample.jsonl",
        "data": "".join(json.dumps(r) + "\n" for r in [
            {"text": "a good film", "text_pair": "a fine film", "score": 4.5},
            {"text": "a bad film", "text_pair": "good good story", "score": 0.5},
            {"text": "the plot is dull", "text_pair": "a dull plot", "score": 4.0},
        ]),
        "input": "a fine story",
    },
    "classification": {
        "file": "sample.jsonl",
        "data": "".join(json.dumps(r) + "\n" for r in [
            {"text": "a good and fine film", "label": "pos"},
            {"text": "a bad film", "label": "neg"},
            {"text": "good good story", "label": "pos"},
            {"text": "bad acting and a dull plot", "label": "neg"},
        ]),
        "input": "a fine story",
    },
    "rerank": {
        "file": "sample.jsonl",
        "data": "".join(json.dumps(r) + "\n" for r in [
            {"query": "a good film", "document": "a fine and good film", "label": 1},
            {"query": "a good film", "document": "bad acting", "label": 0},
            {"query": "a dull plot", "document": "the plot is dull", "label": 1},
            {"query": "a dull plot", "document": "a fine story", "label": 0},
        ]),
        "input": {"text": "a good film", "text_pair": "a fine story"},
    },
    "tagging": {
        "file": "sample.conll",
        "data": "John B-PER\nlives O\nin O\nNew B-LOC\nYork I-LOC\n\nMary B-PER\nvisits O\nParis "
                "B-LOC\n.\tO\n\n"
                "Paris B-LOC\nis O\nbig O\n",
        "input": "Mary lives in Paris.",
    },
    "qa": {
        "file": "sample.json",
        "data": json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [
            squad_paragraph("The cat sat on the mat near the red door.",
                            [("q1", "Where did the cat sit?", "on the mat"),
                             ("q2", "What colour is the door?", "red")]),
            squad_paragraph("Paris is the capital of France.",
                            [("q3", "What is the capital of France?", "Paris")]),
        ]}]}),
        "input": {"question": "Where is the door?", "context": "The door is in the hall."},
    },
}


# the metrics of a task whose data decide what it measures, for its sample (the embedding task: retrieval
# metrics for rows and BEIR directories, these for scored pairs)
SAMPLE_METRICS = {"embedding": ("spearman", "pearson"),
                  "sparse-embedding": ("ndcg@10", "mrr@10", "map@100", "recall@10", "recall@100",
                                       "precision@10",
                                       "query_terms", "document_terms")}
HEADLESS = {"embedding"}  # tasks whose head has no parameters: the embedding task's pooling and normalisation
SAMPLES["fill-mask"] = {  # evaluated on the answers of its [MASK]s; exported as it comes, never fine-tuned
    "file": "sample.jsonl",
    "data": "".join(json.dumps(r) + "\n" for r in [
        {"text": "a good [MASK] film", "answer": "and"},
        {"text": "a [MASK] film", "answer": "bad"},
        {"text": "the [MASK] is [MASK]", "answer": ["plot", "dull"]},
    ]),
    "input": "a fine [MASK] story",
}
SAMPLES["sparse-embedding"] = {  # SPLADE trains on (anchor, positive) rows, evaluated as retrieval
    "file": "sample.jsonl",
    "data": "".join(json.dumps(r) + "\n" for r in [
        {"anchor": "a good film", "positive": "a fine and good film"},
        {"anchor": "a dull plot", "positive": "the plot is dull"},
        {"anchor": "bad acting", "positive": "the acting was bad"},
    ]),
    "input": "a fine story",
}

SAMPLES["colbert"] = {**SAMPLES["sparse-embedding"]}  # late interaction reads what SPLADE reads
SAMPLE_METRICS["colbert"] = ("ndcg@10", "mrr@10", "map@100", "recall@10", "recall@100", "precision@10")


def discovered() -> list[str]:
    registry.reset()
    try:
        return sorted(registry.tasks())
    finally:
        registry.reset()


@pytest.fixture
def sample(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """Task, examples read from a tiny data file, a tokenizer trained on it, the context and config."""
    name = request.param
    task = registry.get_task(name)
    assert name in SAMPLES, f"add sample data for the task '{name}' to SAMPLES in {Path(__file__).name}"
    s = SAMPLES[name]
    path = tmp_path / s["file"]
    path.write_text(s["data"], encoding="utf-8")
    opts = task.resolve_options()
    examples = task.read(path, opts)  # as evaluation reads them
    train = task.read(path, opts, training=True)  # as fine-tuning does (a retrieval set and rows differ)
    assert len(examples) >= 2
    tok = train_tokenizer(s["data"].replace('"', " ").splitlines() * 3, vocab_size=300, min_frequency=1)
    labels = task.label_list(examples)
    ctx = TaskContext(max_length=64, options=opts, labels=tuple(labels) if labels else None,
                      state=task.fit_state(train),
                      tokenizer=tok)
    cfg = tiny_config(tok.get_vocab_size())
    if labels is not None:
        cfg.id2label = dict(enumerate(labels))
        cfg.label2id = {v: k for k, v in cfg.id2label.items()}
    cfg.architectures = [task.hf_architecture]
    return {"task": task, "examples": examples, "train": train, "tok": tok, "ctx": ctx, "config": cfg,
            "input": s["input"], "tmp": tmp_path}


@pytest.mark.parametrize("sample", discovered(), indirect=True)
def test_task_forward_backward(sample: dict[str, Any]) -> None:
    task, tok, ctx = sample["task"], sample["tok"], sample["ctx"]
    if not task.trainable:  # says so, before any work
        with pytest.raises(TaskError, match=f"the {task.name} task is not fine-tuned by mlmkit"):
            run_finetune(task.name, sample["tmp"], sample["tmp"] / "nope", sample["tmp"] / "out")
        return
    feats = task.featurize(sample["train"], tok, ctx, training=True)
    assert feats
    for f in feats:
        assert len(f["input_ids"]) == len(f["token_type_ids"]) <= ctx.max_length
        assert all(k in f for k in task.label_names) and isinstance(f["example"], int)

    torch.manual_seed(0)
    model = task.build_model(sample["config"], sample["ctx"])
    names = dict(model.named_parameters())
    assert ("bert.embeddings.word_embeddings.weight" in names
            and "bert.encoder.layer.1.output.dense.weight" in names)
    arrays = pad_features(feats, special_ids(tok).pad, extra=task.label_names)
    B, T = arrays["input_ids"].shape
    model.train()
    out = model(**{k: torch.from_numpy(v) for k, v in arrays.items()})
    assert set(task.outputs) <= set(out), (f"forward returned {sorted(out)}, outputs declares "
                                           f"{sorted(task.outputs)}")
    for k, axes in task.outputs.items():
        assert out[k].dim() == len(axes) and out[k].shape[0] == B, k
        if per_token(axes):
            assert out[k].shape[1] == T, k
    loss = out["loss"]
    assert loss.dim() == 0 and math.isfinite(loss.item())
    loss.backward()
    enc = [p.grad for n, p in names.items() if n.startswith("bert.encoder.layer.0.")]
    assert all(g is not None for g in enc) and sum(float(g.abs().sum())
                                                   for g in enc) > 0, "no gradient reaches the encoder"
    head = {n: p.grad for n, p in names.items() if not n.startswith("bert.")}
    assert head or task.name in HEADLESS, "the head has no parameters of its own"
    assert all(g is not None and float(g.abs().sum()) > 0
               for g in head.values()), "a head parameter gets no gradient"

    # inference: no labels, no loss, the same outputs
    model.eval()
    with torch.no_grad():
        inf = model(**{k: torch.from_numpy(arrays[k])
                       for k in ("input_ids", "attention_mask", "token_type_ids")})
    assert "loss" not in inf and set(task.outputs) <= set(inf)


@pytest.mark.parametrize("sample", discovered(), indirect=True)
def test_task_evaluates_and_predicts_from_runtime_input(sample: dict[str, Any]) -> None:
    task, tok, ctx = sample["task"], sample["tok"], sample["ctx"]
    model = task.build_model(sample["config"], sample["ctx"])
    ev = TaskEvaluator(task, sample["examples"], tok, ctx, calibrate=True)
    metrics = ev(model)
    declared = SAMPLE_METRICS.get(task.name, task.metrics)
    assert set(declared) <= set(metrics) and task.best_metric(sample["ctx"]) in metrics
    assert all(isinstance(metrics[k], float) and math.isfinite(metrics[k]) for k in declared), metrics
    assert len(ev.predictions) == len(sample["examples"])
    json.dumps(ev.predictions)  # predictions are written as JSON lines
    json.dumps(ev.state)  # and the calibrated state into mlmkit.json

    ex = task.from_input(sample["input"], ctx.options)
    got = prediction.predict(task, [ex], tok, ctx, torch_forward(model, task.outputs))
    assert len(got.predictions) == 1 and isinstance(got.predictions[0], dict)
    json.dumps(got.predictions)
    assert all(isinstance(v, str) for v in task.summary(got.predictions[0]).values())


def family_config(family: str, cfg: Any) -> Any:
    """The tiny config of ``cfg``'s task for another model family: its preset, the same vocabulary,
    labels and head, the sample tokenizer's padding id (BERT's special tokens on every family)."""
    other = preset("tiny", family, vocab_size=cfg.vocab_size, pad_token_id=cfg.pad_token_id,
                   max_position_embeddings=130)
    other.id2label, other.label2id, other.architectures = cfg.id2label, cfg.label2id, cfg.architectures
    return other


LM_HEADED = ("fill-mask", "sparse-embedding")
"""The tasks whose head is the family's own masked-LM head (its layers, norm and tied decoder)."""


def tasks_by_family() -> list[tuple[str, str]]:
    """(task, family) pairs: every task on BERT; on each other family, the tasks whose head the family
    builds (LM_HEADED) and one more of the rest in turn, so that each task runs on two families
    besides BERT. The other heads sit on the encoder's output whatever the family, and each family's
    encoder with each kind of head is exported against transformers in tests/models/test_families.py:
    the full product (104 runs) went through the same code again."""
    tasks = discovered()
    rest = [t for t in tasks if t not in LM_HEADED]
    pairs = [(t, "bert") for t in tasks]
    for i, f in enumerate(f.name for f in FAMILIES if f.name != "bert"):
        pairs += [(t, f) for t in (*LM_HEADED, rest[i % len(rest)])]
    return pairs


@pytest.mark.parametrize(("sample", "family"), tasks_by_family(), indirect=["sample"])
def test_task_is_exported_and_served(sample: dict[str, Any], family: str) -> None:
    """Every registered task on every model family it needs to meet (tasks_by_family): a run exports
    through the parity gate, and its bundle serves the same predictions as PyTorch from a runtime input,
    through the task's own command and `predict`."""
    task, tok, ctx, tmp = sample["task"], sample["tok"], sample["ctx"], sample["tmp"]
    if family != "bert":
        sample["config"] = family_config(family, sample["config"])
    torch.manual_seed(0)
    model = task.build_model(sample["config"], sample["ctx"])
    # a large head init: outputs far from flat, choices far from ties
    for name, p in model.named_parameters():
        if not name.startswith("bert.") and p.dim() == 2:
            torch.nn.init.normal_(p, std=0.5)
    model.eval()
    meta = RunMeta(task=task.name, labels=ctx.labels, max_length=ctx.max_length, options=dict(ctx.options),
                   task_state=dict(ctx.state))
    save_run(model, tmp / "run", config=sample["config"], tokenizer=tok, meta=meta)
    info = run_export(tmp / "run", tmp / "bundle")
    assert info["task"] == task.name and all(v <= 1e-4 for v in info["parity"]["max_abs_diff"].values())
    assert info["outputs"] == {k: list(v) for k, v in task.outputs.items()}

    items = [sample["input"], sample["input"]]
    want = prediction.predict(task, [task.from_input(x, ctx.options) for x in items], tok, ctx,
                              torch_forward(model, task.outputs)).predictions
    pipe = Pipeline.load(tmp / "bundle", command=task.command)
    assert_close(pipe(items), want)
    res = CliRunner().invoke(app, ["predict", str(tmp / "bundle")], input=json.dumps(sample["input"]) + "\n")
    assert res.exit_code == 0, res.output
    assert_close(jsonl(res.stdout), want[:1])


def assert_close(a: Any, b: Any, path: str = "") -> None:
    """Equal structures, floats within 1e-3."""
    if isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, abs=1e-3), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), path
        for k in a:
            assert_close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


@pytest.mark.parametrize("name", discovered())
def test_task_runtime_side_needs_no_torch(name: str) -> None:
    """The ONNX runtime imports the task and calls from_input / featurize without torch."""
    if name not in SAMPLES:
        pytest.fail(f"add sample data for the task '{name}' to SAMPLES in {Path(__file__).name}")
    code = (
        "import json, sys\n"
        "sys.modules['torch'] = None  # any `import torch` now fails\n"
        "from mlmkit.registry import TaskContext, get_task\n"
        "from mlmkit.text.tokenizer import train_tokenizer\n"
        f"task = get_task({name!r})\n"
        f"item = json.loads({json.dumps(json.dumps(SAMPLES[name]['input']))})\n"
        "ctx = TaskContext(max_length=64, options=task.resolve_options())\n"
        "ex = task.from_input(item, ctx.options)\n"
        "tok = train_tokenizer([json.dumps(item)] * 3, vocab_size=100, min_frequency=1)\n"
        "feats = task.featurize([ex], tok, ctx, training=False)\n"
        "print(len(feats))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert int(res.stdout.strip()) >= 1


def test_an_unknown_task_option_is_refused_from_the_cli_with_the_valid_ones(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["finetune", "tagging", "--model", str(tmp_path), "--train", "t.conll",
                                   "--out", str(tmp_path / "o"), "--option", "schema=iob2"])
    assert res.exit_code == 2
    msg = squash(res.stderr)
    assert "--option schema is not an option of task 'tagging'" in msg
    assert "its options: --label-all-tokens, --aggregation, --scheme" in msg
    with pytest.raises(ConfigError, match="task option --scheme must be one of"):
        registry.get_task("tagging").resolve_options({"scheme": "iob3"})


def read_names(sources: list[Path]) -> set[str]:
    """The names the code of ``sources`` reads as keys: ``options["pooling"]``, ``opts.get("doc_stride")``,
    ``"scheme" in options``, the prompts' ``options[f"{kind}_prompt"]``. An option whose name is not
    among them is declared, accepted and never read."""
    used: set[str] = set()
    for src in sources:
        for node in ast.walk(ast.parse(src.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Subscript):  # options["pooling"]
                keys = [node.slice]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("get", "pop",
                                                                                     "setdefault"):
                keys = node.args[:1]  # opts.get("doc_stride", ...)
            elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
                keys = [node.left]  # "scheme" in options
            else:
                continue
            for k in keys:
                if isinstance(k, ast.Constant) and isinstance(k.value, str):
                    used.add(k.value)
                elif isinstance(k, ast.JoinedStr):  # options[f"{kind}_prompt"]: each kind's option
                    tail = "".join(v.value for v in k.values if isinstance(v, ast.Constant))
                    used |= {f"{kind}{tail}"
                             for kind in ("query", "document")} if tail.startswith("_") else set()
    return used


CODE = sorted((ROOT / "mlmkit_tasks").rglob("*.py")) + sorted((ROOT / "mlmkit").rglob("*.py"))


def test_an_option_declared_and_never_read_is_found(tmp_path: Path) -> None:
    """The walker below fails on an option a task takes and ignores: here a plugin's "ignored_knob"."""
    plugin = tmp_path / "ignoring.py"
    plugin.write_text("from mlmkit.taskkit import TaskOption\n\n\nclass Ignoring:\n    name = 'ignoring'\n"
                      "    options = (TaskOption('ignored_knob', 'red', 'Ignored.', "
                      "flags=('--ignored-knob',)),)\n\n"
                      "    def featurize(self, examples, tokenizer, ctx, *, training):\n        return []\n")
    assert "ignored_knob" not in read_names([plugin, *CODE])
    plugin.write_text(plugin.read_text().replace("return []", "return [ctx.options['ignored_knob']]"))
    assert "ignored_knob" in read_names([plugin, *CODE])


def test_every_option_flag_acts_or_is_refused_for_every_task() -> None:
    """The task-option flags (--top-k, --pooling, --doc-stride ...) reach a task as options: a task
    that declares the option takes it, and its code reads it (read_names: an option accepted and never
    read fails here; this walker passed such an option before, since it only checked that the default
    came back), and every other task refuses it in one line naming the flag and task and the tasks
    that have it."""
    from mlmkit.cli.common import command_flags
    from mlmkit.registry import get_task, tasks

    sample = {int: 3, float: 0.5, bool: True, str: "x"}
    every = {n: o for c in ("finetune", "evaluate", "export", "predict") for n, o in command_flags(c).items()}
    assert {"doc_stride", "pooling", "index", "label_all_tokens", "input_type"} <= set(every)
    reads = read_names(CODE)
    unread = sorted(f"{n}: {o.name}" for n in tasks() for o in get_task(n).options if o.name not in reads)
    assert not unread, f"options declared and never read: {unread}"  # flagged or not
    for name in sorted(tasks()):
        task = get_task(name)
        declared = {o.name: o for o in task.options}
        for option, o in every.items():
            kind, flag = o.kind, o.flags[0]
            if option in declared:  # acts: the value given is the value the task runs with, and is read
                assert task.resolve_options({
                    option: declared[option].default})[option] == declared[option].default
                assert option in reads, f"task {name} declares {flag} and no code reads it"
                continue
            shown = flag.split("/")[0]
            takers = sorted(n for n in tasks() if any(o.name == option for o in get_task(n).options))
            with pytest.raises(ConfigError,
                               match=f"{re.escape(shown)} is not an option of task '{re.escape(name)}'") as e:
                task.resolve_options({option: sample[kind]})
            assert (not takers
                    or f"(the tasks that have it: {', '.join(takers)})" in str(e.value)), str(e.value)
