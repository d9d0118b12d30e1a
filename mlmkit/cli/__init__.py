"""The `mlmkit` command line: parse, call the library, render with rich. Nothing else lives here.

The commands live in three modules, composed here: training.py (tokenizer, pretrain, tasks, finetune,
distill, sweep, plot, evaluate, quickstart, data), inference.py (export and the onnxruntime
commands) and indexes.py (index and search). Library errors (MlmkitError) become one red line on stderr and
exit status 2; `--debug` shows the traceback.
Heavy modules (torch) are imported inside the commands that need them, so the inference commands
start fast.
"""

from __future__ import annotations

import functools
import logging
from typing import Annotated

import typer
from rich.logging import RichHandler

from mlmkit.cli.common import err, out


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        out.print(f"mlmkit {version('mlmkit')}")
        raise typer.Exit()


def root(
    debug: Annotated[bool,
                     typer.Option("--debug", help="Show tracebacks of errors, and debug logs.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only warnings and errors on stderr.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version.")] = False,
) -> None:
    """mlmkit: pre-train encoders (BERT, RoBERTa, ModernBERT ...), fine-tune task heads, export to ONNX, serve
    them fast."""
    logger = logging.getLogger("mlmkit")
    logger.handlers[:] = [RichHandler(console=err, show_time=False, show_path=False, markup=False)]
    # common.debugging
    logger.setLevel(logging.DEBUG if debug else logging.WARNING if quiet else logging.INFO)
    logger.propagate = False


@functools.cache
def build() -> typer.Typer:
    """The command line, built on first use (``mlmkit.cli.app``): the command modules are imported, and
    the task plugins discovered, then, not when ``mlmkit.cli`` is imported."""
    from mlmkit.cli import indexes, inference, training

    app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)
    app.callback()(root)
    app.add_typer(training.app)
    app.add_typer(inference.app)
    app.add_typer(indexes.app)
    inference.add_task_commands()
    return app


def __getattr__(name: str) -> typer.Typer:
    if name == "app":
        return build()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    build()()
