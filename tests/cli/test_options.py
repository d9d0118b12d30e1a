"""One CLI dialect: every command's options come from its argument dataclass (mlmkit/args/, and
BuildArgs beside the index it builds), and an option that several commands share is declared once.

The options are read off the CLI itself (typer's click commands), so an option added later is held
to this too: the same name in two commands has the same help and default (the help alone where each
command sets the default: PER_COMMAND_DEFAULTS), a task option's flag included, or its name is in ALLOWED
below, which says why it means something else per command.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from mlmkit.args import Runtime, TrainArgs, cli_fields, per_command_flags
from mlmkit.cli import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()

ALLOWED: dict[str, str] = {}
"""Option names that would mean something else per command, each with why. Empty: a name that meant two
things was renamed (quickstart --pretrain-steps, pretrain --shard, index --quantization, serve
--search-index, mine --batch), and one that meant the same thing, worded per command, is declared once
(mlmkit.args: Output.out, Runtime.workers, Inputs.corpus ...), its help saying what it is in each."""
PER_COMMAND_DEFAULTS = {f.flags[0] for f in cli_fields(TrainArgs)} | per_command_flags()
"""One declaration whose default each command sets: the training loop's options (TrainArgs, composed into
pretrain, finetune, sweep, distill: pretrain 1000 steps at 5e-4, finetune 3 epochs at 5e-5) and the
options declared ``per_command`` (--out: required, or plot's curves.png; --workers: 1, or the inference
commands' measured choice; a task option's flag of the same name: unset). Their help is compared, their
defaults (and so whether they are required) are not."""


def commands() -> dict[str, Any]:
    """Every command as typed ("tokenizer train" too): its click command (typer's own click)."""
    found: dict[str, Any] = {}

    def walk(name: str, cmd: Any) -> None:
        if hasattr(cmd, "commands"):
            for sub, c in cmd.commands.items():
                walk(f"{name} {sub}".strip(), c)
        else:
            found[name] = cmd

    walk("", typer.main.get_command(app))
    return found


def declaration(p: Any, default: bool = True) -> tuple[Any, ...]:
    return (p.help, tuple(p.opts), tuple(p.secondary_opts),
            *((p.required, repr(p.default)) if default else ()))


def declarations() -> dict[str, dict[tuple[Any, ...], list[str]]]:
    """Each option name: its declarations, and the commands with each."""
    by: dict[str, dict[tuple[Any, ...], list[str]]] = {}
    for name, cmd in commands().items():
        for p in cmd.params:
            if p.param_type_name == "option" and p.opts[0] != "--help":
                flag = p.opts[0]
                by.setdefault(flag, {}).setdefault(declaration(p, flag not in PER_COMMAND_DEFAULTS),
                                                   []).append(name)
    return by


def test_an_option_shared_by_commands_is_declared_once() -> None:
    """The same name, the same help, flags and default in every command that has it, but for ALLOWED."""
    differ = {flag: ds for flag, ds in declarations().items() if len(ds) > 1}
    wrong = {flag: [(ds[d], d[0]) for d in ds] for flag, ds in differ.items() if flag not in ALLOWED}
    assert not wrong, ("declare these once (mlmkit.args: Engine, Runtime, Output, Inputs, Training ...; "
                       "per_command where each command has its own default), or rename the one that means "
                       f"something else: {wrong}")
    stale = sorted(set(ALLOWED) - set(differ))
    assert not stale, f"these are declared alike now: drop them from ALLOWED: {stale}"


def test_a_name_is_declared_once_with_one_default_or_per_command() -> None:
    """A second declaration of a name is refused, and so is a default of a command's own for an option
    that has one default."""
    from mlmkit.args import Opt, Output

    with pytest.raises(TypeError, match="--device is declared twice"):
        Opt(("--device",), "cpu", "another help")
    with pytest.raises(TypeError, match="--device has one default"):
        Runtime.device("cuda")
    assert Output.out(Path("x")).default == Path("x")


def test_the_shared_groups_are_what_the_commands_have() -> None:
    """The groups' options as the commands show them: the engine in every batch job, the runtime's device
    from training to serving."""
    by = declarations()
    for flag, users in {"--engine": {"classify", "predict", "index"}, "--address": {"embed", "index"},
                        "--device": {"classify", "index", "mine", "serve", "evaluate", "pretrain", "finetune",
                                     "distill"},
                        "--threads": {"tag", "index", "serve"},
                        "--json": {"qa", "index", "search", "rerank", "tasks", "export"},
                        "--input": {"predict", "rerank", "search"}, "--seed": {"pretrain", "quickstart"},
                        "--max-record-bytes": {"classify", "tokenize", "finetune"}}.items():
        assert len(by[flag]) == 1 and users <= set(next(iter(by[flag].values()))), (flag, by[flag])


def test_the_window_default_is_the_jobs() -> None:
    from mlmkit.jobs.windows import WINDOW

    assert Runtime.window.default == WINDOW


INLINE = {  # where mlmkit/cli may write typer.Option( or typer.Argument( itself
    ("common.py", "Json"): "--json, beside an argument dataclass: args.Output.as_json's flags and help",
    ("common.py", "with_args"): "the options of every argument dataclass's fields",
    ("common.py", "with_task_options"): "--option and the task options' flags, which the tasks declare",
    ("__init__.py", "root"): "the app's own --debug, --quiet and --version, given before a command",
}


def inline_declarations() -> set[tuple[str, str]]:
    """(file, top-level name) of every typer.Option( / typer.Argument( in mlmkit/cli, and any `from typer
    import` (which would hide one from this check)."""
    found = set()
    for path in sorted((ROOT / "mlmkit" / "cli").glob("*.py")):
        tree = ast.parse(path.read_text())
        for stmt in tree.body:
            name = getattr(stmt, "name", None) or next((t.id for t in getattr(stmt, "targets",
                                                                              [getattr(stmt, "target", None)])
                                                        if isinstance(t, ast.Name)), "<module>")
            for node in ast.walk(stmt):
                if isinstance(node, ast.ImportFrom) and node.module == "typer":
                    found.add((path.name, f"from typer import {', '.join(a.name for a in node.names)}"))
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "typer"
                        and node.func.attr in ("Option", "Argument")):
                    found.add((path.name, name))
    return found


