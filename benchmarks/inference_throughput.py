"""Inference throughput: mlmkit ONNX bundles vs transformers pipelines vs a full-logits onnxruntime graph.

    python benchmarks/inference_throughput.py            # the full run (about 10 minutes on 2 quiet cores)
    python benchmarks/inference_throughput.py --quick    # a smoke run of the same steps (about 4 minutes)

Model: MiniLM-sized BERT (6 layers, hidden 384, 12 heads, intermediate 1536, vocabulary 30522),
random weights for fill-mask (speed does not depend on them); a WordPiece tokenizer trained on the
docstrings of Python's standard library, padded with [unusedN] entries to exactly 30522 tokens.
Inputs: 1,024 English sentences of 8-40 words from the same docstrings, one word of each replaced
by [MASK] for fill-mask. Batch 32, 2 threads on every side.

Each side runs in its own worker process (torch and onnxruntime in one process slow each other
down, docs/performance.md), loaded and warmed up once; the driver then asks the workers for one timed pass
over all sentences in turn, the compared sides back to back, the direction reversed each round.
Speeds are medians over the passes; a ratio is the median over the rounds of the two sides'
back-to-back speeds, which keeps it steady when the machine's load drifts. On a shared machine
each pass first waits (up to --patience seconds) for other processes to leave the CPUs alone,
the CPU time other processes took during each pass is measured (/proc/stat), and passes where
it exceeded 0.15 cores are marked and left out of the figures whenever quiet ones exist.

- fill-mask: the mlmkit bundle (head at [MASK] only, top-k in the graph), the same bundle int8,
  ``transformers.pipeline("fill-mask", top_k=5)``, and onnxruntime on a plain export of the same
  model that outputs the full B x T x V logits (same fusions, the batches mlmkit cuts, top-k of the
  [MASK] rows in numpy);
- classification: the mlmkit bundle fp32, int8 (dynamic) and int8 static (`--calibrate` on 512 other
  docstring sentences) vs ``transformers.pipeline("text-classification")``;
- embedding: the fill-mask model's encoder laid out as a sentence-transformers model (mean pooling,
  Normalize); the mlmkit embedding bundle fp32 and int8 vs ``SentenceTransformer.encode`` (which
  sorts by length itself) and vs CTranslate2's ``Encoder`` fp32 and int8 on the batches mlmkit cuts,
  mean pooling and normalisation in numpy; the int8 bundle's mean cosine with fp32.

The peers that take batches from outside (CTranslate2, the full-logits graph) get mlmkit's own cuts
(``mlmkit_cuts``: by length, count, padded tokens and least cost; until 2026-12-04 they got batches cut
by length and count alone, which favoured mlmkit); ``--count-cuts`` runs them that way too, so one run
prints both. The table says what each side got, and each ratio its spread over the rounds.

int8 top-1 agreement is measured on the classifier, which is fine-tuned here first (a keyword
task on the same docstring sentences): the agreement of a random MLM head is meaningless
(docs/performance.md), so the fill-mask int8 agreement is printed for information only. The top-1
agreement between the mlmkit fill-mask bundle and the transformers pipeline (same weights) is
printed as a correctness check.

The script ends with one line per target: ``target NAME: X.XX (goal >= Y.YY)``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from common import (
    MINILM,
    agreement,
    answer_passes,
    cosines,
    log,
    made_by,
    median_speeds,
    mlmkit_cuts,
    noisy_note,
    passes,
    print_machine,
    quiet_rounds,
    race,
    ratio,
    setup_step,
    spread,
    stdlib_sentences,
    target,
    transformers_pipeline,
    workers,
)
from harness import parser

HERE = Path(__file__).resolve()
VOCAB = 30522
MAX_LENGTH = 128
# the classifier's task: does the sentence speak of returning?
KEYWORDS = {"return", "returns", "returned", "returning"}
TARGETS = [  # name, goal
    ("fill-mask-vs-transformers", 4.0),
    ("fill-mask-vs-full-logits", 1.5),
    ("classify-vs-transformers", 3.0),
    ("int8-vs-fp32", 1.5),
    ("int8-top1-agreement", 0.97),
    ("int8-static-vs-fp32", 1.5),
    ("int8-static-top1-agreement", 0.97),
    ("embed-vs-sentence-transformers", 2.0),
    ("embed-vs-ctranslate2", 1.0),
    ("embed-int8-vs-ctranslate2-int8", 1.3),
    ("embed-int8-mean-cosine", 0.99),
]


# ---- setup (torch): data, tokenizer, models, bundles -------------------------------------------
def words(s: str) -> list[str]:
    return s.split()


def keyword_label(s: str) -> str:
    """The classifier's label of sentence ``s``: "returns" when it has one of KEYWORDS, else "other"."""
    return "returns" if KEYWORDS & {w.lower().strip(".,;:()") for w in words(s)} else "other"


