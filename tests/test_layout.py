"""The layout's rules (docs/architecture.md): the torch-free packages import without torch, the
import-linter contracts hold and catch a violation, the public paths stay, and the docs' links resolve."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TORCH_FREE = ("mlmkit.errors", "mlmkit.files", "mlmkit.locks", "mlmkit.typed", "mlmkit.args",
              "mlmkit.registry", "mlmkit.taskkit", "mlmkit.text",
              "mlmkit.runtime", "mlmkit.jobs", "mlmkit.retrieval", "mlmkit.serve")
"""The packages that never import torch (pyproject.toml's first import-linter contract)."""
PUBLIC_PLUGIN_PATHS = {"mlmkit.taskkit", "mlmkit.registry", "mlmkit.model"}


def _run(code: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          **kw)


def test_torch_free_packages_import_with_torch_unimportable():
    """Every module of the torch-free packages, the CLI and every built-in task (all of mlmkit_tasks
    but its heads) import in a process where ``import torch`` fails (not merely where nothing happened
    to import it)."""
    code = f"""
import importlib, pkgutil, sys
sys.modules["torch"] = None  # `import torch` now raises ImportError, as on a machine without it
names = []
for top in {TORCH_FREE!r}:
    mod = importlib.import_module(top)
    names.append(top)
    if hasattr(mod, "__path__"):
        names += [m.name for m in pkgutil.walk_packages(mod.__path__, top + ".")]
import mlmkit_tasks
tasks = [m.name for m in pkgutil.iter_modules(mlmkit_tasks.__path__, "mlmkit_tasks.")
         if m.name != "mlmkit_tasks.heads"]
assert len(tasks) >= 6, tasks
names += ["mlmkit", "mlmkit.cli", *tasks]
for n in names:
    importlib.import_module(n)
import mlmkit
mlmkit.Pipeline, mlmkit.PretrainArgs, mlmkit.ExportArgs  # the top level's torch-free names
print(len(names))
"""
    r = _run(code)
    assert r.returncode == 0, r.stderr[-3000:]
    # every module of runtime/, jobs/, retrieval/, serve/, text/ and the tasks was walked
    assert int(r.stdout.split()[-1]) > 30


def test_import_contracts_hold():
    r = subprocess.run([str(Path(sys.executable).with_name("lint-imports"))], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "4 kept, 0 broken" in r.stdout


@pytest.mark.parametrize("module, line, broken", [
    ("mlmkit/runtime/bundle.py", "import torch", "never imports torch"),
    ("mlmkit/text/batching.py", "from mlmkit.runtime import bundle", "Layers"),
    ("mlmkit/runtime/pipeline.py", "from mlmkit.retrieval import exact", "Layers"),
    ("mlmkit/train/loop.py", "import mlmkit.model", "never imports the plugin kits"),
    ("mlmkit_tasks/qa.py", "from mlmkit.train import losses", "only through the plugin paths"),
])
def test_import_contracts_catch_a_violation(tmp_path, module, line, broken):
    """The contracts are not vacuous: one forbidden import added to a copy of the tree breaks the
    contract it should, with the import chain in the report."""
    for d in ("mlmkit", "mlmkit_tasks"):
        shutil.copytree(ROOT / d, tmp_path / d,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n\ndef _violation():\n    {line}\n")
    r = subprocess.run([str(Path(sys.executable).with_name("lint-imports")), "--no-cache"],
                       capture_output=True,
                       text=True, timeout=120, cwd=tmp_path,
                       env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert r.returncode != 0, r.stdout[-2000:]
    report = r.stdout[r.stdout.index("Broken contracts"):]
    assert broken in report and module[:-3].replace("/", ".") in report, report[:2000]


def test_the_type_checker_catches_a_wrong_attribute_of_the_config(tmp_path):
    """mypy with the settings `make test` runs it with (pyproject.toml's), on a module that reads a
    ModelConfig field by a typo: the check is not vacuous (the config is no Any to mypy)."""
    (tmp_path / "typo.py").write_text("from mlmkit.models.config import ModelConfig\n\n\n"
                                      "def _typo(config: ModelConfig) -> int:\n    return "
                                      "config.hiden_size\n")
    r = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                        "--follow-imports=silent",
                        "--cache-dir", str(tmp_path / "cache"), str(tmp_path / "typo.py")],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 1, r.stdout[-2000:]
    assert ('"ModelConfig" has no attribute "hiden_size"' in r.stdout
            and "Found 1 error" in r.stdout), r.stdout[-2000:]


def _mlmkit_imports(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mlmkit":
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "mlmkit"}
    return found


def test_third_party_plugins_use_only_the_public_paths():
    """The example plugin (tests/plugins) and docs/plugins.md's task code import only mlmkit.taskkit,
    mlmkit.registry and mlmkit.model, so the files behind them can move."""
    for module in ("task.py", "head.py"):
        used = _mlmkit_imports(ast.parse((ROOT / "tests/plugins/pairreg" / module).read_text()))
        assert used and used <= PUBLIC_PLUGIN_PATHS, (module, used)
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs/plugins.md").read_text(), re.S)
    task_code = [b for b in blocks if "class " in b or "def build_model" in b]
    assert task_code
    for b in task_code:
        lines = [ln.strip() for ln in b.splitlines() if re.match(r"\s*(from|import) mlmkit", ln)]
        assert all(re.match(r"(from|import) (mlmkit\.(taskkit|registry|model))\b", ln) for ln in lines), lines


def test_public_api_and_plugin_paths():
    """The top-level API, lazily imported; the three paths plugin authors import, each the one home of
    its names; the alias modules of earlier layouts are gone."""
    code = """
import importlib, sys
import mlmkit
assert "torch" not in sys.modules
assert {"pretrain", "finetune", "evaluate_run", "export", "Pipeline", "PretrainArgs", "FinetuneArgs",
        "ExportArgs", "TrainArgs"} <= set(dir(mlmkit))
from mlmkit.args import ExportArgs, FinetuneArgs, PretrainArgs, TrainArgs
from mlmkit.runtime.pipeline import Pipeline
from mlmkit.taskkit import BATCH, EXAMPLE, Record, TaskOption, iter_jsonl, tokenizer_settings, retrieve
from mlmkit.taskkit import load_pipeline
from mlmkit.registry import Task, TaskDefaults, get_task, tasks
import mlmkit.taskkit, mlmkit.registry
assert set(mlmkit.taskkit.__all__) <= set(dir(mlmkit.taskkit))
assert "torch" not in sys.modules, [m for m in sys.modules if m.startswith("torch")][:3]
assert mlmkit.Pipeline is Pipeline and mlmkit.PretrainArgs is PretrainArgs and mlmkit.TrainArgs is TrainArgs
import mlmkit.model
assert set(mlmkit.model.__all__) <= set(dir(mlmkit.model))
from mlmkit.model import BertModel, ModelConfig, init_weights, MultipleNegativesRankingLoss
from mlmkit.exporter.bundle import export
from mlmkit.train.finetune import evaluate_run, finetune
from mlmkit.train.pretrain import pretrain
import mlmkit.exporter
assert mlmkit.export is export and mlmkit.finetune is finetune and mlmkit.pretrain is pretrain
assert mlmkit.evaluate_run is evaluate_run and not callable(mlmkit.exporter)
for gone in ("mlmkit.infer", "mlmkit.pretraining", "mlmkit.finetuning", "mlmkit.plugin", "mlmkit.export"):
    try:
        importlib.import_module(gone)
    except ImportError:
        continue
    raise AssertionError(gone + " still imports")
try:
    mlmkit.nothing
except AttributeError as e:
    assert "nothing" in str(e)
print("ok")
"""
    r = _run(code)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_top_level_export_calls_the_command(tmp_path):
    """``mlmkit.export(args)`` is the command of mlmkit/exporter/bundle.py."""
    import mlmkit
    from mlmkit.errors import MlmkitError
    from mlmkit.exporter.bundle import export

    args = mlmkit.ExportArgs(run=tmp_path / "no-such-run", out=tmp_path / "bundle")
    with pytest.raises(MlmkitError) as direct:
        export(args)
    with pytest.raises(MlmkitError) as through_the_top:
        mlmkit.export(args)
    assert str(through_the_top.value) == str(direct.value) and "no-such-run" in str(direct.value)


def test_every_package_is_declared_for_the_wheel():
    """pyproject.toml lists each package (a wheel holds only those): every directory with an __init__.py
    under mlmkit/ and mlmkit_tasks/, and the data directory the quickstart reads."""
    import tomllib

    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parts[:-1])
             for d in ("mlmkit", "mlmkit_tasks") for p in (ROOT / d).rglob("__init__.py")
             for p in [p.relative_to(ROOT)]}
    assert found | {"mlmkit.quickstart.data"} == declared, sorted(found ^ declared)


# ---- the shape of the code ----------------------------------------------------------------------------
SOURCES = sorted(p for d in ("mlmkit", "mlmkit_tasks", "benchmarks") for p in (ROOT / d).rglob("*.py"))
LONGEST = 80


def test_no_class_is_defined_inside_a_function():
    """Heads and models are module-level classes: importable, subclassable, seen by the type checker."""
    found = []
    for p in SOURCES:
        if "benchmarks" in p.parts:
            continue
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found += [f"{p.relative_to(ROOT)}:{c.lineno} {c.name}" for c in ast.walk(node)
                          if isinstance(c, ast.ClassDef)]
    assert not found, found


def test_no_function_is_longer_than_80_lines():
    found = []
    for p in SOURCES:
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef,
                                 ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > LONGEST:
                found.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name} "
                             f"({node.end_lineno - node.lineno + 1} lines)")
    assert not found, found


