"""Every model family as a classifier: mlmkit bundles vs transformers pipelines vs optimum-onnx (O3, and its
int8).

    python benchmarks/families.py --work /tmp/bench_fam           # the full run (12-14 minutes on 2 cores, 1
                                                                  # of them setup)
    python benchmarks/families.py --work /tmp/bench_fam --quick   # 256 sentences, 1 round, no transformers
                                                                  # long-input reference
    python benchmarks/families.py --work /tmp/bench_fam --only-long   # the ModernBERT long inputs alone

A full run measured 14 minutes on 2 cores with some foreign load (setup 1, throughput 11, long inputs 2;
setup is reused by later runs in the same --work); --long-reference no saves about a minute,
--rounds 2 about three.

Models: for each family (bert, roberta, xlm-roberta, distilbert, electra, modernbert, deberta-v3) a
MiniLM-sized
ForSequenceClassification checkpoint with 2 labels and random weights (speed does not depend on
them), saved by transformers: 6 layers, hidden 384, 12 heads, intermediate 1536; ELECTRA with its
factorised embeddings (embedding_size 128, projected to 384, as ELECTRA-small); ModernBERT with its
own sizing, a GeGLU MLP of intermediate 576 (1.5 x hidden, as ModernBERT-base's 1152 for 768; Wi is
384 -> 1152), a 128-token sliding window and every third layer global, max_position_embeddings 8192;
DeBERTa-v3 with its disentangled relative attention (256 position buckets, c2p and p2c, shared keys,
no absolute positions or token types: the slowest family, with no fused attention in onnxruntime).
Each has a tokenizer of its family's kind, trained here with the `tokenizers` library on generated
sentences: WordPiece (bert, distilbert, electra), byte-level BPE with RoBERTa's specials (roberta),
SentencePiece-style Unigram (xlm-roberta; deberta-v3 with BERT's specials), byte-level BPE with BERT's
specials (modernbert); 4,096
tokens. Sentences: 8-40 words drawn (by frequency) from the 4,000 commonest words of the docstrings
of Python's standard library; 1,024 of them are timed (another seed's 20,000 train the tokenizers).

Five sides per family, each in its own worker process (torch and onnxruntime in one process slow
each other down, docs/performance.md), loaded and warmed up once, batch 32, 2 threads, max length 512:
- mlmkit: the bundle of ``mlmkit export CHECKPOINT --out BUNDLE`` (the Python API), run by
  ``mlmkit.runtime.pipeline.Pipeline.load(bundle, threads=2, batch_size=32)`` over the texts (its cuts:
  by length, count, padded tokens and least cost);
- mlmkit-int8: the same with ``--quantize int8`` (dynamic), its labels' agreement with fp32 printed
  (random weights: for information only);
- transformers: ``pipeline("text-classification", model=CHECKPOINT)`` with torch at 2 threads,
  ``batch_size=32, truncation=True``: its own batches, in input order, each padded to its longest
  (the pipeline's documented use);
- optimum: optimum-onnx itself (0.1.0, in a venv of its own: it needs transformers < 4.58, this project
  runs 5): ``ORTModelForSequenceClassification.from_pretrained(CHECKPOINT, export=True)``, then
  ``ORTOptimizer`` at O3 (its highest level for a CPU; O4 is fp16, for GPUs), run by ORTModel with 2
  threads and the checkpoint's tokenizer on mlmkit's own cuts of the texts (common.mlmkit_cuts), so
  both sides pad and batch alike;
- optimum-int8: ``ORTQuantizer``'s dynamic int8 (avx512_vnni, per channel) of optimum's plain export,
  as its quantization guide does it (its O3 graph does not quantize: compression.py), on the same cuts.
Until 2026-12-04 this compared an "optimum-equivalent" stand-in (the transformers module exported with
SDPA attention, which defeats onnxruntime's fusions, fed batches in file order); it is gone.

Each pass first waits (up to --patience seconds) for other processes to leave the CPUs alone; the
CPU time other processes took during each pass is measured (/proc/stat), and passes where it
exceeded 0.15 cores are marked and left out of the figures whenever quiet ones exist. Within a
family the sides run back to back, the direction reversed each round; a ratio is the median over
the quiet rounds of the back-to-back ratios.

Then ModernBERT on long inputs: the same ModernBERT classifier bundle (its tokenizer's
model_max_length and the config's max_position_embeddings are 8192, so the bundle's max length is
8192) on a batch of one text of 512, 2,048 and 8,192 tokens, the median of 3 runs each after a
warm-up run; the transformers ModernBertForSequenceClassification (default attention) likewise, for
reference (not with --quick).

The script ends with ``target family-classify-vs-transformers-min: X.XX (goal >= 3.00)`` and
``target family-classify-vs-optimum-min: X.XX (goal >= 1.30)`` and
``target family-int8-vs-optimum-int8-min: X.XX (goal >= 1.00)``, minima over the families.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import time
import traceback
from pathlib import Path
from typing import Any

from common import (
    MINILM,
    QUIET,
    agreement,
    answer_passes,
    bench_env,
    encoder_flops,
    log,
    made_by,
    mark,
    median_speeds,
    mlmkit_cuts,
    noisy_note,
    passes,
    print_machine,
    quiet_median,
    race,
    ratio,
    setup_step,
    share,
    spread,
    stdlib_sentences,
    target,
    thread_env,
    timed,
    transformers_pipeline,
    workers,
)
from harness import parser, peers_python

HERE = Path(__file__).resolve()
# over common.ENV
ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error", **thread_env(2)}
VOCAB = 4096
MAX_LENGTH = 512
LONG_MAX = 8192
LONG_LENGTHS = (512, 2048, 8192)
LABELS = {0: "neg", 1: "pos"}
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
# family -> (transformers class prefix, tokenizer kind, config keywords, inputs of optimum's ONNX config)
FAMILIES: dict[str, tuple[str, str, dict[str, Any], tuple[str, ...]]] = {
    "bert": ("Bert", "wordpiece", dict(MINILM, max_position_embeddings=512),
             ("input_ids", "attention_mask", "token_type_ids")),
    "roberta": ("Roberta", "bpe",
                dict(MINILM, max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5),
                ("input_ids", "attention_mask")),
    "xlm-roberta": ("XLMRoberta", "unigram",
                    dict(MINILM, max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5),
                    ("input_ids", "attention_mask")),
    "distilbert": ("DistilBert", "wordpiece",
                   dict(dim=384, n_layers=6, n_heads=12, hidden_dim=1536, max_position_embeddings=512),
                   ("input_ids", "attention_mask")),
    "electra": ("Electra", "wordpiece", dict(MINILM, embedding_size=128, max_position_embeddings=512),
                ("input_ids", "attention_mask", "token_type_ids")),
    "modernbert": ("ModernBert", "bpe-bert",
                   dict(MINILM, intermediate_size=576, max_position_embeddings=LONG_MAX,
                                                  local_attention=128),
                   ("input_ids", "attention_mask")),
    # DeBERTa-v3 (deberta-v2 in transformers): disentangled relative attention, no absolute positions,
    # no token types, SentencePiece with BERT's specials, as microsoft/deberta-v3-* are
    "deberta-v3": ("DebertaV2", "unigram-bert", dict(MINILM, max_position_embeddings=512, type_vocab_size=0,
                                                     relative_attention=True, position_buckets=256,
                                                     max_relative_positions=-1,
                                                     pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm",
                                                     share_att_key=True, position_biased_input=False,
                                                     layer_norm_eps=1e-7),
                   ("input_ids", "attention_mask")),
}
SIDES = ("transformers", "mlmkit", "optimum", "mlmkit-int8", "optimum-int8")  # compared pairs back to back
OPTIMUM = ["optimum-onnx[onnxruntime]==0.1.0", "transformers==4.57.6", "huggingface-hub==0.36.2"]
"""optimum-onnx's venv (harness.peers_python): the versions compression.py's peers resolved to on 2026-12-03.
"""
GOT = {  # what each side gets besides 2 threads, batch 32 and max length 512, which all share
    "mlmkit": "fp32; mlmkit's cuts", "mlmkit-int8": "int8 dynamic; mlmkit's cuts",
    "transformers": "fp32 (torch); the pipeline's batches, in input order, padded to the longest",
    "optimum": "fp32, optimum-onnx O3; mlmkit's cuts",
       "optimum-int8": "int8 dynamic (ORTQuantizer, avx512_vnni); mlmkit's cuts",
}


# ---- data ---------------------------------------------------------------------------------------
def word_list(n: int = 4000) -> tuple[list[str], list[int]]:
    """The ``n`` commonest alphabetic words of the standard library's docstrings, with their counts."""
    from collections import Counter

    c = Counter(w for s in stdlib_sentences() for w in s.split() if w.isalpha())
    common = c.most_common(n)
    return [w for w, _ in common], [k for _, k in common]