def write_sentences(work: Path, n_sentences: int) -> tuple[list[str], list[str], list[str]]:
    """The timed sentences, plain and masked, into sentences.json; returns all sentences, the timed ones and
    the rest."""
    sents = stdlib_sentences()
    rng = random.Random(0)
    pool = sorted({s for s in sents if 8 <= len(words(s)) <= 40})
    rng.shuffle(pool)
    bench, rest = pool[:n_sentences], pool[n_sentences:]
    masked = []
    for s in bench:
        w = words(s)
        i = rng.choice([k for k, x in enumerate(w) if x.isalpha()] or [0])
        w[i] = "[MASK]"
        masked.append(" ".join(w))
    (work / "sentences.json").write_text(json.dumps({"plain": bench, "masked": masked}))
    return sents, bench, rest


def padded_tokenizer(work: Path, sents: list[str], t0: float) -> Any:
    """WordPiece trained on ``sents``, padded to the BERT vocabulary size with [unusedN], saved in work/vocab.
    """
    from mlmkit.text.tokenizer import SPECIAL_TOKENS, load_tokenizer, save_tokenizer, train_tokenizer

    tok = train_tokenizer(sents, vocab_size=VOCAB, min_frequency=2)
    vocab = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    vocab += [f"[unused{i}]" for i in range(VOCAB - len(vocab))]
    tmp = work / "vocab"
    tmp.mkdir(exist_ok=True)
    (tmp / "vocab.txt").write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    tok = load_tokenizer(tmp / "vocab.txt")
    # "[MASK]" typed in a text is the mask token, as in a trained tokenizer
    tok.add_special_tokens(SPECIAL_TOKENS)
    assert tok.get_vocab_size() == VOCAB
    save_tokenizer(tok, tmp, max_length=MAX_LENGTH)
    log(f"setup: tokenizer of {tok.get_vocab_size()} tokens ({time.perf_counter() - t0:.0f}s)")
    return tok


def save_mlm_run(work: Path, tok: Any) -> None:
    """The fill-mask model: a random-weight MiniLM pretraining run (an HF checkpoint directory) in
    work/mlm-run."""
    import torch

    from mlmkit.models.config import ModelConfig
    from mlmkit.models.core import BertForPreTraining
    from mlmkit.rundir.checkpoint import save_run
    from mlmkit.rundir.meta import RunMeta

    cfg = ModelConfig(vocab_size=VOCAB, max_position_embeddings=512, **MINILM)
    cfg.architectures = ["BertForPreTraining"]
    torch.manual_seed(0)
    save_run(BertForPreTraining(cfg), work / "mlm-run", config=cfg, tokenizer=tok,
             meta=RunMeta(task="pretraining", max_length=MAX_LENGTH))


def write_csv(path: Path, rows: Iterable[tuple[str, str]]) -> None:
    """``rows`` of (text, label) as a CSV file with a header."""
    import csv

    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows(rows)


