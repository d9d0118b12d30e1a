"""What every command of the CLI shares: consoles, the error handler, options built from the argument
dataclasses, task options, and the one way results and metrics are shown.

No torch here, nor in anything imported at module level: `mlmkit classify ...` must start fast.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import sys
from collections.abc import Callable, Mapping
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mlmkit.args import Args, Output, cli_fields, declared
from mlmkit.errors import ConfigError, MlmkitError
from mlmkit.registry import Metrics, Options, Plugin, Prediction, TaskOption, option_flags

out = Console()
err = Console(stderr=True, soft_wrap=True)
F = TypeVar("F", bound=Callable[..., Any])

Json = Annotated[bool, typer.Option(*Output.as_json.flags, help=escape(Output.as_json.help))]
"""--json (args.Output.as_json) beside a command's argument dataclass: ``as_json: Json = False``."""


# ---- errors --------------------------------------------------------------------------------------
TRAIN_MODULES = ("torch", "onnx", "safetensors")
"""What `pip install 'mlmkit[train]'` adds to the torch-free install: training, evaluation of runs, export."""


def debugging() -> bool:
    """Whether the command line asked for tracebacks (``mlmkit --debug``, which also sets mlmkit's
    logger to DEBUG: the one place the flag is kept)."""
    return logging.getLogger("mlmkit").isEnabledFor(logging.DEBUG)