def test_no_command_declares_an_option_inline() -> None:
    found = inline_declarations()
    assert found <= set(INLINE), ("declare these in the command's argument dataclass: "
                                  f"{sorted(found - set(INLINE))}")
    assert set(INLINE) <= found, f"stale entries in INLINE: {sorted(set(INLINE) - found)}"


@pytest.mark.parametrize("argv, says", [
    (["index", "b", "--corpus", "c.jsonl", "--out", "o", "--window", "0"],
     "--window must be at least 1, got 0"),
    (["index", "b", "--corpus", "c.jsonl", "--out", "o", "--workers", "0"],
     "--workers must be at least 1, got 0"),
    (["index", "b", "--corpus", "c.jsonl", "--out", "o", "--batch-size", "0"],
     "--batch-size must be at least 1"),
    (["index", "b", "--corpus", "c.jsonl", "--out", "o", "--threads", "0"], "--threads must be at least 1"),
    (["rerank", "b", "d", "--query", "q", "--top-n", "0"], "--top-n must be at least 1"),
    (["rerank", "b", "d"], "no --query"),
    (["search", "ix", "q", "--batch", "0"], "--batch must be at least 1"),
    (["quickstart", "--retrieval-documents", "49"], "--retrieval-documents must be at least 50"),
    (["qa", "b", "who"], "questions given without --context"),
    (["evaluate", "a", "b", "--data", "d", "--predictions", "p"], "--predictions takes one model"),
])
def test_a_bad_value_is_one_red_line_before_anything_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          argv: list[str], says: str) -> None:
    """What the commands written inline checked (click's ranges, checks in their bodies) their dataclasses
    check: exit 2, one line naming the flag, nothing read or written."""
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, argv, env={"COLUMNS": "1000"})
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert " ".join(r.stderr.split()).startswith(f"error: {says}"), r.stderr
    assert not any(tmp_path.iterdir())


def test_build_args_keep_their_python_api() -> None:
    """BuildArgs is `mlmkit index`'s dataclass and the library's: positional bundle, corpus, out, as
    before."""
    from mlmkit.retrieval.index import BuildArgs

    a = BuildArgs(Path("b"), Path("c.jsonl"), Path("o"), quantization="binary")
    assert (a.window, a.workers, a.batch_size, a.device, a.engine, a.rescore_copy) == (4096, 1, 32, "cpu",
                                                                                       "local", "int8")
    assert BuildArgs.from_flat(bundle=Path("b"), corpus=Path("c"), out=Path("o"), hnsw_m=16).hnsw_m == 16
