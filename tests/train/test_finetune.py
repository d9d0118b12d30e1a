"""The task-independent core of fine-tuning: importing Hugging Face BERT directories, task options,
the length-bucketed training data and resuming an interrupted fine-tuning run."""

from __future__ import annotations

import json
import logging
import math
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import run_finetune
from safetensors.torch import load_file
from torch import nn
from typer.testing import CliRunner

from mlmkit.cli import app
from mlmkit.errors import ConfigError
from mlmkit.models.config import ModelConfig
from mlmkit.models.core import BertForPreTraining, BertModel
from mlmkit.registry import Plugin, TaskOption
from mlmkit.rundir.checkpoint import load_state_dict, load_weights
from mlmkit.rundir.config import load_config
from mlmkit.text.tokenizer import load_tokenizer
from mlmkit.train.data import FeatureData

transformers = pytest.importorskip("transformers")  # a dev extra: the parity oracle

WORDS = "the a film movie plot story was is good great fine bad dull poor very not and".split()
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def squash(text: str) -> str:
    return " ".join(text.split())


def hf_config() -> Any:
    return transformers.BertConfig(
        vocab_size=len(SPECIAL) + len(WORDS), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=128, max_position_embeddings=64,
    )


def write_hf_dir(d: Path, kind: str = "pretraining", weights: str = "safetensors") -> Any:
    """A BERT directory as transformers writes it, plus a vocab.txt; returns the transformers model.

    Weights are drawn wider than BERT's init (LayerNorm included) so a mismatched or missing
    parameter shows in the outputs instead of hiding under near-identity layers."""
    torch.manual_seed(0)
    cls = transformers.BertForPreTraining if kind == "pretraining" else transformers.BertModel
    model = cls(hf_config()).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.1 if "LayerNorm" in name else 0.2))
    if weights == "safetensors":
        model.save_pretrained(d)
        assert (d / "model.safetensors").exists()
    else:  # an older checkpoint: pytorch_model.bin only
        model.save_pretrained(d)
        torch.save(model.state_dict(), d / "pytorch_model.bin")
        (d / "model.safetensors").unlink()
    (d / "vocab.txt").write_text("".join(t + "\n" for t in SPECIAL + WORDS), encoding="utf-8")
    return model


def batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(len(SPECIAL), len(SPECIAL) + len(WORDS), (3, 12), generator=g)
    ids[:, 0] = SPECIAL.index("[CLS]")
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0  # padding in two of the rows
    mask[2, 5:] = 0
    ids[mask == 0] = 0
    types = torch.zeros_like(ids)
    types[:, 6:] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