def handle_errors(fn: F) -> F:
    """MlmkitError and OS errors -> one red line on stderr, exit status 2 (the traceback with --debug)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MlmkitError as e:
            if debugging():
                raise
            err.print(f"[bold red]error:[/] {escape(e.message)}"
                      + (f" [dim]({escape(e.hint)})[/]" if e.hint else ""), highlight=False)
            raise typer.Exit(code=2) from None
        except ModuleNotFoundError as e:  # the torch side on a torch-free install (pip install mlmkit)
            if debugging() or e.name not in TRAIN_MODULES:
                raise
            hint = ("pip install 'mlmkit[train]' for training and export; inference on bundles needs nothing "
                    "more")
            err.print(f"[bold red]error:[/] this command needs {e.name}, which this install leaves out "
                      f"[dim]({escape(hint)})[/]", highlight=False)
            raise typer.Exit(code=2) from None
        except OSError as e:  # a folder that does not exist, a full disk, no permission
            if debugging():
                raise
            where = f": {e.filename}" if getattr(e, "filename", None) else ""
            err.print(f"[bold red]error:[/] {escape(e.strerror or str(e))}{escape(where)}", highlight=False)
            raise typer.Exit(code=2) from None

    return wrapper  # type: ignore[return-value]


# ---- parameters built from declarations ----------------------------------------------------------
def _replace_param(fn: Callable[..., Any], name: str, params: list[inspect.Parameter],
                   build: Callable[[dict[str, Any]], Any]) -> Callable[..., Any]:
    """``fn`` as Typer sees it with its parameter ``name`` replaced by ``params``: the wrapper calls
    ``build`` on their values and passes the result to ``fn`` as ``name``. Arguments come first, then
    ``fn``'s own options, then ``params``' options; --json (Json) last."""
    sig = inspect.signature(fn, eval_str=True)  # annotations as objects: Typer reads its options from them
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in sig.parameters.values() if p.name != name]
    taken = {p.name for p in params}
    clash = taken & {p.name for p in own}
    if clash:
        raise TypeError(f"{fn.__name__}: parameters {sorted(clash)} are declared twice")

    @functools.wraps(fn)
    def wrapper(**kwargs: Any) -> Any:
        values = {k: kwargs.pop(k) for k in list(kwargs) if k in taken}
        return fn(**kwargs, **{name: build(values)})

    positional = [p for p in params if isinstance(_info(p), typer.models.ArgumentInfo)]
    rest = [p for p in params if p not in positional]
    order = positional + [p for p in own if isinstance(_info(p), typer.models.ArgumentInfo)]
    last = [p for p in own if p.annotation == Json]
    order += [p for p in own if p not in order and p not in last] + rest + last
    wrapper.__signature__ = sig.replace(parameters=order)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in order}
    return wrapper


def _info(p: inspect.Parameter) -> Any:
    return next((m for m in getattr(p.annotation, "__metadata__", ())
                 if isinstance(m, typer.models.ParameterInfo)), None)


def with_args(cls: type[Args]) -> Callable[[F], F]:
    """Give the command an option (or argument) for every field of the argument dataclass ``cls``
    (nested ones flattened); the command receives the built dataclass as its ``args`` parameter."""
    fields = cli_fields(cls)
    params = []
    for f in fields:
        flags = f.flags
        # on by default, or undecided: --x/--no-x
        if (f.type is bool and f.default is True) or f.type == bool | None:
            flags = (f"{flags[0]}/--no-{flags[0][2:]}",)
        panel = "Training" if len(f.path) > 1 else None  # the fields of a composed TrainArgs
        text = escape(f.help)  # help is plain text: "mlmkit[serve]" is not rich markup
        decl = typer.Argument(help=text) if f.positional else typer.Option(*flags, help=text,
                                                                           rich_help_panel=panel)
        default = inspect.Parameter.empty if f.required else f.default
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                        annotation=Annotated[f.type, decl]))

    def build(values: dict[str, Any]) -> Any:
        return cls.from_flat(**values)

    return lambda fn: _replace_param(fn, "args", params, build)  # type: ignore[return-value]


# ---- task options -------------------------------------------------------------------------------
# A task option with flags of its own (TaskOption.flags, declared by the task) is a flag of the commands
# that run its task, besides --option NAME=VALUE:
TRAINING = ("finetune", "sweep")
TAKES: dict[str, Callable[[Plugin, TaskOption], bool]] = {
    "finetune": lambda p, o: p.trainable and o.saved and not o.evaluation,  # what is trained and kept
    "evaluate": lambda p, o: not o.fixed,  # a model's fixed options are set
    "export": lambda p, o: o.fixed,  # what is built into the graph
    "predict": lambda p, o: not o.fixed and not o.evaluation,  # every task's runtime options
}
"""Which options' flags a command takes; a task's own inference command (classify, tag, qa, embed:
``Task.command``: classify, tag, qa, embed, fill-mask) takes those of the tasks it serves, as predict
does of all."""


def command_flags(command: str) -> dict[str, TaskOption]:
    """The task options whose flags ``command`` takes (TAKES), by name."""
    takes = TAKES.get("finetune" if command in TRAINING else command)
    if takes is None:  # classify, tag, qa, embed
        def takes(p: Plugin, o: TaskOption) -> bool:
            return p.command == command and TAKES["predict"](p, o)
    return option_flags(takes)


def with_task_options(command: str) -> Callable[[F], F]:
    """Give the command ``--option NAME=VALUE`` (repeatable) and the flags of the task options it takes
    (command_flags); the command receives them as its ``options`` parameter, a dict the task checks
    against its declared options. A flag that a command's option has too (args: --text-column,
    --top-k, --prompt-name ...) shows that option's help, one help for the name in every command."""
    params = [inspect.Parameter("option", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
        list[str] | None, typer.Option("--option", "-O", metavar="NAME=VALUE", rich_help_panel="Task options",
                                       help="A task option, repeatable; `mlmkit tasks` lists each task's "
                                            "options.")])]
    flagged = command_flags(command)
    for name, o in sorted(flagged.items()):
        shared = declared(o.flags[0].split("/")[0])
        text = escape(shared.help) if shared is not None else f"Same as --option {name}=VALUE."
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation=Annotated[
            o.kind | None, typer.Option(*o.flags, help=text, show_default=False,
                                        rich_help_panel="Task options")]))

    def build(values: dict[str, Any]) -> Options:
        return parse_task_options(values.pop("option") or [],
                                  {k: v for k, v in values.items() if v is not None}, flagged)

    return lambda fn: _replace_param(fn, "options", params, build)  # type: ignore[return-value]


