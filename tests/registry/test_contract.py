"""The task contract (mlmkit/contract.py): every member declared, documented and resolved, the defaults
a task with only the required members gets, a task that declares wrongly refused, and the optional
hooks a task has used."""

from __future__ import annotations

import ast
import sys
import typing
from pathlib import Path

import pytest
import torch
from contract_helpers import Minimal

from mlmkit import registry
from mlmkit.errors import TaskError
from mlmkit.registry import OPTIONAL, REQUIRED, Plugin, TaskContext, TaskDefaults


def test_every_member_of_the_contract_is_declared_documented_and_resolved() -> None:
    """The contract is the Task protocol (required) and TaskDefaults (optional): a Plugin exposes every
    member of both, and declares the optional attributes' types for readers."""
    assert REQUIRED[:4] == ("name", "description", "metrics", "outputs") and "featurize" in REQUIRED
    assert not set(REQUIRED) & set(OPTIONAL)
    p = Plugin(Minimal(), "tests:Minimal", "tests")
    assert all(hasattr(p, m) for m in (*REQUIRED, *OPTIONAL))
    attributes = {m for m in OPTIONAL if not callable(getattr(TaskDefaults, m))}
    assert attributes <= set(typing.get_type_hints(Plugin)), attributes - set(typing.get_type_hints(Plugin))
    # every member is documented where it is declared: a method by its docstring, an attribute by
    # the string that follows it
    for cls, names in ((registry.Task, REQUIRED), (TaskDefaults, OPTIONAL)):
        # mlmkit/contract.py, where the contract is declared
        declared = Path(sys.modules[cls.__module__].__file__)
        body = next(n for n in ast.parse(declared.read_text(encoding="utf-8")).body
                    if isinstance(n, ast.ClassDef) and n.name == cls.__name__).body
        documented = {n.name for n in body if isinstance(n, ast.FunctionDef) and ast.get_docstring(n)}
        documented |= {a.target.id for a, b in zip(body, body[1:]) if isinstance(a, ast.AnnAssign)
                       and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)}
        undocumented = [n for n in names if n not in documented and n != "name" and n != "description"]
        assert not undocumented, f"{cls.__name__} leaves {undocumented} undocumented"


def test_a_task_with_only_the_required_members_gets_every_default(tmp_path: Path) -> None:
    p = Plugin(Minimal(), "tests:Minimal", "tests")
    d = TaskDefaults()
    for name in ("formats", "options", "label_names", "hf_architecture", "default_max_length",
                 "greater_is_better",
                 "trainable", "command", "partial_layers"):
        assert getattr(p, name) == getattr(d, name), name
    ctx = TaskContext(max_length=16)
    assert p.from_input("a text", {}) == {"text": "a text"} and p.best_metric(ctx) == "score"
    assert p.main_metric(ctx) is None and p.hf_config(ctx) == {} and p.from_hf(None, tmp_path) is None
    assert p.from_input({"text": "x", "id": 3}, {}) == {"text": "x", "id": 3}
    assert p.label_list([{"text": "x"}]) is None and p.fit_state([]) == {}
    assert p.calibrate({}, [], [], ctx) == {}
    model = torch.nn.Linear(2, 2)
    assert p.export_module(model) is model
    assert p.summary({"score": 0.25, "label": "x", "probabilities": {"x": 1.0}}) == {"score": "0.250",
                                                                                     "label": "x"}
    assert p.resolve_options() == {} and p.describe()["options"] == []


def test_a_task_that_declares_wrongly_is_refused() -> None:
    class NoBatchAxis(Minimal):
        outputs = {"score": ("sequence",)}

    with pytest.raises(TaskError,
                       match=r"outputs must map each output name to its axes, the first being 'batch'"):
        Plugin(NoBatchAxis(), "tests:NoBatchAxis", "tests")

    class TwiceTheSameOption(Minimal):
        options = (registry.TaskOption("a", 1, "one"), registry.TaskOption("a", 2, "two"))

    with pytest.raises(TaskError, match=r"options must be TaskOption objects with distinct names"):
        Plugin(TwiceTheSameOption(), "tests:TwiceTheSameOption", "tests")

    for flags, kind in ((" --x", 1), ("--x", 1), (("--Bad",), 1), (("--x",), True), (("--x/--no-x",), 1)):
        class BadFlags(Minimal):
            options = (registry.TaskOption("x", kind, "x", flags=flags),)

        with pytest.raises(TaskError, match=r"option x: flags must be a tuple of --long-names"):
            Plugin(BadFlags(), "tests:BadFlags", "tests")
    good = (("--x", "--y"), 1), (("--x/--no-x",), True), ((), True)
    for flags, kind in good:
        class Flags(Minimal):
            options = (registry.TaskOption("x", kind, "x", flags=flags),)

        assert Plugin(Flags(), "tests:Flags", "tests").options[0].flags == flags


def test_the_optional_hooks_a_task_has_are_used() -> None:
    class Calibrating(Minimal):
        command = "score"

        def calibrate(self, outputs, features, examples, ctx):
            return {"threshold": 0.5}

    p = Plugin(Calibrating(), "tests:Calibrating", "tests")
    assert p.command == "score" and p.calibrate({}, [], [], TaskContext(max_length=8)) == {"threshold": 0.5}