def test_tests_follow_the_packages():
    """tests/PACKAGE/ holds the tests of mlmkit/PACKAGE (tasks/ of the built-in tasks in mlmkit_tasks/, base/
    of the modules at the top of mlmkit/): every test directory names a package that exists."""
    dirs = [d.name for d in (ROOT / "tests").iterdir() if d.is_dir() and any(d.glob("test_*.py"))]
    packages = {d.name for d in (ROOT / "mlmkit").iterdir()
                if (d / "__init__.py").is_file()} | {"tasks", "base", "registry"}
    assert dirs and set(dirs) <= packages, sorted(set(dirs) - packages)
    assert not [p.name for p in (ROOT / "tests").glob("test_*.py") if p.name != "test_layout.py"]


def test_every_module_has_a_test_module_or_a_row_saying_which_tests_it():
    """tests/README.md lists the modules tested under another name; the rest have test_MODULE.py."""
    own = {p.name for p in (ROOT / "tests").rglob("test_*.py")}
    modules = sorted(str(p.relative_to(ROOT)) for root in ("mlmkit", "mlmkit_tasks")
                     for p in (ROOT / root).rglob("*.py")
                     if p.name not in ("__init__.py", "__main__.py") and "__pycache__" not in p.parts)
    rows = dict(re.findall(r"^\| `([\w/]+\.py)` \| (.+) \|$", (ROOT / "tests" / "README.md").read_text(),
                           re.M))
    untested = [m for m in modules if f"test_{Path(m).stem}.py" not in own and m not in rows]
    assert not untested, f"no test module and no row in tests/README.md: {untested}"
    assert not sorted(set(rows) - set(modules)), "rows for modules that are gone"
    named = {t for cell in rows.values() for t in re.findall(r"`([\w/]+\.py)`", cell)}
    assert not sorted(t for t in named
                      if not (ROOT / "tests" / t).is_file()), "rows naming tests that are gone"