def finetune_classifier(work: Path, bench: list[str], rest: list[str], quick: bool) -> None:
    """The classifier, fine-tuned from mlm-run on the keyword task so that int8 agreement means something."""
    from mlmkit.args import FinetuneArgs
    from mlmkit.train.finetune import finetune

    data = [(s, keyword_label(s)) for s in rest]
    pos = [d for d in data if d[1] == "returns"]
    neg = [d for d in data if d[1] == "other"][: len(pos)]
    train = pos + neg
    random.Random(1).shuffle(train)
    train = train[: 480 if quick else 1600]
    write_csv(work / "train.csv", train)
    write_csv(work / "dev.csv", ((s, keyword_label(s)) for s in bench))
    t1 = time.perf_counter()
    metrics = finetune(FinetuneArgs.from_flat(
        task="classification", model=work / "mlm-run", train_file=work / "train.csv", out=work / "clf-run",
        eval_file=work / "dev.csv", epochs=3, batch_size=32, lr=3e-4, warmup_ratio=0.2, max_length=MAX_LENGTH,
        progress=False, seed=0))
    scores = {k: v for k, v in metrics.items() if isinstance(v, float)}
    (work / "classifier.json").write_text(json.dumps(scores))
    log(f"setup: classifier fine-tuned in {time.perf_counter() - t1:.0f}s: "
        + ", ".join(f"{k} {v:.3f}" for k, v in scores.items()))


def embedding_models(work: Path) -> None:
    """The encoder as a sentence-transformers model (mean pooling, normalised), and CTranslate2's conversion
    of it."""
    sentence_transformers_model(work / "mlm-run", work / "st-model")
    import transformers
    from ctranslate2.converters import TransformersConverter

    # ctranslate2 4.8 reads what transformers 5 dropped
    transformers.BertConfig.position_embedding_type = "absolute"
    TransformersConverter(str(work / "st-model")).convert(str(work / "ct2"), force=True)


def export_bundles(work: Path) -> None:
    """The fp32 and int8 bundles of the three models, and the plain full-logits graph."""
    from mlmkit.args import ExportArgs
    from mlmkit.exporter.bundle import export

    static = {"quantize": "int8", "calibrate": work / "calibration.txt"}
    for name, run, kw in (("fill-mask", "mlm-run", {}), ("fill-mask-int8", "mlm-run", {"quantize": "int8"}),
                          ("classify", "clf-run", {}), ("classify-int8", "clf-run", {"quantize": "int8"}),
                          ("classify-int8-static", "clf-run", static),
                          ("embed", "st-model", {}), ("embed-int8", "st-model", {"quantize": "int8"})):
        t1 = time.perf_counter()
        m = export(ExportArgs(run=work / run, out=work / "bundles" / name, **kw))
        agree = m.parity["top1_agreement"]
        log(f"setup: bundle {name}: {m.model_bytes / 1e6:.0f} MB, fused {m.fused_operators}, "
            f"parity {max(m.parity['max_abs_diff'].values()):.1e}"
            f"{'' if agree is None else f', top-1 {agree:.3f}'} "
            f"({time.perf_counter() - t1:.0f}s)")
    full_logits_graph(work / "mlm-run", work / "full-logits.onnx")


def setup(work: Path, quick: bool, n_sentences: int) -> None:
    """Everything the sides read, written once into ``work`` (reused while setup.json matches)."""
    stamp = made_by(HERE, quick=quick, sentences=n_sentences)  # and the code and libraries that make it
    if (work / "setup.json").exists() and json.loads((work / "setup.json").read_text()) == stamp:
        log(f"setup: reusing {work}")
        return
    if work.exists():  # made by other code or settings: nothing of it is reused (a half-made one included)
        log(f"setup: {work} was made under another key; making it anew")
        shutil.rmtree(work)
    work.mkdir(parents=True)
    t0 = time.perf_counter()
    sents, bench, rest = write_sentences(work, n_sentences)
    # static int8's ranges: not the timed texts
    (work / "calibration.txt").write_text("\n".join(rest[:512]) + "\n")
    tok = padded_tokenizer(work, sents, t0)
    save_mlm_run(work, tok)
    finetune_classifier(work, bench, rest, quick)
    embedding_models(work)
    export_bundles(work)
    (work / "setup.json").write_text(json.dumps(stamp))
    log(f"setup: done in {time.perf_counter() - t0:.0f}s")