def parse_task_options(pairs: list[str], flagged: Mapping[str, Any],
                       flags: dict[str, TaskOption] | None = None) -> Options:
    """NAME=VALUE strings (typed later, by the task's declaration) together with the alias flags given."""
    opts: Options = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        name = name.strip().replace("-", "_")
        if not eq or not name:
            raise ConfigError(f"--option {pair!r} is not NAME=VALUE",
                              "for example --option text_column=sentence")
        opts[name] = value
    both = sorted(set(opts) & set(flagged))
    if both:
        flag = (flags or {})[both[0]].flag if both[0] in (flags or {}) else f"--{both[0].replace('_', '-')}"
        raise ConfigError(f"task option {both[0]} given twice (--option and {flag})")
    return {**opts, **flagged}


# ---- output ------------------------------------------------------------------------------------
def want_json(flag: bool) -> bool:
    return flag or not sys.stdout.isatty()


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")


def print_metrics(metrics: Metrics, title: str, as_json: bool) -> None:
    """Metrics as one JSON object, or a table of the numbers (and a confusion matrix when there is one)."""
    if want_json(as_json):
        print_json({k: v for k, v in metrics.items() if k != "confusion_matrix"})
        return
    t = Table(title=title)
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in metrics.items():
        if isinstance(v, (int, float)):
            t.add_row(k, f"{v:.4f}" if isinstance(v, float) else str(v))
    out.print(t)
    if "confusion_matrix" in metrics:
        cm = Table(title="confusion matrix (rows: gold, columns: predicted)")
        cm.add_column("gold \\ pred")
        for lab in metrics.get("labels", []):
            cm.add_column(str(lab), justify="right")
        for lab, row in zip(metrics.get("labels", []), metrics["confusion_matrix"]):
            cm.add_row(str(lab), *map(str, row))
        out.print(cm)


def print_comparison(models: list[Any], results: list[Metrics], title: str) -> None:
    """Several models' metrics side by side: one row per model, a column per number any of them has
    (examples/s and size last, when measured)."""
    last = ("examples_per_second", "seconds", "model_bytes")
    keys = [k for k in dict.fromkeys(k for r in results for k, v in r.items() if isinstance(v, (int, float))
                                     and not isinstance(v, bool)) if k not in last]
    keys += [k for k in last if any(k in r for r in results)]
    t = Table(title=title)
    t.add_column("model")
    for k in keys:
        t.add_column({"examples_per_second": "examples/s", "model_bytes": "MB"}.get(k, k), justify="right")
    for m, r in zip(models, results):
        cells = []
        for k in keys:
            v = r.get(k)
            cells.append("-" if v is None else f"{v / 1e6:.1f}" if k == "model_bytes" else
                         f"{v:.1f}" if k == "examples_per_second" else f"{v:.4f}" if isinstance(v, float)
                         else str(v))
        t.add_row(escape(str(m)), *cells)
    out.print(t)


def short(x: Any, n: int = 70) -> str:
    s = x if isinstance(x, str) else json.dumps(x, ensure_ascii=False)
    return escape(s if len(s) <= n else s[: n - 1] + "…")


def print_results(title: str, items: list[Any], results: list[Prediction],
                  summary: Callable[[Prediction], dict[str, str]],
                  console: Console | None = None) -> None:
    """Results as a table: the input, then the columns ``summary`` makes of each result."""
    if not results:
        err.print("no inputs, no results")
        return
    rows = [summary(r) for r in results]
    columns = list(dict.fromkeys(k for row in rows for k in row))
    t = Table(title=f"{title}: {len(results)} results")
    t.add_column("#", justify="right")
    t.add_column("input")
    for c in columns:
        t.add_column(c)
    for i, (x, row) in enumerate(zip(items, rows)):
        t.add_row(str(i), short(x), *(escape(row.get(c, "")) for c in columns))
    (console or out).print(t)
