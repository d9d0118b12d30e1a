"""Training curves: metrics.jsonl of one or more runs as a picture (matplotlib, the ``plots`` extra).

One panel per series against the step: training loss, learning rate, then each evaluation metric;
runs overlaid with a legend. A pretraining run's held-out MLM accuracy panel also shows its
baselines (uniform and majority guesses) as dashed lines. `mlmkit finetune` / `pretrain` write
RUN/curves.png at the end when matplotlib is installed; `mlmkit plot` draws any runs.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlmkit.errors import ConfigError, MlmkitError
from mlmkit.files import JSONObject, atomic_write

if TYPE_CHECKING:
    from mlmkit.registry import Metrics

log = logging.getLogger("mlmkit")

FORMATS = (".png", ".svg", ".pdf")
BASELINES = ("eval_mlm_uniform_baseline", "eval_mlm_majority_baseline")
TITLES = {"loss": "training loss", "lr": "learning rate"}


MAX_STEP = 2**53
"""Steps are whole numbers from 0 below this (what a float, and so a plot's axis, holds exactly)."""


def read_metrics(run: Path) -> list[JSONObject]:
    """The records of RUN/metrics.jsonl (a line cut short by a kill is left out, and one whose step
    is no whole number from 0 below MAX_STEP, with a warning: no training writes such a step)."""
    path = run / "metrics.jsonl" if run.is_dir() else run
    if not path.is_file():
        raise MlmkitError(f"{run}: no metrics.jsonl",
                          "pass a run directory written by mlmkit finetune or pretrain")
    out, odd = [], []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        step = rec.get("step") if isinstance(rec, dict) else None
        if isinstance(step, int) and not isinstance(step, bool) and 0 <= step < MAX_STEP:
            out.append(rec)
        elif isinstance(step, (int, float)):
            odd.append(n)
    if odd:
        log.warning("%s: %d record(s) with a step that is no whole number from 0 below 2**53 left out (line "
                    "%s)", path,
                    len(odd), ", ".join(map(str, odd[:5])) + (" ..." if len(odd) > 5 else ""))
    return out


def series(records: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """(step, value) per metric name, in the order names first appear."""
    out: dict[str, list[tuple[int, float]]] = {}
    for rec in records:
        for k, v in rec.items():
            if k in ("step",
                     "epoch") or isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v):
                continue
            out.setdefault(k, []).append((rec["step"], float(v)))
    return out


def _finite(v: int | float) -> bool:
    """Whether a value is a finite float (an integer of hundreds of digits is not one)."""
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def panels(runs: dict[str, dict[str, list[tuple[int, float]]]]) -> list[str]:
    """The panels to draw: loss, lr, the other training series, then every evaluation metric."""
    names: list[str] = []
    for s in runs.values():
        names += [k for k in s if k not in names and k not in BASELINES and k != "tokens_per_s"]
    first = [k for k in ("loss", "lr") if k in names]
    train = [k for k in names if not k.startswith("eval_") and k not in first]
    return first + train + [k for k in names if k.startswith("eval_")]


def plot_runs(runs: Sequence[str | Path], out: str | Path, *, title: str | None = None) -> Path:
    """Draw the runs' curves into ``out`` (.png, .svg or .pdf); returns its path."""
    out = _picture(out, "--out")
    plt = _pyplot()
    data: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for r in runs:
        p = Path(r)
        label = p.name if sum(Path(x).name == p.name for x in runs) == 1 else str(p)
        data[label] = series(read_metrics(p))
    names = panels(data)
    if not names:
        raise MlmkitError("the runs have no metrics to plot yet", "plot a run after its first logging step")
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.3 * rows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, name in zip(axes.flat, names):
        for i, (label, s) in enumerate(data.items()):
            color = colors[i % len(colors)]
            if name in s:
                steps, values = zip(*s[name])
                ax.plot(steps, values, marker="o" if name.startswith("eval_") else None, markersize=3,
                        color=color, label=label)
            if name == "eval_mlm_accuracy":
                for b, style in zip(BASELINES, ("--", ":")):
                    if b in s:
                        ax.axhline(s[b][-1][1], linestyle=style, color=color, linewidth=1,
                                   label=f"{label}: {b[9:].replace('_', ' ')}")
        ax.set_title(TITLES.get(name, name.replace("eval_", "eval ").replace("_", " ")))
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if name == "lr":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
        if len(data) > 1 or name == "eval_mlm_accuracy":
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(plt, fig, out)


def plot_trade_off(models: Sequence[str | Path], results: Sequence[Metrics], out: str | Path) -> Path:
    """Quality against speed: each model a point, its first metric (the task's main one, as
    compute_metrics reports it) against its examples per second (`mlmkit evaluate --speed`)."""
    out = _picture(out, "--plot")
    numbers = [k for k, v in results[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)
               and k not in ("examples_per_second", "seconds", "model_bytes")
               and all(k in r for r in results)]
    if not numbers or not all("examples_per_second" in r for r in results):
        raise MlmkitError("the models share no metric to plot against their speed",
                          "evaluate models of one task, with --speed")
    metric = numbers[0]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    for m, r in zip(models, results):
        ax.scatter(r["examples_per_second"], r[metric], s=30)
        ax.annotate(f"{Path(m).name} ({r.get('model_bytes', 0) / 1e6:.1f} MB)",
                    (r["examples_per_second"], r[metric]),
                    textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel("examples/s (this machine)")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(plt, fig, out)


def write_run_curves(run: Path) -> Path | None:
    """RUN/curves.png when matplotlib is installed (None without it, or with nothing to draw)."""
    try:
        _pyplot()
    except ConfigError:
        log.debug("matplotlib is not installed: no curves.png")
        return None
    try:
        return plot_runs([run], run / "curves.png", title=run.name)
    except MlmkitError:
        return None


def _picture(out: str | Path, flag: str) -> Path:
    """``out`` as a picture path that can be written: its format one matplotlib writes (FORMATS), not a
    directory, in a directory this process may write in or create; matplotlib installed. Else the flag's
    one-line error: what draws a picture after long work checks its path first (check_picture)."""
    out = Path(out)
    if out.suffix.lower() not in FORMATS:
        raise ConfigError(f"{flag} {out}: unknown picture format '{out.suffix}'",
                          f"use one of {', '.join(FORMATS)}")
    if out.is_dir():
        raise ConfigError(f"{flag} {out} is a directory",
                          f"give a file's path, e.g. {out / ('plot' + FORMATS[0])}")
    parent = out.parent
    while not parent.exists() and parent != parent.parent:  # the directory that would be created under
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{flag} {out}: {parent} is a file, not a directory", "give a path in a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {out}: {parent} is not writable",
                          "give a path in a directory you can write to")
    _pyplot()
    return out


def check_picture(out: str | Path | None, flag: str) -> None:
    """Refuse a picture path that could not be written (_picture), before the work it would draw."""
    if out is not None:
        _picture(out, flag)


def _save(plt: Any, fig: Any, out: Path) -> Path:
    """``fig`` written to ``out`` whole (atomically), then closed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        atomic_write(out, lambda tmp: fig.savefig(tmp, format=out.suffix[1:].lower(), dpi=110))
    finally:
        plt.close(fig)
    return out


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("plotting needs matplotlib", "pip install 'mlmkit[plots]'") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt
