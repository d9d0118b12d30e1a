"""The task contract, and the discovery of task plugins through the ``mlmkit.tasks`` entry-point group.

A task plugin is any object with the members of ``Task`` (required) and any of the members of
``TaskDefaults`` (each has a default), advertised in its package's pyproject.toml:

    [project.entry-points."mlmkit.tasks"]
    regression = "my_package.regression:task"

The built-in tasks (classification, tagging, qa, embedding, sparse-embedding, rerank: tasks/) are
registered exactly this way, and import mlmkit only through the plugin paths; the core never
imports a specific task. Discovery is lazy and runs once; a duplicate name, a plugin that fails to
load or one that lacks a required member raises TaskError naming the entry point and its
distribution. Each task is wrapped in a ``Plugin``, which resolves every optional member once, so
the rest of the code calls ``plugin.calibrate(...)`` and never asks whether a task has it.

How data flows through a task (docs/plugins.md walks through writing one):

    read(path) / from_input(item)  -> examples   plain dicts, the task's own keys
    featurize(examples, tok, ctx)  -> features   input_ids, token_type_ids, "example" (the index of
                                                 the example it came from), the label_names when
                                                 training, anything postprocess needs
    the model (torch or onnxruntime) -> outputs   {name: array per feature}, named and shaped as
                                                 ``outputs`` declares
    postprocess(outputs, ...)      -> predictions one JSON-able dict per example
    compute_metrics(predictions, examples, ctx) -> {metric: value}

This module, and everything a task runs at inference time (read, from_input, featurize,
postprocess, compute_metrics and the optional hooks but build_model / export_module), must not
import torch: the onnxruntime runtime calls them. Tasks import torch inside build_model only (a head
is a module-level class in a module of its own, which build_model imports).
"""

from __future__ import annotations

import importlib.metadata as md
import inspect
import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from mlmkit.errors import ConfigError, DataFormatError, TaskError

log = logging.getLogger("mlmkit")

GROUP = "mlmkit.tasks"
EXAMPLE = "example"
"""Feature key: the index, in the list given to featurize, of the example a feature belongs to."""
TRUNCATED = "truncated"
"""Feature key: True when featurize cut its example to the max length (results say so to the user)."""
DISTINCT = "distinct"
"""Training feature key of a task with group_features: no two features of a batch should share its
value (the embedding task's text hash: a text twice in a batch would be its own false negative); an
example that would bring a second one goes to a later batch, and the log counts them."""
BATCH = "batch"
"""Output axis: one entry per feature of the batch (always axis 0)."""
SEQUENCE = "sequence"
"""Output axis: one entry per token; results are trimmed to each feature's own length."""
LABEL = "label"
"""Output axis: one entry per label of the run (ctx.labels); bundles are checked to have as many."""

Example = dict[str, Any]
Feature = dict[str, Any]


# ---- options and context -----------------------------------------------------------------------
@dataclass(frozen=True)
class TaskOption:
    """A setting of a task, given on the command line as ``--option name=value`` (or ``--name value``).

    The type is the default's (bool, int, float or str) unless ``value_type`` says otherwise. A
    ``fixed`` option is built into the model (its head, its graph): it is set when a model is
    fine-tuned or exported, and a saved model refuses another value. An option that is not ``saved``
    is a setting of one call (a file to write, how to search): never kept in a run or bundle.

    ``flags``: the option's own command-line flags besides ``--option NAME=VALUE`` (click's
    declarations: ``("--doc-stride",)``, ``("--normalize/--no-normalize",)`` for a bool, aliases after
    the first); the commands that run the task take them (docs/plugins.md says which). An
    ``evaluation`` option is a setting of evaluation only: its flag is on `mlmkit evaluate` alone."""

    name: str
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None
    value_type: type | None = None
    fixed: bool = False
    saved: bool = True
    flags: tuple[str, ...] = ()
    evaluation: bool = False

    @property
    def kind(self) -> type:
        return self.value_type or type(self.default)

    @property
    def flag(self) -> str:
        """How the command line spells this option: its first flag, else ``--option NAME=VALUE`` (the
        one spelling every option has)."""
        return self.flags[0].split("/")[0] if self.flags else f"--option {self.name}=VALUE"

    def parse(self, value: Any) -> Any:
        """``value`` (a string from the command line, or a typed value) checked and converted."""
        kind = self.kind
        if isinstance(value, str) and kind is not str:
            value = _from_string(value, kind)
        ok = isinstance(value, kind) and (kind is bool) == isinstance(value, bool)  # bool is an int too
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            problem = f"expects {'true or false' if kind is bool else f'a value of type {kind.__name__}'}"
        elif isinstance(value, float) and not math.isfinite(value):
            problem = "expects a finite number"
        elif self.choices is not None and value not in self.choices:
            problem = f"must be one of: {', '.join(map(str, self.choices))}"
        elif self.minimum is not None and value < self.minimum:
            problem = f"must be at least {self.minimum:g}"
        else:
            return value
        raise ConfigError(f"task option {self.flag} {problem}, got {value!r}", self.help)


