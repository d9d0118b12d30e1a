"""A run's description, typed (mlmkit.rundir.meta.RunMeta): read, checked, written back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlmkit.errors import ConfigError
from mlmkit.rundir.meta import RUN_FORMAT, RunMeta, read_meta, write_meta

# a fine-tuned run's mlmkit.json as the layout before the typed one wrote it (no format_version)
OLD = {"task": "classification", "labels": ["neg", "pos"], "max_length": 64,
       "options": {"text_column": "text"},
       "task_state": {"threshold": 0.5}, "base_model": "runs/base",
       "data": {"train": "train.csv", "eval": None},
       "train_args": {"lr": 5e-5}, "best_step": 40, "best_metrics": {"accuracy": 0.9},
       "final_metrics": {"step": 50},
       "history": [{"step": 1}]}


def test_a_run_written_before_the_typed_layout_loads_and_writes_back_every_key(tmp_path: Path):
    (tmp_path / "mlmkit.json").write_text(json.dumps(OLD))
    meta = read_meta(tmp_path)
    assert meta.labels == ("neg", "pos") and meta.best_step == 40 and meta.data == {"train": "train.csv",
                                                                                    "eval": None}
    assert meta.other == {"history": [{"step": 1}]}  # a key it does not know: kept, unread
    assert meta.context({"text_column": "t"}, max_length=32).max_length == 32
    write_meta(tmp_path, meta)
    again = json.loads((tmp_path / "mlmkit.json").read_text())
    assert again == {"format_version": RUN_FORMAT, **OLD}
    assert read_meta(tmp_path) == meta


def test_pretraining_fields_and_none_left_out():
    meta = RunMeta(task="pretraining", max_length=128, nsp=False, arch="bert", mask_prob=0.15,
                   corpus=["a.txt"])
    assert meta.pretraining and meta.to_json() == {"format_version": 1, "task": "pretraining",
                                                   "max_length": 128,
                                                   "labels": None, "options": {}, "task_state": {},
                                                   "nsp": False, "arch": "bert",
                                                   "mask_prob": 0.15, "corpus": ["a.txt"]}


@pytest.mark.parametrize(("changes", "said"), [
    ({"max_length": "64"}, "'max_length' is not a positive whole number of tokens ('64')"),
    ({"labels": "neg,pos"}, "'labels' is not a list of strings"),
    ({"options": []}, "'options' is not an object"),
    ({"best_step": 4.5}, "'best_step' is not a whole number"),
    ({"task": None}, "it has no 'task'"),
])
def test_a_wrong_type_or_a_missing_field_is_one_line_naming_it(changes: dict, said: str):
    data = {k: v for k, v in {**OLD, **changes}.items() if v is not None}
    with pytest.raises(ConfigError,
                       match="run/mlmkit.json: " + said.replace("(", r"\(").replace(")", r"\)")) as e:
        RunMeta.from_json(data, "run/mlmkit.json")
    assert "\n" not in str(e.value)


def test_a_run_of_a_later_format_is_refused():
    with pytest.raises(ConfigError, match="a run of format 2; this mlmkit reads format 1"):
        RunMeta.from_json({**OLD, "format_version": 2}, "run/mlmkit.json")