class Encoder(nn.Module):
    """A bare mlmkit BertModel under the "bert." prefix load_state_dict normalises keys to."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.bert = BertModel(config)


# ---- importing Hugging Face BERT directories ---------------------------------------------------
@pytest.mark.parametrize("weights", ["safetensors", "bin"])
def test_hf_pretraining_dir_gives_transformers_outputs(tmp_path: Path, weights: str) -> None:
    hf = write_hf_dir(tmp_path, "pretraining", weights)
    cfg = load_config(tmp_path)
    ours = BertForPreTraining(cfg).eval()
    missing, unexpected = load_weights(ours, load_state_dict(tmp_path))
    assert (missing, unexpected) == ([], [])
    b = batch()
    with torch.no_grad():
        seq, pooled = ours.bert(**b)
        ref = hf(**b, output_hidden_states=True)
        out = ours(**b)
    keep = b["attention_mask"].bool()  # padded positions are not outputs anyone reads
    torch.testing.assert_close(seq[keep], ref.hidden_states[-1][keep], atol=1e-5, rtol=0)
    torch.testing.assert_close(pooled, hf.bert(**b).pooler_output, atol=1e-5, rtol=0)
    torch.testing.assert_close(out["prediction_logits"][keep], ref.prediction_logits[keep], atol=1e-5, rtol=0)
    torch.testing.assert_close(out["nsp_logits"], ref.seq_relationship_logits, atol=1e-5, rtol=0)
    # the outputs are not trivially equal: the rows differ from each other
    assert (seq[0, 1] - seq[1, 1]).abs().max() > 1e-2


def test_hf_bare_bert_model_dir_without_prefix(tmp_path: Path) -> None:
    hf = write_hf_dir(tmp_path, "bare")
    assert not any(k.startswith("bert.") for k in load_file(str(tmp_path / "model.safetensors")))
    ours = Encoder(load_config(tmp_path)).eval()
    missing, unexpected = load_weights(ours, load_state_dict(tmp_path))
    assert (missing, unexpected) == ([], [])
    b = batch()
    with torch.no_grad():
        seq, pooled = ours.bert(**b)
        ref = hf(**b)
    keep = b["attention_mask"].bool()
    torch.testing.assert_close(seq[keep], ref.last_hidden_state[keep], atol=1e-5, rtol=0)
    torch.testing.assert_close(pooled, ref.pooler_output, atol=1e-5, rtol=0)


def test_hf_vocab_txt_tokenizes_as_transformers(tmp_path: Path) -> None:
    write_hf_dir(tmp_path, "bare")
    ours = load_tokenizer(tmp_path)
    ref = transformers.BertTokenizer.from_pretrained(tmp_path)  # reads vocab.txt, lowercases by default
    for a, b in [("The film was GOOD", None), ("a dull plot", "not a great story"),
                 ("unknownword film", "x")]:
        enc = ours.encode(a, b) if b is not None else ours.encode(a)
        exp = ref(a, b) if b is not None else ref(a)
        assert enc.ids == exp["input_ids"]
        assert enc.type_ids == exp["token_type_ids"]


def sentiment_rows(n: int, rng: random.Random) -> list[dict[str, str]]:
    pos, neg = ["good", "great", "fine"], ["bad", "dull", "poor"]
    rows = []
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        words = rng.sample(["the", "film", "movie", "plot", "story", "was", "very"],
                           3) + [rng.choice(pos if label == "pos" else neg)]
        rng.shuffle(words)
        rows.append({"text": " ".join(words), "label": label})
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("kind,weights", [("pretraining", "safetensors"), ("bare", "bin")])
def test_finetune_accepts_hf_dir_and_says_the_head_is_fresh(tmp_path: Path, kind: str, weights: str) -> None:
    hf_dir = tmp_path / "hf"
    hf = write_hf_dir(hf_dir, kind, weights)
    train = write_jsonl(tmp_path / "train.jsonl", sentiment_rows(16, random.Random(0)))
    run = tmp_path / "run"
    res = CliRunner().invoke(app, [
        "finetune", "classification", "--model", str(hf_dir), "--train", str(train), "--out", str(run),
        "--max-steps", "2", "--batch-size", "8", "--lr", "1e-5", "--max-length", "32",
    ])
    assert res.exit_code == 0, res.output
    log = squash(res.stderr)
    assert "the classification head starts fresh: classifier.weight, classifier.bias" in log, log
    if kind == "pretraining":
        assert "dropping" in log and "cls." in log  # the MLM/NSP heads are not carried over
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["architectures"] == ["BertForSequenceClassification"]
    assert sorted(cfg["id2label"].values()) == ["neg", "pos"]
    assert (run / "tokenizer.json").exists() and (run / "vocab.txt").exists()
    # the encoder came from the HF directory: two small steps leave it close to the imported weights
    sd = load_file(str(run / "model.safetensors"))
    base = hf.bert if kind == "pretraining" else hf
    for name in ("embeddings.word_embeddings.weight", "encoder.layer.1.attention.self.query.weight"):
        imported = base.state_dict()[name]
        assert (sd["bert." + name] - imported).abs().max() < 1e-3, name


# ---- task options ------------------------------------------------------------------------------
class OptionTask:
    """The required members of a task, and two declared options."""

    name, description, metrics, outputs = "fake", "a fake task", ("score",), {"score": ("batch",)}
    options = (TaskOption("text_column", "text", "The text field.", flags=("--text-column",)),
               TaskOption("doc_stride", 128, "Window overlap.", minimum=0, flags=("--doc-stride",)))

    def read(self, path, options): return []
    def featurize(self, examples, tokenizer, ctx, *, training): return []
    def build_model(self, config): raise NotImplementedError
    def postprocess(self, outputs, features, examples, ctx): return []
    def compute_metrics(self, predictions, examples, ctx): return {"score": 0.0}


def test_task_options_defaults_saved_given_and_unknown() -> None:
    task = Plugin(OptionTask(), "tests:OptionTask", "tests")
    assert task.resolve_options() == {"text_column": "text", "doc_stride": 128}
    # strings from the command line take the declared type; None means "not given"
    assert task.resolve_options({"doc_stride": "64", "text_column": None}) == {"text_column": "text",
                                                                               "doc_stride": 64}
    # a run's or bundle's saved options come between the defaults and what is given
    assert task.resolve_options({"text_column": "q"},
                                saved={"doc_stride": 32, "gone": 1}) == {"text_column": "q", "doc_stride": 32}
    assert OptionTask.options[1].default == 128  # the declaration is not mutated
    with pytest.raises(ConfigError, match=r"--label-all-tokens is not an option of task 'fake'") as e:
        task.resolve_options({"label_all_tokens": True})
    assert e.value.hint == "its options: --text-column, --doc-stride"  # as their declarations spell them
    plain = Plugin(type("Plain", (OptionTask,),
                        {"options": (TaskOption("doc_stride", 128, "Window overlap."),)})(),
                   "tests:Plain", "tests")
    with pytest.raises(ConfigError) as e:  # no flags declared: the one spelling every option has
        plain.resolve_options({"text_column": "q"})
    assert e.value.hint == "its options: --option doc_stride=VALUE"
    with pytest.raises(ConfigError,
                       match=r"task option --doc-stride expects a value of type int, got 'many'"):
        task.resolve_options({"doc_stride": "many"})
    with pytest.raises(ConfigError, match=r"task option --doc-stride must be at least 0, got -1"):
        task.resolve_options({"doc_stride": -1})
    with pytest.raises(ConfigError, match=r"expects a value of type int, got True"):
        task.resolve_options({"doc_stride": True})


def test_cli_rejects_an_option_the_task_lacks(tmp_path: Path, base_model_factory: Any) -> None:
    base = base_model_factory(["a b c"] * 4)
    train = write_jsonl(tmp_path / "t.jsonl", sentiment_rows(4, random.Random(0)))
    for extra in (["--doc-stride", "64"], ["--option", "doc_stride=64"]):
        res = CliRunner().invoke(app, [
            "finetune", "classification", "--model", str(base), "--train", str(train), "--out",
            str(tmp_path / "o"), *extra,
        ])
        assert res.exit_code == 2, res.output
        msg = squash(res.stderr)
        assert "--doc-stride is not an option of task 'classification'" in msg and "--text-column" in msg
    res = CliRunner().invoke(app, ["finetune", "classification", "--model", str(base), "--train", str(train),
                                   "--out", str(tmp_path / "o"), "--option", "text_column"])
    assert res.exit_code == 2 and "--option 'text_column' is not NAME=VALUE" in squash(res.stderr)


# ---- length-bucketed training data -------------------------------------------------------------
def bucket_data(n: int = 1000, batch_size: int = 8, seed: int = 0) -> tuple[FeatureData, list[int]]:
    rng = random.Random(123)
    lengths = [rng.randint(3, 120) for _ in range(n)]
    feats = [{"input_ids": [i + 10] + [7] * (n_ - 1), "token_type_ids": [0] * n_, "labels": i}
             for i, n_ in enumerate(lengths)]
    return FeatureData(feats, SimpleNamespace(label_names=("labels",), group_features=False), batch_size,
                       pad_id=0, seed=seed), lengths


def test_feature_data_batches_are_bucketed_complete_and_reshuffled() -> None:
    data, lengths = bucket_data()
    epochs = []
    for epoch in range(3):
        assert data.num_batches(epoch) == math.ceil(len(lengths) / 8)
        seen, real, padded = [], 0, 0
        batches = []
        for i in range(data.num_batches(epoch)):
            b = data.batch(epoch, i, seed=0)
            ids = b["labels"].tolist()
            batches.append(ids)
            seen += ids
            lens = [lengths[j] for j in ids]
            assert b["input_ids"].shape == (len(ids), max(lens))  # padded to the batch's longest only
            assert b["attention_mask"].sum(1).tolist() == lens
            assert (b["input_ids"][:, 0] - 10).tolist() == ids  # rows are the features they claim
            real += sum(lens)
            padded += b["input_ids"].numel()
        assert sorted(seen) == list(range(len(lengths))), "every feature exactly once per epoch"
        assert padded < 1.1 * real, f"bucketing leaves {padded / real - 1:.0%} padding"
        epochs.append(batches)
    # a new order each epoch: both the order of batches and their members change
    assert epochs[0] != epochs[1] != epochs[2]
    assert {frozenset(b) for b in epochs[0]} != {frozenset(b) for b in epochs[1]}
    # random batching would pad far more: the check above is not vacuous
    rng = random.Random(0)
    order = rng.sample(range(len(lengths)), len(lengths))
    chunks = [order[i : i + 8] for i in range(0, len(order), 8)]
    assert sum(len(c) * max(lengths[j] for j in c) for c in chunks) > 1.4 * sum(lengths)


def test_feature_data_order_is_a_function_of_seed_and_epoch() -> None:
    a, _ = bucket_data(seed=3)
    b, _ = bucket_data(seed=3)
    c, _ = bucket_data(seed=4)
    assert a.plan(2) == b.plan(2)  # what resuming relies on: batch (epoch, i) is the same after a restart
    assert a.plan(2) != c.plan(2)
    assert a.plan(0) == b.plan(0) and a.plan(2) == b.plan(2)  # revisiting an epoch gives the same plan


# ---- resuming ----------------------------------------------------------------------------------
class Killed(BaseException):
    """Stands in for a process killed mid-run."""


@pytest.fixture
def classification_setup(tmp_path: Path, base_model_factory: Any) -> dict[str, Any]:
    rows = sentiment_rows(32, random.Random(0))
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    base = base_model_factory([r["text"] for r in rows], vocab_size=120)
    # 32 examples / batch 8 = 4 batches an epoch: a checkpoint at step 4, the run ends at step 8
    kw = dict(batch_size=8, lr=1e-3, steps=8, max_length=32, seed=0, progress=False)
    return {"base": base, "train": train, "kw": kw}


@pytest.fixture
def mlmkit_log():
    """Records of the "mlmkit" logger (the CLI may have turned its propagation off)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("mlmkit")
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(old)