def make_sentences(words: list[str], weights: list[int], n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(words, weights, k=rng.randint(8, 40))) for _ in range(n)]


def family_tokenizer(kind: str, texts: list[str], max_length: int) -> Any:
    """A transformers fast tokenizer of the family's kind around a `tokenizers` model trained on ``texts``."""
    import transformers
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

    if kind == "wordpiece":
        specials = BERT_SPECIALS
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        tok.train_from_iterator(texts,
                                trainers.WordPieceTrainer(vocab_size=VOCAB, special_tokens=specials,
                                                          min_frequency=1))
    elif kind in ("bpe", "bpe-bert"):
        specials = ROBERTA_SPECIALS if kind == "bpe" else BERT_SPECIALS
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials, min_frequency=1,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(texts, trainer)
    else:  # unigram, SentencePiece style (XLM-R's specials; DeBERTa-v3's are BERT's)
        specials = ROBERTA_SPECIALS if kind == "unigram" else BERT_SPECIALS
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        tok.train_from_iterator(texts, trainers.UnigramTrainer(vocab_size=VOCAB, special_tokens=specials,
                                                               unk_token=specials[3] if kind == "unigram"
                                                               else "[UNK]"))
    if specials is ROBERTA_SPECIALS:
        tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
        tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")),
                                                          ("<s>", tok.token_to_id("<s>")))
        names = dict(bos_token="<s>", eos_token="</s>", cls_token="<s>", sep_token="</s>", pad_token="<pad>",
                     unk_token="<unk>",
                     mask_token="<mask>")
    else:
        tok.add_special_tokens(["[MASK]"])
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
            special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
        names = dict(cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]",
                     mask_token="[MASK]")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=max_length, **names)


