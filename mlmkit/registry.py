"""The Task protocol and discovery of task plugins through the ``mlmkit.tasks`` entry-point group.

A task plugin is any object implementing ``Task``, advertised in its package's pyproject.toml:

    [project.entry-points."mlmkit.tasks"]
    regression = "my_package.regression:task"

The built-in tasks (classification, tagging, qa) are registered exactly this way; the core never
imports a specific task. Discovery is lazy and runs once; a duplicate name or a plugin that fails
to load raises TaskError naming the entry point and its distribution.

This module, and everything a task needs at inference time (read, from_input, featurize,
postprocess, compute_metrics), must not import torch: the ONNX runtime calls them. Tasks import
torch inside build_model / export_module only.
"""

from __future__ import annotations

import importlib.metadata as md
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .errors import ConfigError, TaskError

GROUP = "mlmkit.tasks"


@runtime_checkable
class Task(Protocol):
    """What a task plugin provides. Features and outputs are plain Python / numpy, never torch."""

    name: str
    description: str
    formats: tuple[str, ...]
    """Data formats ``read`` accepts, e.g. ("csv", "tsv", "jsonl")."""
    metrics: tuple[str, ...]
    """Keys of ``compute_metrics``; the first is the main one (early stopping, best checkpoint)."""
    options: dict[str, Any]
    """Task-specific options with their defaults (the CLI passes --text-column as text_column)."""
    label_names: tuple[str, ...]
    """Feature keys that are training targets, e.g. ("labels",)."""
    hf_architecture: str
    """The transformers class a fine-tuned run directory loads as, e.g. "BertForSequenceClassification"."""
    default_max_length: int

    def read(self, path: Path, **options: Any) -> list[dict[str, Any]]:
        """Examples from a data file; DataFormatError (file, line, field) on bad input."""

    def from_input(self, item: str | dict[str, Any], **options: Any) -> dict[str, Any]:
        """One example from a runtime input (a text, or a record from .jsonl/.csv)."""

    def label_list(self, examples: list[dict[str, Any]]) -> list[str] | None:
        """Labels found in training data (stored as id2label), or None for label-free tasks."""

    def featurize(
        self, examples: list[dict[str, Any]], tokenizer: Any, *, meta: dict[str, Any], max_length: int, training: bool
    ) -> list[dict[str, Any]]:
        """Model features: dicts with input_ids, token_type_ids, the label_names when ``training``,
        and whatever postprocess needs (example index, offsets). Long inputs become several windows."""

    def build_model(self, config: Any) -> Any:
        """The torch module: HF parameter names; forward(input_ids, attention_mask, token_type_ids,
        **labels) returns a dict with "loss" when labels are given and the onnx_outputs keys."""

    def onnx_outputs(self) -> dict[str, dict[int, str]]:
        """Output names of the exported graph with their dynamic axes, e.g. {"probabilities": {0: "batch"}}."""

    def postprocess(
        self, outputs: dict[str, Any], features: list[dict[str, Any]], examples: list[dict[str, Any]], *, meta: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """User-facing predictions, one per example, from per-feature numpy outputs (torch or ONNX)."""

    def compute_metrics(
        self, predictions: list[dict[str, Any]], examples: list[dict[str, Any]], *, meta: dict[str, Any]
    ) -> dict[str, float]:
        """The task's metrics of predictions against the examples' gold labels."""


@dataclass(frozen=True)
class TaskInfo:
    name: str
    task: Task
    entry_point: str
    distribution: str


_registry: dict[str, TaskInfo] | None = None
# every member of Task: a plugin lacking one would fail later, in `mlmkit tasks` or at inference, with a traceback
PROTOCOL = (
    "name", "description", "formats", "metrics", "options", "label_names", "hf_architecture", "default_max_length",
    "read", "from_input", "label_list", "featurize", "build_model", "onnx_outputs", "postprocess", "compute_metrics",
)


def _discover() -> dict[str, TaskInfo]:
    found: dict[str, TaskInfo] = {}
    for ep in md.entry_points(group=GROUP):
        dist = getattr(getattr(ep, "dist", None), "name", None) or "?"
        try:
            obj = ep.load()
        except Exception as e:
            raise TaskError(
                f"task plugin '{ep.name}' ({ep.value}, from {dist}) failed to load: {type(e).__name__}: {e}",
                f"fix or uninstall {dist}",
            ) from e
        task = obj() if isinstance(obj, type) else obj
        missing = [a for a in PROTOCOL if not hasattr(task, a)]
        if missing:
            raise TaskError(f"task plugin '{ep.name}' from {dist} lacks {', '.join(missing)}", "implement mlmkit.registry.Task")
        if task.name != ep.name:  # runs record task.name and are loaded back by it
            raise TaskError(
                f"task plugin '{ep.name}' ({ep.value}, from {dist}) calls itself '{task.name}'",
                "the entry-point name and the task's name must be the same",
            )
        if ep.name in found:
            other = found[ep.name]
            raise TaskError(
                f"task '{ep.name}' is registered twice: {other.entry_point} (from {other.distribution}) "
                f"and {ep.value} (from {dist})",
                "uninstall one of the two packages",
            )
        found[ep.name] = TaskInfo(ep.name, task, ep.value, dist)
    return found


def tasks() -> dict[str, TaskInfo]:
    """All registered tasks by name (discovered once)."""
    global _registry
    if _registry is None:
        _registry = _discover()
    return _registry


def register(name: str, task: Task, distribution: str = "<runtime>") -> None:
    """Register a task object directly (tests, notebooks); duplicates are an error as for plugins."""
    reg = tasks()
    if name in reg:
        raise TaskError(f"task '{name}' is already registered by {reg[name].distribution}")
    reg[name] = TaskInfo(name, task, f"{type(task).__module__}:{type(task).__name__}", distribution)


def unregister(name: str) -> None:
    tasks().pop(name, None)


def task_options(task: Task, given: dict[str, Any], saved: dict[str, Any] | None = None) -> dict[str, Any]:
    """The task's defaults, overridden by ``saved`` (a run's or bundle's options), then by the
    options ``given`` that are not None; a given option the task lacks is an error."""
    opts = {**dict(getattr(task, "options", {}) or {}), **(saved or {})}
    for k, v in given.items():
        if v is None:
            continue
        if k not in opts:
            known = ", ".join("--" + o.replace("_", "-") for o in opts) or "none"
            raise ConfigError(f"--{k.replace('_', '-')} does not apply to task '{task.name}'", f"its options: {known}")
        opts[k] = v
    return opts


def get_task(name: str) -> Task:
    reg = tasks()
    if name not in reg:
        known = ", ".join(sorted(reg)) or "none"
        raise TaskError(f"unknown task '{name}'; registered tasks: {known}", "see `mlmkit tasks`")
    return reg[name].task


def reset() -> None:
    """Forget the discovered plugins (tests that install one)."""
    global _registry
    _registry = None
