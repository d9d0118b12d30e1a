"""Hostile but ordinary use: no hang, no runaway memory, no lost work, no traceback, no silently wrong
answer. One section per group of the reliability issue; every user error is exit status 2 and one
line on stderr, and nothing that existed before is lost."""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import run_export
from hostile import PEAK, cli, data_fixture, one_line, tiny  # noqa: F401  (data_fixture: the fixture `data`)
from task_runs import build_runs

from mlmkit.errors import BundleError, ConfigError, MlmkitError
from mlmkit.locks import LOCK, exclusive
from mlmkit.runtime.pipeline import Pipeline
from mlmkit.train.corpus import instances as corpus_instances
from mlmkit.train.corpus import shards as corpus_shards
from mlmkit.train.state import ResumeCheckpoints


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    return build_runs(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def bundles(runs, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bundles")
    for kind in ("fill-mask", "classification", "tagging"):
        run_export(runs[kind], root / kind)
    return {kind: root / kind for kind in ("fill-mask", "classification", "tagging")}


def long_text(n_words: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(("the", "cat", "sat", "on", "a", "mat", "john", "paris"))
                    for _ in range(n_words))


def measured(code: str, timeout: float = 120) -> tuple[float, float]:
    """(seconds, peak resident MB) of ``code`` run in a fresh interpreter (Linux: /proc/self/status)."""
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return time.perf_counter() - t0, float(r.stdout.strip().splitlines()[-1]) / 1024


# ---- 1. no hang, no super-linear time --------------------------------------------------------------
def test_pair_truncation_and_packing_are_linear() -> None:
    """One sentence of 400k tokens: the quadratic versions took seconds (and minutes at 4M tokens)."""
    long = list(range(400_000))
    t0 = time.perf_counter()
    a, b = list(long), list(range(10))
    corpus_instances._truncate_pair(a, b, 125, random.Random(0))
    assert (len(a), len(b)) == (115, 10)  # the longer side gives way
    import numpy as np

    tc = corpus_shards.TokenizedCorpus(np.arange(400_000, dtype=np.int32), np.array([0, 400_000]),
                                       np.array([0, 1]))
    packed = corpus_instances.packed_instances(tc, 128)
    assert sum(len(x.a) for x in packed) == 400_000 and max(len(x.a) for x in packed) == 126
    assert time.perf_counter() - t0 < 2.0


def test_truncation_keeps_the_recipe_of_the_original(seed: int = 3) -> None:
    """The linear truncation draws the same random cuts as the token-by-token original."""

    def original(a: list[int], b: list[int], max_tokens: int, rng: random.Random) -> None:
        while len(a) + len(b) > max_tokens:
            longer = a if len(a) > len(b) else b
            if rng.random() < 0.5:
                del longer[0]
            else:
                longer.pop()

    for n_a, n_b, m in ((50, 30, 40), (5, 90, 20), (64, 64, 61), (10, 10, 25)):
        x, y = list(range(n_a)), list(range(100, 100 + n_b))
        x2, y2 = list(x), list(y)
        original(x, y, m, random.Random(seed))
        corpus_instances._truncate_pair(x2, y2, m, random.Random(seed))
        assert (x, y) == (x2, y2)


def test_pretraining_on_one_huge_line_finishes(tmp_path: Path, data: dict[str, Path]) -> None:
    line = tmp_path / "line.txt"
    line.write_text(long_text(300_000) + "\n")  # ~1.2 MB, a single sentence of 300k tokens
    t0 = time.perf_counter()
    r = cli("pretrain", line, "--out", tmp_path / "run", "--vocab-size", "200", "--steps", "2", "--no-nsp",
            "--batch-size", "4", "--seq-len", "32", "--preset", "tiny")
    assert r.exit_code == 0, r.output
    assert time.perf_counter() - t0 < 60


def test_classifying_a_huge_line_costs_what_the_max_length_uses(tmp_path: Path,
                                                                bundles: dict[str, Path]) -> None:
    big = tmp_path / "big.txt"
    big.write_text(long_text(2_000_000) + "\n")  # ~8 MB on one line
    bundle = str(bundles["classification"])
    secs, mb = measured(f"from mlmkit.runtime.pipeline import Pipeline\n"
                        f"r = Pipeline.load({bundle!r})([open({str(big)!r}).read().strip()])\n"
                        f"assert r[0]['truncated'] is True\n{PEAK}")
    assert secs < 20 and mb < 600, (secs, mb)  # the text itself is 8 MB; tokenizing it whole took GBs


def test_tagging_a_long_line_is_linear(tmp_path: Path, bundles: dict[str, Path]) -> None:
    text = long_text(40_000)
    pipe = Pipeline.load(bundles["tagging"])
    t0 = time.perf_counter()
    (r,) = pipe([text])
    t1 = time.perf_counter() - t0
    assert len(r["tags"]) == 40_000
    t0 = time.perf_counter()
    pipe([text + " " + text])
    t2 = time.perf_counter() - t0
    assert t2 < 3.5 * t1 + 0.5, (t1, t2)  # twice the words, about twice the time


# ---- 2. no runaway memory ---------------------------------------------------------------------------
def test_a_batch_larger_than_the_data_is_capped_with_a_notice(tmp_path: Path, data: dict[str, Path]) -> None:
    r = cli(*tiny(data, tmp_path / "run", "--batch-size", "100000"))
    assert r.exit_code == 0, r.output
    assert "--batch-size 100000 is more than the" in " ".join(r.stderr.split())


def test_threads_are_capped_by_the_machine(bundles: dict[str, Path]) -> None:
    r = cli("classify", bundles["classification"], "a cat", "--threads", "10000")
    assert r.exit_code == 0, r.output
    assert f"--threads 10000 is more than the {os.cpu_count()} cores" in " ".join(r.stderr.split())


# ---- 3. no lost work ------------------------------------------------------------------------------
def test_a_run_directory_in_use_is_refused(tmp_path: Path, data: dict[str, Path]) -> None:
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (out / LOCK).write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(),
                                            "since": "then"}))
        one_line(cli(*tiny(data, out)), f"{out} is in use by process {holder.pid}")
        assert not (out / "checkpoints").exists() and (out / LOCK).exists()  # the holder's lock is left alone
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone: its lock is stale and taken over
    r = cli(*tiny(data, out))
    assert r.exit_code == 0, r.output
    assert "taking over the lock of process" in " ".join(r.stderr.split()) and not (out / LOCK).exists()