def sentence_transformers_model(run: Path, out: Path) -> None:
    """The encoder of ``run`` laid out as sentence-transformers saves a model: a BertModel, mean pooling,
    Normalize."""
    import shutil

    import transformers

    transformers.BertModel.from_pretrained(run).save_pretrained(out)
    for f in ("tokenizer.json", "vocab.txt", "tokenizer_config.json"):
        shutil.copy(run / f, out / f)
    (out / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": MINILM["hidden_size"], "pooling_mode_mean_tokens": True,
        "pooling_mode_cls_token": False, "pooling_mode_max_tokens": False,
                                                               "pooling_mode_mean_sqrt_len_tokens": False}))
    (out / "2_Normalize").mkdir(exist_ok=True)
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_LENGTH,
                                                               "do_lower_case": False}))


def full_logits_graph(run: Path, out: Path) -> None:
    """What a user gets from a plain export: prediction logits (B, T, V), the same fusions applied."""
    import tempfile

    import torch

    from mlmkit.exporter.graphs import torch_export
    from mlmkit.exporter.passes import fuse
    from mlmkit.models.core import BertForPreTraining, set_attention_impl
    from mlmkit.rundir.checkpoint import load_state_dict, load_weights
    from mlmkit.rundir.config import load_config
    from mlmkit.runtime.bundle import INPUT_NAMES as INPUTS

    class Full(torch.nn.Module):
        def __init__(self, m: BertForPreTraining) -> None:
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):  # noqa: ANN001
            return (self.m(input_ids, attention_mask, token_type_ids)["prediction_logits"],)

    cfg = load_config(run)
    m = BertForPreTraining(cfg)
    load_weights(m, load_state_dict(run))
    m.eval()
    set_attention_impl(m, "eager")
    import numpy as np

    batch = {k: np.ones((2, 8), dtype=np.int64) for k in INPUTS}
    with tempfile.TemporaryDirectory() as d:
        plain = Path(d) / "plain.onnx"
        torch_export(Full(m), batch, {"logits": ("batch", "sequence", "vocabulary")}, plain, 17, INPUTS)
        fused = fuse(plain, out, cfg)
    log(f"setup: full-logits graph, fused {fused}")


# ---- the sides (each in its own process) -------------------------------------------------------
def serve_side(name: str, work: Path, threads: int, batch_size: int) -> None:
    """A worker: load the side, warm it up, then time one pass over all sentences per "run" line
    on stdin, answering each with a JSON line {"time", "n", "preds"} on stdout."""
    data = json.loads((work / "sentences.json").read_text())
    texts = data["masked"] if name.startswith("fill-mask") else data["plain"]
    run = _SIDES[name](work, threads, batch_size)
    run(texts[: batch_size * 2])  # warm-up: sessions, kernels, caches
    answer_passes({"ready": name}, lambda _: {"n": len(texts), "preds": run(texts)})


def _mlmkit(bundle: str, answers: Any, **kw: Any):
    """The mlmkit pipeline of ``bundle``; ``answers`` turns its results into the predictions compared."""

    def make(work: Path, threads: int, batch_size: int):
        from mlmkit.runtime.pipeline import Pipeline

        pipe = Pipeline.load(work / "bundles" / bundle, threads=threads, batch_size=batch_size)
        return lambda texts: answers(pipe(texts, **kw))

    return make


def _fill(results: list[dict[str, Any]]) -> list[int]:
    return [r["masks"][0]["candidates"][0]["id"] if r["masks"] else -1 for r in results]


def _label(results: list[dict[str, Any]]) -> list[list[Any]]:
    return [[r["label"], r["probabilities"]["returns"]] for r in results]


