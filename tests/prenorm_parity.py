"""What the parity tests of the Llama-style families share (test_qwen3.py, test_gemma3.py,
test_eurobert.py, test_prenorm.py), beside what every family's share (family_parity.py, whose
checkpoints, batches and ONNX runs this module gives on): tokenizers built as the released
checkpoints' are (byte-level BPE with Qwen3's <|endoftext|> appended, Gemma's SentencePiece-style BPE
with <pad> <eos> <bos> <unk> <mask>, EuroBERT's Llama-3-style <|begin_of_text|> ... <|end_of_text|>),
the ONNX graph fused as `mlmkit export` fuses it, `mlmkit export` itself and a classifier fine-tuned
from a checkpoint."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from family_checkpoints import (
    sentence_transformers_bundle,  # noqa: F401  (tests/tasks/test_embedding_data.py imports it from here)
    sentences,
)
from family_parity import (
    export_eager,
    head_of,
    hf_model,
    onnx_diff,
    ort_run,
    ort_session,
    outputs,
    save_hf,  # noqa: F401  (as sentence_transformers_bundle)
)
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
from torch import nn

from mlmkit.exporter.passes import fuse
from mlmkit.models import core
from mlmkit.models.config import ModelConfig

transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")  # the graphs and bundles these tests run

TEXTS = ["the film was good", "john went to paris and the plot was very dull", "a", "not bad at all",
         "very very poor plot and a dull story to the end, and then john went to paris"]


def _byte_bpe(specials: list[str], vocab_size: int = 300) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, min_frequency=1,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(sentences(200), trainer)
    return tok


def qwen3_tokenizer() -> Any:
    """Qwen3-Embedding's kind: byte-level BPE, <|endoftext|> appended to every text (its post-processor)
    and the padding token; no cls, sep, mask or unk token."""
    tok = _byte_bpe(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    eot = ("<|endoftext|>", tok.token_to_id("<|endoftext|>"))
    tok.post_processor = processors.TemplateProcessing(single="$A:0 <|endoftext|>:0",
                                                       pair="$A:0 <|endoftext|>:0 $B:1 <|endoftext|>:1",
                                                       special_tokens=[eot])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|endoftext|>",
                                                eos_token="<|im_end|>")


def gemma_tokenizer() -> Any:
    """EmbeddingGemma's kind: SentencePiece-style BPE (▁ for spaces) whose first ids are <pad> <eos> <bos>
    <unk> <mask>, <bos> A <eos>."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    tok.decoder = decoders.Replace("▁", " ")
    tok.train_from_iterator(sentences(200),
                            trainers.BpeTrainer(vocab_size=200, special_tokens=specials, min_frequency=1))
    ids = [(t, tok.token_to_id(t)) for t in ("<bos>", "<eos>")]
    tok.post_processor = processors.TemplateProcessing(single="<bos>:0 $A:0 <eos>:0",
                                                       pair="<bos>:0 $A:0 <eos>:0 $B:1 <eos>:1",
                                                       special_tokens=ids)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                                bos_token="<bos>",
                                                unk_token="<unk>", mask_token="<mask>")


def eurobert_tokenizer() -> Any:
    """EuroBERT's kind (Llama 3's tokenizer): byte-level BPE, <|begin_of_text|> A <|end_of_text|>, the
    latter also the padding token, and <|mask|>."""
    tok = _byte_bpe(["<|begin_of_text|>", "<|end_of_text|>", "<|mask|>"])
    tok.add_special_tokens([AddedToken("<|mask|>", special=True)])
    bos, eos = (("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>")),
                ("<|end_of_text|>", tok.token_to_id("<|end_of_text|>")))
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|>:0 $A:0 <|end_of_text|>:0",
                                                       pair="<|begin_of_text|>:0 $A:0 <|end_of_text|>:0 $B:1 "
                                                            "<|end_of_text|>:1",
                                                       special_tokens=[bos, eos])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>",
                                                eos_token="<|end_of_text|>",
                                                pad_token="<|end_of_text|>", mask_token="<|mask|>")


