"""The rest of the pipeline for families other than BERT: int8 and fp16 bundles, the CLI's inference
commands ([MASK] as RoBERTa's <mask>), batch jobs, evaluation of a foreign bundle, an XLM-R
sentence-transformers directory, and fine-tuning tagging and QA on byte-level BPE."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from family_checkpoints import encode_batch, export, hf_out, runner, save_checkpoint, sentences

from mlmkit.cli import app
from mlmkit.runtime.pipeline import Pipeline

transformers = pytest.importorskip("transformers")


@pytest.mark.skipif(__import__("importlib").util.find_spec("openvino") is None,
                    reason="OpenVINO is not installed")
@pytest.mark.parametrize("family", ["roberta", "modernbert", "distilbert", "deberta-v2"])
def test_every_family_s_fused_graph_runs_in_bf16_through_openvino(tmp_path: Path, family: str,
                                                                  monkeypatch) -> None:
    """OpenVINO reads each family's fused fp32 graph (its com.microsoft operators, rotary and
    disentangled attention too): auto on bf16 units (forced where the CPU has none) picks it, and its
    labels are fp32's."""
    monkeypatch.setenv("MLMKIT_CPU_FLAGS", "+amx_bf16")
    save_checkpoint(tmp_path / "src", family, "ForSequenceClassification", id2label={0: "neg", 1: "pos"})
    meta = export(tmp_path / "src", tmp_path / "b")
    assert meta["gate"]["bf16"]["passed"], meta["gate"]["bf16"]
    fast, ref = Pipeline.load(tmp_path / "b", precision="auto"), Pipeline.load(tmp_path / "b",
                                                                               precision="fp32")
    assert (fast.precision, ref.precision) == ("bf16", "fp32")
    texts = sentences(16)
    assert [r["label"] for r in fast(texts)] == [r["label"] for r in ref(texts)]


@pytest.mark.parametrize("family", ["roberta", "modernbert", "distilbert", "deberta-v2"])
def test_int8_and_fp16_bundles_of_other_families(tmp_path: Path, family: str) -> None:
    save_checkpoint(tmp_path / "src", family, "ForSequenceClassification", perturb=False,
                    id2label={0: "neg", 1: "pos"})
    q = export(tmp_path / "src", tmp_path / "int8", "--quantize", "int8")
    assert q["precision"] == "int8" and q["parity"]["int8_top1_agreement_vs_fp32"] >= 0.9, q["parity"]
    h = export(tmp_path / "src", tmp_path / "fp16", "--fp16")
    assert h["precision"] == "fp16" and "fp16_check" in h["parity"]
    got = Pipeline.load(tmp_path / "int8")(["the film was good", "a dull plot"])
    assert [r["label"] for r in got] and all(r["label"] in ("neg", "pos") for r in got)


