"""`mlmkit distill`: a student with fewer layers learns the teacher's outputs for every built-in task it
takes (its held-out agreement far above a fresh student's), is an ordinary run (transformers loads it
with the same outputs), and bad requests are one line with nothing written."""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_finetune
from task_runs import sentence
from tokenizers import Tokenizer
from typer.testing import CliRunner

from mlmkit.args import DistillArgs
from mlmkit.cli import app
from mlmkit.errors import MlmkitError
from mlmkit.files import read_json
from mlmkit.text.tokenizer import special_ids
from mlmkit.train.distill import _examples, distill
from mlmkit.train.distill_teacher import augmented, held_out_agreement
from mlmkit.train.finetune import load_finetuned, torch_forward

TASKS = ("classification", "tagging", "qa", "embedding", "rerank")


@pytest.fixture(scope="module")
def teachers(runs, tmp_path_factory) -> dict[str, Path]:
    """The task runs, the classifier fine-tuned on a keyword task first: an untrained head on the tiny
    base gives every text one label, which any student agrees with."""
    d, rng = tmp_path_factory.mktemp("teacher"), random.Random(1)
    rows = [sentence(rng, rng.randint(4, 14)) for _ in range(300)]
    data = d / "train.csv"
    data.write_text("text,label\n"
                    + "".join(f"{t},{'yes' if ' cat' in ' ' + t or ' dog' in ' ' + t else 'no'}\n"
                              for t in rows))
    run_finetune("classification", runs["fill-mask"], data, d / "clf", epochs=3, lr=1e-3, max_length=32)
    return {**runs, "classification": d / "clf"}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """Unlabelled inputs as `mlmkit predict --input` reads them, for each task."""
    d, rng = tmp_path_factory.mktemp("inputs"), random.Random(0)
    texts = d / "texts.txt"
    texts.write_text("".join(sentence(rng, rng.randint(4, 16)) + "\n" for _ in range(500)))
    qa = d / "qa.jsonl"
    qa.write_text("".join(json.dumps({"question": sentence(rng, 4), "context": sentence(rng, 30)}) + "\n"
                          for _ in range(300)))
    pairs = d / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"text": sentence(rng, 5), "text_pair": sentence(rng, 12)}) + "\n"
                             for _ in range(400)))
    return {"classification": texts, "tagging": texts, "embedding": texts, "qa": qa, "rerank": pairs}


def fresh_student_agreement(teacher_dir: Path, data: Path, layers: int = 1) -> float:
    """The agreement with the teacher of a student of ``layers`` with fresh random weights."""
    task, teacher, tok, meta = load_finetuned(teacher_dir)
    ctx = meta.context(task.resolve_options(saved=meta.options))
    cfg = replace(teacher.bert.config, num_hidden_layers=layers, extra=dict(teacher.bert.config.extra))
    torch.manual_seed(1)
    student = task.build_model(cfg, ctx).eval()
    examples = _examples(task, data, ctx.options)[:100]
    outputs = {k: tuple(v) for k, v in task.outputs.items()}
    got = held_out_agreement(task, examples, tok, ctx, torch_forward(teacher, outputs), student, outputs,
                             special_ids(tok).pad)
    return float(got["value"] or 0.0)


@pytest.mark.parametrize("task", TASKS)
def test_the_student_learns_the_teachers_outputs(teachers, inputs, tmp_path, task):
    runs = teachers
    out = tmp_path / "student"
    m = distill(DistillArgs.from_flat(teacher=runs[task], train_file=inputs[task], out=out, layers=1,
                                      epochs=3, lr=3e-4))
    desc = read_json(out / "mlmkit.json")
    info = desc["distill"]
    assert desc["task"] == task and info["layer_map"] == [0] and info["teacher"] == str(runs[task])
    assert read_json(out / "config.json")["num_hidden_layers"] == 1
    fresh = fresh_student_agreement(runs[task], inputs[task])
    got = info["agreement"]["value"]
    assert m["agreement_value"] == got and info["agreement"]["held_out"] > 0
    floor = 0.5 if task == "rerank" else 0.9  # rerank: the Pearson correlation of the relevance scores
    assert got >= floor and got >= fresh + 0.3, (task, fresh, got)


