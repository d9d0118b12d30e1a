"""The registry of task plugins: each task wrapped once in a ``Plugin``, and discovery through the
``mlmkit.tasks`` entry-point group.

A task plugin is any object with the members of ``Task`` (required) and any of the members of
``TaskDefaults`` (each has a default), the contract declared in mlmkit/contract.py and imported from
here, and advertised in its package's pyproject.toml:

    [project.entry-points."mlmkit.tasks"]
    regression = "my_package.regression:task"

The built-in tasks (classification, tagging, qa, embedding, sparse-embedding, rerank: mlmkit_tasks/) are
registered exactly this way, and import mlmkit only through the plugin paths; the core never
imports a specific task. Discovery is lazy (first use, never at import) and runs once, into ``TASKS``, a
mlmkit.typed.Registry like every other registry; a duplicate name, a plugin that fails to
load or one that lacks a required member raises TaskError naming the entry point and its
distribution. Each task is wrapped in a ``Plugin``, which resolves every optional member once, so
the rest of the code calls ``plugin.calibrate(...)`` and never asks whether a task has it.

``mlmkit.registry`` is a public path: the contract's names (``Task``, ``TaskDefaults``,
``TaskOption``, ``TaskContext``, the feature keys and output axes) are importable from it as from
mlmkit/contract.py. Like the contract, this module never imports torch.
"""

from __future__ import annotations

import importlib.metadata as md
import inspect
import logging
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mlmkit.contract import (
    BATCH,
    DISTINCT,
    EXAMPLE,
    LABEL,
    OPTIONAL,
    REQUIRED,
    SEQUENCE,
    TRUNCATED,
    CheckpointInfo,
    Example,
    Feature,
    HFConfig,
    Input,
    Metrics,
    Options,
    Prediction,
    Task,
    TaskContext,
    TaskDefaults,
    TaskOption,
    TaskState,
    per_token,
)
from mlmkit.errors import ConfigError, TaskError
from mlmkit.files import MAX_RECORD_BYTES, JSONObject
from mlmkit.typed import Registry

__all__ = [
    # the contract (mlmkit/contract.py)
    "EXAMPLE", "TRUNCATED", "DISTINCT", "BATCH", "SEQUENCE", "LABEL", "Example", "Feature", "Input",
    "Prediction",
    "Metrics", "TaskState", "Options", "HFConfig", "CheckpointInfo", "TaskOption",
    "TaskContext", "Task", "TaskDefaults", "REQUIRED", "OPTIONAL", "per_token",
    # the registry
    "GROUP", "OWN", "Plugin", "TaskRegistry", "TASKS", "tasks", "broken", "register", "get_task",
    "option_flags", "tasks_for_command",
    "spelled", "reset", "PRETRAINING", "masked_lm_task", "task_of",
]

log = logging.getLogger("mlmkit")

GROUP = "mlmkit.tasks"


