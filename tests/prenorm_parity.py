"""What the parity tests of the Llama-style families share (test_qwen3.py, test_gemma3.py,
test_eurobert.py, test_prenorm.py): tokenizers built as the released checkpoints' are (byte-level BPE
with Qwen3's <|endoftext|> appended, Gemma's SentencePiece-style BPE with <pad> <eos> <bos> <unk>
<mask>, EuroBERT's Llama-3-style <|begin_of_text|> ... <|end_of_text|>), random transformers models
saved by save_pretrained, right-padded batches, the ONNX graph fused as `mlmkit export` fuses it, and
`mlmkit export` itself."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from family_checkpoints import runner, sentences
from family_parity import export_logits, perturb
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

from mlmkit.cli import app
from mlmkit.exporter.passes import fuse
from mlmkit.models import core
from mlmkit.models.config import ModelConfig

transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")

TEXTS = ["the film was good", "john went to paris and the plot was very dull", "a", "not bad at all",
         "very very poor plot and a dull story to the end, and then john went to paris"]


def _byte_bpe(specials: list[str], vocab_size: int = 300) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(sentences(200), trainers.BpeTrainer(vocab_size=vocab_size,
                                                                special_tokens=specials, min_frequency=1,
                                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
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


def save_hf(d: Path, cls_name: str, config: Any, *, seed: int = 0, tokenizer: Any = None) -> nn.Module:
    """A random transformers model of ``cls_name``, perturbed well beyond its init, saved by
    save_pretrained (with ``tokenizer`` beside it)."""
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(config)
    perturb(model, seed)
    model.save_pretrained(d)
    if tokenizer is not None:
        tokenizer.save_pretrained(d)
    return model.eval()


def hf_model(cls_name: str, d: Path, impl: str = "eager") -> nn.Module:
    return getattr(transformers, cls_name).from_pretrained(d, attn_implementation=impl).eval()


def random_batch(V: int, T: int, lengths: tuple[int, ...], seed: int = 1, pad: int = 0,
                 low: int = 5) -> dict[str, torch.Tensor]:
    """Random ids in [low, V) of mixed lengths, right-padded with ``pad`` (attention_mask 0 after each
    length)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(low, V, (len(lengths), T), generator=g)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids[mask == 0] = pad
    return {"input_ids": ids, "attention_mask": mask}


def encode(fast: Any, texts: list[str]) -> dict[str, torch.Tensor]:
    """The texts as the released tokenizer frames them, right-padded with its padding token."""
    enc = fast(texts, padding=True, return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


class Graph(nn.Module):
    """One output of a model as a graph of (input_ids, attention_mask)."""

    def __init__(self, model: nn.Module, fn: Any) -> None:
        super().__init__()
        self.model, self.fn = model, fn

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.fn(self.model, input_ids, attention_mask)


def fused_graph(tmp: Path, graph: nn.Module, cfg: ModelConfig, dummy: dict[str, torch.Tensor], *,
                per_token: bool
                ) -> tuple[Any, dict[str, int]]:
    """``graph`` exported as `mlmkit export` exports it (eager attention, the TorchScript exporter,
    opset 17, dynamic batch and sequence) and fused by onnxruntime's BERT optimizer, held to the
    family's declared fusions (exporter/passes.py's fuse raises short of them). Returns the session and
    the fused operator counts."""
    core.set_attention_impl(graph, "eager")
    plain, fused = tmp / "plain.onnx", tmp / "fused.onnx"
    export_logits(graph, dummy, plain, per_token=per_token)
    core.set_attention_impl(graph, "sdpa")
    counts = fuse(plain, fused, cfg)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(fused), opts, providers=["CPUExecutionProvider"]), counts


def run(session: Any, x: dict[str, torch.Tensor]) -> np.ndarray:
    return session.run(None, {k: v.numpy() for k, v in x.items()})[0]


def cli_export(src: Path, out: Path) -> dict[str, Any]:
    """`mlmkit export SRC --out OUT --json`'s mlmkit.json (the special tokens' roles read from the
    checkpoint's tokenizer_config.json)."""
    r = runner.invoke(app, ["export", str(src), "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    return json.loads((out / "mlmkit.json").read_text())


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


def sentence_transformers_bundle(tmp: Path, hf: Path, pooling: str,
                                 dense: tuple[int, ...] = ()) -> tuple[Any, Path]:
    """A sentence-transformers directory of the transformers model ``hf`` (``pooling``, Dense layers
    without bias to ``dense``'s sizes and back, as EmbeddingGemma's, then Normalize), and `mlmkit
    export` of it. Returns (the SentenceTransformer, the bundle)."""
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as st_models

    torch.manual_seed(0)
    body = st_models.Transformer(str(hf))
    H = body.get_embedding_dimension()
    sizes = [H, *dense, H] if dense else []
    layers = [st_models.Dense(a, b, bias=False, activation_function=nn.Identity())
              for a, b in zip(sizes, sizes[1:])]
    st = SentenceTransformer(modules=[body, st_models.Pooling(H, pooling_mode=pooling), *layers,
                                      st_models.Normalize()])
    st.save(str(tmp / "st"))
    meta = cli_export(tmp / "st", tmp / "bundle")
    assert (meta["task"] == "embedding" and meta["options"]["pooling"] == pooling
            and meta["options"]["normalize"]), meta["options"]
    return st, tmp / "bundle"


def bundle_embeddings(bundle: Path, texts: list[str]) -> np.ndarray:
    from mlmkit.runtime.pipeline import Pipeline

    return np.array([r["embedding"] if isinstance(r, dict) else r for r in Pipeline.load(bundle)(texts)])
