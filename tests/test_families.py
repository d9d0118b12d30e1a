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
from safetensors.torch import load_file
from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from typer.testing import CliRunner

from mlmkit.cli import app
from mlmkit.infer.pipeline import Pipeline
from mlmkit.models.core import BertForLabels, BertForPreTraining
from mlmkit.rundir.checkpoint import load_state_dict, load_weights
from mlmkit.rundir.config import ModelConfig
from mlmkit.text.batching import pad_features
from mlmkit.text.tokenizer import load_tokenizer, special_ids
from mlmkit.train.state import ResumeCheckpoints

transformers = pytest.importorskip("transformers")  # a dev extra: the oracle
runner = CliRunner()
WORDS = "the a film movie plot story was is good great fine bad dull poor very not and john paris went to".split()
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)

# family -> (transformers class prefix, tokenizer kind, config keywords)
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "bert": ("Bert", "wordpiece", dict(SIZES, max_position_embeddings=64)),
    "roberta": ("Roberta", "bpe", dict(SIZES, max_position_embeddings=66, type_vocab_size=1, layer_norm_eps=1e-5)),
    "xlm-roberta": ("XLMRoberta", "unigram", dict(SIZES, max_position_embeddings=66, type_vocab_size=1, layer_norm_eps=1e-5)),
    "distilbert": ("DistilBert", "wordpiece", dict(dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64)),
    "electra": ("Electra", "wordpiece", dict(SIZES, embedding_size=16, max_position_embeddings=64)),
    "modernbert": ("ModernBert", "bpe-bert", dict(SIZES, num_hidden_layers=3, max_position_embeddings=128, local_attention=8,
                                                  global_attn_every_n_layers=2)),
    "deberta-v2": ("DebertaV2", "unigram-bert", dict(SIZES, max_position_embeddings=64, relative_attention=True, pos_att_type=["p2c", "c2p"],
                                                     position_biased_input=False, share_att_key=True, norm_rel_ebd="layer_norm",
                                                     position_buckets=8, max_relative_positions=16, type_vocab_size=0)),
}
HEADS = ("ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering", "Model")


def sentences(n: int = 60, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(n)]


def family_tokenizer(kind: str) -> Any:
    """A transformers fast tokenizer of the family's kind around a `tokenizers` model trained here."""
    texts = sentences(200) + [" ".join(WORDS)] * 5
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(BERT_SPECIALS + WORDS)}, unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        specials = BERT_SPECIALS
    elif kind in ("bpe", "bpe-bert"):
        specials = ROBERTA_SPECIALS if kind == "bpe" else BERT_SPECIALS
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=450, special_tokens=specials, min_frequency=1,
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    else:  # unigram, SentencePiece style (XLM-R; "unigram-bert": DeBERTa-v3's, with BERT's special tokens)
        specials = ROBERTA_SPECIALS if kind == "unigram" else BERT_SPECIALS
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        tok.train_from_iterator(texts, trainers.UnigramTrainer(vocab_size=120, special_tokens=specials, unk_token="<unk>" if kind == "unigram" else "[UNK]"))
    if specials is ROBERTA_SPECIALS:
        tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
        tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>")))
        names = dict(bos_token="<s>", eos_token="</s>", cls_token="<s>", sep_token="</s>", pad_token="<pad>", unk_token="<unk>",
                     mask_token="<mask>")
    else:
        tok.add_special_tokens(["[MASK]"])
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
            special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
        names = dict(cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]", mask_token="[MASK]")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **names)


def save_checkpoint(d: Path, family: str, head: str, *, perturb: bool = True, **config: Any) -> Any:
    """A randomly initialised transformers model of ``family`` + ``head`` saved as transformers saves it,
    its weights drawn wider than init so that every parameter shows in the outputs (``perturb``)."""
    prefix, kind, kw = FAMILIES[family]
    fast = family_tokenizer(kind)
    cfg_cls = getattr(transformers, f"{prefix}Config")
    ids = {"pad_token_id": fast.pad_token_id}
    if family != "distilbert":
        ids.update(bos_token_id=fast.cls_token_id, eos_token_id=fast.sep_token_id)
    if family == "modernbert":
        ids.update(cls_token_id=fast.cls_token_id, sep_token_id=fast.sep_token_id)
    cfg = cfg_cls(vocab_size=len(fast), **kw, **ids, **config)
    torch.manual_seed(0)
    model = getattr(transformers, prefix + head)(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.1 if "norm" in name.lower() else 0.3) * perturb)
    model.save_pretrained(d)
    fast.save_pretrained(d)
    return model