class Plugin:
    """A registered task with its optional members resolved: the only form the core uses."""

    def __init__(self, task: Any, entry_point: str, distribution: str) -> None:
        self.task, self.entry_point, self.distribution = task, entry_point, distribution
        missing = [m for m in REQUIRED if not hasattr(task, m)]
        if missing:
            raise TaskError(
                f"task plugin '{getattr(task, 'name', entry_point)}' from {distribution} lacks "
                f"{', '.join(missing)}",
                "implement the members of mlmkit.registry.Task (docs/plugins.md)",
            )
        defaults = TaskDefaults()
        for m in OPTIONAL:  # the task's own member, else the default
            setattr(self, m, getattr(task, m) if hasattr(task, m) else getattr(defaults, m))
        self.name: str = task.name
        self.description: str = task.description
        self.metrics: tuple[str, ...] = tuple(task.metrics)
        self.outputs: dict[str, tuple[str, ...]] = {k: tuple(v) for k, v in dict(task.outputs).items()}
        self._read, self.featurize, self.build_model = task.read, task.featurize, task.build_model
        try:  # optional keywords: ``training`` (a data set whose training and evaluation parts differ, a
            # BEIR split) and ``max_bytes`` (the record ceiling the user gave, --max-record-bytes)
            takes = set(inspect.signature(task.read).parameters)
        except (TypeError, ValueError):
            takes = set()
        self._read_keywords = takes & {"training", "max_bytes"}
        self.postprocess, self.compute_metrics = task.postprocess, task.compute_metrics
        self._check()

    # declared for readers and type checkers; set in __init__
    formats: tuple[str, ...]
    options: tuple[TaskOption, ...]
    label_names: tuple[str, ...]
    hf_architecture: str
    default_max_length: int
    fresh_head_lr: float | None
    greater_is_better: bool
    trainable: bool
    command: str | None
    partial_layers: int
    group_features: bool
    base_heads: tuple[str, ...]
    kept_heads: tuple[str, ...]
    top_k_option: str | None
    masked_lm: bool
    pipeline_tag: str
    # the optional hooks, the task's own or TaskDefaults' (bound methods, as TaskDefaults declares them)
    from_input: Callable[[Input, Mapping[str, Any]], Example]
    label_list: Callable[[list[Example]], list[str] | None]
    fit_state: Callable[[list[Example]], TaskState]
    calibrate: Callable[[dict[str, list[Any]], list[Feature], list[Example], TaskContext], TaskState]
    main_metric: Callable[[TaskContext], str | None]
    hf_config: Callable[[TaskContext], HFConfig]
    run_files: Callable[[Any, TaskContext], dict[str, str]]
    from_hf: Callable[[Any, Path], CheckpointInfo | None]
    export_module: Callable[[Any], Any]
    summary: Callable[[Prediction], dict[str, str]]

    def _check(self) -> None:
        where = f"task plugin '{self.name}' ({self.entry_point}, from {self.distribution})"
        problems = []
        if not self.metrics or not all(isinstance(m, str) for m in self.metrics):
            problems.append("metrics must be a non-empty tuple of names")
        if not self.outputs or any(not axes or axes[0] != BATCH for axes in self.outputs.values()):
            problems.append(f"outputs must map each output name to its axes, the first being '{BATCH}'")
        names = [getattr(o, "name", None) for o in self.options]
        if not all(isinstance(o, TaskOption) for o in self.options) or len(set(names)) != len(names):
            problems.append("options must be TaskOption objects with distinct names")
        elif self.top_k_option is not None and self.top_k_option not in names:
            problems.append(f"top_k_option '{self.top_k_option}' is not one of its options")
        else:
            bad = [o.name for o in self.options if not isinstance(o.flags, tuple)
                   or not all(isinstance(f, str)
                              and re.fullmatch(r"--[a-z][a-z0-9-]*(/--[a-z][a-z0-9-]*)?", f) for f in o.flags)
                   or ("/" in "".join(o.flags)) != (o.kind is bool and len(o.flags) == 1)]
            if bad:  # the CLI is built from them: a malformed one must break only this plugin
                problems.append(f"option {bad[0]}: flags must be a tuple of --long-names (one --x/--no-x for "
                                "a bool)")
        if problems:
            raise TaskError(f"{where}: {'; '.join(problems)}", "see mlmkit.registry.Task and docs/plugins.md")

    def read(self, path: Path, options: Mapping[str, Any], *, training: bool = False,
             max_bytes: int | None = MAX_RECORD_BYTES) -> list[Example]:
        """The task's ``read``, told whether the data are for training and the record ceiling where it
        asks for them (``training``, ``max_bytes``). A task that takes no ``max_bytes`` reads with its
        readers' default ceiling (MAX_RECORD_BYTES); a ceiling given to it otherwise is said in the log."""
        given = {"training": training, "max_bytes": max_bytes}
        if "max_bytes" not in self._read_keywords and max_bytes != MAX_RECORD_BYTES:
            log.warning("the %s task's read takes no max_bytes: %s is read with the default record ceiling "
                        "of %s bytes, "
                        "not %s", self.name, path, f"{MAX_RECORD_BYTES:,}",
                        "none" if max_bytes is None else f"{max_bytes:,}")
        return self._read(path, options, **{k: v for k, v in given.items() if k in self._read_keywords})

    def best_metric(self, ctx: TaskContext) -> str:
        """The metric that selects the best model under these options."""
        return self.main_metric(ctx) or self.metrics[0]

    def resolve_options(
        self, given: Mapping[str, Any] | None = None, saved: Mapping[str, Any] | None = None, *,
        model: bool = False,
    ) -> Options:
        """Every option: its default, overridden by ``saved`` (a run's or bundle's), then by ``given``
        (values that are None count as not given); an option the task lacks is an error listing its
        options. ``model``: ``saved`` belongs to a trained model, whose ``fixed`` options cannot change."""
        declared = {o.name: o for o in self.options}
        values = {n: o.default for n, o in declared.items()}
        for k, v in (saved or {}).items():  # a model's own, checked as a given value is
            if k in declared and v is not None:
                try:
                    values[k] = declared[k].parse(v)
                except ConfigError as e:
                    raise ConfigError(f"the model's saved task option '{k}' (its mlmkit.json's 'options'): "
                                      f"{e.message}", "the model was edited or damaged: train or export it "
                                      "again") from None
        for k, v in (given or {}).items():
            if v is None:
                continue
            if k not in declared:
                known = ", ".join(o.flag for o in self.options) or "none"
                takers = sorted(n for n, p in tasks().items() if any(o.name == k for o in p.options))
                raise ConfigError(f"{spelled(k)} is not an option of task '{self.name}'"
                                  + (f" (the tasks that have it: {', '.join(takers)})" if takers else ""),
                                  f"its options: {known}")
            value = declared[k].parse(v)
            # built in, as saved
            if model and declared[k].fixed and k in (saved or {}) and value != values[k]:
                raise ConfigError(f"{declared[k].flag} is built into this model ({values[k]!r}); it cannot "
                                  f"be {value!r} here",
                                  "fine-tune or export again with the value you want")
            values[k] = value
        return values

    def saved_options(self, values: Mapping[str, Any]) -> Options:
        """The resolved options a run or bundle keeps (every one but those of a single call)."""
        keep = {o.name for o in self.options if o.saved}
        return {k: v for k, v in values.items() if k in keep}

    def describe(self) -> JSONObject:
        """What `mlmkit tasks --json` prints of the task."""
        return {
            "name": self.name, "description": self.description, "formats": list(self.formats),
            "metrics": list(self.metrics), "package": self.distribution, "command": self.command,
            "trainable": self.trainable,
            "options": [
                {"name": o.name, "flag": o.flag, "type": o.kind.__name__, "default": o.default,
                 "help": o.help,
                 **({"choices": list(o.choices)} if o.choices is not None else {}),
                 **({"fixed": True} if o.fixed else {})}
                for o in self.options
            ],
        }