def test_the_lock_is_not_reentered_by_another_writer(tmp_path: Path) -> None:
    d = tmp_path / "x"
    with exclusive(d):
        assert (d / LOCK).exists()
        other = subprocess.run([sys.executable, "-c",
                                f"from mlmkit.locks import exclusive\nwith exclusive({str(d)!r}): pass"],
                               capture_output=True, text=True)
        assert other.returncode != 0 and "is in use by process" in other.stderr
    assert not (d / LOCK).exists()


@pytest.mark.parametrize("flag, value", [("--keep-last", "-1"), ("--keep-last", "0")])
def test_keep_last_below_one_is_refused(tmp_path: Path, data: dict[str, Path], flag: str, value: str) -> None:
    one_line(cli(*tiny(data, tmp_path / "run"), flag, value), "--keep-last must be at least 1")


def test_output_file_survives_a_failing_run(tmp_path: Path, bundles: dict[str, Path]) -> None:
    prev = tmp_path / "prev.jsonl"
    prev.write_text('{"old": true}\n')
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('{"text": "fine"}\n{"sentence": "no text field"}\n')
    one_line(cli("classify", bundles["classification"], "--input", inputs, "--output", prev), "field 'text'")
    assert (prev.read_text() == '{"old": true}\n' and sorted(p.name for p in tmp_path.iterdir())
            == ["in.jsonl", "prev.jsonl"])