def save_checkpoint(d: Path, family: str, texts: list[str]) -> Any:
    """A randomly initialised ForSequenceClassification of ``family`` saved as transformers saves it."""
    import torch
    import transformers

    prefix, kind, kw, _ = FAMILIES[family]
    fast = family_tokenizer(kind, texts, LONG_MAX if family == "modernbert" else MAX_LENGTH)
    ids = {"pad_token_id": fast.pad_token_id}
    if family != "distilbert":
        ids.update(bos_token_id=fast.cls_token_id, eos_token_id=fast.sep_token_id)
    if family == "modernbert":
        ids.update(cls_token_id=fast.cls_token_id, sep_token_id=fast.sep_token_id)
    cfg = getattr(transformers, f"{prefix}Config")(vocab_size=len(fast), id2label=LABELS,
                                                   label2id={v: k for k, v in LABELS.items()},
                                                   **kw, **ids)
    torch.manual_seed(0)
    model = getattr(transformers, f"{prefix}ForSequenceClassification")(cfg).eval()
    model.save_pretrained(d)
    fast.save_pretrained(d)
    return model


# ---- optimum-onnx (its own venv) ----------------------------------------------------------------
def optimum_setup(d: Path) -> None:
    """In optimum's venv: the checkpoint exported by optimum-onnx, optimised at O3, and the plain export
    quantized to dynamic int8; optimum.json says what O3 fused, optimum-error.txt (and
    optimum-int8-error.txt) why a step failed."""
    from collections import Counter

    import onnx
    from optimum.onnxruntime import ORTModelForSequenceClassification, ORTOptimizer, ORTQuantizer
    from optimum.onnxruntime.configuration import AutoOptimizationConfig, AutoQuantizationConfig

    tok = v4_tokenizer(d / "checkpoint")
    try:
        model = ORTModelForSequenceClassification.from_pretrained(d / "checkpoint", export=True)
        model.save_pretrained(d / "optimum-export")
        ORTOptimizer.from_pretrained(model).optimize(save_dir=d / "optimum-o3",
                                                     optimization_config=AutoOptimizationConfig.O3())
        tok.save_pretrained(d / "optimum-o3")
        ops = Counter(n.op_type
                      for n in onnx.load(str(d / "optimum-o3" / "model_optimized.onnx"),
                                         load_external_data=False).graph.node)
        fused = {k: v for k, v in ops.items()
                 if k in ("Attention", "MultiHeadAttention", "EmbedLayerNormalization",
                                                       "SkipLayerNormalization", "LayerNormalization",
                          "BiasGelu", "FastGelu", "Gelu")}
        (d / "optimum.json").write_text(json.dumps({"optimization": "O3", "fused_operators": fused}))
    except Exception as e:  # noqa: BLE001 - reported, the other sides go on
        (d / "optimum-error.txt").write_text(f"{type(e).__name__}: {e}\n" + traceback.format_exc())
        return
    try:
        q = ORTQuantizer.from_pretrained(d / "optimum-export", file_name="model.onnx")
        q.quantize(save_dir=d / "optimum-int8",
                   quantization_config=AutoQuantizationConfig.avx512_vnni(is_static=False, per_channel=True))
        tok.save_pretrained(d / "optimum-int8")
    except Exception as e:  # noqa: BLE001
        (d / "optimum-int8-error.txt").write_text(f"{type(e).__name__}: {e}\n" + traceback.format_exc())


def v4_tokenizer(ckpt: Path) -> Any:
    """The checkpoint's tokenizer.json as transformers 4 (optimum's venv) reads it: transformers 5 names its
    tokenizer class TokenizersBackend, which 4 does not know; the padding token from config.json."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    pad = json.loads((ckpt / "config.json").read_text())["pad_token_id"]
    return PreTrainedTokenizerFast(tokenizer_file=str(ckpt / "tokenizer.json"), pad_token=Tokenizer.from_file(
        str(ckpt / "tokenizer.json")).id_to_token(pad),
                                   model_max_length=LONG_MAX if ckpt.parent.name == "modernbert"
                                   else MAX_LENGTH)


def checkpoint_tokenizer(ckpt: Path, max_length: int) -> Any:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    tok.enable_truncation(max_length)
    return tok


def write_cuts(d: Path, texts: list[str]) -> None:
    """cuts.json: mlmkit's batches of ``texts`` (their token lengths by the checkpoint's tokenizer), for
    the optimum sides, whose venv has no mlmkit."""
    tok = checkpoint_tokenizer(d / "checkpoint", MAX_LENGTH if d.name != "modernbert" else LONG_MAX)
    lengths = [len(e.ids) for e in tok.encode_batch(texts)]
    (d / "cuts.json").write_text(json.dumps({"n": len(texts),
                                             "batches": mlmkit_cuts(lengths, 32, MINILM["hidden_size"])}))


# ---- setup (torch, onnxruntime; untimed) -----------------------------------------------------------
def useful_per_text(ckpt: Path, texts: list[str]) -> float:
    """The mean useful FLOPs of one of ``texts`` through ``ckpt`` (common.encoder_flops), as its tokenizer
    cuts them."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    tok.enable_truncation(MAX_LENGTH)
    return encoder_flops(ckpt, [len(e.ids) for e in tok.encode_batch(texts)]) / len(texts)


