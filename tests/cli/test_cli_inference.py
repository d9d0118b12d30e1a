"""`mlmkit export` and the inference commands through CliRunner: JSON lines when piped, input
files and stdin, order, empty input, the table, exit status 2 with one line on user errors."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import onnxruntime as ort
import pytest
from conftest import run_export
from task_runs import build_runs, sentence
from typer.testing import CliRunner

import mlmkit.cli.inference as cli_inference
from mlmkit.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return build_runs(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def bundles(runs, tmp_path_factory):
    root = tmp_path_factory.mktemp("bundles")
    r = runner.invoke(app,
                      ["export", str(runs["fill-mask"]), "--out", str(root / "fill-mask"), "--top-k", "3"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["fused_operators"]["Attention"] == 2 and summary["parity"]["top1_agreement"] == 1.0
    for kind in ("classification", "tagging", "qa"):
        run_export(runs[kind], root / kind)
    return {kind: root / kind for kind in ("fill-mask", "classification", "tagging", "qa")}


def jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def one_red_line(r) -> str:
    assert r.exit_code == 2, r.output
    text = " ".join(r.stderr.split())  # rich wraps the line at the terminal width
    assert text.startswith("error:") and "Traceback" not in r.output and text.count("error:") == 1
    return text


# ---- export ------------------------------------------------------------------------------------
def test_export_table_and_errors(runs, tmp_path, monkeypatch):
    monkeypatch.setattr(cli_inference, "want_json", lambda flag: False)  # as on a terminal
    r = runner.invoke(app, ["export", str(runs["classification"]), "--out", str(tmp_path / "b"), "--quantize",
                            "int8"])
    assert r.exit_code == 0, r.output
    # two layers; the classification graph computes the last one for [CLS] only, unfused (encode_cls)
    assert ("fused operators" in r.stdout and "Attention 1" in r.stdout
            and "int8 top-1 agreement vs fp32" in r.stdout)
    assert "classification" in r.stdout
    r = runner.invoke(app, ["export", str(runs["classification"]), "--out", str(tmp_path / "c"), "--quantize",
                            "int4"])
    assert "--quantize int4 is not supported" in one_red_line(r)


# ---- inference ---------------------------------------------------------------------------------
def test_fill_mask_args_json_lines_in_order(bundles):
    texts = ["the [MASK] sat on the mat .", "no mask", "john [MASK] to [MASK] ."]
    r = runner.invoke(app, ["fill-mask", str(bundles["fill-mask"]), *texts, "--top-k", "2"])
    assert r.exit_code == 0, r.output
    rows = jsonl(r.stdout)
    assert [x["text"] for x in rows] == texts
    assert [len(x["masks"]) for x in rows] == [1, 0, 2] and rows[1]["error"] == "no [MASK] token in the text"
    assert all(len(m["candidates"]) == 2 for x in rows for m in x["masks"])


def test_fill_mask_table_on_a_terminal(bundles, monkeypatch):
    monkeypatch.setattr(cli_inference, "want_json", lambda flag: False)
    r = runner.invoke(app, ["fill-mask", str(bundles["fill-mask"]), "a [MASK] cat", "nothing"])
    assert r.exit_code == 0, r.output
    assert ("candidates" in r.stdout and "no [MASK] token in the text" in r.stdout
            and not r.stdout.lstrip().startswith("{"))


def test_classify_input_files_and_output(bundles, tmp_path):
    rng = random.Random(1)
    texts = [sentence(rng, n) for n in (12, 1, 30, 4, 18)]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    (tmp_path / "in.csv").write_text("body\n" + "\n".join(texts) + "\n")
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    got = []
    for f, extra in (("in.txt", []), ("in.csv", ["--text-column", "body"]), ("in.jsonl", [])):
        out = tmp_path / f"{f}.out.jsonl"
        r = runner.invoke(app, ["classify", str(bundles["classification"]), "--input", str(tmp_path / f),
                                "-o", str(out), *extra])
        assert r.exit_code == 0, r.output
        assert f"wrote 5 results to {out}" in r.stderr.replace("\n", "")
        got.append(jsonl(out.read_text()))
    assert got[0] == got[1] == got[2] and len(got[0]) == 5
    # the same texts one at a time: order survives the length buckets
    single = [jsonl(runner.invoke(app, ["classify", str(bundles["classification"]), t]).stdout)[0]["label"]
              for t in texts]
    assert [x["label"] for x in got[0]] == single


def test_stdin_and_empty_inputs(bundles, tmp_path):
    r = runner.invoke(app, ["classify", str(bundles["classification"])], input="first text\n\nsecond text\n")
    assert r.exit_code == 0 and len(jsonl(r.stdout)) == 2
    (tmp_path / "empty.txt").write_text("")
    r = runner.invoke(app, ["fill-mask", str(bundles["fill-mask"]), "--input", str(tmp_path / "empty.txt")])
    assert r.exit_code == 0 and r.stdout == ""
    out = tmp_path / "o.jsonl"
    r = runner.invoke(app, ["classify", str(bundles["classification"]), "-i", str(tmp_path / "empty.txt"),
                            "-o", str(out)])
    assert r.exit_code == 0 and out.read_text() == ""
    r = runner.invoke(app, ["classify", str(bundles["classification"])], input="")
    assert r.exit_code == 0 and r.stdout == ""
    # JSON strings on stdin are texts (quotes gone); a text line that merely starts with '"' stays text
    r = runner.invoke(app, ["fill-mask", str(bundles["fill-mask"])], input='"one [MASK]"\n"two"\n')
    assert r.exit_code == 0 and [x["text"] for x in jsonl(r.stdout)] == ["one [MASK]", "two"]
    r = runner.invoke(app, ["fill-mask", str(bundles["fill-mask"])], input='"quoted" then [MASK]\n')
    assert r.exit_code == 0 and [x["text"] for x in jsonl(r.stdout)] == ['"quoted" then [MASK]']
    r = runner.invoke(app, ["predict", str(bundles["classification"])], input='"a"\n{"text": "b"}\n')
    assert r.exit_code == 0 and len(jsonl(r.stdout)) == 2


def test_tag_qa_and_predict(bundles):
    r = runner.invoke(app, ["tag", str(bundles["tagging"]), "john went to paris", "mary saw the river"])
    assert r.exit_code == 0, r.output
    rows = jsonl(r.stdout)
    assert len(rows) == 2 and rows[0]["tokens"] == ["john", "went", "to", "paris"] and "entities" in rows[0]
    r = runner.invoke(app, ["qa", str(bundles["qa"]), "where did john go", "who went", "--context",
                            "john went to paris"])
    assert r.exit_code == 0, r.output
    rows = jsonl(r.stdout)
    assert len(rows) == 2 and all({"answer", "score", "start", "end"} <= set(x) for x in rows)
    r = runner.invoke(app, ["qa", str(bundles["qa"])],
                      input='{"question": "who", "context": "mary saw john"}\n')
    assert r.exit_code == 0 and len(jsonl(r.stdout)) == 1
    r = runner.invoke(app, ["predict", str(bundles["classification"]), "a cat"])
    assert r.exit_code == 0 and jsonl(r.stdout)[0]["label"] in ("neg", "pos")
    r = runner.invoke(app, ["predict", str(bundles["fill-mask"]), "a [MASK]"])
    assert r.exit_code == 0 and jsonl(r.stdout)[0]["masks"]


def test_qa_needs_context(bundles):
    r = runner.invoke(app, ["qa", str(bundles["qa"]), "where?"])
    assert "without --context" in one_red_line(r)
    r = runner.invoke(app, ["predict", str(bundles["qa"]), "just a text"])
    assert "question and a context" in one_red_line(r)


# ---- errors ------------------------------------------------------------------------------------
def test_wrong_command_exits_2(bundles):
    r = runner.invoke(app, ["classify", str(bundles["fill-mask"]), "a text"])
    msg = one_red_line(r)
    assert "is a fill-mask bundle" in msg and "mlmkit fill-mask" in msg
    r = runner.invoke(app, ["fill-mask", str(bundles["tagging"]), "a [MASK]"])
    assert "use `mlmkit tag" in one_red_line(r)


def test_missing_and_corrupted_bundles_exit_2(bundles, tmp_path):
    r = runner.invoke(app, ["classify", str(tmp_path / "nope"), "x"])
    assert "bundle not found" in one_red_line(r)
    b = Path(shutil.copytree(bundles["classification"], tmp_path / "b"))
    (b / "model.onnx").write_bytes(b"not a model")
    assert "model.onnx is corrupted" in one_red_line(runner.invoke(app, ["classify", str(b), "x"]))
    (b / "mlmkit.json").unlink()
    assert "lacks mlmkit.json" in one_red_line(runner.invoke(app, ["classify", str(b), "x"]))


def test_bad_options_exit_2(bundles, tmp_path):
    r = runner.invoke(app, ["fill-mask", str(bundles["fill-mask"]), "a [MASK]", "--top-k", "9"])
    assert "exported with --top-k 3" in one_red_line(r)
    r = runner.invoke(app,
                      ["classify", str(bundles["classification"]), "x", "--input", str(tmp_path / "f.txt")])
    assert "not both" in one_red_line(r)
    r = runner.invoke(app,
                      ["classify", str(bundles["classification"]), "--input", str(tmp_path / "missing.txt")])
    assert "file not found" in one_red_line(r)


def test_device_cuda_falls_back_with_a_message(bundles):
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA")
    r = runner.invoke(app, ["classify", str(bundles["classification"]), "a cat", "--device", "cuda",
                            "--threads", "1"])
    assert r.exit_code == 0, r.output
    assert "running on the CPU" in " ".join(r.stderr.split()) and len(jsonl(r.stdout)) == 1


def test_evaluate_a_bundle(bundles, runs, tmp_path):
    """`mlmkit evaluate BUNDLE` scores through onnxruntime, equal to the run's PyTorch figures."""
    rows = [{"tokens": ["john", "went", "to", "paris"], "tags": ["B-PER", "O", "O", "B-LOC"]},
            {"tokens": ["mary", "saw", "the", "old", "river", "in", "rome"],
             "tags": ["B-PER", "O", "O", "O", "O", "O", "B-LOC"]}]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    onnx_r = runner.invoke(app, ["evaluate", str(bundles["tagging"]), "--data", str(data), "--predictions",
                                 str(tmp_path / "p.jsonl")])
    torch_r = runner.invoke(app, ["evaluate", str(runs["tagging"]), "--data", str(data)])
    assert onnx_r.exit_code == 0 and torch_r.exit_code == 0, onnx_r.output + torch_r.output
    got, want = jsonl(onnx_r.stdout)[0], jsonl(torch_r.stdout)[0]
    assert set(got) >= {"f1", "precision", "recall"}
    assert all(abs(got[k] - want[k]) <= 0.005 for k in ("f1", "precision", "recall"))
    assert len(jsonl((tmp_path / "p.jsonl").read_text())) == 2
    # tagging data: no text
    r = runner.invoke(app, ["evaluate", str(bundles["fill-mask"]), "--data", str(data)])
    assert r.exit_code == 2 and "d.jsonl, line 1, field 'text'" in one_red_line(r)