def test_resume_refuses_changed_data_order_settings(tmp_path: Path, data: dict[str, Path]) -> None:
    out = tmp_path / "run"
    assert cli(*tiny(data, out)).exit_code == 0
    shutil.rmtree(out / "checkpoints" / "step-0000004")  # as if killed after the checkpoint at step 2
    for p in ("model.safetensors", "mlmkit.json"):
        (out / p).unlink()
    one_line(cli(*tiny(data, out, "--resume", "--batch-size", "2")),
             "--resume: settings that decide the data order changed",
             "batch_size: 4 then, 2 now", "--resume-force")
    one_line(cli(*tiny(data, out, "--resume", "--seed", "9")), "seed: 0 then, 9 now")
    r = cli(*tiny(data, out, "--resume", "--batch-size", "2", "--resume-force"))
    assert r.exit_code == 0 and "--resume-force: continuing although" in " ".join(r.stderr.split()), r.output
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()
             if "loss" in json.loads(x)]
    assert steps == sorted(set(steps)), "metrics.jsonl repeats steps after a resume"


def test_a_full_disk_during_a_checkpoint_is_one_line_and_leaves_no_partial_checkpoint(
    tmp_path: Path, data: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = torch.save

    def full_disk(obj, path, *a, **kw):
        if "step-0000004" in str(path):
            raise OSError(28, "No space left on device", str(path))
        return real(obj, path, *a, **kw)

    monkeypatch.setattr(torch, "save", full_disk)
    out = tmp_path / "run"
    one_line(cli(*tiny(data, out)), "could not write the checkpoint", "step-0000004",
             "No space left on device",
             "the previous checkpoint is intact")
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-0000002"]
    assert ResumeCheckpoints(out, lambda *a: None, 1).latest().name == "step-0000002"


# ---- 4. no silently wrong answer --------------------------------------------------------------------
def test_a_bundle_whose_labels_do_not_fit_its_head_is_refused(tmp_path: Path,
                                                              bundles: dict[str, Path]) -> None:
    b = Path(shutil.copytree(bundles["classification"], tmp_path / "b"))
    meta = json.loads((b / "mlmkit.json").read_text())
    meta["labels"] = ["neg", "pos", "other", "more"]
    (b / "mlmkit.json").write_text(json.dumps(meta))
    with pytest.raises(BundleError, match=r"lists 4 labels but the model's 'logits' has 2"):
        Pipeline.load(b)
    one_line(cli("classify", b, "a cat"), "lists 4 labels")


def test_a_run_whose_labels_disagree_with_its_config_does_not_export(tmp_path: Path,
                                                                     runs: dict[str, Path]) -> None:
    r = Path(shutil.copytree(runs["classification"], tmp_path / "r"))
    meta = json.loads((r / "mlmkit.json").read_text())
    meta["labels"] = ["pos", "neg"]  # the head's order is neg, pos
    (r / "mlmkit.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError,
                       match=r"its labels \['pos', 'neg'\] are not config.json's id2label \['neg', 'pos'\]"):
        run_export(r, tmp_path / "b")
    one_line(cli("evaluate", r, "--data", tmp_path / "x.csv"), "are not config.json's id2label")


def test_divergence_stops_with_an_error_and_saves_no_model(tmp_path: Path, data: dict[str, Path]) -> None:
    one_line(cli(*tiny(data, tmp_path / "a", "--lr", "inf")), "--lr must be a positive number")
    out = tmp_path / "b"
    one_line(cli(*tiny(data, out, "--lr", "1e30", "--max-grad-norm", "0")), "training diverged")
    assert not (out / "model.safetensors").exists()


def test_piped_json_lines_with_a_bad_line_are_an_error(bundles: dict[str, Path]) -> None:
    one_line(cli("classify", bundles["classification"],
                 input='{"text": "a"}\n{"text": oops}\n{"text": "b"}\n'),
             "<stdin>, line 2: malformed JSON")


def test_empty_texts_and_unknown_columns_are_refused(bundles: dict[str, Path]) -> None:
    one_line(cli("classify", bundles["classification"], "fine", ""), "input 2: empty text")
    one_line(cli("classify", bundles["classification"], "--pair-column", "second", input='{"text": "a"}\n'),
             "field 'second': no field 'second'")


# ---- 5. one line, not a traceback -------------------------------------------------------------------
@pytest.mark.parametrize("extra, message", [
    (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    (["--batch-size", "-1"], "--batch-size must be at least 1, got -1"),
    (["--lr", "nan"], "--lr must be a positive number"),
    (["--seq-len", "100000"], "--seq-len 100000 exceeds max_position_embeddings 64"),
])
def test_bad_pretraining_options(tmp_path: Path, data: dict[str, Path], extra: list[str],
                                 message: str) -> None:
    one_line(cli(*tiny(data, tmp_path / "run", *extra)), message)


def test_bad_files_given_as_options(tmp_path: Path, data: dict[str, Path], runs: dict[str, Path]) -> None:
    (tmp_path / "list.json").write_text("[1, 2]")
    one_line(cli("pretrain", data["corpus"], "--out", tmp_path / "r", "--config", tmp_path / "list.json"),
             "list.json: a config.json holds a JSON object, not a list")
    m = Path(shutil.copytree(runs["classification"], tmp_path / "m"))
    (m / "config.json").write_bytes(b"\xff\xfe{}")
    one_line(cli("finetune", "classification", "--model", m, "--train", tmp_path / "t.csv", "--out",
                 tmp_path / "o"),
             "config.json: not a valid config.json")
    (tmp_path / "bad.gz").write_text("not gzip")
    bad = tmp_path / "bad.txt.gz"
    shutil.move(tmp_path / "bad.gz", bad)
    one_line(cli("pretrain", bad, "--out", tmp_path / "r2"),
             f"{bad}: the compressed stream is not valid gzip data")
    whole = gzip.compress(data["corpus"].read_bytes())
    cut = tmp_path / "cut.txt.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    # found while the tokenizer reads the corpus (-q: without the progress line before it)
    one_line(cli("-q", "pretrain", cut, "--out", tmp_path / "r3"), f"{cut}, line",
             "ends early: the file is truncated")


def test_damaged_bundles_are_one_line(tmp_path: Path, bundles: dict[str, Path]) -> None:
    for value, why in ((-5, "'max_length' -5 is not a whole number of tokens"),
                       (10**9, "is not a whole number of tokens")):
        b = Path(shutil.copytree(bundles["classification"], tmp_path / f"b{value}"))
        meta = json.loads((b / "mlmkit.json").read_text())
        meta["max_length"] = value
        (b / "mlmkit.json").write_text(json.dumps(meta))
        one_line(cli("classify", b, "a cat"), why)
    b = Path(shutil.copytree(bundles["classification"], tmp_path / "other-task"))
    meta = json.loads((b / "mlmkit.json").read_text())
    meta["task"] = "qa"  # edited to another task
    (b / "mlmkit.json").write_text(json.dumps(meta))
    one_line(cli("predict", b, "a cat"), "is described as a qa bundle, but its outputs")


# ---- 6. options checked before any work -------------------------------------------------------------
@pytest.mark.parametrize("extra, message", [
    (["--max-length", "0"], "--max-length 0 is too short"),
    (["--max-length", "2"], "--max-length 2 is too short"),
    (["--epochs", "0"], "--epochs must be positive"),
    (["--epochs", "-2"], "--epochs must be positive"),
    (["--warmup-ratio", "5"], "--warmup-ratio must be between 0 and 1"),
    (["--weight-decay", "-1"], "--weight-decay must not be negative"),
    (["--warmup-steps", "-10"], "--warmup-steps must not be negative"),
])
def test_bad_finetuning_options(tmp_path: Path, runs: dict[str, Path], extra: list[str],
                                message: str) -> None:
    one_line(cli("finetune", "classification", "--model", runs["fill-mask"], "--train", tmp_path / "t.csv",
                 "--out", tmp_path / "o", *extra), message)
    assert not (tmp_path / "o").exists()


def test_an_empty_corpus_is_refused_before_a_tokenizer_is_trained(tmp_path: Path) -> None:
    (tmp_path / "blank.txt").write_text("\n  \n\n")
    one_line(cli("pretrain", tmp_path / "blank.txt", "--out", tmp_path / "r"), "the corpus", "is empty")
    assert not (tmp_path / "r").exists()


def test_a_huge_seq_len_for_a_preset_is_refused(tmp_path: Path, data: dict[str, Path]) -> None:
    one_line(cli("pretrain", data["corpus"], "--out", tmp_path / "r", "--tokenizer", data["tok"], "--seq-len",
                 "100000"),
             "--seq-len 100000 is more than the 8192 positions a preset model gets")


# ---- 7. clear messages ------------------------------------------------------------------------------
def test_clear_messages(tmp_path: Path, data: dict[str, Path], runs: dict[str, Path],
                        bundles: dict[str, Path]) -> None:
    (tmp_path / "adir").mkdir()
    one_line(cli("pretrain", tmp_path / "adir", "--out", tmp_path / "r"),
             "adir: a directory without corpus files")
    labelled = tmp_path / "d.jsonl"
    labelled.write_text('{"tokens": ["john"], "tags": ["B-PER"]}\n')
    (tmp_path / "preds").mkdir()
    msg = one_line(cli("evaluate", bundles["tagging"], "--data", labelled, "--predictions",
                       tmp_path / "preds"),
                   "preds is a directory")
    assert ".tmp" not in msg
    one_line(cli("classify", bundles["classification"], input='{"text": 5}\n'),
             "field 'text': must be a string, not int")
    no_tok = Path(shutil.copytree(runs["fill-mask"], tmp_path / "no-tok"))
    for f in ("tokenizer.json", "vocab.txt"):
        (no_tok / f).unlink()
    msg = one_line(cli("finetune", "classification", "--model", no_tok, "--train", data["corpus"], "--out",
                       tmp_path / "o"))
    assert "--tokenizer" not in msg


def test_a_refused_pickle_does_not_suggest_unpickling_it(tmp_path: Path) -> None:
    from mlmkit.rundir.checkpoint import load_state_dict

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"w": Evil()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ConfigError) as e:
        load_state_dict(tmp_path)
    assert "weights_only=False" not in str(e.value) and "pickled code or objects" in str(e.value)


def test_a_csv_field_longer_than_the_csv_modules_limit_is_read(tmp_path: Path) -> None:
    from mlmkit.registry import get_task

    task = get_task("classification")
    f = tmp_path / "long.csv"
    f.write_text("text,label\n" + "a " * 100_000 + ",pos\nshort,neg\n")
    ex = task.read(f, task.resolve_options())
    assert [e["label"] for e in ex] == ["pos", "neg"] and [e["line"] for e in ex] == [2, 3]


def test_os_errors_name_the_file_not_a_temporary(tmp_path: Path) -> None:
    from mlmkit.files import atomic_write_text

    with pytest.raises(MlmkitError, match="is a directory"):
        atomic_write_text(tmp_path, "x")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as a user who can write anywhere")
        with pytest.raises(OSError) as e:
            atomic_write_text(ro / "out.txt", "x")
        assert e.value.filename == str(ro / "out.txt")
    finally:
        ro.chmod(0o700)


@pytest.mark.parametrize("files", [
    {"tokenizer.json": '{"version": "1.0", "model": {"type": "WordPiece", "vocab": '},  # cut short
    {"tokenizer.json": '{"version": "1.0", "model": {"type": "Nope"}}'},
    {"vocab.json": '{"a": 1}', "merges.txt": "#version\nab c d e\n"},
    {"spm.model": "\x00\x01 not a sentencepiece model \xff" * 10},
])
def test_a_damaged_tokenizer_file_is_one_line(tmp_path: Path, files: dict[str, str]) -> None:
    from mlmkit.errors import ConfigError
    from mlmkit.text.tokenizer import load_tokenizer

    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="latin-1")
    with pytest.raises(ConfigError) as e:
        load_tokenizer(tmp_path)
    assert str(tmp_path) in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("seed", [str(2**64), str(10**30), str(-2**63 - 1)])
