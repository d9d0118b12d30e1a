"""The task registry: entry-point discovery, its errors, a third-party plugin installed from outside
the package, and the Task contract checked on every discovered task (timm-style parametrisation)."""

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
from conftest import tiny_config
from typer.testing import CliRunner

from mlmkit import registry
from mlmkit.batching import pad_features, per_token
from mlmkit.cli import app
from mlmkit.errors import TaskError
from mlmkit.finetuning import TaskEvaluator, evaluate_run, finetune, predict_torch, task_options
from mlmkit.tokenizer import special_ids, train_tokenizer

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = Path(__file__).resolve().parent / "plugins"
BUILTINS = ("classification", "qa", "tagging")


def squash(text: str) -> str:
    """CLI output with rich's line wrapping undone."""
    return " ".join(text.split())


# ---- installing fake distributions -------------------------------------------------------------
def install_distribution(site: Path, name: str, entry_points: dict[str, str], version: str = "0.1") -> Path:
    """What pip leaves behind for a package that declares [project.entry-points."mlmkit.tasks"]."""
    d = site / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
    eps = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (d / "entry_points.txt").write_text(f"[mlmkit.tasks]\n{eps}", encoding="utf-8")
    return d


FAKE_TASK = '''
class FakeTask:
    name = "{name}"
    description = "a fake task"
    formats = ("jsonl",)
    metrics = ("score",)
    options = {{}}
    label_names = ("labels",)
    hf_architecture = "BertModel"
    default_max_length = 32

    def read(self, path, **options): return []
    def from_input(self, item, **options): return {{"text": item}}
    def label_list(self, examples): return None
    def featurize(self, examples, tokenizer, *, meta, max_length, training): return []
    def build_model(self, config): raise NotImplementedError
    def onnx_outputs(self): return {{"score": {{0: "batch"}}}}
    def postprocess(self, outputs, features, examples, *, meta): return []
    def compute_metrics(self, predictions, examples, *, meta): return {{"score": 0.0}}


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
    """[project.entry-points."mlmkit.tasks"] of pyproject.toml (tomllib is 3.11+; the project supports 3.10)."""
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
        info = reg[name]
        assert info.distribution == "mlmkit"
        assert info.entry_point == declared[name] == f"mlmkit_tasks.{name}:task"
        assert isinstance(info.task, registry.Task)
        assert info.task.name == name
        assert info.task.metrics, f"{name} declares no metrics"


def test_core_never_imports_a_task() -> None:
    """No module under mlmkit/ imports a task, by import statement or by name (importlib)."""
    for src in sorted((ROOT / "mlmkit").glob("*.py")):
        for node in ast.walk(ast.parse(src.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module or ""] if node.level == 0 else []
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                mods = [node.value] if node.value.startswith("mlmkit_tasks") else []
            else:
                continue
            bad = [m for m in mods if m.split(".")[0] in ("mlmkit_tasks", "tasks")]
            assert not bad, f"{src.name}:{node.lineno} imports {bad[0]}"


def test_unknown_task_lists_the_registered_ones() -> None:
    registry.reset()
    with pytest.raises(TaskError, match=r"unknown task 'ner'; registered tasks: classification, qa, tagging") as e:
        registry.get_task("ner")
    assert "mlmkit tasks" in (e.value.hint or "")


def test_cli_unknown_task_exits_2_with_the_list() -> None:
    registry.reset()
    res = CliRunner().invoke(app, ["finetune", "nosuchtask", "--model", "m", "--train", "t.jsonl", "--out", "o"])
    assert res.exit_code == 2, res.output
    assert len(res.stderr.strip().splitlines()) == 1, f"not one line: {res.stderr!r}"
    msg = squash(res.stderr)
    assert "unknown task 'nosuchtask'; registered tasks: classification, qa, tagging" in msg
    assert "Traceback" not in res.output


def test_duplicate_name_across_distributions_names_both(site: Path) -> None:
    (site / "alpha_tasks.py").write_text(FAKE_TASK.format(name="dup"), encoding="utf-8")
    (site / "beta_tasks.py").write_text(FAKE_TASK.format(name="dup"), encoding="utf-8")
    install_distribution(site, "alpha-tasks", {"dup": "alpha_tasks:task"})
    install_distribution(site, "beta-tasks", {"dup": "beta_tasks:task"})
    with pytest.raises(TaskError, match=r"task 'dup' is registered twice") as e:
        registry.tasks()
    msg = str(e.value)
    for part in ("alpha_tasks:task", "from alpha-tasks", "beta_tasks:task", "from beta-tasks"):
        assert part in msg
    with pytest.raises(TaskError):  # nothing half-registered: the next lookup fails the same way
        registry.get_task("classification")


def test_plugin_reusing_a_builtin_name_is_refused(site: Path) -> None:
    (site / "copycat.py").write_text(FAKE_TASK.format(name="classification"), encoding="utf-8")
    install_distribution(site, "copycat", {"classification": "copycat:task"})
    with pytest.raises(TaskError, match=r"task 'classification' is registered twice") as e:
        registry.tasks()
    assert "from mlmkit" in str(e.value) and "from copycat" in str(e.value)


def test_register_refuses_to_overwrite() -> None:
    registry.reset()
    try:
        with pytest.raises(TaskError, match=r"task 'qa' is already registered by mlmkit"):
            registry.register("qa", registry.get_task("classification"))
        assert registry.get_task("qa").name == "qa"
    finally:
        registry.reset()


def test_plugin_failing_to_import_names_entry_point_and_distribution(site: Path) -> None:
    (site / "broken_plugin.py").write_text("import a_dependency_that_is_not_installed\ntask = None\n", encoding="utf-8")
    install_distribution(site, "broken-plugin", {"broken": "broken_plugin:task"})
    with pytest.raises(TaskError) as e:
        registry.get_task("classification")
    msg = str(e.value)
    assert "task plugin 'broken' (broken_plugin:task, from broken-plugin) failed to load" in msg
    assert "ModuleNotFoundError" in msg and "a_dependency_that_is_not_installed" in msg
    # the CLI turns it into one red line and status 2
    res = CliRunner().invoke(app, ["tasks", "--json"])
    assert res.exit_code == 2
    assert "broken-plugin" in squash(res.stderr) and "Traceback" not in res.output


def test_plugin_lacking_the_protocol_is_refused(site: Path) -> None:
    (site / "halfdone.py").write_text("class T:\n    name = 'half'\n    def read(self, path): return []\n\ntask = T()\n")
    install_distribution(site, "halfdone", {"half": "halfdone:task"})
    with pytest.raises(TaskError, match=r"task plugin 'half' from halfdone lacks description, formats, .*, build_model, onnx_outputs, postprocess, compute_metrics"):
        registry.tasks()


def test_entry_point_name_must_be_the_task_name(site: Path) -> None:
    """A run records task.name and is loaded back by it: the two names cannot differ."""
    (site / "misnamed.py").write_text(FAKE_TASK.format(name="regression"), encoding="utf-8")
    install_distribution(site, "misnamed", {"pair-regression": "misnamed:task"})
    with pytest.raises(TaskError, match=r"task plugin 'pair-regression' \(misnamed:task, from misnamed\) calls itself 'regression'"):
        registry.tasks()


# ---- a third-party plugin, installed without touching the core ---------------------------------
def test_third_party_plugin_is_discovered_and_listed(pairreg: Any) -> None:
    assert pairreg.name == "pairreg" and type(pairreg).__module__ == "pairreg.task"
    info = registry.tasks()["pairreg"]
    assert (info.distribution, info.entry_point) == ("pairreg", "pairreg.task:task")
    assert set(BUILTINS) <= set(registry.tasks())  # the built-ins are still there

    res = CliRunner().invoke(app, ["tasks", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in map(json.loads, res.stdout.splitlines())}
    assert sorted(rows) == sorted(registry.tasks())
    assert rows["pairreg"] == {
        "name": "pairreg", "description": pairreg.description, "formats": ["jsonl"],
        "metrics": ["pearson", "spearman"], "package": "pairreg",
    }
    assert {rows[n]["package"] for n in BUILTINS} == {"mlmkit"}


COLOURS = "red blue green black white pink gray brown gold teal".split()
WARM = set(COLOURS[:5])


def pair_rows(n: int, rng: random.Random) -> list[dict[str, Any]]:
    """score = share of 'warm' colours over both sentences: a function of the pair a small model can learn."""
    rows = []
    for _ in range(n):
        a, b = rng.sample(COLOURS, 4), rng.sample(COLOURS, 4)
        rows.append({"text": " ".join(a), "text_pair": " ".join(b), "score": sum(w in WARM for w in a + b) / 8})
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_third_party_plugin_fine_tunes_and_evaluates(pairreg: Any, base_model_factory: Any, tmp_path: Path) -> None:
    rng = random.Random(0)
    train = write_jsonl(tmp_path / "train.jsonl", pair_rows(256, rng))
    test_rows = pair_rows(100, rng)
    test = write_jsonl(tmp_path / "test.jsonl", test_rows)
    base = base_model_factory([" ".join(COLOURS)] * 4)
    run = tmp_path / "run"

    finetune("pairreg", base, train, run, epochs=8, batch_size=16, lr=3e-3, seed=0, progress=False)
    meta = json.loads((run / "mlmkit.json").read_text())
    assert (meta["task"], meta["labels"]) == ("pairreg", None)

    preds_file = tmp_path / "preds.jsonl"
    metrics = evaluate_run(run, test, predictions=preds_file)
    assert metrics["pearson"] > 0.8 and metrics["spearman"] > 0.8, metrics
    preds = [json.loads(line) for line in preds_file.read_text().splitlines()]
    assert len(preds) == len(test_rows) and all(set(p) == {"score"} and isinstance(p["score"], float) for p in preds)
    mse = sum((p["score"] - r["score"]) ** 2 for p, r in zip(preds, test_rows)) / len(preds)
    var = sum((r["score"] - 0.5) ** 2 for r in test_rows) / len(test_rows)
    assert mse < 0.25 * var, (mse, var)  # not just correlated: close to the scores

    res = CliRunner().invoke(app, ["evaluate", str(run), "--data", str(test), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == pytest.approx(metrics)


def test_third_party_plugin_is_gone_after_its_test() -> None:
    registry.reset()
    assert "pairreg" not in registry.tasks()
    assert "pairreg" not in sys.modules


# ---- the Task contract, on every discovered task -----------------------------------------------
def squad_paragraph(context: str, qas: list[tuple[str, str, str]]) -> dict[str, Any]:
    return {"context": context, "qas": [
        {"id": i, "question": q, "answers": [{"text": a, "answer_start": context.index(a)}]} for i, q, a in qas
    ]}


SAMPLES: dict[str, dict[str, Any]] = {
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
    "tagging": {
        "file": "sample.conll",
        "data": "John B-PER\nlives O\nin O\nNew B-LOC\nYork I-LOC\n\nMary B-PER\nvisits O\nParis B-LOC\n.\tO\n\n"
                "Paris B-LOC\nis O\nbig O\n",
        "input": "Mary lives in Paris.",
    },
    "qa": {
        "file": "sample.json",
        "data": json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [
            squad_paragraph("The cat sat on the mat near the red door.",
                            [("q1", "Where did the cat sit?", "on the mat"), ("q2", "What colour is the door?", "red")]),
            squad_paragraph("Paris is the capital of France.", [("q3", "What is the capital of France?", "Paris")]),
        ]}]}),
        "input": {"question": "Where is the door?", "context": "The door is in the hall."},
    },
}


def discovered() -> list[str]:
    registry.reset()
    try:
        return sorted(registry.tasks())
    finally:
        registry.reset()


@pytest.fixture
def sample(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """Task, examples read from a tiny data file, a tokenizer trained on it, the run metadata."""
    name = request.param
    task = registry.get_task(name)
    assert name in SAMPLES, f"add sample data for the task '{name}' to SAMPLES in {Path(__file__).name}"
    s = SAMPLES[name]
    path = tmp_path / s["file"]
    path.write_text(s["data"], encoding="utf-8")
    opts = task_options(task, {})
    examples = task.read(path, **opts)
    assert len(examples) >= 2
    tok = train_tokenizer(s["data"].replace('"', " ").splitlines() * 3, vocab_size=300, min_frequency=1)
    labels = task.label_list(examples)
    meta = {"task": name, "labels": labels, "max_length": 64, "options": opts}
    cfg = tiny_config(tok.get_vocab_size())
    if labels is not None:
        cfg.id2label = dict(enumerate(labels))
        cfg.label2id = {v: k for k, v in cfg.id2label.items()}
    return {"task": task, "examples": examples, "tok": tok, "meta": meta, "config": cfg, "input": s["input"]}


@pytest.mark.parametrize("sample", discovered(), indirect=True)
def test_task_forward_backward(sample: dict[str, Any]) -> None:
    task, tok, meta = sample["task"], sample["tok"], sample["meta"]
    feats = task.featurize(sample["examples"], tok, meta=meta, max_length=meta["max_length"], training=True)
    assert feats
    for f in feats:
        assert len(f["input_ids"]) == len(f["token_type_ids"]) <= meta["max_length"]
        assert all(k in f for k in task.label_names)

    torch.manual_seed(0)
    model = task.build_model(sample["config"])
    names = dict(model.named_parameters())
    assert "bert.embeddings.word_embeddings.weight" in names and "bert.encoder.layer.1.output.dense.weight" in names
    arrays = pad_features(feats, special_ids(tok).pad, extra=task.label_names)
    B, T = arrays["input_ids"].shape
    model.train()
    out = model(**{k: torch.from_numpy(v) for k, v in arrays.items()})
    axes = task.onnx_outputs()
    assert axes and set(axes) <= set(out), f"forward returned {sorted(out)}, onnx_outputs() names {sorted(axes)}"
    for k, ax in axes.items():
        assert out[k].shape[0] == B, k
        if per_token(ax):
            assert out[k].shape[1] == T, k
    loss = out["loss"]
    assert loss.dim() == 0 and math.isfinite(loss.item())
    loss.backward()
    enc = [p.grad for n, p in names.items() if n.startswith("bert.encoder.layer.0.")]
    assert all(g is not None for g in enc) and sum(float(g.abs().sum()) for g in enc) > 0, "no gradient reaches the encoder"
    head = {n: p.grad for n, p in names.items() if not n.startswith("bert.")}
    assert head, "the head has no parameters of its own"
    assert all(g is not None and float(g.abs().sum()) > 0 for g in head.values()), "a head parameter gets no gradient"

    # inference: no labels, no loss, the same outputs
    model.eval()
    with torch.no_grad():
        inf = model(**{k: torch.from_numpy(arrays[k]) for k in ("input_ids", "attention_mask", "token_type_ids")})
    assert "loss" not in inf and set(axes) <= set(inf)


@pytest.mark.parametrize("sample", discovered(), indirect=True)
def test_task_evaluates_and_predicts_from_runtime_input(sample: dict[str, Any]) -> None:
    task, tok, meta = sample["task"], sample["tok"], sample["meta"]
    model = task.build_model(sample["config"])
    ev = TaskEvaluator(task, sample["examples"], tok, dict(meta))
    metrics = ev(model)
    assert set(task.metrics) <= set(metrics)
    assert all(isinstance(metrics[k], float) and math.isfinite(metrics[k]) for k in task.metrics), metrics
    assert len(ev.predictions) == len(sample["examples"])
    json.dumps(ev.predictions)  # predictions are written as JSON lines

    ex = task.from_input(sample["input"], **meta["options"])
    feats = task.featurize([ex], tok, meta=ev.meta, max_length=meta["max_length"], training=False)
    outputs = predict_torch(task, model, feats, special_ids(tok).pad)
    preds = task.postprocess(outputs, feats, [ex], meta=ev.meta)
    assert len(preds) == 1 and isinstance(preds[0], dict)
    json.dumps(preds)


@pytest.mark.parametrize("name", discovered())
def test_task_runtime_side_needs_no_torch(name: str) -> None:
    """The ONNX runtime imports the task and calls from_input / featurize without torch."""
    if name not in SAMPLES:
        pytest.fail(f"add sample data for the task '{name}' to SAMPLES in {Path(__file__).name}")
    code = (
        "import importlib, json, sys\n"
        "sys.modules['torch'] = None  # any `import torch` now fails\n"
        "from mlmkit.tokenizer import train_tokenizer\n"
        f"mod, attr = {registry.tasks()[name].entry_point!r}.split(':')\n"
        "task = getattr(importlib.import_module(mod), attr)\n"
        f"item = json.loads({json.dumps(json.dumps(SAMPLES[name]['input']))})\n"
        "ex = task.from_input(item)\n"
        "tok = train_tokenizer([json.dumps(item)] * 3, vocab_size=100, min_frequency=1)\n"
        "meta = {'task': task.name, 'labels': None, 'max_length': 64, 'options': dict(task.options)}\n"
        "feats = task.featurize([ex], tok, meta=meta, max_length=64, training=False)\n"
        "print(len(feats))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert int(res.stdout.strip()) >= 1