def _embedding(results: list[dict[str, Any]]) -> list[list[float]]:
    return [r["embedding"] for r in results]


def _sentence_transformers(work: Path, threads: int, batch_size: int):
    """SentenceTransformer.encode on the same model files (it sorts the texts by length itself)."""
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    model = SentenceTransformer(str(work / "st-model"), device="cpu")

    def run(texts: list[str]) -> list[list[float]]:
        with torch.inference_mode():
            return model.encode(texts, batch_size=batch_size, convert_to_numpy=True).tolist()

    return run


def _ctranslate2(compute_type: str, count_only: bool = False):
    """CTranslate2's Encoder on the converted model, given the batches mlmkit cuts (mlmkit_cuts: its
    best case); mean pooling and normalisation in numpy."""

    def make(work: Path, threads: int, batch_size: int):
        import ctranslate2
        import numpy as np

        from mlmkit.text.tokenizer import load_tokenizer

        tok = load_tokenizer(work / "st-model")
        tok.enable_truncation(MAX_LENGTH)
        encoder = ctranslate2.Encoder(str(work / "ct2"), device="cpu", intra_threads=threads,
                                      compute_type=compute_type)

        def run(texts: list[str]) -> list[list[float]]:
            ids = [e.ids for e in tok.encode_batch(texts)]
            out: list[Any] = [None] * len(ids)
            for batch in mlmkit_cuts([len(x) for x in ids], batch_size, MINILM["hidden_size"],
                                     count_only=count_only):
                h = np.asarray(encoder.forward_batch([ids[i] for i in batch]).last_hidden_state)  # (B, T, H)
                lens = np.array([len(ids[i]) for i in batch])
                m = (np.arange(h.shape[1])[None, :] < lens[:, None])[..., None]  # (B, T, 1)
                v = (h * m).sum(axis=1) / lens[:, None]
                v /= np.linalg.norm(v, axis=1, keepdims=True)
                for r, i in enumerate(batch):
                    out[i] = v[r].tolist()
            return out

        return run

    return make


def _transformers(task: str):
    def make(work: Path, threads: int, batch_size: int):
        import torch

        if task == "fill-mask":
            pipe = transformers_pipeline("fill-mask", work / "mlm-run", threads, top_k=5)

            def run(texts: list[str]) -> list[int]:
                with torch.inference_mode():
                    # cut at the max length as every other side (one sentence is longer; its [MASK] is inside)
                    out = pipe(texts, batch_size=batch_size,
                               tokenizer_kwargs={"truncation": True, "max_length": MAX_LENGTH})
                return [r[0]["token"] if r else -1 for r in out]

            return run
        pipe = transformers_pipeline("text-classification", work / "clf-run", threads)

        def run_clf(texts: list[str]) -> list[str]:
            with torch.inference_mode():
                return [[r["label"]] for r in pipe(texts, batch_size=batch_size, truncation=True)]

        return run_clf

    return make