def test_a_run_records_where_its_time_went(classification_setup: dict[str, Any], tmp_path: Path,
                                           mlmkit_log: list) -> None:
    """Seconds by phase (train/timing.py) in the log and in mlmkit.json: every phase of a fine-tuning run
    is there (reading 32 rows can round to nothing), and together no more than the whole."""
    from mlmkit.rundir.meta import read_meta

    s = classification_setup
    run_finetune("classification", s["base"], s["train"], tmp_path / "run", **s["kw"])
    t = read_meta(tmp_path / "run").timings
    assert t is not None and {"read", "load", "tokenize", "batches", "forward", "backward", "optimizer",
                              "saving", "total"} <= set(t), t
    assert all(t[k] > 0 for k in ("forward", "backward", "optimizer", "saving", "total"))
    assert sum(v for k, v in t.items() if k != "total") <= t["total"]
    line = next(r.getMessage() for r in mlmkit_log if r.getMessage().startswith("where the time went"))
    assert "forward" in line and "backward" in line and "of " in line


def test_resume_after_a_kill_matches_an_uninterrupted_run(
    classification_setup: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mlmkit_log: list
) -> None:
    s = classification_setup
    full = tmp_path / "full"
    run_finetune("classification", s["base"], s["train"], full, **s["kw"])

    cut = tmp_path / "cut"
    real_batch = FeatureData.batch
    calls = []

    def dying_batch(self: FeatureData, epoch: int, index: int, seed: int) -> dict[str, torch.Tensor]:
        calls.append((epoch, index))
        if len(calls) == 6:  # during step 6, after the checkpoint at step 4
            raise Killed
        return real_batch(self, epoch, index, seed)

    with monkeypatch.context() as m:
        m.setattr(FeatureData, "batch", dying_batch)
        with pytest.raises(Killed):
            run_finetune("classification", s["base"], s["train"], cut, **s["kw"])
    assert [p.name for p in (cut / "checkpoints").iterdir()] == ["step-0000004"]

    result = run_finetune("classification", s["base"], s["train"], cut, resume=True, **s["kw"])
    assert result["step"] == 8
    assert any("resumed from" in r.getMessage() and "step 4" in r.getMessage() for r in mlmkit_log)
    want, got = load_file(str(full / "model.safetensors")), load_file(str(cut / "model.safetensors"))
    assert want.keys() == got.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=1e-6, rtol=0, msg=lambda m, k=k: f"{k}: {m}")
    # and the resumed weights are not simply the base model's
    base = load_state_dict(s["base"])
    assert (got["bert.encoder.layer.0.output.dense.weight"]
            - base["bert.encoder.layer.0.output.dense.weight"]).abs().max() > 1e-4


