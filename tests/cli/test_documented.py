"""Every command of the CLI has a row in the README's table of commands and in docs/cli.md's index,
so a newcomer finds each one from the front door."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from mlmkit.cli import app

ROOT = Path(__file__).resolve().parents[2]


def commands() -> list[str]:
    """Every command as typed: "pretrain", "tokenizer train" ..."""
    found = []
    for name, cmd in typer.main.get_command(app).commands.items():
        if hasattr(cmd, "commands"):  # a group: tokenizer
            found += [f"{name} {sub}" for sub in cmd.commands]
        else:
            found.append(name)
    return found


def table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| `mlmkit ")]


def test_the_readme_has_a_row_for_every_command():
    rows = table_rows((ROOT / "README.md").read_text())
    missing = [c for c in commands()
               if not any(r.startswith(f"| `mlmkit {c} ") or r.startswith(f"| `mlmkit {c}`")
                           for r in rows)]
    assert not missing, missing


def test_the_cli_index_names_every_command():
    """docs/cli.md's table: a row may name several commands (`mlmkit fill-mask`, `classify`, ...)."""
    named = {n for r in table_rows((ROOT / "docs/cli.md").read_text())
             for n in re.findall(r"`(?:mlmkit )?([a-z-]+(?: train)?)[ `]", r.split(" | ")[0])}
    missing = [c for c in commands() if c not in named]
    assert not missing, missing