def test_a_seed_past_64_bits_is_one_line_before_any_work(tmp_path: Path, seed: str) -> None:
    (tmp_path / "c.txt").write_text("a b c\n")
    for command in (["finetune", "classification", "--model", str(tmp_path / "m"), "--train",
                     str(tmp_path / "t.csv")],
                    ["pretrain", str(tmp_path / "c.txt")]):
        r = cli(*command, "--out", tmp_path / "out", "--steps", "1", "--seed", seed)
        one_line(r, f"--seed {seed} is past 64 bits")
        assert not (tmp_path / "out").exists()


def test_a_path_that_is_not_utf8_is_one_line_before_any_work(tmp_path: Path, data: dict[str, Path]) -> None:
    """A name holding bytes 0xfe / 0xff (arriving as lone surrogates) is refused before training: the run
    would record it in mlmkit.json, which JSON cannot hold, and curves.png's title would fail."""
    odd = os.fsdecode(os.fsencode(str(tmp_path)) + b"/run-\xfe\xff")
    one_line(cli(*tiny(data, Path(odd))), "--out", "the name holds bytes that are not UTF-8")
    shutil.copy(data["corpus"], os.fsdecode(os.fsencode(str(tmp_path)) + b"/c\xfe.txt"))
    one_line(cli("pretrain", os.fsdecode(os.fsencode(str(tmp_path)) + b"/c\xfe.txt"),
             "--out", tmp_path / "run", "--steps", "1"), "CORPUS", "not UTF-8")
    assert sorted(p.name for p in tmp_path.iterdir()) == [os.fsdecode(b"c\xfe.txt")]