def encode_batch(d: Path, texts: list[Any]) -> dict[str, np.ndarray]:
    tok = load_tokenizer(d)
    feats = [{"input_ids": e.ids, "token_type_ids": e.type_ids} for e in tok.encode_batch(texts)]
    return pad_features(feats, special_ids(tok).pad)


def onnx_outputs(bundle: Path, b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    s = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(names, {i.name: b[i.name] for i in s.get_inputs()})))


def hf_out(model: Any, b: dict[str, np.ndarray], family: str) -> Any:
    keys = ["input_ids", "attention_mask"] + (["token_type_ids"] if family in ("bert", "electra") else [])
    with torch.no_grad():
        return model(**{k: torch.from_numpy(b[k]) for k in keys})


def export(src: Path, out: Path, *extra: str) -> dict[str, Any]:
    r = runner.invoke(app, ["export", str(src), "--out", str(out), "--json", *extra])
    assert r.exit_code == 0, r.output
    return json.loads((out / "mlmkit.json").read_text())


MIXED = ["the film was good", "john went to paris and the plot was very dull", "a", "not bad",
         ("the story", "was great and fine"), "very very poor plot and a dull story to the end"]


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_and_head_exports_with_transformers_outputs(tmp_path: Path, family: str, head: str) -> None:
    src = tmp_path / "src"
    labels = {"id2label": dict(enumerate(TAGS))} if head == "ForTokenClassification" else {}
    if head == "ForSequenceClassification":
        labels = {"id2label": {0: "neg", 1: "neu", 2: "pos"}}
    hf = save_checkpoint(src, family, head, **labels)
    meta = export(src, tmp_path / "b")
    fam_cfg = ModelConfig.load(src)
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
    b = encode_batch(src, MIXED if head != "ForTokenClassification" else [t for t in MIXED if isinstance(t, str)])
    ours, ref, real = onnx_outputs(tmp_path / "b", b), hf_out(hf, b, family), b["attention_mask"].astype(bool)
    if head == "ForSequenceClassification":
        np.testing.assert_allclose(ours["logits"], ref.logits.numpy(), atol=1e-4)
    elif head == "ForTokenClassification":
        np.testing.assert_allclose(ours["probabilities"][real], torch.softmax(ref.logits, -1).numpy()[real], atol=1e-4)
    elif head == "ForQuestionAnswering":
        np.testing.assert_allclose(ours["start_logits"][real], ref.start_logits.numpy()[real], atol=1e-4)
        np.testing.assert_allclose(ours["end_logits"][real], ref.end_logits.numpy()[real], atol=1e-4)
    else:
        h = ref.last_hidden_state.numpy()
        m = b["attention_mask"][..., None]
        np.testing.assert_allclose(ours["embedding"], (h * m).sum(1) / m.sum(1), atol=1e-4)


@pytest.mark.parametrize("family", ["roberta", "xlm-roberta", "modernbert", "distilbert", "deberta-v2"])
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
    got = Pipeline.load(tmp_path / "qb")([{"question": "where did john go", "context": context, "id": str(i)} for i in range(3)])
    for p in got:
        assert p["answer"] == context[p["start"]:p["end"]] and p["answer"] == p["answer"].strip()
        words = context.split()
        assert p["answer"] == "" or (p["start"] == 0 or context[p["start"] - 1] == " ") or p["answer"].split()[0] not in words