def encode(fast: Any, texts: list[str]) -> dict[str, torch.Tensor]:
    """The texts as the released tokenizer frames them, right-padded with its padding token."""
    enc = fast(texts, padding=True, return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def fused_graph(tmp: Path, graph: nn.Module, cfg: ModelConfig, dummy: dict[str, torch.Tensor], *,
                per_token: bool
                ) -> tuple[Any, dict[str, int]]:
    """``graph`` exported as `mlmkit export` exports it (eager attention, the TorchScript exporter,
    opset 17, dynamic batch and sequence) and fused by onnxruntime's BERT optimizer, held to the
    family's declared fusions (exporter/passes.py's fuse raises short of them). Returns the session and
    the fused operator counts."""
    plain = export_eager(graph, dummy, tmp / "plain.onnx", per_token=per_token)
    counts = fuse(plain, tmp / "fused.onnx", cfg)
    return ort_session(tmp / "fused.onnx"), counts


def fused_graph_diff(tmp: Path, graph: nn.Module, cfg: ModelConfig, dummy: dict[str, torch.Tensor],
                     x: dict[str, torch.Tensor], cls_name: str, d: Path) -> tuple[dict[str, int], float]:
    """``graph``, one output of mlmkit's model of transformers' ``cls_name`` (per row for a sequence
    head, else per token), fused into ``tmp`` (fused_graph) from ``dummy``: (the fused operator counts,
    the largest difference of its output on ``x``, a batch of another size and length, from
    transformers' model of ``d``, at real tokens where it is per token)."""
    tmp.mkdir(parents=True)
    head = head_of(cls_name)
    per_token = head != "ForSequenceClassification"
    session, counts = fused_graph(tmp, graph, cfg, dummy, per_token=per_token)
    with torch.no_grad():
        ref = outputs(head, hf_model(cls_name, d)(**x))[0].numpy()
    return counts, onnx_diff(ort_run(session, x), ref, x, per_token=per_token)


def bundle_output(bundle: Path, name: str, x: dict[str, torch.Tensor]) -> np.ndarray:
    """The output ``name`` of the bundle's model.onnx on ``x``, by onnxruntime."""
    return ort_run(ort_session(bundle / "model.onnx"), x, [name])


def labelled(n: int, seed: int) -> list[dict[str, str]]:
    """Texts whose label one word says (good / great: pos, bad / dull: neg) among filler words."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        words = [rng.choice(["the", "film", "plot", "story", "was", "very"])
                 for _ in range(rng.randint(2, 6))]
        words.insert(rng.randint(0, len(words)),
                     rng.choice(["good", "great"] if label == "pos" else ["bad", "dull"]))
        rows.append({"text": " ".join(words), "label": label})
    return rows


def fine_tunes_a_classifier(tmp: Path, base: Path, fast: Any, *, lr: float = 4e-3) -> None:
    """`mlmkit finetune` of a classifier from the checkpoint ``base`` (any head) learns the labelled
    texts, and its run loads in transformers (AutoModelForSequenceClassification: the family's
    class) with nothing missing or unexpected and the same logits on texts the tokenizer frames."""
    from conftest import run_finetune

    from mlmkit.rundir.checkpoint import load_state_dict, load_weights
    from mlmkit.rundir.config import load_config

    for name, n, seed in (("train", 160, 1), ("eval", 60, 2)):
        (tmp / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in labelled(n, seed)))
    metrics = run_finetune("classification", base, tmp / "train.jsonl", tmp / "run",
                           eval_file=tmp / "eval.jsonl", epochs=6,
                           batch_size=16, lr=lr, warmup_ratio=0.1, max_length=32, seed=0, progress=False)
    assert metrics["eval_accuracy"] >= 0.9, metrics
    hf, info = transformers.AutoModelForSequenceClassification.from_pretrained(tmp / "run",
                                                                               output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ours = core.BertForLabels(load_config(tmp / "run"), per_token=False).eval()
    load_weights(ours, load_state_dict(tmp / "run"))
    x = encode(fast, ["the film was good", "a very dull story was the plot"])
    with torch.no_grad():
        np.testing.assert_allclose(ours(**x)["logits"].numpy(), hf.eval()(**x).logits.numpy(), atol=1e-5)