def setup(work: Path, families: list[str], n_sentences: int) -> None:
    """Sentences, and for each family a checkpoint, its mlmkit bundles and optimum-onnx's graphs (made in
    optimum's venv), written once into ``work`` (reused while a family's setup.json matches)."""
    import torch

    torch.set_num_threads(2)
    if not (work / "words.json").exists():
        work.mkdir(parents=True, exist_ok=True)
        words, weights = word_list()
        (work / "words.json").write_text(json.dumps({"words": words, "weights": weights}))
    w = json.loads((work / "words.json").read_text())
    sents = work / f"sentences-{n_sentences}.json"
    if not sents.exists():
        sents.write_text(json.dumps(make_sentences(w["words"], w["weights"], n_sentences, seed=0)))
    train = None
    for fam in families:
        d = work / fam
        stamp = made_by(HERE, family=fam, optimum=OPTIMUM)  # the code that makes it, too
        if (d / "setup.json").exists() and json.loads((d / "setup.json").read_text()) == stamp:
            log(f"setup {fam}: reusing {d}")
            continue
        t0 = time.perf_counter()
        train = train or make_sentences(w["words"], w["weights"], 20_000, seed=1)
        d.mkdir(parents=True, exist_ok=True)
        for f in ("export-error.txt", "optimum-error.txt", "optimum-int8-error.txt", "optimum.json"):
            (d / f).unlink(missing_ok=True)
        save_checkpoint(d / "checkpoint", fam, train)
        t1 = time.perf_counter()
        from mlmkit.args import ExportArgs
        from mlmkit.exporter.bundle import export

        try:
            m = export(ExportArgs(run=d / "checkpoint", out=d / "bundle"))
            log(f"setup {fam}: bundle max_length {m.max_length}, fused {m.fused_operators}, "
                f"parity {max(m.parity['max_abs_diff'].values()):.1e} ({time.perf_counter() - t1:.0f}s)")
        except Exception as e:  # noqa: BLE001 - reported, the other families go on
            (d / "export-error.txt").write_text(f"{type(e).__name__}: {e}\n" + traceback.format_exc())
            log(f"setup {fam}: mlmkit export FAILED: {type(e).__name__}: {e}")
        setup_int8(d, fam)
        t1 = time.perf_counter()
        r = subprocess.run([peers_python(work / "optimum-venv", OPTIMUM), str(HERE), "--role",
                            "optimum-setup", "--family", fam,
                            "--work", str(work)], capture_output=True, text=True, env=bench_env(**ENV))
        if r.returncode and not (d / "optimum-error.txt").exists():
            (d / "optimum-error.txt").write_text("the setup process exited "
                                                 f"{r.returncode}\n{r.stderr[-3000:]}")
        for f in ("optimum-error.txt", "optimum-int8-error.txt"):
            if (d / f).exists():
                log(f"setup {fam}: {f.removesuffix('-error.txt')} FAILED: "
                    f"{(d / f).read_text().splitlines()[0]}")
        if (d / "optimum.json").exists():
            log(f"setup {fam}: optimum-onnx O3 fused "
                f"{json.loads((d / 'optimum.json').read_text())['fused_operators']} "
                f"({time.perf_counter() - t1:.0f}s)")
        (d / "setup.json").write_text(json.dumps(stamp))
        log(f"setup {fam}: done in {time.perf_counter() - t0:.0f}s")


def setup_int8(d: Path, fam: str) -> None:
    """The family's int8 bundle (dynamic, as `mlmkit export --quantize int8`), or int8-error.txt saying why
    not."""
    from mlmkit.args import ExportArgs
    from mlmkit.exporter.bundle import export

    (d / "int8-error.txt").unlink(missing_ok=True)
    try:
        q = export(ExportArgs(run=d / "checkpoint", out=d / "bundle-int8", quantize="int8"))
        log(f"setup {fam}: int8 bundle, top-1 agreement with fp32 on the sample batch "
            f"{q.parity['int8_top1_agreement_vs_fp32']:.3f}")
    except Exception as e:  # noqa: BLE001 - reported, the fp32 sides go on
        (d / "int8-error.txt").write_text(f"{type(e).__name__}: {e}\n" + traceback.format_exc())
        log(f"setup {fam}: mlmkit int8 export FAILED: {type(e).__name__}: {e}")


# ---- the sides (each in its own process) -----------------------------------------------------------
def _mlmkit(d: Path, threads: int, batch_size: int, bundle: str = "bundle"):
    from mlmkit.runtime.pipeline import Pipeline

    pipe = Pipeline.load(d / bundle, threads=threads, batch_size=batch_size)
    return lambda texts: [[r["label"], r["probabilities"]["pos"]] for r in pipe(texts)]


def _mlmkit_int8(d: Path, threads: int, batch_size: int):
    return _mlmkit(d, threads, batch_size, bundle="bundle-int8")


def _transformers(d: Path, threads: int, batch_size: int):
    import torch

    pipe = transformers_pipeline("text-classification", d / "checkpoint", threads, top_k=None)

    def run(texts: list[str]) -> list[list[Any]]:
        with torch.inference_mode():
            out = pipe(texts, batch_size=batch_size, truncation=True)
        return [[max(r, key=lambda x: x["score"])["label"],
                 next(x["score"] for x in r if x["label"] == "pos")] for r in out]

    return run


