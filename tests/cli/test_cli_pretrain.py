"""`mlmkit pretrain` from the command line: bad input gives one clear line and exit status 2."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from mlmkit.cli import app
from mlmkit.models.config import ModelConfig
from mlmkit.rundir.config import save_config
from mlmkit.text.tokenizer import save_tokenizer, train_tokenizer

runner = CliRunner()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cli")
    rng = random.Random(0)
    words = [f"w{i}" for i in range(30)]
    docs = ["\n".join(" ".join(rng.choices(words, k=rng.randint(4, 9))) for _ in range(4)) for _ in range(12)]
    (d / "corpus.txt").write_text("\n\n".join(docs) + "\n")
    tok = train_tokenizer((d / "corpus.txt").read_text().split("\n"), vocab_size=100, min_frequency=1)
    save_tokenizer(tok, d / "tok")
    V = tok.get_vocab_size()
    small = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=64)
    save_config(ModelConfig(vocab_size=V, **small), d / "config.json")
    save_config(ModelConfig(vocab_size=V + 50, **small), d / "wrong.json")
    return {"dir": d, "corpus": d / "corpus.txt", "tok": d / "tok" / "tokenizer.json",
            "config": d / "config.json",
            "wrong": d / "wrong.json", "V": V}


def pretrain(*args: str | Path):
    return runner.invoke(app, ["pretrain", *map(str, args)])


def tiny_args(files, out: Path) -> list[str | Path]:
    return [files["corpus"], "--out", out, "--tokenizer", files["tok"], "--config", files["config"],
            "--steps", "2", "--batch-size", "2", "--seq-len", "32"]


def one_error_line(result) -> str:
    """The whole of stderr is a single 'error: ...' line: no traceback, no noise."""
    assert result.exit_code == 2, (result.exit_code, result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in result.output
    return lines[0]


def test_missing_corpus_file(files, tmp_path):
    line = one_error_line(pretrain(tmp_path / "nope.txt", "--out", tmp_path / "run"))
    assert "not found" in line and "nope.txt" in line


def test_empty_corpus(files, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n")
    line = one_error_line(pretrain(empty, "--out", tmp_path / "run", "--tokenizer", files["tok"]))
    assert "empty" in line and "empty.txt" in line


def test_non_utf8_bytes_name_the_line(files, tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("first line\nsecond line\n\ncaf\u00e9 au lait\n".encode("latin-1"))
    line = one_error_line(pretrain(bad, "--out", tmp_path / "run", "--tokenizer", files["tok"]))
    assert "latin1.txt, line 4" in line and "UTF-8" in line


def test_non_utf8_while_training_the_tokenizer(files, tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"ok\n\xe9t\xe9\n")
    r = pretrain(bad, "--out", tmp_path / "run", "--vocab-size", "100")
    assert r.exit_code == 2 and "Traceback" not in r.output
    errors = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and "latin1.txt, line 2" in errors[0]


def test_tokenizer_config_vocabulary_mismatch(files, tmp_path):
    out = tmp_path / "run"
    line = one_error_line(pretrain(files["corpus"], "--out", out, "--tokenizer", files["tok"],
                                   "--config", files["wrong"]))
    assert f"{files['V']} tokens" in line and f"vocab_size {files['V'] + 50}" in line
    assert not out.exists()  # refused before any training


def test_bad_options(files, tmp_path):
    line = one_error_line(pretrain(*tiny_args(files, tmp_path / "a"), "--mask-prob", "1.5"))
    assert "--mask-prob" in line
    line = one_error_line(pretrain(*tiny_args(files, tmp_path / "b"), "--resume"))
    assert "--resume" in line and "checkpoint" in line
    line = one_error_line(pretrain(files["corpus"], "--out", tmp_path / "d", "--tokenizer", files["tok"],
                                   "--preset", "huge"))
    assert "huge" in line and "tiny" in line  # lists the valid presets


def test_bf16_is_refused_on_a_cpu_without_native_bf16(files, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    out = tmp_path / "run"
    line = one_error_line(pretrain(*tiny_args(files, out), "--bf16"))
    assert "--bf16" in line and "CPU" in line
    assert not (out / "checkpoints").exists()


def test_device_cuda_without_gpu_falls_back_to_cpu(files, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "run"
    r = pretrain(*tiny_args(files, out), "--device", "cuda")
    assert r.exit_code == 0, r.output
    assert "no CUDA GPU" in r.stderr and "CPU" in r.stderr
    assert (out / "model.safetensors").is_file()


def test_success_prints_metrics_as_json_when_piped(files, tmp_path):
    out = tmp_path / "run"
    r = pretrain(*tiny_args(files, out))
    assert r.exit_code == 0, r.output
    metrics = json.loads(r.stdout.strip().splitlines()[-1])
    assert metrics["step"] == 2 and "eval_mlm_accuracy" in metrics and "eval_mlm_majority_baseline" in metrics
    assert (out / "model.safetensors").is_file()


def test_debug_shows_the_exception(files, tmp_path):
    r = runner.invoke(app,
                      ["--debug", "pretrain", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "run")])
    assert r.exit_code != 0 and r.exception is not None and "not found" in str(r.exception)


def test_a_new_run_into_a_directory_with_checkpoints_is_refused(files, tmp_path):
    out = tmp_path / "run"
    assert pretrain(*tiny_args(files, out)).exit_code == 0
    line = one_error_line(pretrain(*tiny_args(files, out)))
    assert "already holds a run" in line and "--resume" in line
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-0000002"]  # the first run is intact


def test_tokenizer_train_to_a_named_file_leaves_a_tokenizer_json_beside_it_alone(files, tmp_path):
    (tmp_path / "tokenizer.json").write_text("precious")
    res = runner.invoke(app, ["tokenizer", "train", str(files["corpus"]), "--vocab-size", "80", "--out",
                              str(tmp_path / "mine.json")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "tokenizer.json").read_text() == "precious"
    assert json.loads((tmp_path / "mine.json").read_text())["model"]["type"] == "WordPiece"
    res = runner.invoke(app, ["tokenizer", "train", str(files["corpus"]), "--vocab-size", "80", "--out",
                              str(tmp_path / "d")])
    assert res.exit_code == 0 and {"tokenizer.json",
                                   "vocab.txt"} <= {p.name for p in (tmp_path / "d").iterdir()}


def test_an_os_error_is_one_line_too(files, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")  # --out under a regular file cannot be created
    line = one_error_line(pretrain(*tiny_args(files, blocker / "run")))
    assert "file" in line


# ---- prepare once, train many times ----------------------------------------------------------------
def test_tokenize_then_pretrain_from_the_shard_trains_as_from_the_files(files, tmp_path):
    shard = tmp_path / "shard"
    r = runner.invoke(app, ["tokenize", str(files["corpus"]), "--tokenizer", str(files["tok"]), "--out",
                            str(shard)])
    assert r.exit_code == 0, r.output
    assert {"tokens.bin", "sentences.bin", "documents.bin", "manifest.json",
            "tokenizer.json"} <= {p.name for p in shard.iterdir()}
    common = ["--config", files["config"], "--steps", "3", "--batch-size", "2", "--seq-len", "32"]
    from_files = pretrain(files["corpus"], "--out", tmp_path / "a", "--tokenizer", files["tok"], *common)
    from_shard = pretrain("--shard", shard, "--out", tmp_path / "b", *common)  # the shard's own tokenizer
    assert from_files.exit_code == 0 and from_shard.exit_code == 0, (from_files.output, from_shard.output)
    a, b = (json.loads(x.stdout.strip().splitlines()[-1]) for x in (from_files, from_shard))
    # the same tokens, the same batches
    assert a["loss"] == b["loss"] and a["eval_mlm_accuracy"] == b["eval_mlm_accuracy"]
    assert json.loads((tmp_path / "b" / "mlmkit.json").read_text())["corpus"] == [str(
        files["corpus"].resolve())]
    # tokenize again over it: replaced; over a directory that is not a shard: refused
    again = runner.invoke(app, ["tokenize", str(files["corpus"]), "--tokenizer", str(files["tok"]), "--out",
                                str(shard)])
    assert again.exit_code == 0 and not list(tmp_path.glob(".shard*"))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    line = one_error_line(runner.invoke(app,
                                        ["tokenize", str(files["corpus"]), "--tokenizer", str(files["tok"]),
                                         "--out", str(tmp_path / "notes")]))
    assert "is not a token shard" in line and (tmp_path / "notes" / "todo.txt").exists()


def test_pretrain_data_errors(files, tmp_path):
    shard = tmp_path / "shard"
    assert runner.invoke(app, ["tokenize", str(files["corpus"]), "--tokenizer", str(files["tok"]), "--out",
                               str(shard)]).exit_code == 0
    other = train_tokenizer(["some other words entirely"] * 20, vocab_size=60, min_frequency=1)
    save_tokenizer(other, tmp_path / "other")
    cases = [
        (["--shard", shard, "--tokenizer", tmp_path / "other" / "tokenizer.json"], "another tokenizer"),
        (["--shard", tmp_path / "nothing-here"], "not a token shard"),
        ([files["corpus"], "--shard", shard], "corpus files or --shard"),
        ([], "corpus files or --shard"),
    ]
    for args, message in cases:
        line = one_error_line(pretrain(*args, "--out", tmp_path / "run", "--steps", "1"))
        assert message in line, line
    (shard / "tokens.bin").write_bytes(b"\0")  # damaged: said, never silently rebuilt or deleted
    line = one_error_line(pretrain("--shard", shard, "--out", tmp_path / "run", "--steps", "1"))
    assert "is damaged" in line and shard.is_dir()


@pytest.mark.parametrize("native", [True, False])
def test_bf16_by_default_only_where_the_cpu_has_it_and_it_was_measured_faster(native, monkeypatch):
    from mlmkit.models.core import BertModel
    from mlmkit.train.devices import BF16_MIN_HIDDEN, use_bf16

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    cpu = torch.device("cpu")
    small, large = (BertModel(ModelConfig(vocab_size=64, hidden_size=h, num_hidden_layers=1,
                                          num_attention_heads=2,
                                         intermediate_size=2 * h))
                    for h in (BF16_MIN_HIDDEN // 2, BF16_MIN_HIDDEN))
    assert use_bf16(None, cpu, large) is native  # undecided: on where native
    assert use_bf16(None, cpu, small) is False  # smaller than any size measured faster: fp32
    assert use_bf16(False, cpu, large) is False  # --no-bf16
    assert use_bf16(None, torch.device("cuda"), large) is False  # a GPU: only when asked
