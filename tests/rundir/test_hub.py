"""Bring your own model: checkpoints written by transformers (and sentence-transformers' layout) export
through the fusion and parity gates, and their bundles give transformers' outputs; they evaluate and
serve like mlmkit runs, and fine-tuning keeps a head whose labels fit."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
from conftest import run_finetune
from typer.testing import CliRunner

from mlmkit.cli import app
from mlmkit.rundir.meta import RunMeta
from mlmkit.runtime.pipeline import Pipeline
from mlmkit.text.batching import pad_features
from mlmkit.text.tokenizer import load_tokenizer

transformers = pytest.importorskip("transformers")  # a dev extra: the oracle
runner = CliRunner()
WORDS = ("the a film movie plot story was is good great fine bad dull poor very not and john paris went "
         "to").split()
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def hf_config(**kw: Any) -> Any:
    return transformers.BertConfig(vocab_size=len(SPECIAL) + len(WORDS), hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                                   **kw)


def save_hf(d: Path, cls: type, *, weights: str = "safetensors", tokenizer: str = "json", shard: bool = False,
            **config: Any) -> Any:
    """A randomly initialised transformers model saved as transformers saves it; weights drawn wider
    than BERT's init so that every parameter shows in the outputs."""
    torch.manual_seed(0)
    model = cls(hf_config(**config)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.1 if "LayerNorm" in name else 0.3))
    model.save_pretrained(d, max_shard_size="40KB" if shard else "5GB")
    if weights == "bin":  # an older checkpoint: pytorch_model.bin only
        torch.save(model.state_dict(), d / "pytorch_model.bin")
        (d / "model.safetensors").unlink()
    (d / "vocab.txt").write_text("".join(t + "\n" for t in SPECIAL + WORDS), encoding="utf-8")
    if tokenizer == "json":  # tokenizer.json, tokenizer_config.json ... as transformers writes them
        transformers.BertTokenizerFast.from_pretrained(d).save_pretrained(d)
    return model


def batch(d: Path) -> dict[str, np.ndarray]:
    """Sentences and pairs of mixed lengths, tokenized by the checkpoint's own tokenizer, padded."""
    tok = load_tokenizer(d)
    rng = random.Random(0)
    feats = []
    for n in (3, 11, 7, 18, 1, 9):
        a = " ".join(rng.choice(WORDS) for _ in range(n))
        enc = tok.encode(a, " ".join(rng.choice(WORDS) for _ in range(4))) if n % 2 else tok.encode(a)
        feats.append({"input_ids": enc.ids, "token_type_ids": enc.type_ids})
    return pad_features(feats, 0)


def onnx_outputs(bundle: Path, b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    s = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(names, {i.name: b[i.name] for i in s.get_inputs()})))


def hf_out(model: Any, b: dict[str, np.ndarray], **kw: Any) -> Any:
    with torch.no_grad():
        return model(**{k: torch.from_numpy(v) for k, v in b.items()}, **kw)


def export_json(src: Path, out: Path, *extra: str) -> dict[str, Any]:
    r = runner.invoke(app, ["export", str(src), "--out", str(out), "--json", *extra])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def assert_fused(summary: dict[str, Any], layers: int = 2) -> None:
    f = summary["fused_operators"]
    assert (f.get("Attention", 0) >= layers - 1 and f["SkipLayerNormalization"] >= 2 * layers - 1
            and f["EmbedLayerNormalization"] == 1)