def labelled(n: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        word = rng.choice(["good", "great"] if label == "pos" else ["bad", "dull"])
        filler = [rng.choice(["the", "film", "plot", "story", "was", "very"]) for _ in range(rng.randint(2, 6))]
        filler.insert(rng.randint(0, len(filler)), word)
        rows.append({"text": " ".join(filler), "label": label})
    return rows


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_fine_tunes_a_classifier_that_loads_in_transformers(tmp_path: Path, family: str) -> None:
    save_checkpoint(tmp_path / "base", family, "ForMaskedLM", perturb=False)
    for name, n, seed in (("train", 160, 1), ("eval", 60, 2)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in labelled(n, seed)))
    metrics = run_finetune("classification", tmp_path / "base", tmp_path / "train.jsonl", tmp_path / "run",
                           eval_file=tmp_path / "eval.jsonl", epochs=6, batch_size=16, lr=4e-3, warmup_ratio=0.1,
                           max_length=32, seed=0, progress=False)
    assert metrics["eval_accuracy"] >= 0.9, metrics
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text())["model_type"] == family
    hf, info = transformers.AutoModelForSequenceClassification.from_pretrained(run, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    cfg = ModelConfig.load(run)
    ours = BertForLabels(cfg, per_token=False).eval()
    load_weights(ours, load_state_dict(run))
    b = encode_batch(run, ["the film was good", "a very dull story was the plot"])
    with torch.no_grad():
        a = ours(*(torch.from_numpy(b[k]) for k in ("input_ids", "attention_mask", "token_type_ids")))["logits"]
    np.testing.assert_allclose(a.numpy(), hf_out(hf.eval(), b, family).logits.numpy(), atol=1e-5)


class Killed(Exception):
    pass


@pytest.mark.parametrize("arch", ["roberta", "modernbert"])
def test_pretraining_other_families_resumes_exactly_and_loads_in_transformers(
    tmp_path: Path, arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join("\n".join(sentences(5, seed=d)) for d in range(30)) + "\n")
    kw = dict(arch=arch, batch_size=8, seq_len=32, vocab_size=300, lr=1e-3, eval_every=1000, save_every=2, seed=0,
              steps=4, progress=False)
    run_pretrain([corpus], tmp_path / "full", **kw)
    original = ResumeCheckpoints.save

    def save_then_die(self: Any, *args: Any) -> Any:
        ck = original(self, *args)
        if args[-2]["step"] == 2:
            raise Killed
        return ck

    monkeypatch.setattr(ResumeCheckpoints, "save", save_then_die)
    with pytest.raises(Killed):
        run_pretrain([corpus], tmp_path / "cut", **kw)
    monkeypatch.undo()
    assert run_pretrain([corpus], tmp_path / "cut", resume=True, **kw)["step"] == 4
    a, b = load_file(tmp_path / "full" / "model.safetensors"), load_file(tmp_path / "cut" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    run = tmp_path / "full"
    config = json.loads((run / "config.json").read_text())
    assert config["model_type"] == arch and "type_vocab_size" not in config or arch == "roberta"
    cls = transformers.RobertaForMaskedLM if arch == "roberta" else transformers.ModernBertForMaskedLM
    hf, info = cls.from_pretrained(run, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ours = BertForPreTraining(ModelConfig.load(run))
    load_weights(ours, load_state_dict(run))
    b = encode_batch(run, ["the film was good", "a very dull story was the plot and john went to paris"])
    with torch.no_grad():
        mine = ours.eval()(torch.from_numpy(b["input_ids"]), torch.from_numpy(b["attention_mask"]))["prediction_logits"]
    real = b["attention_mask"].astype(bool)
    np.testing.assert_allclose(mine.numpy()[real], hf_out(hf.eval(), b, arch).logits.numpy()[real], atol=1e-5)


def test_nsp_is_refused_for_families_without_it(tmp_path: Path) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(sentences(20)) + "\n")
    r = runner.invoke(app, ["pretrain", str(corpus), "--out", str(tmp_path / "r"), "--arch", "roberta", "--nsp"])
    assert r.exit_code == 2 and "next-sentence prediction is BERT's" in r.output


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_tokenizer_train_kinds(tmp_path: Path, kind: str) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(sentences(100)) + "\n")
    r = runner.invoke(app, ["tokenizer", "train", str(corpus), "--out", str(tmp_path / "t"), "--kind", kind, "--vocab-size", "200"])
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
