"""What the qa task's tests share (tests/tasks/test_qa.py, test_qa_data.py, test_qa_metrics.py): the
task's context with its resolved options, its reader, and files written as text or JSON lines."""

from __future__ import annotations

import json
from pathlib import Path

from mlmkit.registry import TaskContext, get_task
from mlmkit_tasks.qa import task

plugin = get_task("qa")


def ctx(max_length: int = 64, state: dict | None = None, **options) -> TaskContext:
    return TaskContext(max_length=max_length, options=plugin.resolve_options(options), state=state or {})


def read(path: Path):
    return task.read(path, plugin.resolve_options())


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def jsonl(path: Path, rows: list) -> Path:
    return write(path, "".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n"
                               for r in rows))