def _optimum(d: Path, threads: int, batch_size: int, which: str = "o3"):
    """optimum-onnx's ORTModel (in its venv) on mlmkit's cuts of the texts (cuts.json)."""
    import onnxruntime as ort
    import torch
    from optimum.onnxruntime import ORTModelForSequenceClassification
    from transformers import AutoTokenizer

    torch.set_num_threads(threads)
    sub, name = ("optimum-o3", "model_optimized.onnx") if which == "o3" else ("optimum-int8",
                                                                              "model_quantized.onnx")
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    model = ORTModelForSequenceClassification.from_pretrained(d / sub, file_name=name, session_options=so)
    tok = AutoTokenizer.from_pretrained(d / sub)
    cuts = json.loads((d / "cuts.json").read_text())
    longest = MAX_LENGTH if d.name != "modernbert" else LONG_MAX

    def run(texts: list[str]) -> list[list[Any]]:
        if len(texts) == cuts["n"]:
            batches = cuts["batches"]
        else:  # the warm-up
            batches = [list(range(a, min(a + batch_size, len(texts))))
                       for a in range(0, len(texts), batch_size)]
        preds: list[Any] = [None] * len(texts)
        for b in batches:
            enc = tok([texts[i] for i in b], padding=True, truncation=True, max_length=longest,
                      return_tensors="pt")
            with torch.inference_mode():
                p = model(**enc).logits.softmax(-1)
            for i, row in zip(b, p.tolist()):
                preds[i] = [LABELS[int(max(range(len(row)), key=row.__getitem__))], float(row[1])]
        return preds

    return run


def _optimum_int8(d: Path, threads: int, batch_size: int):
    return _optimum(d, threads, batch_size, "int8")


_SIDES = {"mlmkit": _mlmkit, "transformers": _transformers, "optimum": _optimum, "mlmkit-int8": _mlmkit_int8,
          "optimum-int8": _optimum_int8}


def serve_side(side: str, d: Path, texts: list[str], threads: int, batch_size: int) -> None:
    """A worker: load, warm up, then one timed pass over all texts per "run" line on stdin, each
    answered with a JSON line {"time", "cpu", "n", "preds"} on stdout."""
    run = _SIDES[side](d, threads, batch_size)
    run(texts[: batch_size * 2])  # warm-up: sessions, kernels, caches
    answer_passes({"ready": side}, lambda _: {"n": len(texts), "preds": run(texts)})


