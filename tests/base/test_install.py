"""The torch-free install: `pip install mlmkit` (no extras) runs bundles. A virtual environment gets
exactly the distributions mlmkit's base requirements resolve to (from the installed metadata, as pip
would resolve them; linked from this environment, so no network), torch is not among them and cannot
be imported there, and `mlmkit embed` / `mlmkit classify` run a bundle; a training command says what to
install, in one line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest
from conftest import make_base_model, run_export, run_finetune
from packaging.markers import default_environment
from packaging.requirements import Requirement

SITE = sysconfig.get_paths()["purelib"]
WORDS = "the a cat dog sat on mat went to city big small red blue house river good bad".split()


def base_closure(name: str = "mlmkit") -> dict[str, metadata.Distribution]:
    """The distributions ``name``'s requirements without extras resolve to, transitively."""
    env = {**default_environment(), "extra": ""}
    found: dict[str, metadata.Distribution] = {}
    todo = [name]
    while todo:
        key = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if key in found:
            continue
        # installed, not a source tree's egg-info
        dist = next(iter(metadata.distributions(name=key, path=[SITE])))
        found[key] = dist
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate(env):
                todo.append(req.name)
    return found


def link_install(venv: Path, dists: dict[str, metadata.Distribution]) -> None:
    """Each distribution's files, top-level entries linked into the venv's site-packages."""
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    here = Path(SITE)
    for dist in dists.values():
        for top in {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            src, dst = here / top, site / top
            if src.exists() and not dst.exists() and top != "__pycache__":
                dst.symlink_to(src)


@pytest.fixture(scope="module")
def torch_free(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("install")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    dists = base_closure()
    link_install(venv, dists)
    rows = root / "train.csv"
    rows.write_text("text,label\n"
                    + "".join(f"{w} {w} cat,{'pos' if i % 2 else 'neg'}\n" for i, w in enumerate(WORDS * 3)))
    base = make_base_model(root / "base", [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))])
    run_finetune("classification", base, rows, root / "clf", epochs=1, max_length=16)
    run_export(root / "clf", root / "clf-bundle")
    run_export(base, root / "emb-bundle", task="embedding")
    return {"python": venv / "bin" / "python", "clf": root / "clf-bundle", "emb": root / "emb-bundle",
            "rows": rows,
            "base": base}


def test_the_base_requirements_leave_torch_out() -> None:
    names = set(base_closure())
    assert {"onnxruntime", "tokenizers", "numpy", "typer"} <= names
    assert not names & {"torch", "onnx", "safetensors", "transformers"}, sorted(names)


def test_bundles_run_without_torch(torch_free: dict[str, Path]) -> None:
    py = str(torch_free["python"])
    r = subprocess.run([py, "-c", "import torch"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "No module named 'torch'" in r.stderr
    for command, bundle, key in (("embed", "emb", "embedding"), ("classify", "clf", "label")):
        r = subprocess.run([py, "-m", "mlmkit", command, str(torch_free[bundle]), "a red cat",
                            "the big house"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        results = [json.loads(line) for line in r.stdout.splitlines()]
        assert len(results) == 2 and all(key in x for x in results), r.stdout[:500]
    r = subprocess.run([py, "-m", "mlmkit", "evaluate", str(torch_free["clf"]), "--data",
                        str(torch_free["rows"])],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "accuracy" in r.stdout, r.stderr[-2000:]


def test_training_without_torch_says_what_to_install(torch_free: dict[str, Path], tmp_path: Path) -> None:
    r = subprocess.run([str(torch_free["python"]), "-m", "mlmkit", "finetune", "classification", "--model",
                        str(torch_free["base"]), "--train", str(torch_free["rows"]), "--out",
                        str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert (len(lines) == 1 and "needs torch" in lines[0]
            and "pip install 'mlmkit[train]'" in lines[0]), r.stderr