# ---- each architecture --------------------------------------------------------------------------
@pytest.mark.parametrize("kind, weights, tokenizer, shard", [
    ("single", "safetensors", "json", False),
    ("single", "bin", "vocab", False),
    ("multi", "safetensors", "json", True),
    ("regression", "safetensors", "vocab", False),
])
def test_sequence_classification_checkpoints(tmp_path: Path, kind: str, weights: str, tokenizer: str,
                                             shard: bool) -> None:
    src = tmp_path / "hf"
    config = {"single": {"num_labels": 3, "id2label": {0: "neg", 1: "mid", 2: "pos"}},
              "multi": {"num_labels": 3, "id2label": {0: "sport", 1: "film", 2: "food"},
                        "problem_type": "multi_label_classification"},
              "regression": {"num_labels": 1}}[kind]
    hf = save_hf(src, transformers.BertForSequenceClassification, weights=weights, tokenizer=tokenizer,
                 shard=shard, **config)
    if shard:
        assert (src / "model.safetensors.index.json").exists() and not (src / "model.safetensors").exists()
    summary = export_json(src, tmp_path / "b")
    assert summary["task"] == "classification" and summary["parity"]["max_abs_diff"]["logits"] <= 1e-4
    assert_fused(summary, layers=1)  # the last layer runs for [CLS] only
    b = batch(src)
    got, want = onnx_outputs(tmp_path / "b", b)["logits"], hf_out(hf, b).logits.numpy()
    assert np.abs(got - want).max() <= 1e-4 and np.abs(want).max() > 1e-2
    meta = json.loads((tmp_path / "b" / "mlmkit.json").read_text())
    want_type = {"single": "single_label_classification", "multi": "multi_label_classification",
                 "regression": "regression"}[kind]
    assert meta["options"]["problem_type"] == want_type
    assert meta["source"]["name"] == "hf" and len(meta["source"]["weights_sha256"]) == 64
    assert meta["source"]["format"] == "transformers"
    # served: the labels are the checkpoint's, the decision the problem type's
    (r,) = Pipeline.load(tmp_path / "b")(["the film was good"])
    if kind == "single":
        # row 0 is not the same text; use the pipeline's own
        probs = torch.softmax(torch.from_numpy(got[0]), -1)
        assert r["label"] in ("neg", "mid",
                              "pos") and abs(sum(r["probabilities"].values()) - 1) < 1e-5 and probs.sum() > 0
    elif kind == "multi":
        assert set(r["probabilities"]) == {"sport", "film", "food"}
        assert r["labels"] == [lab for lab, p in r["probabilities"].items() if p >= 0.5]
    else:
        assert set(r) == {"score"} and isinstance(r["score"], float)


def test_classifier_with_transformers_default_labels(tmp_path: Path) -> None:
    """transformers leaves id2label out of config.json when it is its default (two labels, LABEL_0
    and LABEL_1): the checkpoint still exports, with those labels, as transformers reads it."""
    src = tmp_path / "hf"
    hf = save_hf(src, transformers.BertForSequenceClassification)
    written = json.loads((src / "config.json").read_text())
    assert "id2label" not in written and "num_labels" not in written
    assert hf.config.id2label == {0: "LABEL_0", 1: "LABEL_1"}
    summary = export_json(src, tmp_path / "b")
    assert summary["task"] == "classification" and summary["parity"]["max_abs_diff"]["logits"] <= 1e-4
    (r,) = Pipeline.load(tmp_path / "b")(["the film was good"])
    assert set(r["probabilities"]) == {"LABEL_0", "LABEL_1"}
    # num_labels without id2label (older transformers configs): that many LABEL_i
    from mlmkit.models.config import ModelConfig

    cfg = ModelConfig.from_dict({**written, "num_labels": 3})
    assert cfg.id2label == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"} and "num_labels" not in cfg.extra
    assert ModelConfig.from_dict({**written, "architectures": ["BertModel"]}).id2label is None


def test_token_classification_checkpoint(tmp_path: Path) -> None:
    src = tmp_path / "hf"
    hf = save_hf(src, transformers.BertForTokenClassification, num_labels=5, id2label=dict(enumerate(TAGS)))
    summary = export_json(src, tmp_path / "b")
    assert summary["task"] == "tagging"
    assert_fused(summary)
    b = batch(src)
    got = onnx_outputs(tmp_path / "b", b)["probabilities"]
    want = torch.softmax(hf_out(hf, b).logits, -1).numpy()
    real = b["attention_mask"].astype(bool)
    assert np.abs(got[real] - want[real]).max() <= 1e-4
    (r,) = Pipeline.load(tmp_path / "b")(["john went to paris"])
    assert r["tokens"] == ["john", "went", "to", "paris"] and set(r["tags"]) <= set(TAGS)


