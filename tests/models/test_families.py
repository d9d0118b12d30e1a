"""Every model family x every head transformers has for it: tiny random checkpoints saved by
transformers, with a tokenizer of the family's kind trained here with the `tokenizers` library, export
through the parity gate and give transformers' outputs; tags and answers slice the text exactly; a
classifier of each family learns and loads back in transformers; RoBERTa- and ModernBERT-style
pretraining runs resume exactly and load in transformers."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
from conftest import run_finetune, run_pretrain
from family_checkpoints import (
    FAMILIES,
    encode_batch,
    export,
    hf_out,
    runner,
    save_checkpoint,
    sentences,
    transformers,
)
from safetensors.torch import load_file

from mlmkit.cli import app
from mlmkit.models.core import BertForLabels, BertForPreTraining
from mlmkit.rundir.checkpoint import load_state_dict, load_weights
from mlmkit.rundir.config import load_config
from mlmkit.runtime.pipeline import Pipeline
from mlmkit.text.tokenizer import load_tokenizer, special_ids
from mlmkit.train.state import ResumeCheckpoints

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
HEADS = ("ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering",
         "Model")


def onnx_outputs(bundle: Path, b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    s = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(names, {i.name: b[i.name] for i in s.get_inputs()})))


MIXED = ["the film was good", "john went to paris and the plot was very dull", "a", "not bad",
         ("the story", "was great and fine"), "very very poor plot and a dull story to the end"]


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_and_head_exports_with_transformers_outputs(tmp_path: Path, family: str,
                                                                 head: str) -> None:
    src = tmp_path / "src"
    labels = {"id2label": dict(enumerate(TAGS))} if head == "ForTokenClassification" else {}
    if head == "ForSequenceClassification":
        labels = {"id2label": {0: "neg", 1: "neu", 2: "pos"}}
    hf = save_checkpoint(src, family, head, **labels)
    meta = export(src, tmp_path / "b")
    fam_cfg = load_config(src)
    assert ("token_type_ids" in meta["inputs"]) == fam_cfg.family.uses_token_types(fam_cfg)
    assert all(v <= 1e-4 for v in meta["parity"]["max_abs_diff"].values()), meta["parity"]
    for op, n in fam_cfg.family.fusions.items():  # the fusion gate held
        assert meta["fused_operators"].get(op, 0) >= n, meta["fused_operators"]
    tok = load_tokenizer(src)
    if head == "ForMaskedLM":
        mask = tok.id_to_token(special_ids(tok).mask)
        texts = ["the film was [MASK] and good", f"john went to {mask}", "[MASK] plot"]
        got = Pipeline.load(tmp_path / "b")(texts, top_k=1)
        b = encode_batch(src, [t.replace("[MASK]", mask) for t in texts])
        logits = hf_out(hf, b, family).logits.numpy()
        want = [logits[r, p].argmax() for r, p in zip(*np.nonzero(b["input_ids"] == special_ids(tok).mask))]
        have = [m["candidates"][0]["id"] for r in got for m in r["masks"]]
        assert have == want and len(have) == 3
        return
    b = encode_batch(src,
                     MIXED if head != "ForTokenClassification" else [t for t in MIXED if isinstance(t, str)])
    ours, ref, real = onnx_outputs(tmp_path / "b", b), hf_out(hf, b, family), b["attention_mask"].astype(bool)
    if head == "ForSequenceClassification":
        np.testing.assert_allclose(ours["logits"], ref.logits.numpy(), atol=1e-4)
    elif head == "ForTokenClassification":
        np.testing.assert_allclose(ours["probabilities"][real], torch.softmax(ref.logits, -1).numpy()[real],
                                   atol=1e-4)
    elif head == "ForQuestionAnswering":
        np.testing.assert_allclose(ours["start_logits"][real], ref.start_logits.numpy()[real], atol=1e-4)
        np.testing.assert_allclose(ours["end_logits"][real], ref.end_logits.numpy()[real], atol=1e-4)
    else:
        h = ref.last_hidden_state.numpy()
        m = b["attention_mask"][..., None]
        np.testing.assert_allclose(ours["embedding"], (h * m).sum(1) / m.sum(1), atol=1e-4)


@pytest.mark.parametrize("family", ["roberta", "xlm-roberta", "modernbert", "distilbert", "deberta-v2",
                                    "jina_embeddings_v3"])
def test_tags_and_answers_slice_the_text_exactly(tmp_path: Path, family: str) -> None:
    save_checkpoint(tmp_path / "tag", family, "ForTokenClassification", id2label=dict(enumerate(TAGS)))
    export(tmp_path / "tag", tmp_path / "tb")
    text = "john  went to paris, and the film was very good"
    (r,) = Pipeline.load(tmp_path / "tb")([text])
    assert r["tokens"] == ["john", "went", "to", "paris", ",", "and", "the", "film", "was", "very", "good"]
    for e in r["entities"]:
        assert e["text"] == text[e["start"]:e["end"]] and e["text"] == e["text"].strip() and e["text"]
    save_checkpoint(tmp_path / "qa", family, "ForQuestionAnswering")
    export(tmp_path / "qa", tmp_path / "qb")
    context = "john went to paris and the plot was good"
    got = Pipeline.load(tmp_path / "qb")([{"question": "where did john go", "context": context, "id": str(i)}
                                          for i in range(3)])
    for p in got:
        assert p["answer"] == context[p["start"]:p["end"]] and p["answer"] == p["answer"].strip()
        words = context.split()
        assert p["answer"] == "" or (p["start"] == 0 or context[p["start"] - 1]
                                     == " ") or p["answer"].split()[0] not in words


def labelled(n: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        word = rng.choice(["good", "great"] if label == "pos" else ["bad", "dull"])
        filler = [rng.choice(["the", "film", "plot", "story", "was", "very"])
                  for _ in range(rng.randint(2, 6))]
        filler.insert(rng.randint(0, len(filler)), word)
        rows.append({"text": " ".join(filler), "label": label})
    return rows


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_fine_tunes_a_classifier_that_loads_in_transformers(tmp_path: Path, family: str) -> None:
    save_checkpoint(tmp_path / "base", family, "ForMaskedLM", perturb=False)
    for name, n, seed in (("train", 160, 1), ("eval", 60, 2)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in labelled(n, seed)))
    metrics = run_finetune("classification", tmp_path / "base", tmp_path / "train.jsonl", tmp_path / "run",
                           eval_file=tmp_path / "eval.jsonl", epochs=6, batch_size=16, lr=4e-3,
                           warmup_ratio=0.1,
                           max_length=32, seed=0, progress=False)
    assert metrics["eval_accuracy"] >= 0.9, metrics
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text())["model_type"] == family
    hf, info = transformers.AutoModelForSequenceClassification.from_pretrained(run, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    cfg = load_config(run)
    ours = BertForLabels(cfg, per_token=False).eval()
    load_weights(ours, load_state_dict(run))
    b = encode_batch(run, ["the film was good", "a very dull story was the plot"])
    with torch.no_grad():
        a = ours(*(torch.from_numpy(b[k])
                   for k in ("input_ids", "attention_mask", "token_type_ids")))["logits"]
    np.testing.assert_allclose(a.numpy(), hf_out(hf.eval(), b, family).logits.numpy(), atol=1e-5)


class Killed(Exception):
    pass


@pytest.mark.parametrize("arch", ["roberta", "modernbert"])
def test_pretraining_other_families_resumes_exactly_and_loads_in_transformers(
    tmp_path: Path, arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join("\n".join(sentences(5, seed=d)) for d in range(30)) + "\n")
    kw = dict(arch=arch, batch_size=8, seq_len=32, vocab_size=300, lr=1e-3, eval_every=1000, save_every=2,
              seed=0,
              steps=4, progress=False)
    run_pretrain([corpus], tmp_path / "full", **kw)
    original = ResumeCheckpoints.save

    def save_then_die(self: Any, *args: Any) -> Any:
        ck = original(self, *args)
        if args[-2].step == 2:
            raise Killed
        return ck

    monkeypatch.setattr(ResumeCheckpoints, "save", save_then_die)
    with pytest.raises(Killed):
        run_pretrain([corpus], tmp_path / "cut", **kw)
    monkeypatch.undo()
    assert run_pretrain([corpus], tmp_path / "cut", resume=True, **kw)["step"] == 4
    a, b = (load_file(tmp_path / "full" / "model.safetensors"),
            load_file(tmp_path / "cut" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    run = tmp_path / "full"
    config = json.loads((run / "config.json").read_text())
    assert config["model_type"] == arch and "type_vocab_size" not in config or arch == "roberta"
    cls = transformers.RobertaForMaskedLM if arch == "roberta" else transformers.ModernBertForMaskedLM
    hf, info = cls.from_pretrained(run, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ours = BertForPreTraining(load_config(run))
    load_weights(ours, load_state_dict(run))
    b = encode_batch(run, ["the film was good", "a very dull story was the plot and john went to paris"])
    with torch.no_grad():
        mine = ours.eval()(torch.from_numpy(b["input_ids"]),
                           torch.from_numpy(b["attention_mask"]))["prediction_logits"]
    real = b["attention_mask"].astype(bool)
    np.testing.assert_allclose(mine.numpy()[real], hf_out(hf.eval(), b, arch).logits.numpy()[real], atol=1e-5)


def test_nsp_is_refused_for_families_without_it(tmp_path: Path) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(sentences(20)) + "\n")
    r = runner.invoke(app,
                      ["pretrain", str(corpus), "--out", str(tmp_path / "r"), "--arch", "roberta", "--nsp"])
    assert r.exit_code == 2 and "next-sentence prediction is BERT's" in r.output


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_tokenizer_train_kinds(tmp_path: Path, kind: str) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(sentences(100)) + "\n")
    r = runner.invoke(app, ["tokenizer", "train", str(corpus), "--out", str(tmp_path / "t"), "--kind", kind,
                            "--vocab-size", "200"])
    assert r.exit_code == 0, r.output
    tok = load_tokenizer(tmp_path / "t")
    text = "john went to paris"
    enc = tok.encode(text)
    assert enc.tokens[0] == "<s>" and enc.tokens[-1] == "</s>"
    assert tok.decode(enc.ids) == text
    if kind == "bpe":  # byte-level pieces' offsets leave the space out (RoBERTa's trim_offsets)
        words = [text[a:b] for t, (a, b) in zip(enc.tokens[1:-1], enc.offsets[1:-1]) if b > a]
        assert words and all(w.strip() == w for w in words), words
    fast = transformers.AutoTokenizer.from_pretrained(tmp_path / "t")
    assert fast(text).input_ids == enc.ids and fast.mask_token == "<mask>"