def long_texts(d: Path, work: Path) -> dict[int, str]:
    """One text of exactly N tokens (with [CLS] and [SEP]) for each of LONG_LENGTHS, by the checkpoint's
    tokenizer."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(d / "checkpoint" / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    w = json.loads((work / "words.json").read_text())
    rng = random.Random(2)
    words = rng.choices(w["words"], w["weights"], k=int(LONG_MAX * 1.2))
    one = next(x for x in w["words"] if len(tok.encode(f"the {x} the").ids) == len(tok.encode("the the").ids)
               + 1)
    out = {}
    for n in LONG_LENGTHS:
        lo, hi = 1, len(words)  # the most words that stay within n tokens
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(tok.encode(" ".join(words[:mid])).ids) <= n:
                lo = mid
            else:
                hi = mid - 1
        text = " ".join(words[:lo])
        text += f" {one}" * (n - len(tok.encode(text).ids))  # one token each
        out[n] = text
    return out


def serve_long(side: str, d: Path, work: Path, threads: int) -> None:
    """A worker for the long inputs: "run N" times one batch of the text of N tokens."""
    texts = long_texts(d, work)
    if side == "mlmkit":
        from mlmkit.runtime.pipeline import Pipeline

        pipe = Pipeline.load(d / "bundle", threads=threads, batch_size=1)
        tokens = {n: len(pipe.tokenizer.encode(t).ids) for n, t in texts.items()}

        def run(text: str) -> Any:
            return pipe([text])[0]["label"]
    else:
        import torch
        import transformers

        torch.set_num_threads(threads)
        tok = transformers.AutoTokenizer.from_pretrained(d / "checkpoint")
        model = transformers.AutoModelForSequenceClassification.from_pretrained(d / "checkpoint").eval()
        tokens = {n: len(tok(t).input_ids) for n, t in texts.items()}

        def run(text: str) -> Any:
            with torch.inference_mode():
                return int(model(**tok([text], return_tensors="pt", truncation=True)).logits.argmax())
    answer_passes({"ready": side, "tokens": tokens,
                   "attention": None if side == "mlmkit" else model.config._attn_implementation},
                  lambda args: {"label": run(texts[int(args[0])])})


# ---- the driver ----------------------------------------------------------------------------------
def bench_family(fam: str, a: argparse.Namespace, common: list[str], rounds: int) -> dict[str, Any]:
    d = a.work / fam
    sides = [s for s in SIDES if not (s.startswith("mlmkit") and (d / "export-error.txt").exists())
             and not (s == "mlmkit-int8" and (d / "int8-error.txt").exists())
             and not (s.startswith("optimum") and (d / "optimum-error.txt").exists())
             and not (s == "optimum-int8" and (d / "optimum-int8-error.txt").exists())]
    n = a.sentences or (256 if a.quick else 1024)
    write_cuts(d, json.loads((a.work / f"sentences-{n}.json").read_text()))
    args = {s: ["--role", "side", "--side", s, "--family", fam, *common] for s in sides}
    py = peers_python(a.work / "optimum-venv", OPTIMUM)
    with workers(HERE, args, ENV, pythons={s: py for s in sides if s.startswith("optimum")}) as ws:
        return race(ws, rounds, a.patience, label=f"{fam} ")


def bench_long(a: argparse.Namespace, common: list[str], sides: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for s in sides:
        try:
            with workers(HERE, {s: ["--role", "long", "--side", s, "--family", "modernbert", *common]},
                         ENV) as ws:
                w = ws[s]
                times: dict[int, list[float]] = {}
                others: dict[int, list[float]] = {}
                for n in LONG_LENGTHS:
                    warm, other = timed(w, a.patience, f"run {n}")  # warm-up at this length
                    if warm["time"] > a.long_budget:
                        log(f"long {s}: the warm-up at {n} tokens took {warm['time']:.0f}s, more than "
                            f"--long-budget {a.long_budget:.0f}s: that run only")
                        times[n], others[n] = [warm["time"]], [other]
                        break
                    times[n], others[n] = [], []
                    for _ in range(3):
                        res, other = timed(w, a.patience, f"run {n}")
                        times[n].append(res["time"])
                        others[n].append(other)
                    log(f"long {s} {n:5d} tokens: "
                        + ", ".join(f"{t:.3f}s" + mark(o) for t, o in zip(times[n], others[n])))
                out[s] = {"tokens": w.ready["tokens"], "attention": w.ready.get("attention"), "times": times,
                          "others": others}
        except RuntimeError as e:
            out[s] = {"error": str(e)}
    return out


def report_long(long: dict[str, Any], threads: int) -> None:
    """The long-input table of bench_long's results (adds each side's medians to ``long``)."""
    if not long:
        return
    print(f"\nModernBERT classifier, long inputs (both sides fp32, {threads} threads, batch of 1, max length "
          f"{LONG_MAX}; "
          "seconds, median of the quiet ones of 3 runs after a warm-up, one side's runs after the other's; * "
          "= no quiet run):")
    for s, r in long.items():
        if "error" in r:
            print(f"  {s}: failed: {r['error']}")
            continue
        name = ("mlmkit bundle" if s == "mlmkit"
                else f"transformers ModernBertForSequenceClassification ({r['attention']})")
        med = {k: quiet_median(v, r["others"][k]) for k, v in r["times"].items()}
        long[s]["median"] = med
        cells = ", ".join(f"{k} tokens ({r['tokens'][str(k)]}) {med[k]:.3f}s"
                          + ("*" if all(o > QUIET for o in r["others"][k]) else "")
                          + ("" if len(r["times"][k]) == 3 else " (1 run)") for k in med)
        print(f"  {name}: {cells}")
        tag = "modernbert-classify" if s == "mlmkit" else "transformers-modernbert-classify"
        for lo, hi in zip(LONG_LENGTHS, LONG_LENGTHS[1:]):
            if lo in med and hi in med:
                print(f"  {tag}-{hi}-vs-{lo}: {med[hi] / med[lo]:.2f} (quadratic would be "
                      f"{(hi / lo) ** 2:.2f})")
    if all(s in long and "error" not in long[s] for s in ("mlmkit", "transformers")):
        m, t = long["mlmkit"]["median"], long["transformers"]["median"]
        print("  mlmkit vs transformers (time ratio of the medians, for information): "
              + ", ".join(f"{k} tokens {t[k] / m[k]:.2f}x" for k in m if k in t))


def parse_args() -> tuple[argparse.Namespace, int, list[str]]:
    """The command line, checked: the arguments, the sentences timed per pass and the families to run."""
    ap = parser(__doc__, work="runs/bench-families",
                quick="256 sentences, 1 round, no transformers long-input reference",
                work_help="where checkpoints, bundles, graphs and data are written (reused between runs)",
                rounds=(3, 1), rounds_help="timed passes per side, alternating", patience=60.0, threads=2,
                batch_size=32, role=True)
    ap.add_argument("--families", default=",".join(FAMILIES),
                    help="comma-separated, of: " + ", ".join(FAMILIES))
    ap.add_argument("--sentences", type=int, default=None,
                    help="texts timed per pass (default 1024, --quick 256)")
    ap.add_argument("--no-long", action="store_true", help="skip the ModernBERT long-input timings")
    ap.add_argument("--only-long", action="store_true",
                    help="the ModernBERT long-input timings alone: setup of "
                    "modernbert only (reused when there), no throughput passes")
    ap.add_argument("--long-reference", choices=("auto", "yes", "no"), default="auto",
                    help="time transformers' ModernBERT on the long inputs too (auto: not with --quick)")
    ap.add_argument("--long-budget", type=float, default=90.0,
                    help="seconds: when a side's warm-up run at a length "
                    "takes longer, it is not repeated and longer ones are skipped")
    ap.add_argument("--side", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--family", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    n = a.sentences or (256 if a.quick else 1024)
    families = [f.strip() for f in a.families.split(",") if f.strip()]
    if a.only_long:
        if a.no_long or "modernbert" not in families:
            ap.error("--only-long times ModernBERT's long inputs: not with --no-long, "
                     "and --families must include modernbert")
        families = ["modernbert"]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        ap.error(f"unknown families {unknown}; choose from {', '.join(FAMILIES)}")
    return a, n, families


def long_sides_of(a: argparse.Namespace, families: list[str]) -> list[str]:
    """The sides timed on ModernBERT's long inputs: none, mlmkit, or mlmkit and the transformers reference."""
    return [] if a.no_long or "modernbert" not in families else (
        ["mlmkit"] + (["transformers"] if a.long_reference == "yes"
                      or (a.long_reference == "auto" and not a.quick) else []))


