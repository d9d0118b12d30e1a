"""`mlmkit quickstart`: the whole pipeline on built-in data, offline, in a few minutes on 2 cores.

1. a corpus from the docstrings of Python's standard library (nothing downloaded);
2. a WordPiece tokenizer and a tiny BERT pretrained on it (MLM + NSP); held-out MLM accuracy next to
   the uniform and majority baselines, and a few fill-mask predictions;
3. a sentiment classifier fine-tuned on the small labelled set shipped in mlmkit/quickstart/data, with its
   evaluation and confusion matrix;
4. both models exported to ONNX bundles and served through onnxruntime (fill-mask, classify);
5. an embedding model fine-tuned from the pretrained encoder on a retrieval set made from the same
   docstrings (summary line -> the rest), with its nDCG@10 before and after;
6. the classifier distilled into a 1-layer student, both exported fp32 and int8, side by side with
   accuracy, examples/s and size.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from mlmkit.registry import Metrics, Prediction

FILL_MASK_EXAMPLES = [
    "Return the number of [MASK] in the list.",
    "Raise a [MASK] if the file does not exist.",
    "This function is called when the [MASK] is closed.",
    "The default value is [MASK].",
]
CLASSIFY_EXAMPLES = [
    "My new lamp is excellent, a pleasure to use every day.",
    "The charger stopped working after a week. Avoid it.",
    "The blanket is fine, about what I expected.",
]


def data_file(name: str) -> Path:
    """A file shipped in mlmkit/quickstart/data (package data, installed with the package)."""
    return Path(__file__).parent / "data" / name


def _step(console: Console, n: int, title: str) -> float:
    console.rule(f"[bold]{n}. {title}")
    return time.perf_counter()


def fill_mask_torch(run_dir: str | Path, texts: list[str],
                    top_k: int = 5) -> list[list[tuple[str | None, float]]]:
    """Top-k tokens for the first [MASK] of each text with the PyTorch model of a pretraining run."""
    import torch

    from mlmkit.models.core import BertForPreTraining
    from mlmkit.rundir.checkpoint import load_state_dict, load_weights
    from mlmkit.rundir.config import load_config
    from mlmkit.text.tokenizer import load_tokenizer, special_ids

    tok = load_tokenizer(run_dir)
    model = BertForPreTraining(load_config(run_dir))
    load_weights(model, load_state_dict(run_dir))
    model.eval()
    mask_id = special_ids(tok).need("mask", "filling masks")
    results: list[list[tuple[str | None, float]]] = []
    for text in texts:
        ids = torch.tensor([tok.encode(text).ids])
        pos = (ids[0] == mask_id).nonzero()
        if len(pos) == 0:
            results.append([])
            continue
        with torch.no_grad():
            logits = model(ids)["prediction_logits"][0, int(pos[0])]
        p = logits.softmax(-1).topk(top_k)
        results.append([(tok.id_to_token(int(i)), float(v)) for v, i in zip(p.values, p.indices)])
    return results


class Summary(TypedDict, total=False):
    """The figures the quickstart printed, by stage (each stage's function says what it returns)."""

    pretrain: Metrics
    classifier: dict[str, float]
    onnx_classify: list[Prediction]
    retrieval: dict[str, float | None]
    cheaper: list[Metrics]
    curves: list[str]


def run(out: str | Path, *, steps: int = 1500, seed: int = 0, retrieval_documents: int = 1000,
        console: Console | None = None) -> Summary:
    """Run the quickstart into ``out``; returns the figures it printed."""
    console = console or Console()
    out = Path(out)
    # a rerun starts afresh
    for sub in ("pretrain", "classifier", "exports", "embedding", "retrieval", "student"):
        shutil.rmtree(out / sub, ignore_errors=True)
    summary: Summary = {}
    _corpus_stage(console, out)
    summary["pretrain"] = _pretrain_stage(console, out, steps=steps, seed=seed)
    summary["classifier"] = _classifier_stage(console, out, seed=seed)
    summary["onnx_classify"] = _onnx_stage(console, out)
    summary["retrieval"] = _retrieval_stage(console, out, seed=seed, retrieval_documents=retrieval_documents)
    summary["cheaper"] = _cheaper_stage(console, out, seed=seed)
    summary["curves"] = _closing_lines(console, out)
    return summary


def _corpus_stage(console: Console, out: Path) -> None:
    """Step 1: the corpus, from the standard library's docstrings (nothing to download)."""
    from mlmkit.quickstart.stdlib_corpus import write_corpus

    t = _step(console, 1, "corpus from the docstrings of Python's standard library")
    stats = write_corpus(out / "corpus.txt", max_chars=1_500_000)
    console.print(f"{stats['documents']:,} documents, {stats['sentences']:,} sentences -> "
                  f"{out / 'corpus.txt'} "
                  f"[dim]({time.perf_counter() - t:.1f}s)[/]")


def _pretrain_stage(console: Console, out: Path, *, steps: int, seed: int) -> Metrics:
    """Step 2: the tokenizer and the tiny BERT, with its held-out figures next to the baselines and a few
    fill-mask predictions (what pretraining learnt, before any fine-tuning); returns its final metrics."""
    from mlmkit.args import PretrainArgs
    from mlmkit.train.pretrain import pretrain

    t = _step(console, 2, f"tokenizer + tiny BERT pretrained for {steps} steps (MLM + NSP)")
    m = pretrain(PretrainArgs.from_flat(
        corpus=[out / "corpus.txt"], out=out / "pretrain", vocab_size=4000, preset="tiny", steps=steps,
        batch_size=32,
        seq_len=64, lr=1.5e-3, eval_every=max(100, steps // 3), save_every=max(100, steps // 3), seed=seed,
        cache_dir=out / "cache", progress=console.is_terminal,
    ))
    acc, uni, maj = m["eval_mlm_accuracy"], m["eval_mlm_uniform_baseline"], m["eval_mlm_majority_baseline"]
    table = Table(title=f"held-out masked-token accuracy [dim]({time.perf_counter() - t:.0f}s)[/]")
    for c in ("model", "uniform baseline", "majority baseline", "perplexity", "NSP accuracy"):
        table.add_column(c, justify="right")
    table.add_row(f"{acc:.1%}", f"{uni:.2%}", f"{maj:.1%}", f"{m['eval_perplexity']:.1f}",
                  f"{m.get('eval_nsp_accuracy', 0):.1%}")
    console.print(table)
    fm = Table(title="fill-mask (PyTorch)")
    fm.add_column("text")
    fm.add_column("top predictions")
    for text, preds in zip(FILL_MASK_EXAMPLES, fill_mask_torch(out / "pretrain", FILL_MASK_EXAMPLES)):
        fm.add_row(text, ", ".join(f"{w} {p:.2f}" for w, p in preds))
    console.print(fm)
    return m


def _classifier_stage(console: Console, out: Path, *, seed: int) -> dict[str, float]:
    """Step 3: the sentiment classifier fine-tuned on the shipped set, its held-out scores and confusion
    matrix; returns the scores."""
    from mlmkit.args import FinetuneArgs
    from mlmkit.train.finetune import evaluate_run, finetune

    t = _step(console, 3, "sentiment classifier fine-tuned on the shipped labelled set")
    finetune(FinetuneArgs.from_flat(
        task="classification", model=out / "pretrain", train_file=data_file("quickstart_train.csv"),
        out=out / "classifier",
        eval_file=data_file("quickstart_eval.csv"), epochs=8, batch_size=16, lr=1e-3, seed=seed,
        progress=console.is_terminal,
    ))
    ev = evaluate_run(out / "classifier", data_file("quickstart_eval.csv"))
    res = Table(title=f"classifier on the held-out set [dim]({time.perf_counter() - t:.0f}s)[/]")
    for k in ("accuracy", "macro_f1", "mcc"):
        res.add_column(k, justify="right")
    res.add_row(*(f"{ev[k]:.3f}" for k in ("accuracy", "macro_f1", "mcc")))
    console.print(res)
    cm = Table(title="confusion matrix (rows: gold, columns: predicted)")
    cm.add_column("")
    for lab in ev["labels"]:
        cm.add_column(lab, justify="right")
    for lab, row in zip(ev["labels"], ev["confusion_matrix"]):
        cm.add_row(lab, *map(str, row))
    console.print(cm)
    return {k: ev[k] for k in ("accuracy", "macro_f1", "mcc")}


def _onnx_stage(console: Console, out: Path) -> list[Prediction]:
    """Step 4: both runs exported to ONNX bundles and run through onnxruntime, as a deployment would;
    returns the classifier's predictions."""
    from mlmkit.args import ExportArgs
    from mlmkit.exporter.bundle import export
    from mlmkit.runtime.pipeline import Pipeline

    t = _step(console, 4, "ONNX export and onnxruntime inference")
    for run_name, bundle in (("pretrain", "fill-mask"), ("classifier", "classifier")):
        info = export(ExportArgs(run=out / run_name, out=out / "exports" / bundle))
        fused = ", ".join(f"{k} {v}" for k, v in sorted(info.fused_operators.items()) if v)
        console.print(f"{out / 'exports' / bundle}: {info.task}, fused: {fused or 'none'}, "
                      f"max |torch - onnx| {max(info.parity['max_abs_diff'].values()):.1e}")
    fill = Pipeline.load(out / "exports" / "fill-mask")(FILL_MASK_EXAMPLES)
    fm = Table(title="fill-mask (onnxruntime)")
    fm.add_column("text")
    fm.add_column("top predictions")
    for r in fill:
        cands = r["masks"][0]["candidates"] if r.get("masks") else []
        fm.add_row(r["text"], ", ".join(f"{c['token']} {c['score']:.2f}" for c in cands))
    console.print(fm)
    preds = Pipeline.load(out / "exports" / "classifier")(CLASSIFY_EXAMPLES)
    ct = Table(title=f"classify (onnxruntime) [dim]({time.perf_counter() - t:.0f}s)[/]")
    for c in ("text", "label", "score"):
        ct.add_column(c)
    for text, p in zip(CLASSIFY_EXAMPLES, preds):
        ct.add_row(text, p["label"], f"{p['score']:.2f}")
    console.print(ct)
    return preds


def _retrieval_stage(console: Console, out: Path, *, seed: int,
                     retrieval_documents: int) -> dict[str, float | None]:
    """Step 5: the embedding model fine-tuned on a retrieval set from the same docstrings, scored against
    the pretrained encoder (and BM25 when bm25s is installed); returns the nDCG@10 of each."""
    from mlmkit.args import FinetuneArgs
    from mlmkit.errors import MlmkitError
    from mlmkit.quickstart.retrieval_set import write_retrieval_set
    from mlmkit.train.finetune import evaluate_base, finetune

    t = _step(console, 5, "embedding model fine-tuned on a retrieval set from the same docstrings")
    counts = write_retrieval_set(out / "retrieval", max_documents=retrieval_documents)
    console.print(f"{counts['documents']:,} documents, {counts['train_queries']:,} training and "
                  f"{counts['test_queries']:,} test queries -> {out / 'retrieval'}")
    try:
        from mlmkit.retrieval.exact import bm25_metrics

        bm25 = bm25_metrics(out / "retrieval")
    except MlmkitError as e:  # bm25s is an extra: the dense rows stand without it
        console.print(f"[dim]BM25 left out: {e}[/]")
        bm25 = None
    zero = evaluate_base("embedding", out / "pretrain", out / "retrieval", max_length=64)
    tuned = finetune(FinetuneArgs.from_flat(
        task="embedding", model=out / "pretrain", train_file=out / "retrieval", out=out / "embedding",
        eval_file=out / "retrieval", epochs=2, batch_size=64, lr=1e-3, max_length=64, seed=seed,
        progress=console.is_terminal,
    ))
    rt = Table(title=f"test queries searching {counts['documents']:,} documents "
                     f"[dim]({time.perf_counter() - t:.0f}s)[/]")
    for c in ("", "nDCG@10", "MRR@10", "Recall@100"):
        rt.add_column(c, justify="right")
    if bm25:
        rt.add_row("BM25 (bm25s)", *(f"{bm25[k]:.3f}" for k in ("ndcg@10", "mrr@10", "recall@100")))
    rt.add_row("pretrained encoder, mean pooling",
               *(f"{zero[k]:.3f}" for k in ("ndcg@10", "mrr@10", "recall@100")))
    rt.add_row("fine-tuned (mnrl)",
               *(f"{tuned['eval_' + k]:.3f}" for k in ("ndcg@10", "mrr@10", "recall@100")))
    console.print(rt)
    return {"zero_shot_ndcg@10": zero["ndcg@10"], "fine_tuned_ndcg@10": tuned["eval_ndcg@10"],
            "bm25_ndcg@10": bm25["ndcg@10"] if bm25 else None}


def _cheaper_stage(console: Console, out: Path, *, seed: int) -> list[Metrics]:
    """Step 6: the classifier made cheaper: distilled into one layer on its training texts (the teacher
    labels them), both exported fp32 and int8, and scored side by side on the held-out set with their
    speed and size, as `mlmkit evaluate A B ... --speed` prints them; returns the rows."""
    from mlmkit.args import DistillArgs, ExportArgs
    from mlmkit.exporter.bundle import export
    from mlmkit.runtime.pipeline import evaluate_bundle
    from mlmkit.train.distill import distill

    t = _step(console, 6, "the classifier made cheaper: distilled into 1 layer, int8")
    distill(DistillArgs.from_flat(teacher=out / "classifier", train_file=data_file("quickstart_train.csv"),
                                  out=out / "student", layers=1, epochs=8, batch_size=16, lr=1e-3, seed=seed,
                                  progress=console.is_terminal))
    names = {"teacher (2 layers)": ("classifier", None), "teacher int8": ("classifier", "int8"),
             "student (1 layer)": ("student", None), "student int8": ("student", "int8")}
    rows = []
    for name, (run, quantize) in names.items():
        bundle = out / "exports" / f"{run}{'-int8' if quantize else ''}"
        if not (bundle / "model.onnx").is_file():
            export(ExportArgs(run=out / run, out=bundle, quantize=quantize))
        rows.append({"model": name, **evaluate_bundle(bundle, data_file("quickstart_eval.csv"), speed=True)})
    table = Table(title=f"quality, speed and size on the held-out set [dim]({time.perf_counter() - t:.0f}s; "
                        f"speeds of a tiny model on 100 texts are noisy)[/]")
    for c in ("model", "accuracy", "examples/s", "vs teacher", "MB"):
        table.add_column(c, justify="right")
    for r in rows:
        table.add_row(r["model"], f"{r['accuracy']:.3f}", f"{r['examples_per_second']:,.0f}",
                      f"{r['examples_per_second'] / rows[0]['examples_per_second']:.2f}x",
                      f"{r['model_bytes'] / 1e6:.1f}")
    console.print(table)
    return rows


def _closing_lines(console: Console, out: Path) -> list[str]:
    """Where the runs, bundles and training curves are, and a command to try next; returns the curves'
    paths."""
    console.print(f"\nRuns and bundles are in {out}. Try: mlmkit classify {out / 'exports' / 'classifier'} "
                  "\"I love it\"")
    console.print("The data sets as files, to train on with the other commands: mlmkit data DIR")
    pictures = [p for p in (out / "pretrain" / "curves.png", out / "classifier" / "curves.png") if p.exists()]
    if pictures:
        console.print(f"Training curves: {', '.join(map(str, pictures))}; model cards: README.md in each run "
                      "and bundle.")
    return [str(p) for p in pictures]