def test_cli_fill_mask_takes_bert_s_mask_for_roberta(tmp_path: Path) -> None:
    hf = save_checkpoint(tmp_path / "src", "roberta", "ForMaskedLM")
    export(tmp_path / "src", tmp_path / "b")
    r = runner.invoke(app, ["fill-mask", str(tmp_path / "b"), "the film was [MASK]", "the plot <mask> good",
                            "--top-k", "2",
                            "--json"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 2 and all(len(row["masks"]) == 1 for row in rows)
    b = encode_batch(tmp_path / "src", ["the film was <mask>", "the plot <mask> good"])
    logits = hf_out(hf, b, "roberta").logits.numpy()
    mask_id = transformers.AutoTokenizer.from_pretrained(tmp_path / "src").mask_token_id
    want = [int(logits[i, p].argmax()) for i, p in zip(*np.nonzero(b["input_ids"] == mask_id))]
    assert [row["masks"][0]["candidates"][0]["id"] for row in rows] == want
    text, m = rows[0]["text"], rows[0]["masks"][0]
    assert text[m["start"]:m["end"]].strip() == "[MASK]"


def test_batch_job_and_evaluate_on_a_roberta_classifier(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "src", "roberta", "ForSequenceClassification", id2label={0: "neg", 1: "pos"})
    export(tmp_path / "src", tmp_path / "b")
    rows = [{"text": t, "label": "pos" if i % 2 else "neg"} for i, t in enumerate(sentences(40))]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    r = runner.invoke(app, ["classify", str(tmp_path / "b"), "--input", str(data), "--output", str(out)])
    assert r.exit_code == 0, r.output
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(got) == 40
    direct = Pipeline.load(tmp_path / "b")([r["text"] for r in rows])
    assert [g["label"] for g in got] == [d["label"] for d in direct]
    r = runner.invoke(app, ["evaluate", str(tmp_path / "b"), "--data", str(data), "--json"])
    assert r.exit_code == 0, r.output
    metrics = json.loads(r.stdout[r.stdout.index("{"):])
    want = sum(d["label"] == row["label"] for d, row in zip(direct, rows)) / len(rows)
    assert abs(metrics["accuracy"] - want) < 1e-9


def test_xlm_roberta_sentence_transformers_directory(tmp_path: Path) -> None:
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers import models as st_models

    save_checkpoint(tmp_path / "enc", "xlm-roberta", "Model")
    word = st_models.Transformer(str(tmp_path / "enc"), max_seq_length=64)
    model = SentenceTransformer(modules=[word, st_models.Pooling(word.get_word_embedding_dimension(),
                                                                 pooling_mode="mean"),
                                         st_models.Normalize()], device="cpu")
    model.save(str(tmp_path / "st"))
    meta = export(tmp_path / "st", tmp_path / "b")
    assert (meta["task"] == "embedding" and meta["options"]["normalize"] is True
            and "token_type_ids" not in meta["inputs"])
    texts = ["the film was good", "john went to paris and the plot was very dull", "a"]
    ours = np.stack([r["embedding"] for r in Pipeline.load(tmp_path / "b")(texts)])
    want = model.encode(texts, convert_to_numpy=True)
    assert np.abs(ours - want).max() < 1e-4


def test_tagging_and_qa_fine_tune_on_byte_level_bpe(tmp_path: Path) -> None:
    """Words of a pre-split sentence get their leading space (Ġ) as in running text; both tasks train,
    export and answer with spans of the input."""
    from conftest import run_finetune

    save_checkpoint(tmp_path / "base", "roberta", "ForMaskedLM", perturb=False)
    names = {"john": "PER", "paris": "LOC"}
    rows = []
    for s in sentences(120, seed=3):
        words = s.split()
        tags = [f"B-{names[w]}" if w in names else "O" for w in words]
        rows.append({"tokens": words, "tags": tags})
    (tmp_path / "tag.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = run_finetune("tagging", tmp_path / "base", tmp_path / "tag.jsonl", tmp_path / "tagger",
                     eval_file=tmp_path / "tag.jsonl",
                     epochs=6, batch_size=16, lr=4e-3, warmup_ratio=0.1, max_length=32, seed=0,
                     progress=False)
    assert m["eval_f1"] >= 0.9, m
    export(tmp_path / "tagger", tmp_path / "tb")
    text = "the film john saw in paris was good"
    (r,) = Pipeline.load(tmp_path / "tb")([text])
    assert {(e["type"], e["text"]) for e in r["entities"]} == {("PER", "john"), ("LOC", "paris")}
    assert all(text[e["start"]:e["end"]] == e["text"] for e in r["entities"])
    qa = [{"id": str(i), "question": "who went", "context": f"{s} john went", "answers": {"text": ["john"],
           "answer_start": [len(s) + 1]}} for i, s in enumerate(sentences(60, seed=4))]
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in qa))
    torch.manual_seed(0)
    run_finetune("qa", tmp_path / "base", tmp_path / "qa.jsonl", tmp_path / "reader", epochs=2, batch_size=16,
                 lr=4e-3,
                 warmup_ratio=0.1, max_length=48, seed=0, progress=False)
    export(tmp_path / "reader", tmp_path / "qb")
    context = "the plot was dull and john went"
    (p,) = Pipeline.load(tmp_path / "qb")([{"id": "x", "question": "who went", "context": context}])
    assert p["answer"] == context[p["start"]:p["end"]] and p["answer"] == p["answer"].strip()


def test_a_checkpoint_with_vocab_json_and_merges_txt_only(tmp_path: Path) -> None:
    """A byte-level BPE tokenizer given as vocab.json + merges.txt (older RoBERTa / GPT-2 layouts) is
    converted, with RoBERTa's template and a <mask> that takes the space before it."""
    save_checkpoint(tmp_path / "src", "roberta", "ForMaskedLM")
    fast = transformers.AutoTokenizer.from_pretrained(tmp_path / "src")
    model = json.loads((tmp_path / "src" / "tokenizer.json").read_text())["model"]
    (tmp_path / "src" / "vocab.json").write_text(json.dumps(model["vocab"]))
    (tmp_path / "src" / "merges.txt").write_text("#version: 0.2\n" + "".join(
        (" ".join(m) if isinstance(m, list) else m) + "\n" for m in model["merges"]))
    (tmp_path / "src" / "tokenizer.json").unlink()
    from mlmkit.text.tokenizer import load_tokenizer

    tok = load_tokenizer(tmp_path / "src")
    for text in ("the film was good", "john went to <mask> and paris"):
        assert tok.encode(text).ids == fast(text).input_ids
    meta = export(tmp_path / "src", tmp_path / "b")
    assert meta["task"] == "fill-mask"


def test_a_sentencepiece_only_checkpoint_names_the_extra_to_install(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "src", "xlm-roberta", "ForMaskedLM")
    (tmp_path / "src" / "tokenizer.json").unlink()
    (tmp_path / "src" / "sentencepiece.bpe.model").write_bytes(b"\x00not a real model")
    r = runner.invoke(app, ["export", str(tmp_path / "src"), "--out", str(tmp_path / "b")])
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and "SentencePiece" in said and "mlmkit[convert]" in said, said
