"""fill-mask as a task plugin: bundles of the layout before it still load and answer the same, a
pretraining run exports through the task, and the task's options and evaluation."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import make_base_model, run_export
from hostile import cli, one_line

from mlmkit.errors import BundleError, ConfigError, DataFormatError
from mlmkit.registry import TaskContext, masked_lm_task, task_of
from mlmkit.runtime.pipeline import Pipeline, evaluate_bundle

LEGACY = Path(__file__).parent.parent / "data" / "legacy"
"""A fill-mask bundle written by mlmkit before fill-mask was a task (main at e2ef86c, 2026-12-06), and
what that mlmkit answered on its inputs (fill-mask-results.json); tests/data/legacy/README.md says how
both were made."""
TEXTS = ["the cat sat on the mat", "a dog ran in the park", "the bird sang a song", "cats and dogs play"] * 3


def _same(got: list[dict], want: list[dict]) -> None:
    """The same masks, positions, spans and candidate ids, scores to 1e-5."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert {k: v for k, v in g.items() if k != "masks"} == {k: v for k, v in w.items() if k != "masks"}
        assert len(g["masks"]) == len(w["masks"])
        for gm, wm in zip(g["masks"], w["masks"]):
            assert {k: v for k, v in gm.items() if k != "candidates"} == {k: v for k, v in wm.items() if k
                                                                          != "candidates"}
            assert [c["id"] for c in gm["candidates"]] == [c["id"] for c in wm["candidates"]]
            assert [c["token"] for c in gm["candidates"]] == [c["token"] for c in wm["candidates"]]
            assert [c["score"] for c in gm["candidates"]] == pytest.approx([
                c["score"] for c in wm["candidates"]], abs=1e-5)


@pytest.fixture(scope="module")
def legacy() -> dict:
    return json.loads((LEGACY / "fill-mask-results.json").read_text())


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, dict]:
    """The run the legacy bundle was exported from, made again (same seed, texts, sizes), exported
    now with --top-k 3: (bundle, its mlmkit.json)."""
    d = tmp_path_factory.mktemp("fill-mask")
    run = make_base_model(d / "run", TEXTS, vocab_size=120, hidden_size=32, num_hidden_layers=1,
                          intermediate_size=64, max_position_embeddings=128)
    return d / "b", run_export(run, d / "b", top_k=3)


def test_the_masked_lm_task_is_fill_mask_and_pretraining_runs_are_its():
    assert masked_lm_task().name == "fill-mask"
    assert task_of("pretraining") is masked_lm_task()


def test_a_bundle_of_the_layout_before_the_task_is_refused_saying_to_export_again(tmp_path):
    """The one-row-per-[MASK] graph of an earlier layout is not special-cased in the runtime: refused
    in one line naming the bundle, saying how to re-create it."""
    bundle = Path(shutil.copytree(LEGACY / "fill-mask-bundle", tmp_path / "b"))
    with pytest.raises(BundleError, match="fill-mask bundle of an earlier layout") as e:
        Pipeline.load(bundle)
    assert str(bundle) in str(e.value) and "mlmkit export RUN" in e.value.hint and "\n" not in str(e.value)


def test_a_pretraining_run_exported_now_answers_as_the_bundle_of_before(legacy, exported):
    """The same run through the task's graph: per-token outputs with the MLM head at the [MASK] rows
    only, read back to the same results."""
    bundle, meta = exported
    assert meta["task"] == "fill-mask" and meta["trained_as"] == "pretraining"
    assert meta["options"] == {"candidates": 3} and meta["outputs"] == {"indices": ["batch", "sequence", "k"],
                                                                         "values": ["batch", "sequence", "k"]}
    assert meta["parity"]["top1_agreement"] == 1.0
    _same(Pipeline.load(bundle)(legacy["inputs"]), legacy["results"])


def test_top_k_zero_shows_every_candidate_and_more_than_the_graph_is_refused(exported):
    pipe = Pipeline.load(exported[0])
    assert [len(m["candidates"]) for m in pipe(["a [MASK] and a [MASK]"])[0]["masks"]] == [3, 3]
    assert [len(m["candidates"]) for m in pipe(["a [MASK] and a [MASK]"], top_k=1)[0]["masks"]] == [1, 1]
    with pytest.raises(ConfigError, match="exported with --top-k 3"):
        pipe.check(["a [MASK]"], {"top_k": 4})


def test_evaluate_scores_the_answers_of_each_mask(exported, tmp_path):
    """Half the answers are the model's own best candidate, half another of its candidates: accuracy
    0.5, top-k accuracy 1.0, over every [MASK] of every record."""
    texts = ["the [MASK] sat on the mat", "a dog [MASK] in the [MASK]", "[MASK] bird sang"]
    results = Pipeline.load(exported[0])(texts)
    answers, n = [], 0
    for r in results:
        answers.append([])
        for m in r["masks"]:
            answers[-1].append(m["candidates"][n % 2]["token"].removeprefix("##"))
            n += 1
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps({"text": t, "answer": a}) + "\n" for t, a in zip(texts, answers)))
    metrics = evaluate_bundle(exported[0], data)
    assert metrics["masks"] == 4
    assert metrics["accuracy"] == 0.5 and metrics["top_k_accuracy"] == 1.0


def test_evaluation_data_without_answers_is_refused_naming_the_line(exported, tmp_path):
    data = tmp_path / "eval.jsonl"
    data.write_text(json.dumps({"text": "a [MASK]", "answer": "cat"}) + "\n"
                    + json.dumps({"text": "a [MASK]"}) + "\n")
    with pytest.raises(DataFormatError, match=r"eval.jsonl, line 2.*answer"):
        evaluate_bundle(exported[0], data)


