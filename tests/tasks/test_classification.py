"""The classification task: readers and their errors, featurization, metrics, learning, HF parity, CLI."""

from __future__ import annotations

import json
import random
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import run_finetune
from typer.testing import CliRunner

from mlmkit.errors import DataFormatError
from mlmkit.registry import Task, TaskContext, get_task
from mlmkit.text.tokenizer import train_tokenizer
from mlmkit.train.finetune import evaluate_run
from mlmkit_tasks.classification import task

plugin = get_task("classification")
OPTS = plugin.resolve_options()
CTX = TaskContext(max_length=32, options=OPTS, labels=("a", "b", "c"))


def read(path: Path, **options):
    return task.read(path, plugin.resolve_options(options))


def write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


# ---- registry ----------------------------------------------------------------------------------
def test_registered_through_entry_point():
    t = get_task("classification")
    assert t.task is task and isinstance(task, Task) and t.command == "classify"
    assert t.metrics[0] == "accuracy" and set(t.formats) == {"csv", "tsv", "jsonl"}


# ---- readers -----------------------------------------------------------------------------------
def test_read_csv_quoting_multiline_and_line_numbers(tmp_path):
    f = write(tmp_path / "d.csv",
              'text,label\n"good, really good",pos\n\nbad,neg\n"two\nlines",pos\nlast,neg\n')
    ex = read(f)
    assert [(e["text"], e["label"], e["line"]) for e in ex] == [
        ("good, really good", "pos", 2), ("bad", "neg", 4), ("two\nlines", "pos", 5), ("last", "neg", 7)]
    assert all("text_pair" not in e for e in ex)


def test_read_tsv_pairs_without_quoting(tmp_path):
    f = write(tmp_path / "d.tsv", 'sentence1\tsentence2\ty\nhe said "hi\tthere\tyes\nfoo\tbar\tno\n')
    ex = read(f, text_column="sentence1", pair_column="sentence2", label_column="y")
    assert [(e["text"], e["text_pair"], e["label"]) for e in ex] == [('he said "hi', "there", "yes"),
                                                                     ("foo", "bar", "no")]


def test_read_jsonl_pairs_and_label_types(tmp_path):
    rows = [{"text": "a", "label": 1}, {"text": "b", "text_pair": "c", "label": "x"},
            {"text": "d", "label": True}]
    f = write(tmp_path / "d.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n\n")
    ex = read(f)
    assert [e["label"] for e in ex] == ["1", "x", "true"]
    assert ex[1]["text_pair"] == "c" and "text_pair" not in ex[0]
    assert [e["line"] for e in ex] == [1, 2, 3]


def test_label_list_sorted_strings():
    assert task.label_list([{"label": x} for x in ["neg", "pos", "neg", "mid"]]) == ["mid", "neg", "pos"]
    assert task.label_list([{"label": x} for x in ["10", "2", "1"]]) == ["1", "2", "10"]


@pytest.mark.parametrize(
    ("name", "content", "options", "pattern"),
    [
        ("d.csv", "sentence,label\nhi,a\n", {},
         r"d\.csv, line 1, field 'text': no column 'text'; the header has: sentence, label.*--text-column"),
        ("d.csv", "text,tag\nhi,a\n", {},
         r"line 1, field 'label': no column 'label'; the header has: text, tag.*--label-column"),
        ("d.csv", "text,label\nhi,a\n", {"pair_column": "second"},
         r"line 1, field 'second': no column 'second'.*--pair-column"),
        ("d.csv", "text,label\nhi,a\n  ,b\n", {}, r"line 3, field 'text': empty text"),
        ("d.csv", "text,label\nhi,a\nho\n", {}, r"line 3, field 'label':.*ends before this column"),
        ("d.csv", "text,label\nhi, there,a\n", {}, r"line 2: 3 fields but the header has 2.*quote"),
        ("d.csv", "text,label\nhi,\n", {}, r"line 2, field 'label': empty label"),
        ("d.tsv", "text\tlabel\nok\ta\n\tb\n", {}, r"d\.tsv, line 3, field 'text': empty text"),
        ("d.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", label: "y"}\n', {},
         r"d\.jsonl, line 2: malformed JSON"),
        ("d.jsonl", '{"text": "a", "label": "x"}\n{"sentence": "b", "label": "y"}\n', {},
         r"line 2, field 'text': no field 'text'; the record has: sentence, label.*--text-column"),
        ("d.jsonl", '{"text": "a", "label": "x"}\n\n{"text": "", "label": "y"}\n', {},
         r"line 3, field 'text': empty text"),
        ("d.jsonl", '["a", "x"]\n', {}, r"line 1: expected a JSON object"),
        ("d.csv", b"text,label\nfine,a\nbad \xff byte,b\n", {}, r"line 3: not valid UTF-8.*UTF-8"),
        ("d.txt", "hi\n", {}, r"unknown format '\.txt'.*csv, \.tsv, \.jsonl"),
    ],
)
def test_read_errors_name_file_line_and_field(tmp_path, name, content, options, pattern):
    f = write(tmp_path / name, content)
    with pytest.raises(DataFormatError, match=pattern):
        read(f, **options)