def test_bioes_tags_are_read_as_bioes(tmp_path: Path) -> None:
    src = tmp_path / "hf"
    save_hf(src, transformers.BertForTokenClassification, num_labels=3,
            id2label={0: "O", 1: "S-PER", 2: "B-PER"})
    export_json(src, tmp_path / "b")
    assert json.loads((tmp_path / "b" / "mlmkit.json").read_text())["options"]["scheme"] == "bioes"


def test_question_answering_checkpoint(tmp_path: Path) -> None:
    src = tmp_path / "hf"
    hf = save_hf(src, transformers.BertForQuestionAnswering, weights="bin")
    summary = export_json(src, tmp_path / "b")
    assert summary["task"] == "qa"
    b = batch(src)
    got, want = onnx_outputs(tmp_path / "b", b), hf_out(hf, b)
    real = b["attention_mask"].astype(bool)
    for name, ref in (("start_logits", want.start_logits), ("end_logits", want.end_logits)):
        assert np.abs(got[name][real] - ref.numpy()[real]).max() <= 1e-4
    (r,) = Pipeline.load(tmp_path / "b")([{"question": "who went", "context": "john went to paris"}])
    assert r["start"] == -1 or "john went to paris"[r["start"]:r["end"]] == r["answer"]


@pytest.mark.parametrize("cls", ["BertForMaskedLM", "BertForPreTraining"])
def test_masked_lm_checkpoints_export_as_fill_mask(tmp_path: Path, cls: str) -> None:
    src = tmp_path / "hf"
    hf = save_hf(src, getattr(transformers, cls))
    summary = export_json(src, tmp_path / "b", "--top-k", "3")
    assert summary["task"] == "fill-mask"
    b = batch(src)
    mask_id = load_tokenizer(src).token_to_id("[MASK]")
    b["input_ids"][1, 2] = b["input_ids"][3, 4] = mask_id
    got = onnx_outputs(tmp_path / "b", b)
    logits = hf_out(hf, b).logits if cls == "BertForMaskedLM" else hf_out(hf, b).prediction_logits
    is_mask = b["input_ids"] == mask_id
    where = np.argwhere(is_mask)
    ref = torch.softmax(logits[where[:, 0], where[:, 1]], -1).topk(3)
    assert np.abs(got["values"][is_mask] - ref.values.numpy()).max() <= 1e-4
    np.testing.assert_array_equal(got["indices"][is_mask][:, 0], ref.indices[:, 0].numpy())
    assert (got["indices"][~is_mask] == -1).all()


def mean_pool(hidden: torch.Tensor, mask: np.ndarray) -> np.ndarray:
    m = torch.from_numpy(mask).unsqueeze(-1).float()
    return ((hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)).numpy()


def test_bare_encoder_exports_as_mean_pooled_embeddings(tmp_path: Path) -> None:
    src = tmp_path / "hf"
    hf = save_hf(src, transformers.BertModel)
    summary = export_json(src, tmp_path / "b")
    assert summary["task"] == "embedding"
    assert_fused(summary)
    b = batch(src)
    got = onnx_outputs(tmp_path / "b", b)["embedding"]  # (batch, hidden): never (batch, length, hidden)
    want = mean_pool(hf_out(hf, b).last_hidden_state, b["attention_mask"])
    assert got.shape == (6, 32) and np.abs(got - want).max() <= 1e-4


def write_sentence_transformers(d: Path, pooling: str, normalize: bool) -> None:
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    (d / "modules.json").write_text(json.dumps(modules))
    (d / "1_Pooling").mkdir()
    (d / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 32, "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": pooling == "max",
        "pooling_mode_mean_sqrt_len_tokens": False}))
    (d / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 40, "do_lower_case": False}))