def test_resume_without_a_checkpoint_is_a_clear_error(classification_setup: dict[str, Any],
                                                      tmp_path: Path) -> None:
    s = classification_setup
    with pytest.raises(ConfigError, match=r"--resume: no complete checkpoint under"):
        run_finetune("classification", s["base"], s["train"], tmp_path / "empty", resume=True, **s["kw"])


def test_finetuning_a_finetuned_run_with_other_labels_starts_a_fresh_head(
    classification_setup: dict[str, Any], tmp_path: Path
) -> None:
    """--model may be a fine-tuned run: only the encoder carries over, whatever its label count."""
    s = classification_setup
    first = tmp_path / "first"
    run_finetune("classification", s["base"], s["train"], first, **s["kw"])
    rows = [json.loads(line) for line in s["train"].read_text().splitlines()]
    three = write_jsonl(tmp_path / "three.jsonl", [{**r, "label": f"c{i % 3}"} for i, r in enumerate(rows)])
    run_finetune("classification", first, three, tmp_path / "second", **s["kw"])
    assert json.loads((tmp_path / "second" / "config.json").read_text())["id2label"] == {"0": "c0", "1": "c1",
                                                                                         "2": "c2"}


def test_early_stopping_needs_an_eval_file(classification_setup: dict[str, Any], tmp_path: Path) -> None:
    s = classification_setup
    with pytest.raises(ConfigError, match="--early-stopping needs --eval"):
        run_finetune("classification", s["base"], s["train"], tmp_path / "x", early_stopping=2, **s["kw"])