# ---- discovery ---------------------------------------------------------------------------------
OWN = "mlmkit"  # the distribution of the built-in tasks: a plugin of the same name does not replace one


def _load(ep: Any, dist: str) -> Plugin:
    """The plugin behind one entry point. Anything its import or construction raises, SystemExit and a
    KeyboardInterrupt that no Ctrl-C caused included, is a TaskError naming the plugin."""
    import signal
    import threading

    interrupted: list[bool] = []
    previous = None
    if threading.current_thread() is threading.main_thread():
        def on_sigint(signum: int, frame: Any) -> None:
            interrupted.append(True)
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        obj = ep.load()
        plugin = Plugin(obj() if isinstance(obj, type) else obj, ep.value, dist)
    except TaskError:
        raise
    except BaseException as e:  # noqa: BLE001 - a plugin's failure is its own, whatever it raises
        if isinstance(e, KeyboardInterrupt) and interrupted:
            raise  # a real Ctrl-C
        what = (f"{type(e).__name__}: {e}" if not isinstance(e, SystemExit)
                else f"it called sys.exit({e.code!r}) on import")
        raise TaskError(f"task plugin '{ep.name}' ({ep.value}, from {dist}) failed to load: {what}",
                        f"fix or uninstall {dist}") from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    if plugin.name != ep.name:  # runs record the task's name and are loaded back by it
        raise TaskError(f"task plugin '{ep.name}' ({ep.value}, from {dist}) calls itself '{plugin.name}'",
                        "the entry-point name and the task's name must be the same")
    return plugin