FILL_MASK_TOP_K = TaskOption("top_k", 5, "fill-mask: candidates per [MASK], at most the export's --top-k.",
                             minimum=1, flags=("--top-k",))
"""fill-mask bundles (the pretraining head, no task plugin) take one option, the way tasks take theirs."""


def _from_string(text: str, kind: type) -> Any:
    s = text.strip()
    if kind is bool:
        return {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}.get(s.lower(), text)
    try:
        return kind(s)
    except ValueError:
        return text


@dataclass(frozen=True)
class TaskContext:
    """What a task's hooks see of the model they serve.

    ``labels``: the label list of the run (config.json's id2label), None for label-free tasks;
    ``options``: every declared option, resolved; ``state``: what ``fit_state`` and ``calibrate``
    returned, saved with the model (mlmkit.json "task_state") and read back with it."""

    max_length: int
    options: Mapping[str, Any] = field(default_factory=dict)
    labels: tuple[str, ...] | None = None
    state: Mapping[str, Any] = field(default_factory=dict)

    def with_state(self, update: Mapping[str, Any]) -> TaskContext:
        return replace(self, state={**self.state, **update}) if update else self

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any], options: Mapping[str, Any]) -> TaskContext:
        """The context of a run's or bundle's mlmkit.json, with ``options`` already resolved."""
        labels = meta.get("labels")
        return cls(
            max_length=int(meta["max_length"]),
            options=dict(options),
            labels=tuple(labels) if labels is not None else None,
            state=dict(meta.get("task_state") or {}),
        )


# ---- the contract ------------------------------------------------------------------------------
@runtime_checkable
class Task(Protocol):
    """What every task provides. Features, outputs and predictions are plain Python / numpy."""

    name: str
    """The registered name (must equal the entry-point name); runs and bundles record it."""
    description: str
    metrics: tuple[str, ...]
    """Keys of ``compute_metrics``; the first is the main one (best model, early stopping)."""
    outputs: dict[str, tuple[str, ...]]
    """The model's outputs and the names of their axes, e.g. {"probabilities": (BATCH, "label")}:
    axis 0 is BATCH; SEQUENCE at axis 1 makes an output per token. Exported graphs have exactly these."""

    def read(self, path: Path, options: Mapping[str, Any]) -> list[Example]:
        """Labelled examples of a data file; DataFormatError (file, line, field) on bad input. A task
        whose training and evaluation data differ in one source (a BEIR directory's train and test
        splits) may take a keyword ``training``: True for --train, False otherwise."""

    def featurize(self, examples: list[Example], tokenizer: Any, ctx: TaskContext, *, training: bool) -> list[Feature]:
        """Model features (see the module docstring), at most ``ctx.max_length`` tokens each; long
        inputs may become several features. With ``training`` the label_names keys are filled."""

    def build_model(self, config: Any, ctx: TaskContext) -> Any:
        """The torch module for this config (a ModelConfig) and these options: Hugging Face parameter
        names (bert.* for the encoder); forward(input_ids, attention_mask, token_type_ids, **labels)
        returns a dict with the ``outputs`` and, given labels, "loss"."""

    def postprocess(
        self, outputs: dict[str, list[Any]], features: list[Feature], examples: list[Example], ctx: TaskContext
    ) -> list[dict[str, Any]]:
        """One JSON-able prediction per example from the outputs of each feature (numpy)."""

    def compute_metrics(self, predictions: list[dict[str, Any]], examples: list[Example], ctx: TaskContext) -> dict[str, Any]:
        """The ``metrics`` (floats) of predictions against the examples' gold labels; may add more keys."""