def test_a_tokenizer_of_special_tokens_alone_is_one_line(tmp_path: Path, data: dict[str, Path]) -> None:
    """Its vocabulary is [PAD] [UNK] [CLS] [SEP] [MASK]: export died in its parity sample ("a cannot be
    empty"), and fine-tuning trained on all-[UNK] inputs without a word."""
    from tokenizers import Tokenizer, models

    from mlmkit.text.tokenizer import load_tokenizer

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(specials)}, unk_token="[UNK]"))
    tok.add_special_tokens(specials)
    tok.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ConfigError, match="the vocabulary holds only special tokens"):
        load_tokenizer(tmp_path / "tokenizer.json")
    one_line(cli("pretrain", data["corpus"], "--out", tmp_path / "run", "--tokenizer",
                 tmp_path / "tokenizer.json",
                 "--config", data["config"], "--steps", "1"), "only special tokens")
    assert load_tokenizer(data["tok"]).get_vocab_size() > 5  # a real one still loads


def test_max_record_bytes_reaches_tokenize_pretrain_and_finetune_readers(tmp_path: Path,
                                                                         data: dict[str, Path]) -> None:
    """--max-record-bytes (the inference commands had it alone): a corpus line or a training record
    over it is one line naming it, for `mlmkit tokenize`, `pretrain` and `finetune` (the task's own
    reader, through taskkit's); the default, 64 MB, reads them."""
    from conftest import make_base_model

    model = make_base_model(tmp_path / "model", data["corpus"].read_text().split("\n")[:50])
    (tmp_path / "train.jsonl").write_text(json.dumps({"text": "w1 w2 " * 20, "label": "a"}) + "\n"
                                          + json.dumps({"text": "w3", "label": "b"}) + "\n")
    runs = {
        "tokenize": ["tokenize", data["corpus"], "--tokenizer", data["tok"], "--out", tmp_path / "shard"],
        "pretrain": [*tiny(data, tmp_path / "run")],
        "finetune": ["finetune", "classification", "--model", model, "--train", tmp_path / "train.jsonl",
                     "--out",
                     tmp_path / "ft", "--steps", "1"],
    }
    for name, argv in runs.items():
        where = "train.jsonl, line 1" if name == "finetune" else "corpus.txt, line 1"
        one_line(cli(*argv, "--max-record-bytes", "20"), where, "more than 20 bytes")
    assert cli(*runs["tokenize"]).exit_code == 0  # the default ceiling
