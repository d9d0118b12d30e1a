"""The onnxruntime runtime: no torch, PyTorch parity through the pipelines, order under bucketing,
truncation and windowing, no-[MASK] texts, bundle errors, the CUDA fallback, evaluate on a bundle."""

from __future__ import annotations

import json
import logging
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from conftest import run_export, run_finetune
from task_runs import WORDS, corpus, sentence

from mlmkit.errors import BundleError, ConfigError, DataFormatError
from mlmkit.models.core import BertForPreTraining
from mlmkit.rundir.checkpoint import load_state_dict, load_weights
from mlmkit.rundir.config import load_config
from mlmkit.runtime.pipeline import (
    CPU_BATCH_ACTIVATIONS,
    Pipeline,
    evaluate_bundle,
    make_session,
    read_inputs,
)
from mlmkit.runtime.prediction import run_features
from mlmkit.text.batching import pad_features
from mlmkit.text.tokenizer import load_tokenizer, special_ids, train_tokenizer
from mlmkit.train.finetune import evaluate_run, load_finetuned, torch_forward


@pytest.fixture(scope="module")
def bundles(task_bundles):
    return task_bundles


@pytest.fixture
def mlmkit_log(caplog, monkeypatch):
    """Capture the "mlmkit" logger even after the CLI has pointed it at its own handler."""
    monkeypatch.setattr(logging.getLogger("mlmkit"), "propagate", True)
    caplog.set_level(logging.INFO, logger="mlmkit")
    return caplog