class TaskDefaults:
    """The optional members of a task, with the value a task gets when it leaves one out."""

    formats: tuple[str, ...] = ()
    """Data formats ``read`` accepts, for `mlmkit tasks`, e.g. ("csv", "jsonl")."""
    options: tuple[TaskOption, ...] = ()
    """Settings of the task; resolved values reach every hook as ``ctx.options`` (and ``read``)."""
    label_names: tuple[str, ...] = ("labels",)
    """Feature keys that are training targets, passed to the model's forward by these names."""
    hf_architecture: str = "BertModel"
    """config.json's architectures entry of a fine-tuned run, e.g. "BertForSequenceClassification"."""
    default_max_length: int = 128
    """Tokens per input when fine-tuning is given no --max-length."""
    greater_is_better: bool = True
    """Whether a larger main metric is better."""
    trainable: bool = True
    """Whether `mlmkit finetune` trains this task (False: it is exported and served as it comes)."""
    command: str | None = None
    """The inference command that serves bundles of this task besides `mlmkit predict` (e.g. "classify")."""
    partial_layers: int = 0
    """Trailing encoder layers that ``export_module`` computes for a few positions only (the fusion
    check does not expect their attention to fuse)."""
    group_features: bool = False
    """Keep the features of one example together in training batches (multiple choice, listwise
    ranking: a loss over an example's features). A batch then holds whole examples (one example with
    more features than --batch-size is a batch of its own), and the model's forward also gets
    ``example``: int64 [batch], the example of each feature numbered 0, 1, ... within the batch."""
    base_heads: tuple[str, ...] = ()
    """Prefixes of a base model's head weights this task's model takes over besides the encoder (the
    SPLADE task: the masked-LM head, "cls.predictions."); fine-tuning refuses a base without them."""
    top_k_option: str | None = None
    """The option `mlmkit export --top-k` sets for this task (the SPLADE task: "max_terms"); None: the
    flag is refused for it (it is fill-mask's: the candidates per [MASK])."""
    pipeline_tag: str = "feature-extraction"
    """The Hugging Face Hub's pipeline tag of this task's models, for the model card (e.g.
    "text-classification", "token-classification", "question-answering", "sentence-similarity")."""

    def from_input(self, item: str | dict[str, Any], options: Mapping[str, Any]) -> Example:
        """An example from one runtime input: a text becomes {"text": item}; a record must have a "text"."""
        if isinstance(item, str):
            return {"text": item}
        if isinstance(item, dict) and isinstance(item.get("text"), str):
            return dict(item)
        have = ", ".join(item) if isinstance(item, dict) else type(item).__name__
        raise DataFormatError("<input>", f"expected a text or a record with a 'text' field, got: {have}", field="text")

    def label_list(self, examples: list[Example]) -> list[str] | None:
        """Labels found in training data (saved as config.json's id2label); None: a label-free task."""
        return None

    def fit_state(self, examples: list[Example]) -> dict[str, Any]:
        """Settings derived from the training examples, saved with the model (ctx.state)."""
        return {}

    def calibrate(
        self, outputs: dict[str, list[Any]], features: list[Feature], examples: list[Example], ctx: TaskContext
    ) -> dict[str, Any]:
        """Decision settings tuned on fine-tuning's evaluation set (never on test data), saved with
        the model (ctx.state), e.g. QA's null-score threshold."""
        return {}

    def main_metric(self, ctx: TaskContext) -> str | None:
        """The metric that picks the best model and stops training early, for these options (a task
        whose options change what it measures); None: the first of ``metrics``."""
        return None

    def hf_config(self, ctx: TaskContext) -> dict[str, Any]:
        """Keys config.json of a fine-tuned run gets beside id2label, so transformers reads it the same
        way, e.g. {"problem_type": "multi_label_classification"}."""
        return {}

    def run_files(self, config: Any, ctx: TaskContext) -> dict[str, str]:
        """Files a fine-tuned run directory gets beside the Hugging Face ones: {relative path: text},
        so another library reads the run as its own (the embedding task's sentence-transformers
        modules.json, 1_Pooling/config.json, ...)."""
        return {}

    def from_hf(self, config: Any, directory: Path) -> dict[str, Any] | None:
        """Whether a Hugging Face checkpoint directory (its config, a ModelConfig) is a model of this task,
        and if so its run description: {"labels", "options", "task_state", "max_length"}, each optional.
        None (the default): not this task's. `mlmkit export DIR` asks every task; `--task` asks one."""
        return None

    def export_module(self, model: Any) -> Any:
        """The module to export instead of the model: same inputs and outputs, written for inference.
        Export checks it against the model's own forward."""
        return model

    def summary(self, prediction: dict[str, Any]) -> dict[str, str]:
        """Columns of the terminal table for one prediction (JSON output is the prediction itself)."""
        return {k: _cell(v) for k, v in prediction.items() if isinstance(v, (str, int, float, bool))}


