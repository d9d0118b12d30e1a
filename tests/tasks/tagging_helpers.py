"""What the tagging task's tests share (tests/tasks/test_tagging.py, test_tagging_schemes.py): the
registered plugin, a label set, and the task's context with its resolved options."""

from __future__ import annotations

from mlmkit.registry import TaskContext, get_task

plugin = get_task("tagging")
LABELS = ("B-LOC", "B-PER", "I-LOC", "I-PER", "O")


def ctx(max_length: int = 16, labels: tuple[str, ...] = LABELS, **options) -> TaskContext:
    return TaskContext(max_length=max_length, options=plugin.resolve_options(options), labels=labels)
