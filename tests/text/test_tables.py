"""Tables (mlmkit/text/tables.py): every task trains from Parquet files and `datasets` directories as
from JSON lines, and a table's errors name its file, row and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clf_data import POSITIVE, WORDS, clf_rows, no_curves_fixture, write_jsonl  # noqa: F401  (`no_curves`)
from conftest import make_base_model, run_finetune

from mlmkit.errors import DataFormatError
from mlmkit.registry import get_task


def tag_rows(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        w = WORDS[i % len(WORDS)]
        rows.append({"tokens": ["the", w, "cat", str(i % 5)],
                     "tags": ["O", "B-ADJ" if w in POSITIVE else "O", "B-N", "O"]})
    return rows


def qa_rows(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        w = WORDS[i % len(WORDS)]
        context = f"the cat was {w} and the dog was calm number {i % 5}"
        rows.append({"id": str(i), "question": "how was the cat?", "context": context,
                     "answers": {"text": [w], "answer_start": [context.index(w)]}})
    return rows


def save_forms(d: Path, rows: list[dict]) -> dict[str, Path]:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    d.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), d / "data.parquet", row_group_size=7)  # several row groups
    datasets.Dataset.from_list(rows).save_to_disk(str(d / "hf"), num_shards=3)  # several Arrow files
    return {"jsonl": write_jsonl(d / "data.jsonl", rows), "parquet": d / "data.parquet", "datasets": d / "hf"}


def strip(examples: list[dict]) -> list[dict]:
    return [{k: v for k, v in ex.items() if k not in ("source", "line", "format")} for ex in examples]


@pytest.mark.parametrize("task,rows",
                         [("classification", clf_rows(40)), ("tagging", tag_rows(40)), ("qa", qa_rows(40))])
@pytest.mark.usefixtures("no_curves")
def test_every_task_trains_from_parquet_and_datasets_as_from_jsonl(task, rows, tmp_path):
    forms = save_forms(tmp_path / "data", rows)
    assert len(list((forms["datasets"]).glob("*.arrow"))) > 1
    t = get_task(task)
    opts = t.resolve_options({})
    want = strip(t.read(forms["jsonl"], opts))
    texts = [r.get("text") or r.get("context") or " ".join(r["tokens"]) for r in rows]
    base = make_base_model(tmp_path / "base", texts * 2)
    losses = {}
    for name, path in forms.items():
        assert strip(t.read(path, opts)) == want, name
        out = tmp_path / name
        run_finetune(task, base, path, out, eval_file=path, steps=4, log_every=1, batch_size=8, lr=1e-3)
        losses[name] = [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines()
                        if '"loss"' in x]
    assert losses["parquet"] == losses["jsonl"] and losses["datasets"] == losses["jsonl"]


def test_table_errors_name_file_row_and_field(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = get_task("classification")
    opts = t.resolve_options({})
    rows = clf_rows(5)
    rows[3]["label"] = None
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "bad.parquet")
    with pytest.raises(DataFormatError, match=r"bad\.parquet, row 4, field 'label'"):
        t.read(tmp_path / "bad.parquet", opts)
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(DataFormatError, match=r"broken\.parquet: not a readable Parquet file"):
        t.read(tmp_path / "broken.parquet", opts)
    datasets.DatasetDict({"train": datasets.Dataset.from_list(clf_rows(4)),
                          "validation": datasets.Dataset.from_list(clf_rows(4))}).save_to_disk(str(
                              tmp_path / "dd"))
    with pytest.raises(DataFormatError, match=r"DatasetDict directory \(train, validation\)") as e:
        t.read(tmp_path / "dd", opts)
    assert str(tmp_path / "dd" / "train") in e.value.hint
    assert len(t.read(tmp_path / "dd" / "validation", opts)) == 4