def print_plan(a: argparse.Namespace, families: list[str], n: int, rounds: int,
               long_sides: list[str]) -> None:
    """The opening line: what this run will time, and where its work directory is."""
    if a.only_long:
        print("families.py --only-long: the ModernBERT classifier on long inputs "
              f"({', '.join(map(str, LONG_LENGTHS))} tokens, "
              f"batch 1, {a.threads} threads, median of 3 after a warm-up): {', '.join(long_sides)}.  Work "
              f"directory: {a.work}", flush=True)
    else:
        print(f"families.py: {', '.join(families)}; each a MiniLM-sized random ForSequenceClassification (2 "
              "labels) saved by "
              f"transformers;\n  {n} sentences of 8-40 words, batch {a.batch_size}, {a.threads} threads, "
              f"{rounds} alternating "
              "round(s) of mlmkit bundle (fp32, int8) / transformers pipeline / optimum-onnx O3 (and its "
              "int8), each side in its own "
              f"process;\n  then ModernBERT long inputs ({', '.join(map(str, LONG_LENGTHS))} tokens, batch "
              "1, median of 3 after a "
              f"warm-up): {', '.join(long_sides) or 'skipped'}.  Work directory: {a.work}", flush=True)


def bench_families(a: argparse.Namespace, families: list[str], common: list[str],
                   rounds: int) -> dict[str, dict[str, Any]]:
    """The throughput races of every family (none with --only-long); a family that fails gets its error."""
    results: dict[str, dict[str, Any]] = {}
    for fam in [] if a.only_long else families:
        try:
            results[fam] = bench_family(fam, a, common, rounds)
        except RuntimeError as e:
            log(f"{fam}: {e}")
            results[fam] = {"error": str(e)}
    return results


def speed_cell(speed: dict[str, float], s: str, width: int) -> str:
    """Side ``s``'s median speed in ``width`` characters, or 'failed' when it has none."""
    return f"{speed[s]:{width}.1f}" if s in speed else f"{'failed':>{width}s}"


def ratio_cell(x: float | None, width: int) -> str:
    """A ratio as ``1.23x`` in ``width`` characters, or '-' when there is none."""
    return f"{x:{width - 1}.2f}x" if x is not None else f"{'-':>{width}s}"


def print_fusions(d: Path) -> None:
    """What the mlmkit export and the optimum-equivalent fused in family directory ``d``, or why they failed.
    """
    if (d / "export-error.txt").exists():
        print(f"      mlmkit export failed: {(d / 'export-error.txt').read_text().splitlines()[0]}")
    else:
        m = json.loads((d / "bundle" / "mlmkit.json").read_text())
        print(f"      mlmkit fused: {m['fused_operators']}")
    for f in ("optimum-error.txt", "optimum-int8-error.txt"):
        if (d / f).exists():
            print(f"      {f.removesuffix('-error.txt')} failed: {(d / f).read_text().splitlines()[0]}")
    if (d / "optimum.json").exists():
        print("      optimum-onnx O3 fused: "
              f"{json.loads((d / 'optimum.json').read_text())['fused_operators']}")


def print_agreement(p: dict[str, Any]) -> None:
    """mlmkit's labels and p(pos) against each other side's (nothing when no pair of sides answered)."""
    checks = []
    for other in ("transformers", "optimum"):
        if "mlmkit" in p and other in p:
            same = agreement(p["mlmkit"], p[other])
            diff = max(abs(x[1] - y[1]) for x, y in zip(p["mlmkit"], p[other]))
            checks.append(f"vs {other}: labels {same:.4f} equal, max |p(pos) diff| {diff:.1e}")
    if checks:
        print(f"      mlmkit {'; '.join(checks)}")


def print_int8(res: dict[str, Any], speed: dict[str, float]) -> None:
    """The int8 bundle against the fp32 one: speed, and labels equal (random weights: for information only).
    """
    p = res["preds"]
    if "mlmkit-int8" not in speed or "mlmkit" not in speed:
        return
    vs = (f"; {ratio(res, 'mlmkit-int8', 'optimum-int8'):.2f}x optimum-onnx's int8 "
          f"({spread(res, 'mlmkit-int8', 'optimum-int8')}, "
          f"{speed['optimum-int8']:.1f} sentences/s)" if "optimum-int8" in speed else "")
    print(f"      int8: {speed['mlmkit-int8']:.1f} sentences/s, {ratio(res, 'mlmkit-int8', 'mlmkit'):.2f}x "
          f"fp32 ({spread(res, 'mlmkit-int8', 'mlmkit')}){vs}; labels "
          f"{agreement(p['mlmkit-int8'], p['mlmkit']):.4f} equal (random weights: for information only)")


def report_family(fam: str, res: dict[str, Any], work: Path, n: int,
                  ceiling: dict[str, Any]) -> tuple[float | None, float | None]:
    """One family's row of the throughput table and its detail lines; returns mlmkit vs transformers and vs
    optimum."""
    d = work / fam
    sp = res["speeds"]
    speed = median_speeds(res)
    rt, ro = (ratio(res, "mlmkit", y) if "mlmkit" in sp and y in sp else None
              for y in ("transformers", "optimum"))
    per_text = useful_per_text(d / "checkpoint", json.loads((work / f"sentences-{n}.json").read_text()))
    shares = " / ".join(share(speed[s] * per_text, ceiling).split(" ")[0] if s in speed else "-"
                        for s in ("mlmkit", "transformers", "optimum"))
    print(f"  {fam:12s} {speed_cell(speed, 'mlmkit', 8)} {speed_cell(speed, 'transformers', 13)} "
          f"{speed_cell(speed, 'optimum', 11)} {ratio_cell(rt, 16)} {ratio_cell(ro, 11)}   {shares:>17s}")
    print(f"      passes: {'; '.join(f'{s} ' + passes(sp[s], res['others'][s]) for s in sp)}")
    print("      ratios' spread: "
          + "; ".join(f"vs {y} {spread(res, 'mlmkit', y)}" for y in ("transformers", "optimum") if y in sp))
    print_fusions(d)
    print_agreement(res["preds"])
    print_int8(res, speed)
    return rt, ro