def test_int8_calibrated_on_masked_texts_is_gated_on_their_masks(exported, tmp_path):
    """--calibrate texts are featurized by the task, as a pretraining run's bundle featurizes them: the
    int8 agreement is the top-1 candidate of their [MASK]s."""
    calib = tmp_path / "calib.txt"
    calib.write_text("".join(f"{t.replace(w, '[MASK]', 1)}\n" for t in TEXTS for w in t.split()[1:3]))
    run = exported[0].parent / "run"
    q = run_export(run, tmp_path / "int8", quantize="int8", calibrate=calib, top_k=3)
    got = q["parity"]["int8_agreement"]
    assert got["on"] == f"{2 * len(TEXTS)} --calibrate inputs" and got["measure"] == "top-1 agreement"
    assert 0.5 <= got["top1"] <= 1.0
    assert len(Pipeline.load(tmp_path / "int8")(["the [MASK] sat"])[0]["masks"]) == 1


GOOD = {"text": "the [MASK] sat on the mat", "answer": "cat"}
BAD = {  # (row, field, words of the one-line error): each could only ever be scored as a miss
    "multi-token answer": ({"text": "the [MASK] sang a song", "answer": "birdsong"}, "answer",
                           ("'birdsong' is 4 tokens for the tokenizer", "use a one-token answer")),
    "more answers than masks": ({"text": "a dog [MASK] in the park", "answer": ["ran", "park"]}, "answer",
                                ("2 answers for 1 [MASK] in the text", "one answer per [MASK]")),
    "fewer answers than masks": ({"text": "a [MASK] ran in the [MASK]", "answer": "dog"}, "answer",
                                 ("1 answer for 2 [MASK]s", "one answer per [MASK]")),
    "no mask": ({"text": "the cat sat on the mat", "answer": "cat"}, "text",
                ("no [MASK] in the text", "write [MASK] where the answer goes")),
}


@pytest.fixture(scope="module")
def checkpoint(exported, tmp_path_factory) -> Path:
    """The exported run as a masked-LM checkpoint directory (no mlmkit.json): what `mlmkit evaluate`
    scores as fill-mask with PyTorch (a pretraining run itself is refused: not a fine-tuned model)."""
    d = Path(shutil.copytree(exported[0].parent / "run", tmp_path_factory.mktemp("ckpt") / "run"))
    (d / "mlmkit.json").unlink()
    return d


@pytest.mark.parametrize("model", ["checkpoint", "bundle"])
@pytest.mark.parametrize("case", list(BAD))
def test_a_row_that_could_only_be_a_miss_is_refused_naming_file_line_and_field(exported, checkpoint, tmp_path,
                                                                             model, case):
    """A checkpoint (PyTorch) and its bundle (onnxruntime) refuse the same rows, in one line (exit 2) naming
    the file, the line and the field and saying how to fix it, before the model runs: nothing written."""
    row, field, words = BAD[case]
    data, out = tmp_path / "eval.jsonl", tmp_path / "predictions.jsonl"
    data.write_text(json.dumps(GOOD) + "\n" + json.dumps(row) + "\n")
    path = checkpoint if model == "checkpoint" else exported[0]
    r = cli("evaluate", path, "--data", data, "--predictions", out)
    one_line(r, f"{data}, line 2, field '{field}'", *words)
    assert not out.exists()


def test_an_answer_the_tokenizer_cannot_write_is_refused(exported, tmp_path):
    """An answer no token decodes to ([UNK] for this vocabulary) can never be a candidate."""
    data = tmp_path / "eval.csv"
    data.write_text("text,answer\nthe [MASK] sat,cat\nthe [MASK] sat,zebra\n")
    with pytest.raises(DataFormatError, match=r"eval.csv, line 3, field 'answer': answer 'zebra' is no "):
        evaluate_bundle(exported[0], data)


@pytest.mark.parametrize("model", ["checkpoint", "bundle"])
def test_masks_counts_the_masks_scored(exported, checkpoint, tmp_path, model):
    """A row with two [MASK]s and two answers counts 2, one with one counts 1 (an answer in upper case
    is compared as the uncased tokenizer's tokens are), through PyTorch and onnxruntime alike."""
    data = tmp_path / "eval.jsonl"
    data.write_text(json.dumps({"text": "a dog [MASK] in the [MASK]", "answer": ["ran", "PARK"]}) + "\n"
                    + json.dumps(GOOD) + "\n")
    r = cli("evaluate", checkpoint if model == "checkpoint" else exported[0], "--data", data, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["masks"] == 3


def test_answers_are_matched_to_their_own_masks_in_a_pair():
    """The pair's answers come after the text's: a text [MASK] cut by the max length is a miss and
    leaves the pair's [MASK] matched to its own answer."""
    task = masked_lm_task()
    ex = {"text": "a [MASK] and a [MASK]", "text_pair": "the [MASK]", "answer": ["cat", "dog", "park"]}
    pred = {"masks": [{"segment": 0, "candidates": [{"token": "cat"}]},
                      {"segment": 1, "candidates": [{"token": "##park"}, {"token": "mat"}]}]}
    got = task.compute_metrics([pred], [ex], TaskContext(max_length=8))
    assert got == {"accuracy": 2 / 3, "top_k_accuracy": 2 / 3, "masks": 3}