@pytest.mark.parametrize("pooling, normalize", [("cls", True), ("max", False), ("mean", True)])
def test_sentence_transformers_layout(tmp_path: Path, pooling: str, normalize: bool) -> None:
    src = tmp_path / "st"
    hf = save_hf(src, transformers.BertModel)
    write_sentence_transformers(src, pooling, normalize)
    export_json(src, tmp_path / "b")
    meta = json.loads((tmp_path / "b" / "mlmkit.json").read_text())
    assert meta["options"]["pooling"] == pooling and meta["options"]["normalize"] is normalize
    assert meta["max_length"] == 40 and meta["source"]["format"] == "sentence-transformers"
    b = batch(src)
    hidden = hf_out(hf, b).last_hidden_state
    m = torch.from_numpy(b["attention_mask"]).bool()
    if pooling == "cls":
        want = hidden[:, 0]
    elif pooling == "max":
        want = hidden.masked_fill(~m.unsqueeze(-1), -1e9).max(1).values
    else:
        want = torch.from_numpy(mean_pool(hidden, b["attention_mask"]))
    if normalize:
        want = torch.nn.functional.normalize(want, dim=-1)
    got = onnx_outputs(tmp_path / "b", b)["embedding"]
    assert np.abs(got - want.numpy()).max() <= 1e-4
    if normalize:
        assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_embed_command_writes_npy_jsonl_and_parquet(tmp_path: Path) -> None:
    src = tmp_path / "st"
    save_hf(src, transformers.BertModel)
    write_sentence_transformers(src, "mean", True)
    export_json(src, tmp_path / "b")
    texts = ["the film was good", "john went to paris", "a"]
    r = runner.invoke(app, ["embed", str(tmp_path / "b"), *texts, "--output", str(tmp_path / "e.npy")])
    assert r.exit_code == 0, r.output
    m = np.load(tmp_path / "e.npy")
    assert m.shape == (3, 32) and np.allclose(np.linalg.norm(m, axis=1), 1.0, atol=1e-5)
    rows = [json.loads(x)
            for x in runner.invoke(app, ["embed", str(tmp_path / "b"), *texts]).stdout.splitlines()]
    # JSON lines when piped, same order
    assert np.abs(np.array([x["embedding"] for x in rows]) - m).max() < 1e-6
    pq = pytest.importorskip("pyarrow.parquet")
    r = runner.invoke(app, ["predict", str(tmp_path / "b"), *texts, "--output", str(tmp_path / "e.parquet")])
    assert r.exit_code == 0, r.output
    table = pq.read_table(tmp_path / "e.parquet")
    assert np.abs(np.array(table.column("embedding").to_pylist()) - m).max() < 1e-6
    r = runner.invoke(app, ["classify", str(tmp_path / "b"), "x", "--output", str(tmp_path / "c.npy")])
    assert r.exit_code == 2 and "use `mlmkit embed" in " ".join(r.stderr.split())
    r = runner.invoke(app, ["embed", str(tmp_path / "b"), "x", "--option", "pooling=cls"])
    assert r.exit_code == 2 and "--pooling is built into this model ('mean')" in " ".join(r.stderr.split())


def test_evaluate_a_foreign_classifier_and_an_embedding_on_sts(tmp_path: Path) -> None:
    src = tmp_path / "hf"
    save_hf(src, transformers.BertForSequenceClassification, num_labels=2, id2label={0: "bad", 1: "good"})
    export_json(src, tmp_path / "b")
    data = tmp_path / "d.csv"
    data.write_text("text,label\nthe film was good,good\nthe plot was dull,bad\na great story,good\n")
    r = runner.invoke(app, ["evaluate", str(tmp_path / "b"), "--data", str(data), "--json"])
    assert r.exit_code == 0, r.output
    assert set(json.loads(r.stdout)) >= {"accuracy", "macro_f1", "mcc"}
    enc = tmp_path / "enc"
    save_hf(enc, transformers.BertModel)
    export_json(enc, tmp_path / "e")
    sts = tmp_path / "sts.jsonl"
    sts.write_text("".join(json.dumps({"text": a, "text_pair": b, "score": s}) + "\n" for a, b, s in [
        ("the film was good", "the film was great", 4.8), ("john went to paris", "the plot was dull", 0.2),
        ("a good story", "a fine story", 4.0), ("paris", "film", 1.0)]))
    r = runner.invoke(app, ["evaluate", str(tmp_path / "e"), "--data", str(sts), "--json"])
    assert r.exit_code == 0, r.output
    m = json.loads(r.stdout)
    assert -1.0 <= m["spearman"] <= 1.0 and -1.0 <= m["pearson"] <= 1.0