def test_the_intermediate_losses_and_augmentation(teachers, inputs, tmp_path, caplog):
    """MiniLMv2's relation loss is 0 for the same vectors whatever the padding holds, and positive
    otherwise; augmentation swaps words for vocabulary neighbours; a distillation with the hidden-state
    and relation losses logs each, lowers them, and its student agrees with the teacher."""
    from mlmkit.train.distill_student import relation_kl

    torch.manual_seed(0)
    x, mask = torch.randn(2, 5, 8), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]).bool()
    padded = x.clone()
    padded[0, 3:] = 100.0  # padding only
    assert float(relation_kl(x, x, mask, 2)) == pytest.approx(0.0, abs=1e-6)
    assert float(relation_kl(x, padded, mask, 2)) == pytest.approx(0.0, abs=1e-6)
    assert float(relation_kl(x, torch.randn(2, 5, 8), mask, 2)) > 0.05

    task, teacher, tok, _ = load_finetuned(teachers["classification"])
    texts = [line for line in inputs["classification"].read_text().splitlines() if line][:200]
    got = augmented([{"text": t} for t in texts], teacher.bert.embeddings.word_embeddings.weight, tok, 2,
                    seed=0)
    assert [g["text"] for g in got[:3]] != texts[:3] and len(got) == 2 * len(texts)
    assert all(len(g["text"].split()) == len(t.split()) for g, t in zip(got, texts + texts))
    changed = sum(a != b for g, t in zip(got, texts + texts) for a, b in zip(g["text"].split(), t.split()))
    # about 40% of the words, those in the vocabulary
    assert 0.2 < changed / sum(len(t.split()) for t in texts + texts) < 0.6
    assert all(w in tok.get_vocab() for g, t in zip(got, texts) for a, w in zip(t.split(), g["text"].split())
               if a != w)

    out = tmp_path / "student"
    with caplog.at_level("INFO", logger="mlmkit"):
        m = distill(DistillArgs.from_flat(teacher=teachers["classification"],
                                          train_file=inputs["classification"], out=out,
                                          layers=1, epochs=3, lr=3e-4, hidden_weight=1.0, relation_weight=1.0,
                                          augment=1))
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    hidden = [r["hidden_loss"] for r in logged if "hidden_loss" in r]
    relations = [r["relations_loss"] for r in logged if "relations_loss" in r]
    assert len(hidden) >= 3 and hidden[-1] < 0.7 * hidden[0] and relations[-1] < relations[0], (hidden,
                                                                                                relations)
    assert sum("distill evaluation" in r.getMessage() and "agreement" in r.getMessage()
               for r in caplog.records) == 3
    info = read_json(out / "mlmkit.json")["distill"]
    assert (info["hidden_weight"], info["relation_weight"], info["augment"]) == (1.0, 1.0, 1)
    fresh = fresh_student_agreement(teachers["classification"], inputs["classification"])
    assert m["agreement_value"] >= 0.9 and m["agreement_value"] >= fresh + 0.3


def test_a_distilled_classifier_loads_in_transformers_with_the_same_outputs(runs, inputs, tmp_path):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "student"
    distill(DistillArgs.from_flat(teacher=runs["classification"], train_file=inputs["classification"],
                                  out=out,
                                  layers=1, steps=20))
    _, ours, tok, _ = load_finetuned(out)
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    enc = tok.encode("john went to paris and saw the old river")
    ids = torch.tensor([enc.ids])
    with torch.no_grad():
        a = ours(ids, torch.ones_like(ids), torch.zeros_like(ids))["logits"]
        b = theirs(input_ids=ids, attention_mask=torch.ones_like(ids),
                   token_type_ids=torch.zeros_like(ids)).logits
    np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5)


def test_bad_requests_are_one_line_and_write_nothing(runs, inputs, tmp_path):
    runner = CliRunner()
    cases = [
        ([str(runs["classification"]), "--layers", "0"], "--layers must be at least 1"),
        ([str(runs["classification"]), "--layers", "3"],
         "--layers 3: the student has 1 to the teacher's 2 layers"),
        ([str(runs["classification"]), "--layers", "2", "--layer-map", "1,1"], "each teacher layer once"),
        ([str(runs["classification"]), "--layers", "1", "--layer-map", "4"],
         "the teacher's layers are 0 to 1"),
        ([str(runs["fill-mask"]), "--layers", "1"], "is a pretraining run"),
        ([str(runs["sparse-embedding"]), "--layers", "1"], "outputs are not distilled yet"),
        ([str(runs["classification"]), "--layers", "1", "--temperature", "0"],
         "--temperature must be a positive number"),
        ([str(runs["classification"])], "distill needs --layers"),
        ([str(runs["classification"]), "--layers", "1", "--dims", "8"], "--dims is a static table's size"),
        ([str(runs["classification"]), "--layers", "1", "--hidden-weight", "-1"],
         "--hidden-weight must be 0 or more"),
        ([str(runs["classification"]), "--static", "--augment", "1"],
         "train a transformer student, not a static table"),
    ]
    # a teacher whose tokenizer has more tokens than its embedding table: refused before the teacher runs
    big = tmp_path / "big-vocab"
    shutil.copytree(runs["classification"], big)
    tok = Tokenizer.from_file(str(big / "tokenizer.json"))
    vocab = json.loads((big / "config.json").read_text())["vocab_size"]
    tok.add_tokens([f"newword{i}" for i in range(vocab + 5 - tok.get_vocab_size())])
    tok.save(str(big / "tokenizer.json"))
    cases.append(([str(big), "--layers", "1"],
                  f"has {vocab + 5:,} tokens; the model's embeddings hold {vocab:,}"))
    for i, (argv, match) in enumerate(cases):
        out = tmp_path / f"o{i}"
        r = runner.invoke(app,
                          ["distill", *argv, "--train", str(inputs["classification"]), "--out", str(out)])
        text = " ".join(r.stderr.split())
        assert (r.exit_code == 2 and text.startswith("error:") and match in text
                and "Traceback" not in r.output), (argv, r.output)
        assert not (out / "model.safetensors").exists() and not (out / "mlmkit.json").exists()
    with pytest.raises(MlmkitError, match="the teacher needs inputs"):
        (tmp_path / "one.txt").write_text("a cat\n")
        distill(DistillArgs.from_flat(teacher=runs["classification"], train_file=tmp_path / "one.txt",
                                      out=tmp_path / "x", layers=1))


