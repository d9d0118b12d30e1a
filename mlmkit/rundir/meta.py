"""A run directory's description (mlmkit.json), typed: ``RunMeta``, read, checked and written here only.

What pretraining, fine-tuning, distillation and the training loop record of a run, and what export,
evaluation and fine-tuning from it read. Every field is checked when the file is read: a wrong type
is one line naming the file and the field. The file carries a ``format_version`` from this layout
on (1); a run written before it (no version) reads the same way, and a key this version does not
know is kept, unread, in ``other`` and written back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from mlmkit.errors import ConfigError
from mlmkit.files import JSONObject, parse_json, write_json
from mlmkit.registry import PRETRAINING, Metrics, Options, TaskContext, TaskState
from mlmkit.typed import check_version, from_json, rule

META = "mlmkit.json"
RUN_FORMAT = 1
"""mlmkit.json's format_version for runs: 1 is the typed layout; a file without one is the layout
before it, which has the same fields."""
FIX = "the run directory was edited or damaged; train it again"


@dataclass(frozen=True)
class RunMeta:
    """The description of a run: its task and head, how it was trained and what it scored."""

    task: str = field(metadata=rule(bool, "a task name"))  # "pretraining" or a registered task
    max_length: int = field(metadata=rule(lambda n: n >= 1, "a positive whole number of tokens"))
    labels: tuple[str, ...] | None = None
    options: Options = field(default_factory=dict)  # the task's saved options
    # what the task fitted on the data (fit_state, calibration)
    task_state: TaskState = field(default_factory=dict)
    base_model: str | None = None  # fine-tuning: the checkpoint it started from
    data: dict[str, str | None] | None = None  # fine-tuning: {"train": file, "eval": file or None}
    source: JSONObject | None = None  # where the weights came from (export's description of a checkpoint)
    train_args: JSONObject | None = None  # the training loop's arguments (TrainArgs as JSON)
    best_step: int | None = None
    best_metrics: Metrics | None = None
    final_metrics: Metrics | None = None
    distill: JSONObject | None = None  # a distilled student: its teacher, layer map, agreement
    timings: dict[str, float] | None = None  # training: seconds by phase (train/timing.py)
    nsp: bool | None = None  # pretraining: next-sentence prediction, the family, the masking and the corpus
    arch: str | None = None
    whole_word: bool | None = None
    mask_prob: float | None = None
    corpus: list[str] | None = None
    other: JSONObject = field(default_factory=dict)  # keys this version does not know, written back as read

    @property
    def pretraining(self) -> bool:
        return self.task == PRETRAINING

    def context(self, options: Mapping[str, Any], max_length: int | None = None) -> TaskContext:
        """The task's context for this run, with ``options`` already resolved (``max_length``: another)."""
        return TaskContext(max_length=max_length or self.max_length, options=dict(options),
                           labels=self.labels,
                           state=dict(self.task_state))

    @classmethod
    def from_json(cls, data: Any, path: Path | str) -> RunMeta:
        """The description ``data`` (parsed mlmkit.json at ``path``), checked field by field."""
        if isinstance(data, dict) and data.get("format_version") is not None:
            check_version(data, path, key="format_version", reads=RUN_FORMAT, what="a run",
                          fix="use the mlmkit version that wrote it, or train the run again")
        fields_only = {k: v for k, v in data.items() if k != "format_version" and v is not None} \
            if isinstance(data, dict) else data
        return from_json(cls, fields_only, path, fix=FIX, rest="other")

    def to_json(self) -> JSONObject:
        """mlmkit.json's object: the fields that have a value (``labels`` always: null for a task
        without), then the keys read and not known."""
        out: JSONObject = {"format_version": RUN_FORMAT}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name != "other" and (v is not None or f.name == "labels"):
                out[f.name] = list(v) if isinstance(v, tuple) else v
        return {**out, **self.other}


def _bad(path: Path | str, why: str) -> ConfigError:
    return ConfigError(f"{path}: {why}", FIX)


def read_meta(d: str | Path) -> RunMeta:
    """mlmkit.json of run directory ``d``, checked field by field (read_run_meta also checks it against
    the model's config.json)."""
    p = Path(d) / META
    try:
        data = parse_json(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{d} has no {META}", "is it a run directory?") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise _bad(p, f"it is not JSON ({e})") from None
    return RunMeta.from_json(data, p)


def write_meta(d: str | Path, meta: RunMeta) -> None:
    """Write ``meta`` as run directory ``d``'s mlmkit.json (atomically)."""
    write_json(Path(d) / META, meta.to_json())