def test_evaluate_several_models_side_by_side(bundles, runs, tmp_path, monkeypatch):
    """`mlmkit evaluate A B C --speed`: the same data through each (a run by PyTorch, bundles by
    onnxruntime), one JSON line per model with its metrics, examples/s and bytes; the table on a
    terminal; --predictions takes one model."""
    rng = random.Random(0)
    data = tmp_path / "d.csv"
    data.write_text("text,label\n"
                    + "".join(f"{sentence(rng, 6)},{rng.choice(['neg', 'pos'])}\n" for _ in range(30)))
    int8 = tmp_path / "int8"
    run_export(runs["classification"], int8, quantize="int8")
    models = [runs["classification"], bundles["classification"], int8]
    r = runner.invoke(app, ["evaluate", *map(str, models), "--data", str(data), "--speed"])
    assert r.exit_code == 0, r.output
    rows = jsonl(r.stdout)
    assert [x["model"] for x in rows] == [str(m) for m in models]
    assert all(x["examples_per_second"] > 0 and x["model_bytes"] > 0 and 0 <= x["accuracy"] <= 1
               for x in rows)
    # PyTorch and onnxruntime: the same predictions
    assert abs(rows[0]["accuracy"] - rows[1]["accuracy"]) < 1e-9
    assert rows[2]["model_bytes"] < rows[1]["model_bytes"]
    plain = runner.invoke(app, ["evaluate", *map(str, models[1:]), "--data", str(data)])
    assert all("examples_per_second" not in x for x in jsonl(plain.stdout))  # timing only when asked
    import mlmkit.cli.training as cli_training

    monkeypatch.setattr(cli_training, "want_json", lambda flag: False)  # as on a terminal
    table = runner.invoke(app, ["evaluate", *map(str, models), "--data", str(data), "--speed"])
    assert table.exit_code == 0 and "examples/s" in table.stdout and "accuracy" in table.stdout, table.output
    picture = runner.invoke(app, ["evaluate", *map(str, models), "--data", str(data), "--plot",
                                  str(tmp_path / "t.png")])
    assert (picture.exit_code == 0 and (tmp_path / "t.png").read_bytes()[:8]
            == b"\x89PNG\r\n\x1a\n"), picture.output
    # a picture path that cannot be written is refused before any model is evaluated (the work is not lost)
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "d.png").mkdir()
    monkeypatch.setattr(cli_training, "_evaluate_one", lambda *a,
                        **k: pytest.fail("evaluated before the --plot check"))
    for bad, said in ((tmp_path / "d.png", "is a directory"),
                      (tmp_path / "a-file" / "t.png", "is a file, not a directory"),
                      (tmp_path / "t.txt", "unknown picture format '.txt'")):
        r = runner.invoke(app, ["evaluate", str(models[1]), "--data", str(data), "--plot", str(bad)])
        assert said in one_red_line(r), bad
    monkeypatch.undo()
    two = runner.invoke(app, ["evaluate", *map(str, models[1:]), "--data", str(data), "--predictions",
                              str(tmp_path / "p")])
    assert "--predictions takes one model" in one_red_line(two)
    gone = runner.invoke(app, ["evaluate", str(models[1]), str(tmp_path / "nothing"), "--data", str(data)])
    assert "not found" in one_red_line(gone) and not gone.stdout