def test_a_bundle_teacher_labels_with_onnxruntime_and_the_student_starts_from_its_run(teachers, inputs,
                                                                                      tmp_path):
    from conftest import run_export

    bundle = tmp_path / "bundle"
    run_export(teachers["classification"], bundle)
    out = tmp_path / "student"
    distill(DistillArgs.from_flat(teacher=bundle, train_file=inputs["classification"], out=out, layers=1,
                                  epochs=3, lr=3e-4))
    info = read_json(out / "mlmkit.json")["distill"]
    assert (info["labelled_by"] == "onnxruntime" and Path(info["initialised_from"]).resolve()
            == teachers["classification"].resolve())
    fresh = fresh_student_agreement(teachers["classification"], inputs["classification"])
    assert info["agreement"]["value"] >= max(0.9, fresh + 0.3), (fresh, info)
    # a bundle whose run is gone (or holds other weights now) cannot start a student
    desc = read_json(bundle / "mlmkit.json")
    desc["source"]["path"] = str(tmp_path / "gone")
    (bundle / "mlmkit.json").write_text(json.dumps(desc))
    r = CliRunner().invoke(app, ["distill", str(bundle), "--train", str(inputs["classification"]), "--out",
                                 str(tmp_path / "x"), "--layers", "1"])
    assert r.exit_code == 2 and "the run it was exported from" in " ".join(r.stderr.split()), r.output
    assert not (tmp_path / "x" / "mlmkit.json").exists()


def test_eval_scores_the_student_on_labelled_data_and_keeps_the_best(teachers, inputs, tmp_path):
    labelled = teachers["classification"].parent / "train.csv"
    out = tmp_path / "student"
    m = distill(DistillArgs.from_flat(teacher=teachers["classification"], train_file=inputs["classification"],
                                      out=out,
                                      eval_file=labelled, layers=1, epochs=2, lr=3e-4))
    desc = read_json(out / "mlmkit.json")
    assert "eval_accuracy" in m and desc["best_metrics"]["accuracy"] == pytest.approx(m["eval_accuracy"])
    from mlmkit.train.finetune import evaluate_run

    teacher = evaluate_run(teachers["classification"], labelled)["accuracy"]
    assert desc["distill"]["eval"] == str(labelled) and m["eval_accuracy"] >= teacher - 0.05, (teacher, m)


def test_the_teachers_outputs_are_computed_once_per_teacher_and_inputs(teachers, inputs, tmp_path,
                                                                       monkeypatch):
    """The second student of the same teacher and inputs reads the teacher's outputs from the cache
    (the teacher is not run again) and trains the same; other inputs are labelled anew."""
    import mlmkit.train.distill as distill_mod

    kw = dict(teacher=teachers["tagging"], layers=1, steps=10)
    first = distill(DistillArgs.from_flat(train_file=inputs["tagging"], out=tmp_path / "a", **kw))
    cached = list((Path(tmp_path / "cache") / "teacher-outputs").glob("*.npz"))
    assert len(cached) == 1

    def no_teacher(*a, **k):
        raise AssertionError("the teacher ran again")

    with monkeypatch.context() as m:
        m.setattr(distill_mod.prediction, "run_features", no_teacher)
        again = distill(DistillArgs.from_flat(train_file=inputs["tagging"], out=tmp_path / "b", **kw))
    assert again["last_step_metrics"]["loss"] == pytest.approx(first["last_step_metrics"]["loss"], rel=1e-6)
    other = tmp_path / "other.txt"
    other.write_text(inputs["tagging"].read_text() + "one more line of text\n")
    distill(DistillArgs.from_flat(train_file=other, out=tmp_path / "c", **kw))
    assert len(list((Path(tmp_path / "cache") / "teacher-outputs").glob("*.npz"))) == 2