class TaskRegistry(Registry[Plugin]):
    """The task plugins that loaded, by name: the one registry shape (mlmkit.typed.Registry), filled
    from the ``mlmkit.tasks`` entry points on first use (``tasks()``), never at import. ``broken``
    holds the plugins that failed to load, by entry-point name: (reason, distribution); they break only
    themselves."""

    def __init__(self) -> None:
        super().__init__("task", "see `mlmkit tasks`")
        self.broken: dict[str, tuple[str, str]] = {}
        self.discovered = False

    def discover(self) -> TaskRegistry:
        """Load every entry point once; later calls return the same registry."""
        if not self.discovered:
            self.discovered = True
            for ep in md.entry_points(group=GROUP):
                self._take(ep, getattr(getattr(ep, "dist", None), "name", None) or "?")
        return self

    def _take(self, ep: Any, dist: str) -> None:
        try:
            plugin = _load(ep, dist)
        except TaskError as e:
            if ep.name not in self:
                self.broken[ep.name] = (e.args[0], dist)
            log.warning("%s (the other tasks work; `mlmkit tasks` lists it as broken)", e.args[0])
            return
        other = self[ep.name] if ep.name in self else None
        if other is None and ep.name not in self.broken:
            self.add(ep.name, plugin)
            return
        if other is not None and OWN in (other.distribution, dist):  # a built-in keeps its name
            drop = plugin if other.distribution == OWN else other
            log.warning("task '%s' from %s is ignored: the name is mlmkit's own task", ep.name,
                        drop.distribution)
            if drop is other:
                self.remove(ep.name)
                self.add(ep.name, plugin)
            return
        where = f"{other.entry_point} (from {other.distribution}) and " if other is not None else ""
        self.broken[ep.name] = (f"task '{ep.name}' is registered twice: {where}{ep.value} (from {dist})",
                                dist)
        if other is not None:
            self.remove(ep.name)

    def reset(self) -> None:
        """Forget what was discovered (tests that install a plugin)."""
        self.__init__()  # type: ignore[misc]


TASKS = TaskRegistry()  # discovered on first use of ``tasks()`` / ``get_task``


def tasks() -> TaskRegistry:
    """All registered tasks that loaded, by name (discovered once)."""
    return TASKS.discover()


def broken() -> dict[str, tuple[str, str]]:
    """Plugins that failed to load: name -> (reason, distribution)."""
    return dict(tasks().broken)


def register(task: Any, distribution: str = "<runtime>") -> Plugin:
    """Register a task object directly (tests, notebooks); duplicates are an error as for plugins."""
    reg = tasks()
    plugin = Plugin(task, f"{type(task).__module__}:{type(task).__name__}", distribution)
    if plugin.name in reg:
        raise TaskError(f"task '{plugin.name}' is already registered by {reg[plugin.name].distribution}")
    return reg.add(plugin.name, plugin)


def get_task(name: str) -> Plugin:
    reg = tasks()
    if name in reg.broken and name not in reg:
        reason, dist = reg.broken[name]
        raise TaskError(f"the {name} task is broken: {reason}", f"fix or uninstall {dist}")
    if name not in reg:
        known = ", ".join(sorted(reg)) or "none"
        raise TaskError(f"unknown task '{name}'; registered tasks: {known}", "see `mlmkit tasks`")
    return reg[name]


def option_flags(takes: Callable[[Plugin, TaskOption], bool]) -> dict[str, TaskOption]:
    """The options with flags of their own (``TaskOption.flags``) of the tasks that loaded, by name,
    where ``takes(plugin, option)``: what a command's flags are made of (cli/common.py). Two tasks'
    options of one name share the flag; the first task's (by name) says its type and help."""
    found: dict[str, TaskOption] = {}
    for _, plugin in sorted(tasks().items()):
        for o in plugin.options:
            if o.flags and takes(plugin, o):
                found.setdefault(o.name, o)
    return found


PRETRAINING = "pretraining"
"""The task a pretraining run records (mlmkit.json): not a registered task; it is exported and served
as the masked-LM task (``masked_lm_task``)."""


def masked_lm_task() -> Plugin:
    """The task a masked LM is exported and served as when no other task claims it (a pretraining run,
    a BertForMaskedLM checkpoint): the one registered task with ``masked_lm``."""
    found = [p for _, p in sorted(tasks().items()) if p.masked_lm]
    if len(found) != 1:
        why = "none does" if not found else f"{' and '.join(p.name for p in found)} all say so"
        raise TaskError(f"exactly one registered task must serve masked-LM models (masked_lm = True); {why}",
                        "reinstall mlmkit, or uninstall the plugin that claims it too (see `mlmkit tasks`)")
    return found[0]


def task_of(name: str) -> Plugin:
    """The task of a run or bundle that records ``name``: a pretraining run's is the masked-LM task."""
    return masked_lm_task() if name == PRETRAINING else get_task(name)


def tasks_for_command(command: str) -> list[str]:
    """Names of the tasks whose bundles the inference command ``command`` serves."""
    return sorted(n for n, p in tasks().items() if p.command == command)


def spelled(name: str) -> str:
    """How a message names option ``name``: the first flag a task gives it, else ``--option NAME``."""
    flagged = [o.flag for p in tasks().values() for o in p.options if o.name == name and o.flags]
    return flagged[0] if flagged else f"--option {name}"


reset = TASKS.reset  # forget the discovered plugins (tests that install one)