# ---- documentation ---------------------------------------------------------------------------------
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 200
    first_screen = "\n".join(text.splitlines()[:25])
    assert "make quickstart" in first_screen and "make test" in first_screen


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve(doc):
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            broken.append(target)
        elif ROOT not in path.parents and path != ROOT:
            broken.append(f"{target} (outside the repository)")
    assert not broken, broken


def test_nothing_cites_a_document_outside_the_repository():
    """Comments and docs cite documents that a clone has: docs/NAME.md must exist, and the notes kept
    outside the repository are never named."""
    sources = [p for d in ("mlmkit", "mlmkit_tasks", "tests", "benchmarks") for p in (ROOT / d).rglob("*.py")]
    outside = re.compile(r"PERF_NOTES|DESIGN\.md|STYLE\.md|\.\./shared")
    for p in [*sources, *DOCS, ROOT / "Makefile", ROOT / "pyproject.toml"]:
        text = p.read_text()
        if p.name == "test_layout.py":
            continue
        assert not outside.search(text), f"{p.relative_to(ROOT)}: {outside.search(text).group(0)}"
        for cited in re.findall(r"\bdocs/([\w.-]+\.(?:md|png))", text):
            assert (ROOT / "docs" / cited).exists(), f"{p.relative_to(ROOT)} cites docs/{cited}"