# ---- telling what a directory is --------------------------------------------------------------------
def test_a_directory_whose_task_cannot_be_told(tmp_path: Path) -> None:
    src = tmp_path / "hf"
    save_hf(src, transformers.BertForMultipleChoice)
    r = runner.invoke(app, ["export", str(src), "--out", str(tmp_path / "b")], env={"COLUMNS": "400"})
    assert r.exit_code == 2
    msg = " ".join(r.stderr.split())
    assert ("cannot tell which task this checkpoint is for (config.json's architectures: "
            "BertForMultipleChoice)") in msg
    assert ("pass --task, one of: classification, colbert, embedding, fill-mask, qa, rerank, "
            "sparse-embedding, tagging") in msg
    # --task says what to read it as: its encoder exports as an embedding model
    assert export_json(src, tmp_path / "b", "--task", "embedding")["task"] == "embedding"


def test_a_checkpoint_of_an_unsupported_family_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "gpt2"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    (src / "model.safetensors").write_bytes(b"")
    r = runner.invoke(app, ["export", str(src), "--out", str(tmp_path / "b")], env={"COLUMNS": "400"})
    said = " ".join(r.stderr.split())
    assert r.exit_code == 2 and "model_type 'gpt2' is not supported" in said and "roberta" in said, said


def test_a_pickle_that_would_run_code_is_never_run(tmp_path: Path) -> None:
    src = tmp_path / "hf"
    save_hf(src, transformers.BertForSequenceClassification, weights="bin", num_labels=2)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (Path.touch, (marker,))

    sd = torch.load(src / "pytorch_model.bin", weights_only=True)
    sd["classifier.bias"] = Evil()
    torch.save(sd, src / "pytorch_model.bin")
    r = runner.invoke(app, ["export", str(src), "--out", str(tmp_path / "b")], env={"COLUMNS": "400"})
    assert (r.exit_code == 2
            and "not a plain tensor checkpoint (it holds pickled code or objects)" in " ".join(
                r.stderr.split()))
    assert not marker.exists()