def test_read_missing_file(tmp_path):
    with pytest.raises(DataFormatError, match=r"nope\.csv: file not found"):
        read(tmp_path / "nope.csv")


def test_from_input():
    assert task.from_input("hello", OPTS) == {"text": "hello"}
    named = plugin.resolve_options({"text_column": "q", "pair_column": "p"})
    assert task.from_input({"q": "a", "p": "b", "label": "x"}, named) == {"text": "a", "text_pair": "b"}
    with pytest.raises(DataFormatError, match="field 'text': no field 'text'; the record has: sentence"):
        task.from_input({"sentence": "a"}, OPTS)
    # a pair column asked for by name must be there
    with pytest.raises(DataFormatError, match="field 'p': no field 'p'"):
        task.from_input({"q": "a"}, named)


# ---- featurize ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(["the quick brown fox jumps over the lazy dog", "a b c d e f g"] * 5,
                           vocab_size=100, min_frequency=1)


def test_featurize_pairs_truncation_and_labels(tok):
    examples = [
        {"text": "the quick brown fox", "label": "b"},
        {"text": "the lazy dog", "text_pair": "the fox", "label": "c"},
        {"text": "a b c d e f g " * 10, "text_pair": "a b", "label": "a"},
    ]
    tok.enable_padding(pad_id=0, length=50)  # a caller's setting: featurize must ignore and restore it
    feats = task.featurize(examples, tok, replace(CTX, max_length=8), training=True)
    assert tok.padding is not None and tok.padding["length"] == 50 and tok.truncation is None
    tok.no_padding()
    assert [f["labels"] for f in feats] == [1, 2, 0]
    assert [f["example"] for f in feats] == [0, 1, 2]
    assert all(len(f["input_ids"]) == len(f["token_type_ids"]) <= 8 for f in feats)
    assert set(feats[0]["token_type_ids"]) == {0}
    n_a = len(tok.encode("the lazy dog").ids)  # [CLS] A [SEP]
    assert feats[1]["token_type_ids"] == [0] * n_a + [1] * (len(feats[1]["input_ids"]) - n_a)
    # longest_first keeps the short second text of a truncated pair
    assert len(feats[2]["input_ids"]) == 8 and feats[2]["token_type_ids"][-3:] == [1, 1, 1]
    # evaluation features carry no labels
    assert all("labels" not in f
               for f in task.featurize(examples, tok, replace(CTX, max_length=8), training=False))


def test_unknown_label_at_evaluation_names_line_and_known_labels(tok, tmp_path):
    f = write(tmp_path / "eval.csv", "text,label\nthe fox,a\nthe dog,zebra\n")
    with pytest.raises(DataFormatError, match=r"eval\.csv, line 3, field 'label': label 'zebra' was not in "
                                              r"the training data; the model knows: a, b, c"):
        task.featurize(read(f), tok, replace(CTX, max_length=16), training=False)


# ---- metrics -----------------------------------------------------------------------------------
def _score(gold: list[str], pred: list[str]) -> dict:
    preds = [{"label": p} for p in pred]
    return task.compute_metrics(preds, [{"label": g} for g in gold], CTX)


def test_metrics_equal_hand_computed_values():
    m = _score(["a", "a", "a", "b", "b", "c"], ["a", "a", "b", "b", "c", "c"])
    assert m["accuracy"] == pytest.approx(4 / 6)
    # F1 per class: a: P 1, R 2/3 -> 0.8; b: P 1/2, R 1/2 -> 0.5; c: P 1/2, R 1 -> 2/3
    assert m["macro_f1"] == pytest.approx((0.8 + 0.5 + 2 / 3) / 3)
    # multiclass MCC (Gorodkin): (c*s - sum p_k t_k) / sqrt((s^2 - sum p_k^2)(s^2 - sum t_k^2)),
    # c=4 correct, s=6, t=(3,2,1), p=(2,2,2): (24 - 12) / sqrt(24 * 22)
    assert m["mcc"] == pytest.approx(12 / (24 * 22) ** 0.5)
    assert m["confusion_matrix"] == [[2, 1, 0], [0, 1, 1], [0, 0, 1]]
    assert m["labels"] == ["a", "b", "c"]