# ---- no torch ----------------------------------------------------------------------------------
def test_runtime_and_commands_import_no_torch(bundles):
    code = f"""
import sys
import mlmkit.cli, mlmkit.taskkit, mlmkit.registry
from mlmkit.runtime.pipeline import Pipeline
r = Pipeline.load({str(bundles['fill-mask'])!r})(["a [MASK] cat"])
assert r[0]["masks"], r
for kind, item in (("classification", "a cat"), ("tagging", "john went to paris"),
                   ("qa", {{"question": "who", "context": "john went to paris"}})):
    assert Pipeline.load({str(bundles['fill-mask'].parent)!r} + "/" + kind)([item])
bad = [m for m in sys.modules if m == "torch" or m.startswith("torch.")]
assert not bad, bad[:5]
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


# ---- fill-mask ---------------------------------------------------------------------------------
def test_fill_mask_several_masks_per_text_match_pytorch(runs, bundles):
    d = runs["fill-mask"]
    tok = load_tokenizer(d)
    model = BertForPreTraining(load_config(d))
    load_weights(model, load_state_dict(d))
    model.eval()
    texts = ["the [MASK] sat on the mat",
             "john went to [MASK] and [MASK] saw a [MASK] house near the old river",
             "a [MASK] .", "[MASK] [MASK] [MASK] city in the night with a big red dog and a small blue cat"]
    results = Pipeline.load(bundles["fill-mask"], batch_size=3)(texts, top_k=4)
    assert [r["text"] for r in results] == texts
    for text, r in zip(texts, results):
        enc = tok.encode(text)
        with torch.no_grad():  # each text alone, unpadded: batching must not change anything
            logits = model(torch.tensor([enc.ids]))["prediction_logits"][0]
        where = [i for i, t in enumerate(enc.ids) if t == special_ids(tok).mask]
        assert [m["position"] for m in r["masks"]] == where == [m["position"] for m in r["masks"]]
        for m, pos in zip(r["masks"], where):
            top = torch.softmax(logits[pos], -1).topk(4)
            assert [c["id"] for c in m["candidates"]][:1] == top.indices[:1].tolist()
            np.testing.assert_allclose([c["score"] for c in m["candidates"]], top.values.numpy(), atol=1e-5)
            assert text[m["start"] : m["end"]] == "[MASK]"
        assert "[MASK]" not in r["sequence"]


def test_fill_mask_text_without_mask_gets_error_field(bundles):
    pipe = Pipeline.load(bundles["fill-mask"])
    r = pipe(["no mask here", "one [MASK] here", ""])
    assert r[0] == {"text": "no mask here", "masks": [], "error": "no [MASK] token in the text"}
    assert r[1]["masks"] and "error" not in r[1]
    assert r[2]["masks"] == [] and "error" in r[2]
    assert pipe([]) == [] and pipe(["nothing", "at all"])[1]["error"]  # a batch without any [MASK]


def test_fill_mask_long_text_truncated_with_notice(bundles, mlmkit_log):
    pipe = Pipeline.load(bundles["fill-mask"])
    long_words = " ".join(["dog"] * 300)
    r = pipe([f"a [MASK] {long_words}", f"{long_words} [MASK]", "short [MASK]"])
    assert r[0]["truncated"] is True and len(r[0]["masks"]) == 1
    assert (r[1]["truncated"] is True and r[1]["masks"] == []
            and "within the first 128 tokens" in r[1]["error"])
    assert "truncated" not in r[2]
    assert "2 of 3 inputs were truncated to at most 128 tokens" in mlmkit_log.text


def test_fill_mask_with_a_vocab_txt_tokenizer(runs, tmp_path):
    """A run whose tokenizer came from a bare vocab.txt (a Hugging Face directory): "[MASK]" in the
    text is still the mask token, not "[", "mask", "]" (load_tokenizer registers the special tokens;
    the runtime also guards against a tokenizer.json without them)."""
    run = Path(shutil.copytree(runs["fill-mask"], tmp_path / "run"))
    (run / "tokenizer.json").write_text(load_tokenizer(run / "vocab.txt").to_str())
    assert load_tokenizer(run).encode("a [MASK]").tokens == ["[CLS]", "a", "[MASK]", "[SEP]"]
    run_export(run, tmp_path / "b")
    r = Pipeline.load(tmp_path / "b")(["the [MASK] sat"])[0]
    assert [m["position"] for m in r["masks"]] == [2]


def test_fill_mask_pairs_and_top_k_limit(bundles):
    pipe = Pipeline.load(bundles["fill-mask"])
    r = pipe([{"text": "the [MASK] sat", "text_pair": "on the [MASK]"}], top_k=2)[0]
    assert [m["segment"] for m in r["masks"]] == [0, 1] and all(len(m["candidates"]) == 2 for m in r["masks"])
    assert "[MASK]" not in r["sequence"] and "[MASK]" not in r["sequence_pair"]
    with pytest.raises(ConfigError, match="exported with --top-k 5"):
        pipe(["a [MASK]"], top_k=6)
    with pytest.raises(DataFormatError, match="'text' field"):
        pipe([{"sentence": "a [MASK]"}])
    # never dropped without a word, as classification answers
    for pair in (7, ["on the [MASK]"], {"text": "x"}):
        with pytest.raises(DataFormatError, match="text_pair.*must be a text"):
            pipe([{"text": "the [MASK] sat", "text_pair": pair}])


# ---- task pipelines ----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["classification", "tagging", "qa"])
def test_task_pipeline_matches_pytorch(kind, runs, bundles):
    """Same features, same postprocessing: ONNX outputs per feature equal PyTorch's, and so do the
    user-facing predictions."""
    task, net, tok, meta = load_finetuned(runs[kind])
    pipe = Pipeline.load(bundles[kind], batch_size=4)
    rng = random.Random(5)
    texts = [sentence(rng, n) for n in (3, 40, 9, 1, 25, 14, 60)]
    items = [{"question": "who went", "context": t} for t in texts] if kind == "qa" else texts
    ctx = pipe.context()
    examples = [task.from_input(x, ctx.options) for x in items]
    features = task.featurize(examples, tok, ctx, training=False)
    pad = special_ids(tok).pad
    got = run_features(features, pipe.run_batch, task.outputs, pad_id=pad, batch_size=4)
    ref = run_features(features, torch_forward(net, task.outputs), task.outputs, pad_id=pad, batch_size=64)
    for name in task.outputs:
        for a, b in zip(ref[name], got[name]):
            assert a.shape == b.shape and np.abs(a - b).max() < 1e-4
    want = task.postprocess(ref, features, examples, ctx)
    got_preds = pipe(items)
    flagged = [i for i, p in enumerate(got_preds) if p.pop("truncated", False)]
    assert flagged == ([1, 6] if kind == "classification" else [])  # the long ones; the others window
    assert_same(got_preds, want)


def assert_same(a, b, path="") -> None:
    """Equal structures, floats within 1e-4."""
    if isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, abs=1e-4), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def test_results_keep_input_order_under_bucketing(bundles):
    rng = random.Random(7)
    texts = [sentence(rng, n) for n in (30, 2, 17, 5, 29, 1, 12, 22, 8)]
    batched = Pipeline.load(bundles["classification"], batch_size=3)(texts)
    alone = Pipeline.load(bundles["classification"], batch_size=1)
    for text, r in zip(texts, batched):
        single = alone([text])[0]
        assert r["label"] == single["label"]
        np.testing.assert_allclose(list(r["probabilities"].values()), list(single["probabilities"].values()),
                                   atol=1e-5)
    # distinct outputs, so a permutation would have been caught
    assert len({round(r["score"], 6) for r in batched}) > 3


def test_token_budget_batches_give_the_same_results(bundles):
    """On the CPU batches are also cut by padded tokens (from the hidden size); any budget, or none,
    gives the same results in the same order, and the budget is checked."""
    rng = random.Random(3)
    texts = [sentence(rng, n) for n in (40, 3, 25, 1, 33, 9, 17, 2, 28, 12)]
    auto = Pipeline.load(bundles["classification"])
    hidden = json.loads((bundles["classification"] / "mlmkit.json").read_text())["model"]["hidden_size"]
    assert auto.batch_tokens == CPU_BATCH_ACTIVATIONS // hidden
    calls: list[tuple[int, int]] = []
    tight = Pipeline.load(bundles["classification"], batch_tokens=40)
    run = tight.run_batch
    tight.run_batch = lambda feed: calls.append(feed["input_ids"].shape) or run(feed)  # type: ignore[method-assign]
    unlimited = Pipeline.load(bundles["classification"], batch_tokens=0)
    assert unlimited.batch_tokens is None
    want = unlimited(texts)
    for got in (auto(texts), tight(texts)):
        assert [r["label"] for r in got] == [r["label"] for r in want]
        np.testing.assert_allclose([r["score"] for r in got], [r["score"] for r in want], atol=1e-5)
    assert len(calls) > 3 and all(rows == 1 or rows * length <= 40 for rows, length in calls)
    with pytest.raises(ConfigError, match="--batch-tokens"):
        Pipeline.load(bundles["classification"], batch_tokens=-1)


def test_classify_truncates_long_text_with_notice(bundles, mlmkit_log):
    pipe = Pipeline.load(bundles["classification"])
    r = pipe([" ".join(WORDS), "short text", {"text": "a pair", "text_pair": " ".join(WORDS)}])
    assert r[0]["truncated"] is True and "truncated" not in r[1] and r[2]["truncated"] is True
    assert "2 of 3 inputs were truncated to at most 32 tokens" in mlmkit_log.text


def test_tag_windows_long_text(runs, bundles, mlmkit_log):
    pipe = Pipeline.load(bundles["tagging"])
    rng = random.Random(2)
    text = sentence(rng, 80) + " , john went to paris ."  # far beyond the 24-token max length
    task, _, tok, meta = load_finetuned(runs["tagging"])
    ctx = pipe.context()
    ex = task.from_input(text, ctx.options)
    assert ctx.max_length == 24 and len(task.featurize([ex], tok, ctx, training=False)) > 3
    r = pipe([text, "john went to paris"])
    assert len(r[0]["tags"]) == len(ex["tokens"]) == len(text.split())
    assert "truncated" not in r[0] and "truncated" not in mlmkit_log.text
    for e in r[0]["entities"] + r[1]["entities"]:
        assert e["type"] in ("LOC", "PER") and 0 <= e["score"] <= 1
    assert all(text[e["start"] : e["end"]] == e["text"] for e in r[0]["entities"])


def test_qa_windows_long_context(runs, bundles):
    pipe = Pipeline.load(bundles["qa"])
    rng = random.Random(3)
    context = sentence(rng, 150)
    task, _, tok, meta = load_finetuned(runs["qa"])
    ctx = pipe.context()
    ex = task.from_input({"question": "where", "context": context}, ctx.options)
    assert ctx.max_length == 64 and len(task.featurize([ex], tok, ctx, training=False)) > 3
    r = pipe([{"question": "where did john go", "context": context},
              {"question": "who", "context": "mary saw john"}])
    for item_ctx, p in zip((context, "mary saw john"), r):
        assert set(p) >= {"answer", "score", "start", "end"}
        if p["start"] >= 0:
            assert item_ctx[p["start"] : p["end"]] == p["answer"] != ""
    with pytest.raises(Exception, match="question and a context"):
        pipe(["just a text"])


def test_token_type_ids_supplied_when_missing(bundles):
    pipe = Pipeline.load(bundles["classification"])
    tok = pipe.tokenizer
    ids = tok.encode("the cat sat").ids
    without = pipe.run_batch(pad_features([{"input_ids": ids}], pipe.pad_id))
    zeros = pipe.run_batch(pad_features([{"input_ids": ids, "token_type_ids": [0] * len(ids)}], pipe.pad_id))
    np.testing.assert_array_equal(without["logits"], zeros["logits"])


def test_unknown_task_option_is_refused(bundles):
    with pytest.raises(ConfigError, match="--doc-stride is not an option of task 'classification'"):
        Pipeline.load(bundles["classification"])(["a"], doc_stride=3)


# ---- bundle errors -----------------------------------------------------------------------------
@pytest.fixture
def copy_bundle(bundles, tmp_path):
    def make(kind: str) -> Path:
        return Path(shutil.copytree(bundles[kind], tmp_path / kind))

    return make


def test_missing_file(copy_bundle):
    b = copy_bundle("classification")
    (b / "tokenizer.json").unlink()
    with pytest.raises(BundleError, match="lacks tokenizer.json"):
        Pipeline.load(b)


def test_corrupted_model(copy_bundle):
    b = copy_bundle("classification")
    data = (b / "model.onnx").read_bytes()
    (b / "model.onnx").write_bytes(data[: len(data) // 3])
    with pytest.raises(BundleError, match="model.onnx is corrupted"):
        Pipeline.load(b)


def test_corrupted_description(copy_bundle):
    b = copy_bundle("fill-mask")
    (b / "mlmkit.json").write_text("{not json")
    with pytest.raises(BundleError, match="mlmkit.json is corrupted"):
        Pipeline.load(b)


def test_mismatched_tokenizer_is_refused(copy_bundle):
    b = copy_bundle("fill-mask")
    other = train_tokenizer(corpus(seed=9)[:50], vocab_size=200, min_frequency=1)
    (b / "tokenizer.json").write_text(other.to_str())
    with pytest.raises(BundleError, match="does not match the model"):
        Pipeline.load(b)


def test_run_directory_is_not_a_bundle(runs):
    with pytest.raises(BundleError, match="lacks model.onnx"):
        Pipeline.load(runs["classification"])


def test_wrong_command(bundles):
    with pytest.raises(BundleError, match="is a fill-mask bundle; `mlmkit classify` serves classification or "
                                          "rerank bundles"):
        Pipeline.load(bundles["fill-mask"], command="classify")
    assert Pipeline.load(bundles["tagging"], command="tag").task == "tagging"


# ---- devices -----------------------------------------------------------------------------------
def test_cuda_without_cuda_provider_falls_back(bundles, mlmkit_log):
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA")
    pipe = Pipeline.load(bundles["classification"], device="cuda")
    assert pipe.providers == ["CPUExecutionProvider"]
    assert "no CUDA execution provider" in mlmkit_log.text and "running on the CPU" in mlmkit_log.text
    assert pipe(["a cat"])[0]["label"] in ("neg", "pos")


def test_cuda_provider_without_gpu_falls_back(bundles, mlmkit_log, monkeypatch):
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA")
    monkeypatch.setattr(ort, "get_available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    s = make_session(bundles["classification"] / "model.onnx", device="cuda", threads=1)
    assert s.get_providers() == ["CPUExecutionProvider"]
    assert "no usable GPU" in mlmkit_log.text


def test_bad_device_and_threads(bundles):
    with pytest.raises(ConfigError, match="--device tpu"):
        make_session(bundles["classification"] / "model.onnx", device="tpu")
    with pytest.raises(ConfigError, match="--threads"):
        make_session(bundles["classification"] / "model.onnx", threads=0)


@pytest.mark.parametrize(("omp", "budget"), [("1", 1), ("2", 2), ("64", 64), ("1,1", 1), ("", None),
                                             ("0", None), ("two", None)])
def test_onnxruntime_keeps_to_omp_num_threads_without_threads(monkeypatch, bundles, omp, budget):
    """Without --threads, OMP_NUM_THREADS (the budget torch keeps to) holds onnxruntime's threads too,
    cut to the cores; unset or not a positive number, onnxruntime's default (0). --threads wins; a job's
    workers share the budget out."""
    import os

    from mlmkit.jobs.batch import split_threads
    from mlmkit.runtime.engines import thread_budget

    monkeypatch.setenv("OMP_NUM_THREADS", omp)
    cores = os.cpu_count() or 1
    assert thread_budget() == budget
    model = bundles["classification"] / "model.onnx"
    assert make_session(model).get_session_options().intra_op_num_threads == min(budget or 0, cores)
    assert make_session(model, threads=1).get_session_options().intra_op_num_threads == 1
    assert split_threads(None, 2) == max(1, (budget or cores) // 2)


# ---- evaluate on a bundle ----------------------------------------------------------------------
def _labelled(path: Path, n: int, seed: int) -> Path:
    rng = random.Random(seed)
    rows = ["text,label"]
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        key = "good happy" if label == "pos" else "bad sad"
        rows.append(f"{sentence(rng, rng.randint(2, 8))} {key} {sentence(rng, rng.randint(0, 5))},{label}")
    path.write_text("\n".join(rows) + "\n")
    return path


def test_evaluate_bundle_equals_pytorch_classification(runs, tmp_path):
    train, dev = _labelled(tmp_path / "train.csv", 200, 0), _labelled(tmp_path / "dev.csv", 60, 1)
    run = tmp_path / "clf"
    run_finetune("classification", runs["fill-mask"], train, run, steps=40, batch_size=16, lr=2e-3,
                 progress=False, max_length=32)
    bundle = tmp_path / "clf-bundle"
    run_export(run, bundle)
    want = evaluate_run(run, dev)
    got = evaluate_bundle(bundle, dev, predictions=tmp_path / "pred.jsonl")
    assert want["accuracy"] > 0.8  # it learned, so agreement is not agreement on noise
    for k in ("accuracy", "macro_f1", "mcc"):
        assert abs(got[k] - want[k]) <= 0.005, k
    assert got["confusion_matrix"] == want["confusion_matrix"]
    lines = (tmp_path / "pred.jsonl").read_text().splitlines()
    assert len(lines) == 60 and json.loads(lines[0])["label"] in ("pos", "neg")


@pytest.mark.parametrize("kind", ["tagging", "qa"])
def test_evaluate_bundle_equals_pytorch_windowed_tasks(kind, runs, bundles, tmp_path):
    rng = random.Random(4)
    f = tmp_path / "data.jsonl"
    rows = []
    for i in range(12):
        words = sentence(rng, rng.randint(5, 70)).split() + ["john", "went", "to", "paris"]
        if kind == "tagging":
            rows.append({"tokens": words, "tags": ["O"] * (len(words) - 4) + ["B-PER", "O", "O", "B-LOC"]})
        else:
            ctx = " ".join(words)
            rows.append({"id": str(i), "question": "where did john go", "context": ctx,
                         "answers": [{"text": "paris", "answer_start": ctx.rindex("paris")}]})
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    want = evaluate_run(runs[kind], f)
    got = evaluate_bundle(bundles[kind], f)
    scale = 100.0 if kind == "qa" else 1.0  # 0.5 points
    for k, v in want.items():
        if isinstance(v, float):
            assert abs(got[k] - v) <= 0.5 / 100 * scale, k


# ---- input files -------------------------------------------------------------------------------
def test_read_inputs_formats(tmp_path):
    (tmp_path / "a.txt").write_text("first text\n\n  \nsecond, with comma\n")
    (tmp_path / "a.jsonl").write_text('{"text": "x", "text_pair": "y"}\n\n"plain"\n')
    (tmp_path / "a.csv").write_text('text,other\n"a, b",1\n\nc,2\n')
    (tmp_path / "a.tsv").write_text('question\tcontext\nwho "is"\tsomeone\n')
    (tmp_path / "empty.txt").write_text("")
    assert read_inputs(tmp_path / "a.txt") == ["first text", "second, with comma"]
    assert read_inputs(tmp_path / "a.jsonl") == [{"text": "x", "text_pair": "y"}, "plain"]
    assert read_inputs(tmp_path / "a.csv") == [{"text": "a, b", "other": "1"}, {"text": "c", "other": "2"}]
    assert read_inputs(tmp_path / "a.tsv") == [{"question": 'who "is"', "context": "someone"}]
    assert read_inputs(tmp_path / "empty.txt") == []


def test_read_inputs_errors(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"text": "x"}\n{oops\n')
    with pytest.raises(DataFormatError, match=r"bad.jsonl, line 2: malformed JSON"):
        read_inputs(tmp_path / "bad.jsonl")
    (tmp_path / "a.docx").write_text("x")
    with pytest.raises(DataFormatError, match="unknown format '.docx'"):
        read_inputs(tmp_path / "a.docx")
    with pytest.raises(DataFormatError, match="file not found"):
        read_inputs(tmp_path / "nope.txt")


def test_every_bundle_loads_as_the_pipeline_of_its_task(bundles):
    for kind in ("qa", "fill-mask"):
        pipe = Pipeline.load(bundles[kind])
        assert type(pipe) is Pipeline and pipe.plugin.name == pipe.task == kind