# ---- fine-tuning from them ------------------------------------------------------------------------
def sentiment(n: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.choice(["bad", "good"])
        word = rng.choice(["good", "great", "fine"] if label == "good" else ["bad", "dull", "poor"])
        rows.append({"text": f"the {rng.choice(['film', 'movie', 'plot'])} was {word}", "label": label})
    return rows


def test_fine_tuning_keeps_a_head_whose_labels_fit(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    src = tmp_path / "hf"
    save_hf(src, transformers.BertForSequenceClassification, num_labels=2, id2label={0: "bad", 1: "good"})
    train = tmp_path / "t.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in sentiment(16, 0)))
    runner.invoke(app, ["--quiet"])  # (the CLI's logger setup is not needed: caplog listens)
    import logging

    logging.getLogger("mlmkit").propagate = True
    caplog.set_level(logging.INFO, logger="mlmkit")
    run_finetune("classification", src, train, tmp_path / "same", steps=1, batch_size=8, lr=1e-9,
                 progress=False)
    assert "head carries over" in caplog.text
    before = torch.load(src / "pytorch_model.bin",
                        weights_only=True) if (src / "pytorch_model.bin").exists() else None
    from safetensors.torch import load_file

    w = load_file(str(tmp_path / "same" / "model.safetensors"))
    theirs = before or load_file(str(src / "model.safetensors"))
    # lr 1e-9: the head kept
    assert torch.allclose(w["classifier.weight"], theirs["classifier.weight"], atol=1e-5)
    caplog.clear()
    three = tmp_path / "three.jsonl"
    three.write_text("".join(json.dumps({**r, "label": f"c{i % 3}"}) + "\n"
                             for i, r in enumerate(sentiment(16, 0))))
    run_finetune("classification", src, three, tmp_path / "other", steps=1, batch_size=8, progress=False)
    assert "head starts fresh" in caplog.text


def fixed_vocab_base(d: Path, words: list[str]) -> Path:
    """A random tiny pretraining run whose tokenizer is a fixed vocab.txt: the same token ids (and so
    the same training) in every process, where a tokenizer trained here could number them otherwise."""
    from conftest import tiny_config

    from mlmkit.models.core import BertForPreTraining
    from mlmkit.rundir.checkpoint import save_run

    d.mkdir()
    (d / "vocab.txt").write_text("".join(t + "\n" for t in SPECIAL + words), encoding="utf-8")
    tok = load_tokenizer(d / "vocab.txt")
    config = tiny_config(tok.get_vocab_size())
    torch.manual_seed(0)
    save_run(BertForPreTraining(config), d, config=config, tokenizer=tok,
             meta=RunMeta(task="pretraining", max_length=64))
    return d


@pytest.mark.slow  # 9 s
def test_multi_label_and_regression_fine_tuning_learn(tmp_path: Path) -> None:
    rng = random.Random(0)
    topics = {"sport": ["ball", "goal"], "film": ["actor", "scene"], "food": ["bread", "soup"]}
    filler = ["the", "a", "and", "was", "very"]

    def rows(n: int) -> list[dict[str, Any]]:
        out = []
        for _ in range(n):
            chosen = [t for t in topics if rng.random() < 0.4]
            words = [w for t in chosen for w in rng.sample(topics[t], 1)] + rng.sample(filler, 3)
            rng.shuffle(words)
            out.append({"text": " ".join(words), "label": chosen, "score": float(len(chosen))})
        return out

    train, test = rows(300), rows(80)
    for name, data in (("train", train), ("test", test)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    base = fixed_vocab_base(tmp_path / "base", sum(topics.values(), []) + filler)
    run_finetune("classification", base, tmp_path / "train.jsonl", tmp_path / "multi", epochs=20,
                 batch_size=16, lr=2e-3,
                 progress=False, options={"problem_type": "multi_label_classification"})
    cfg = json.loads((tmp_path / "multi" / "config.json").read_text())
    assert (cfg["problem_type"] == "multi_label_classification" and sorted(cfg["id2label"].values())
            == sorted(topics))
    r = runner.invoke(app,
                      ["evaluate", str(tmp_path / "multi"), "--data", str(tmp_path / "test.jsonl"), "--json"])
    m = json.loads(r.stdout)
    # the trivial answers: every label for every text (micro-F1), the most common label set (subset accuracy)
    n_gold = sum(len(x["label"]) for x in test)
    all_labels_f1 = 2 * n_gold / (n_gold + 3 * len(test))
    common = max(sum(x["label"] == y["label"] for y in test) for x in test) / len(test)
    assert m["micro_f1"] > all_labels_f1 + 0.15 and m["subset_accuracy"] > common + 0.15, (m, all_labels_f1,
                                                                                           common)
    hf = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "multi")
    assert hf.config.problem_type == "multi_label_classification"

    run_finetune("classification", base, tmp_path / "train.jsonl", tmp_path / "reg", epochs=12, batch_size=16,
                 lr=1e-3,
                 progress=False, options={"problem_type": "regression", "label_column": "score"})
    r = runner.invoke(app,
                      ["evaluate", str(tmp_path / "reg"), "--data", str(tmp_path / "test.jsonl"), "--json",
                       "--option", "label_column=score"])
    m = json.loads(r.stdout)
    variance = float(np.var([x["score"] for x in test]))  # what always predicting the mean would cost
    assert m["pearson"] > 0.8 and m["mse"] < 0.5 * variance, (m, variance)
    export_json(tmp_path / "reg", tmp_path / "reg-b")
    (p,) = Pipeline.load(tmp_path / "reg-b")(["ball goal actor scene bread soup"])
    assert p["score"] > 2.0  # all three topics