def _cell(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


# the members, read off the two classes above (never a list kept in step by hand)
REQUIRED = (*Task.__annotations__, *(k for k, v in vars(Task).items() if callable(v) and not k.startswith("_")))
OPTIONAL = tuple(k for k in vars(TaskDefaults) if not k.startswith("_"))


class Plugin:
    """A registered task with its optional members resolved: the only form the core uses."""

    def __init__(self, task: Any, entry_point: str, distribution: str) -> None:
        self.task, self.entry_point, self.distribution = task, entry_point, distribution
        missing = [m for m in REQUIRED if not hasattr(task, m)]
        if missing:
            raise TaskError(
                f"task plugin '{getattr(task, 'name', entry_point)}' from {distribution} lacks {', '.join(missing)}",
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
        try:  # ``training`` is optional: a data set whose training and evaluation parts differ (a BEIR split)
            self._read_training = "training" in inspect.signature(task.read).parameters
        except (TypeError, ValueError):
            self._read_training = False
        self.postprocess, self.compute_metrics = task.postprocess, task.compute_metrics
        self._check()

    # declared for readers and type checkers; set in __init__
    formats: tuple[str, ...]
    options: tuple[TaskOption, ...]
    label_names: tuple[str, ...]
    hf_architecture: str
    default_max_length: int
    greater_is_better: bool
    trainable: bool
    command: str | None
    partial_layers: int
    group_features: bool
    base_heads: tuple[str, ...]
    top_k_option: str | None
    pipeline_tag: str
    # the optional hooks, the task's own or TaskDefaults' (bound methods, as TaskDefaults declares them)
    from_input: Callable[[str | dict[str, Any], Mapping[str, Any]], Example]
    label_list: Callable[[list[Example]], list[str] | None]
    fit_state: Callable[[list[Example]], dict[str, Any]]
    calibrate: Callable[[dict[str, list[Any]], list[Feature], list[Example], TaskContext], dict[str, Any]]
    main_metric: Callable[[TaskContext], str | None]
    hf_config: Callable[[TaskContext], dict[str, Any]]
    run_files: Callable[[Any, TaskContext], dict[str, str]]
    from_hf: Callable[[Any, Path], dict[str, Any] | None]
    export_module: Callable[[Any], Any]
    summary: Callable[[dict[str, Any]], dict[str, str]]

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
                   or not all(isinstance(f, str) and re.fullmatch(r"--[a-z][a-z0-9-]*(/--[a-z][a-z0-9-]*)?", f) for f in o.flags)
                   or ("/" in "".join(o.flags)) != (o.kind is bool and len(o.flags) == 1)]
            if bad:  # the CLI is built from them: a malformed one must break only this plugin
                problems.append(f"option {bad[0]}: flags must be a tuple of --long-names (one --x/--no-x for a bool)")
        if problems:
            raise TaskError(f"{where}: {'; '.join(problems)}", "see mlmkit.registry.Task and docs/plugins.md")

    def read(self, path: Path, options: Mapping[str, Any], *, training: bool = False) -> list[dict[str, Any]]:
        """The task's ``read``, told whether the data are for training where it asks (``training``)."""
        if self._read_training:
            return self._read(path, options, training=training)
        return self._read(path, options)

    def best_metric(self, ctx: TaskContext) -> str:
        """The metric that selects the best model under these options."""
        return self.main_metric(ctx) or self.metrics[0]

    def resolve_options(
        self, given: Mapping[str, Any] | None = None, saved: Mapping[str, Any] | None = None, *, model: bool = False,
    ) -> dict[str, Any]:
        """Every option: its default, overridden by ``saved`` (a run's or bundle's), then by ``given``
        (values that are None count as not given); an option the task lacks is an error listing its
        options. ``model``: ``saved`` belongs to a trained model, whose ``fixed`` options cannot change."""
        declared = {o.name: o for o in self.options}
        values = {n: o.default for n, o in declared.items()}
        values.update({k: v for k, v in (saved or {}).items() if k in declared})
        for k, v in (given or {}).items():
            if v is None:
                continue
            if k not in declared:
                known = ", ".join(o.flag for o in self.options) or "none"
                takers = sorted(n for n, p in tasks().items() if any(o.name == k for o in p.options))
                raise ConfigError(f"{spelled(k)} is not an option of task '{self.name}'"
                                  + (f" (the tasks that have it: {', '.join(takers)})" if takers else ""), f"its options: {known}")
            value = declared[k].parse(v)
            if model and declared[k].fixed and value != values[k]:
                raise ConfigError(f"{declared[k].flag} is built into this model ({values[k]!r}); it cannot be {value!r} here",
                                  "fine-tune or export again with the value you want")
            values[k] = value
        return values

    def saved_options(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The resolved options a run or bundle keeps (every one but those of a single call)."""
        keep = {o.name for o in self.options if o.saved}
        return {k: v for k, v in values.items() if k in keep}

    def describe(self) -> dict[str, Any]:
        """What `mlmkit tasks --json` prints of the task."""
        return {
            "name": self.name, "description": self.description, "formats": list(self.formats),
            "metrics": list(self.metrics), "package": self.distribution, "command": self.command, "trainable": self.trainable,
            "options": [
                {"name": o.name, "flag": o.flag, "type": o.kind.__name__, "default": o.default, "help": o.help,
                 **({"choices": list(o.choices)} if o.choices is not None else {}), **({"fixed": True} if o.fixed else {})}
                for o in self.options
            ],
        }


# ---- discovery ---------------------------------------------------------------------------------
_registry: dict[str, Plugin] | None = None
_broken: dict[str, tuple[str, str]] = {}
"""Plugins that failed to load, by entry-point name: (reason, distribution). They break only themselves."""
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
        what = f"{type(e).__name__}: {e}" if not isinstance(e, SystemExit) else f"it called sys.exit({e.code!r}) on import"
        raise TaskError(f"task plugin '{ep.name}' ({ep.value}, from {dist}) failed to load: {what}",
                        f"fix or uninstall {dist}") from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    if plugin.name != ep.name:  # runs record the task's name and are loaded back by it
        raise TaskError(f"task plugin '{ep.name}' ({ep.value}, from {dist}) calls itself '{plugin.name}'",
                        "the entry-point name and the task's name must be the same")
    return plugin


def _discover() -> dict[str, Plugin]:
    found: dict[str, Plugin] = {}
    _broken.clear()
    for ep in md.entry_points(group=GROUP):
        dist = getattr(getattr(ep, "dist", None), "name", None) or "?"
        try:
            plugin = _load(ep, dist)
        except TaskError as e:
            if ep.name not in found:
                _broken[ep.name] = (e.args[0], dist)
            log.warning("%s (the other tasks work; `mlmkit tasks` lists it as broken)", e.args[0])
            continue
        if ep.name in found or ep.name in _broken:
            other = found.get(ep.name)
            if other is not None and OWN in (other.distribution, dist):  # a built-in keeps its name
                keep, drop = (other, plugin) if other.distribution == OWN else (plugin, other)
                log.warning("task '%s' from %s is ignored: the name is mlmkit's own task", ep.name, drop.distribution)
                found[ep.name] = keep
                continue
            where = f"{other.entry_point} (from {other.distribution}) and " if other is not None else ""
            _broken[ep.name] = (f"task '{ep.name}' is registered twice: {where}{ep.value} (from {dist})", dist)
            found.pop(ep.name, None)
            continue
        found[ep.name] = plugin
    return found


def tasks() -> dict[str, Plugin]:
    """All registered tasks that loaded, by name (discovered once)."""
    global _registry
    if _registry is None:
        _registry = _discover()
    return _registry


def broken() -> dict[str, tuple[str, str]]:
    """Plugins that failed to load: name -> (reason, distribution)."""
    tasks()
    return dict(_broken)


def register(task: Any, distribution: str = "<runtime>") -> Plugin:
    """Register a task object directly (tests, notebooks); duplicates are an error as for plugins."""
    reg = tasks()
    plugin = Plugin(task, f"{type(task).__module__}:{type(task).__name__}", distribution)
    if plugin.name in reg:
        raise TaskError(f"task '{plugin.name}' is already registered by {reg[plugin.name].distribution}")
    reg[plugin.name] = plugin
    return plugin


def get_task(name: str) -> Plugin:
    reg = tasks()
    if name in _broken and name not in reg:
        reason, dist = _broken[name]
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


def tasks_for_command(command: str) -> list[str]:
    """Names of the tasks whose bundles the inference command ``command`` serves."""
    return sorted(n for n, p in tasks().items() if p.command == command)


def spelled(name: str) -> str:
    """How a message names option ``name``: the first flag a task (or fill-mask) gives it, else ``--option NAME``."""
    flagged = [o.flag for p in tasks().values() for o in (*p.options, FILL_MASK_TOP_K) if o.name == name and o.flags]
    return flagged[0] if flagged else f"--option {name}"


def reset() -> None:
    """Forget the discovered plugins (tests that install one)."""
    global _registry
    _registry = None
    _broken.clear()


def per_token(axes: Sequence[str]) -> bool:
    """Whether an output with these axes has one entry per token (axis 1 is SEQUENCE)."""
    return len(axes) > 1 and axes[1] == SEQUENCE