def _full_logits(work: Path, threads: int, batch_size: int, count_only: bool = False):
    """onnxruntime on the full-logits graph: same tokenizer, the batches mlmkit cuts, top-k of the [MASK]
    rows."""
    import numpy as np

    from mlmkit.runtime.bundle import load_bundle_tokenizer, read_bundle_meta
    from mlmkit.runtime.pipeline import make_session
    from mlmkit.text.batching import pad_features

    bundle = work / "bundles" / "fill-mask"
    meta = read_bundle_meta(bundle)
    tok = load_bundle_tokenizer(bundle, meta)
    tok.enable_truncation(MAX_LENGTH)
    tok.add_special_tokens(["[MASK]"])
    session = make_session(work / "full-logits.onnx", threads=threads)
    inputs = [i.name for i in session.get_inputs()]
    mask_id, pad_id = meta.tokenizer.mask_id, meta.tokenizer.pad_id

    def run(texts: list[str]) -> list[int]:
        encs = tok.encode_batch(texts)
        feats = [{"input_ids": e.ids, "token_type_ids": e.type_ids} for e in encs]
        best = [-1] * len(texts)
        for batch in mlmkit_cuts([len(f["input_ids"]) for f in feats], batch_size, MINILM["hidden_size"],
                                 count_only=count_only):
            arrays = pad_features([feats[i] for i in batch], pad_id)
            (logits,) = session.run(None, {k: arrays[k] for k in inputs})  # (B, T, V)
            rows, cols = np.nonzero(arrays["input_ids"] == mask_id)
            x = logits[rows, cols]  # (N, V)
            top = np.argpartition(-x, 5, axis=1)[:, :5]
            p = np.exp(x - x.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            order = np.argsort(-np.take_along_axis(p, top, 1), axis=1)
            top = np.take_along_axis(top, order, 1)
            for r, ids in zip(rows, top):
                if best[batch[r]] == -1:
                    best[batch[r]] = int(ids[0])
        return best

    return run


_SIDES = {  # in the order they run: each compared pair back to back
    "fill-mask/transformers": _transformers("fill-mask"),
    "fill-mask/mlmkit": _mlmkit("fill-mask", _fill, top_k=5),
    "fill-mask/ort-full-logits": _full_logits,
    "fill-mask/mlmkit-int8": _mlmkit("fill-mask-int8", _fill, top_k=5),
    "classify/transformers": _transformers("text-classification"),
    "classify/mlmkit": _mlmkit("classify", _label),
    "classify/mlmkit-int8": _mlmkit("classify-int8", _label),
    "classify/mlmkit-int8-static": _mlmkit("classify-int8-static", _label),
    "embed/sentence-transformers": _sentence_transformers,
    "embed/mlmkit": _mlmkit("embed", _embedding),
    "embed/ctranslate2": _ctranslate2("float32"),
    "embed/ctranslate2-int8": _ctranslate2("int8"),
    "embed/mlmkit-int8": _mlmkit("embed-int8", _embedding),
}
COUNT_CUTS = {  # --count-cuts: the peers as they ran before 2026-12-04, batches cut by length and count alone
    "fill-mask/ort-full-logits-count-cuts": lambda work, threads,
              batch_size: _full_logits(work, threads, batch_size, True),
    "embed/ctranslate2-count-cuts": _ctranslate2("float32", count_only=True),
    "embed/ctranslate2-int8-count-cuts": _ctranslate2("int8", count_only=True),
}
_SIDES.update(COUNT_CUTS)
GOT = {  # what each side gets besides the threads, the batch size and the max length, which all share
    "transformers": "fp32; the pipeline's own batches (in input order, padded to the longest)",
    "mlmkit": "fp32; mlmkit's cuts (by length, count, padded tokens and least cost)",
    "mlmkit-int8": "int8 (dynamic); mlmkit's cuts",
    "mlmkit-int8-static": "int8 (static, calibrated); mlmkit's cuts",
    "ort-full-logits": "fp32, the same fusions; mlmkit's cuts",
    "sentence-transformers": "fp32; its own batches (sorted by length, cut by count)",
    "ctranslate2": "fp32; mlmkit's cuts",
    "ctranslate2-int8": "int8; mlmkit's cuts",
    "ort-full-logits-count-cuts": "fp32, the same fusions; batches cut by length and count alone (as before "
       "2026-12-04)",
    "ctranslate2-count-cuts": "fp32; batches cut by length and count alone (as before 2026-12-04)",
    "ctranslate2-int8-count-cuts": "int8; batches cut by length and count alone (as before 2026-12-04)",
}


def report_agreement(res: dict[str, Any], work: Path) -> tuple[float, float]:
    """The agreement lines (top-1 token or label, int8 against fp32) and int8's speed; returns the
    classifier's dynamic and static int8 top-1 agreement with fp32."""
    preds = res["preds"]
    fm_int8 = agreement(preds["fill-mask/mlmkit-int8"], preds["fill-mask/mlmkit"])
    clf_int8 = agreement(preds["classify/mlmkit-int8"], preds["classify/mlmkit"])
    clf_static = agreement(preds["classify/mlmkit-int8-static"], preds["classify/mlmkit"])
    print("agreement (top-1 token or label):")
    print("  mlmkit fill-mask vs transformers pipeline, same weights: "
          f"{agreement(preds['fill-mask/mlmkit'], preds['fill-mask/transformers']):.4f}")
    print("  mlmkit fill-mask vs full-logits onnxruntime:             "
          f"{agreement(preds['fill-mask/mlmkit'], preds['fill-mask/ort-full-logits']):.4f}")
    print("  mlmkit classify vs transformers pipeline:                "
          f"{agreement(preds['classify/mlmkit'], preds['classify/transformers']):.4f}")
    clf = json.loads((work / "classifier.json").read_text())
    print(f"  int8 vs fp32, fine-tuned classifier:                     {clf_int8:.4f}   (the classifier: "
          "accuracy "
          f"{clf.get('eval_accuracy', float('nan')):.3f}, macro-F1 "
          f"{clf.get('eval_macro_f1', float('nan')):.3f} on these sentences)")
    print(f"  int8 static (calibrated) vs fp32, fine-tuned classifier: {clf_static:.4f}")
    diffs = [abs(x[1] - y[1]) for x, y in zip(preds["classify/mlmkit-int8"], preds["classify/mlmkit"])]
    print(f"  int8 vs fp32 probability of the classifier, mean / max abs difference: "
          f"{statistics.fmean(diffs):.4f} / {max(diffs):.4f}")
    if clf.get("eval_macro_f1", 0.0) < 0.8:
        print("  (the classifier has not learned its task - as in --quick - so its int8 agreement says "
              "little)")
    print(f"  int8 vs fp32, fill-mask (random MLM head: information only): {fm_int8:.4f}")
    print("int8 speed (medians of the rounds' ratios, spread): " + "; ".join(
        f"{what} {ratio(res, x, y):.2f}x ({spread(res, x, y)})" for what, x, y in (
            ("fill-mask int8 vs fp32", "fill-mask/mlmkit-int8", "fill-mask/mlmkit"),
            ("classify int8 vs transformers", "classify/mlmkit-int8", "classify/transformers"),
            ("classify int8 static vs dynamic", "classify/mlmkit-int8-static", "classify/mlmkit-int8"))))
    return clf_int8, clf_static


# ---- the driver --------------------------------------------------------------------------------
def main() -> None:
    ap = parser(__doc__, work="runs/bench-inference",
                quick="a smoke run: 128 sentences, 2 rounds, a shorter fine-tune",
                work_help="where models, bundles and data are written (reused between runs)",
                rounds=(5, 2), rounds_help="timed passes per side, alternating", threads=2, batch_size=32,
                role=True)
    ap.add_argument("--side", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--count-cuts", action="store_true",
                    help="also run the peers on batches cut by length and count "
                    "alone, as before 2026-12-04 (the ratios' before and after in one run)")
    a = ap.parse_args()
    work = a.work / ("quick" if a.quick else "full")
    if a.role == "setup":
        setup(work, a.quick, 128 if a.quick else 1024)
        return
    if a.role == "side":
        serve_side(a.side, work, a.threads, a.batch_size)
        return

    rounds = a.rounds
    print_machine(a.threads)
    common = ["--work", str(a.work), "--threads", str(a.threads), "--batch-size", str(a.batch_size)]
    if a.quick:
        common.append("--quick")
    setup_step(HERE, *common)
    names = [k for k in _SIDES if a.count_cuts or k not in COUNT_CUTS]  # a compared pair runs back to back
    log(f"starting {len(names)} workers (each loads its model and warms up)")
    try:
        with workers(HERE, {k: ["--role", "side", "--side", k, *common] for k in names}) as ws:
            res = race(ws, rounds, a.patience, width=28)
    except RuntimeError as e:  # a side died: its error is above
        raise SystemExit(str(e)) from None
    speeds, others, preds, count = res["speeds"], res["others"], res["preds"], res["n"]
    speed = median_speeds(res)

    print(f"\n{count} sentences of 8-40 words; every side: batch {a.batch_size}, {a.threads} threads, max "
          "length "
          f"{MAX_LENGTH}, {rounds} alternating passes; medians over the quiet passes (sentences/s):")
    for k in names:
        got = GOT[k.split("/")[1]]
        print(f"  {k:36s} {speed[k]:8.1f}   (passes: {passes(speeds[k], others[k])}; {got})")
    print(noisy_note())
    clf_int8, clf_static = report_agreement(res, work)
    emb = {k: cosines(preds[k], preds["embed/sentence-transformers"])
           for k in ("embed/mlmkit", "embed/ctranslate2")}
    int8_cos = cosines(preds["embed/mlmkit-int8"], preds["embed/mlmkit"])
    ct2_int8_cos = cosines(preds["embed/ctranslate2-int8"], preds["embed/ctranslate2"])
    print("embeddings, cosine with sentence-transformers (min / mean): "
          + "; ".join(f"{k.split('/')[1]} {min(v):.5f} / {statistics.fmean(v):.5f}" for k, v in emb.items()))
    print(f"  int8 vs fp32 cosine (min / mean): mlmkit {min(int8_cos):.4f} / "
          f"{statistics.fmean(int8_cos):.4f}; "
          f"ctranslate2 {min(ct2_int8_cos):.4f} / {statistics.fmean(ct2_int8_cos):.4f}")
    print()
    pairs = {"fill-mask-vs-transformers": ("fill-mask/mlmkit", "fill-mask/transformers"),
             "fill-mask-vs-full-logits": ("fill-mask/mlmkit", "fill-mask/ort-full-logits"),
             "classify-vs-transformers": ("classify/mlmkit", "classify/transformers"),
             "int8-vs-fp32": ("classify/mlmkit-int8", "classify/mlmkit"),
             "int8-static-vs-fp32": ("classify/mlmkit-int8-static", "classify/mlmkit"),
             "embed-vs-sentence-transformers": ("embed/mlmkit", "embed/sentence-transformers"),
             "embed-vs-ctranslate2": ("embed/mlmkit", "embed/ctranslate2"),
             "embed-int8-vs-ctranslate2-int8": ("embed/mlmkit-int8", "embed/ctranslate2-int8")}
    if a.count_cuts:  # before (the peers' batches cut by count alone) and after (mlmkit's cuts), one run
        pairs.update({"fill-mask-vs-full-logits-count-cuts": ("fill-mask/mlmkit",
                                                              "fill-mask/ort-full-logits-count-cuts"),
                      "embed-vs-ctranslate2-count-cuts": ("embed/mlmkit", "embed/ctranslate2-count-cuts"),
                      "embed-int8-vs-ctranslate2-int8-count-cuts": ("embed/mlmkit-int8",
                                                                    "embed/ctranslate2-int8-count-cuts")})
    figures = {k: ratio(res, *v) for k, v in pairs.items()}
    print("each ratio: the median, then its spread over the quiet rounds (each round the two sides back to "
          "back):")
    for k, v in pairs.items():
        print(f"  {k:44s} {figures[k]:.2f}x  ({spread(res, *v)})")
    figures.update({"int8-top1-agreement": clf_int8, "int8-static-top1-agreement": clf_static,
                    "embed-int8-mean-cosine": statistics.fmean(int8_cos)})
    print("ratios from the quiet rounds of each pair: "
          + ", ".join(f"{k} {len(quiet_rounds(res, *v, fallback=False))}/{rounds}" for k, v in pairs.items()))
    for name, goal in TARGETS:
        print(target(name, figures[name], ">=", goal))


if __name__ == "__main__":
    main()