def report_families(a: argparse.Namespace, families: list[str], results: dict[str, dict[str, Any]], n: int,
                    rounds: int,
                    ceiling: dict[str, Any]) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """The throughput table of every family; returns mlmkit's ratios to transformers and to optimum O3,
    and its int8's to optimum's int8, by family."""
    print(f"\n{n} sentences of 8-40 words, batch {a.batch_size}, {a.threads} threads, max length "
          f"{MAX_LENGTH} "
          f"(ModernBERT {LONG_MAX}; no sentence reaches it), {rounds} alternating pass(es) per side; "
          "medians over the quiet passes (sentences/s); ratios: medians of back-to-back ratios; 'of fp32': "
          "each side's "
          "useful FLOP/s (padding not counted) over the fp32 GEMM ceiling above, mlmkit / transformers / "
          "optimum O3")
    print("  what each side got: " + "; ".join(f"{k}: {v}" for k, v in GOT.items()))
    print(f"  {'family':12s} {'mlmkit':>8s} {'transformers':>13s} {'optimum O3':>11s} "
          f"{'vs transformers':>16s} {'vs optimum':>11s}"
          f"   {'of fp32':>17s}")
    vs_tf: dict[str, float] = {}
    vs_opt: dict[str, float] = {}
    int8: dict[str, float] = {}
    for fam in families:
        res = results[fam]
        if "error" in res:
            print(f"  {fam:12s} failed: {res['error']}")
            continue
        rt, ro = report_family(fam, res, a.work, n, ceiling)
        if rt is not None:
            vs_tf[fam] = rt
        if ro is not None:
            vs_opt[fam] = ro
        if "mlmkit-int8" in res["speeds"] and "optimum-int8" in res["speeds"]:
            int8[fam] = ratio(res, "mlmkit-int8", "optimum-int8")
    return vs_tf, vs_opt, int8


def report_targets(families: list[str], vs_tf: dict[str, float], vs_opt: dict[str, float],
                   int8: dict[str, float]) -> None:
    """The target lines, minima over the families measured (and which family each minimum is)."""
    if min(len(vs_tf), len(vs_opt), len(int8)) < len(families):
        print(f"(the minima are over the families measured: vs transformers {', '.join(vs_tf) or 'none'}; "
              f"vs optimum {', '.join(vs_opt) or 'none'}; "
              f"int8 vs optimum's int8 {', '.join(int8) or 'none'})")
    lines = []
    for name, vals, goal in (("family-classify-vs-transformers-min", vs_tf, 3.0),
                             ("family-classify-vs-optimum-min", vs_opt, 1.3),
                             ("family-int8-vs-optimum-int8-min", int8, 1.0)):
        worst = min(vals, key=vals.__getitem__) if vals else None
        if worst:
            print(f"{name} is {worst}'s")
        lines.append(target(name, vals[worst] if worst else float("nan"), ">=", goal))
    print("\n".join(lines))


def main() -> None:
    a, n, families = parse_args()
    if a.role == "setup":
        setup(a.work, families, n)
        return
    if a.role == "optimum-setup":  # in optimum's venv
        optimum_setup(a.work / a.family)
        return
    if a.role == "side":
        texts = json.loads((a.work / f"sentences-{n}.json").read_text())
        serve_side(a.side, a.work / a.family, texts, a.threads, a.batch_size)
        return
    if a.role == "long":
        serve_long(a.side, a.work / a.family, a.work, a.threads)
        return

    ceiling = print_machine(a.threads)
    t_start = time.perf_counter()
    rounds = a.rounds
    long_sides = long_sides_of(a, families)
    print_plan(a, families, n, rounds, long_sides)
    common = ["--work", str(a.work), "--threads", str(a.threads), "--batch-size", str(a.batch_size),
              "--sentences", str(n)]
    t0 = time.perf_counter()
    setup_step(HERE, "--families", ",".join(families), *common, env=ENV)
    t_setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    results = bench_families(a, families, common, rounds)
    t_bench = time.perf_counter() - t0
    t0 = time.perf_counter()
    long = bench_long(a, common, long_sides) if long_sides else {}
    t_long = time.perf_counter() - t0
    if a.only_long:
        report_long(long, a.threads)
        print(f"\nwall time {time.perf_counter() - t_start:.0f}s (setup {t_setup:.0f}s, long inputs "
              f"{t_long:.0f}s)")
        return

    vs_tf, vs_opt, int8 = report_families(a, families, results, n, rounds, ceiling)
    print(noisy_note())

    report_long(long, a.threads)

    wall = time.perf_counter() - t_start
    print(f"\nwall time {wall:.0f}s (setup {t_setup:.0f}s, throughput {t_bench:.0f}s, long inputs "
          f"{t_long:.0f}s)")
    report_targets(families, vs_tf, vs_opt, int8)


if __name__ == "__main__":
    main()