def test_mcc_undefined_is_zero_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = _score(["a", "b", "a", "b"], ["a", "a", "a", "a"])
    assert m["mcc"] == 0.0 and m["accuracy"] == 0.5
    assert m["macro_f1"] == pytest.approx((2 / 3 + 0) / 2)


def test_metrics_refuse_unknown_gold_label():
    with pytest.raises(DataFormatError, match="label 'd' was not in the training data"):
        _score(["a", "d"], ["a", "a"])


# ---- learning, HF parity, CLI ------------------------------------------------------------------
POS = ["great", "excellent", "love", "wonderful", "superb", "perfect"]
NEG = ["awful", "terrible", "hate", "broken", "useless", "horrible"]
FILL = ["the", "box", "was", "it", "this", "phone", "and", "really", "very", "my", "day", "came", "with", "a",
        "case"]


def easy_set(n: int, seed: int) -> list[tuple[str, str]]:
    """Sentiment carried by one cue word among random filler words: learnable, not memorisable."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = "positive" if i % 2 else "negative"
        words = rng.choices(FILL, k=rng.randint(3, 8))
        words.insert(rng.randrange(len(words) + 1), rng.choice(POS if label == "positive" else NEG))
        rows.append((" ".join(words), label))
    return rows


def write_csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    return write(path, "text,label\n" + "".join(f"{t},{y}\n" for t, y in rows))


@pytest.fixture
def one_thread():
    """Two tiny-model tests share 2 cores with other test runs: one thread avoids oversubscription."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def easy_data(tmp_path, base_model_factory, one_thread):
    train, held = easy_set(256, seed=1), easy_set(100, seed=2)
    base = base_model_factory([t for t, _ in train], vocab_size=200)
    return base, write_csv(tmp_path / "train.csv", train), write_csv(tmp_path / "held.csv", held)


def test_learns_easy_set_and_loads_in_transformers(easy_data, tmp_path):
    base, train, held = easy_data
    run = tmp_path / "run"
    run_finetune("classification", base, train, run, epochs=4, batch_size=32, lr=4e-3, warmup_ratio=0.1,
                 progress=False)
    metrics = evaluate_run(run, held)
    assert metrics["accuracy"] >= 0.9, metrics
    assert metrics["macro_f1"] >= 0.9 and metrics["mcc"] >= 0.8
    assert sum(map(sum, metrics["confusion_matrix"])) == 100

    from transformers import BertForSequenceClassification

    from mlmkit.text.batching import pad_features
    from mlmkit.train.finetune import load_finetuned

    hf, info = BertForSequenceClassification.from_pretrained(run, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert hf.config.id2label == {0: "negative", 1: "positive"}
    t, ours, tok, meta = load_finetuned(run)
    examples = [{"text": "great box"},
                {"text": "it came broken", "text_pair": "the phone was very awful and useless"}]
    feats = task.featurize(examples, tok, meta.context(t.resolve_options(saved=meta.options)), training=False)
    # mixed lengths: padding is masked
    batch = {k: torch.from_numpy(v) for k, v in pad_features(feats, 0).items()}
    hf.eval()
    with torch.no_grad():
        a = ours(**batch)
        b = hf(**batch).logits
    assert (a["logits"] - b).abs().max().item() <= 1e-5
    assert torch.allclose(a["probabilities"].sum(-1), torch.ones(2))


def test_cli_finetune_evaluate_json_and_unknown_label(easy_data, tmp_path):
    from mlmkit.cli import app

    base, train, held = easy_data
    run = tmp_path / "cli_run"
    runner = CliRunner()
    r = runner.invoke(app, ["finetune", "classification", "--model", str(base), "--train", str(train),
                            "--eval", str(held),
                            "--out", str(run), "--max-steps", "10", "--lr", "4e-3", "--batch-size", "32"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["evaluate", str(run), "--data", str(held), "--json"])
    assert r.exit_code == 0, r.output
    m = json.loads(r.stdout.strip().splitlines()[-1])
    assert {"accuracy", "macro_f1", "mcc"} <= set(m) and all(0 <= m[k] <= 1 for k in ("accuracy", "macro_f1"))

    bad = write(tmp_path / "bad.csv", "text,label\ngreat box,positive\nthe box,meh\n")
    # a wide COLUMNS keeps rich from wrapping the message, so "one line" is what is tested
    r = runner.invoke(app, ["evaluate", str(run), "--data", str(bad), "--json"], env={"COLUMNS": "1000"})
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    assert "bad.csv, line 3, field 'label': label 'meh' was not in the training data" in lines[0]
    assert "knows: negative, positive" in lines[0]
