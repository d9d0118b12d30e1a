"""The commands that train and score: tokenizer train, tokenize, pretrain, tasks, finetune, distill, sweep,
plot, evaluate, quickstart, and data (the built-in data sets).

torch is imported inside the commands that need it, never at module level.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from mlmkit.args import (
    DataArgs,
    DistillArgs,
    EvaluateArgs,
    FinetuneArgs,
    PlotArgs,
    PretrainArgs,
    QuickstartArgs,
    SweepArgs,
    TokenizeArgs,
    TokenizerArgs,
)
from mlmkit.cli.common import (
    Json,
    err,
    handle_errors,
    out,
    print_comparison,
    print_json,
    print_metrics,
    want_json,
    with_args,
    with_task_options,
)
from mlmkit.errors import MlmkitError
from mlmkit.registry import Metrics, Options

app = typer.Typer()
tokenizer_app = typer.Typer(no_args_is_help=True,
                            help="Train tokenizers: WordPiece, byte-level BPE or Unigram.")
app.add_typer(tokenizer_app, name="tokenizer")



@tokenizer_app.command("train")
@handle_errors
@with_args(TokenizerArgs)
def tokenizer_train(args: TokenizerArgs) -> None:
    """Train a tokenizer on a corpus: WordPiece with BERT normalisation, byte-level BPE or Unigram. --out:
    the tokenizer.json to write (vocab.txt goes beside it), or a directory."""
    from mlmkit.files import atomic_write_text
    from mlmkit.text.tokenizer import ROBERTA_TOKENS, SPECIAL_TOKENS, save_tokenizer, train_tokenizer
    from mlmkit.train.corpus.files import iter_sentences

    specials = {"bert": SPECIAL_TOKENS, "roberta": ROBERTA_TOKENS}.get(args.special_tokens)
    tok = train_tokenizer(iter_sentences(args.corpus, args.text_column), vocab_size=args.vocab_size,
                          cased=args.cased,
                          kind=args.kind, specials=specials)
    if args.out.suffix == ".json" and args.out.name != "tokenizer.json":
        atomic_write_text(args.out, tok.to_str())  # just this file: never touch a tokenizer.json beside it
        err.print(f"wrote {args.out} ({tok.get_vocab_size()} tokens)")
        return
    d = args.out.parent if args.out.suffix == ".json" else args.out
    save_tokenizer(tok, d)
    beside = "vocab.txt and tokenizer_config.json" if args.kind == "wordpiece" else "tokenizer_config.json"
    err.print(f"wrote {d / 'tokenizer.json'} ({tok.get_vocab_size()} tokens), {beside}")


@app.command()
@handle_errors
@with_args(TokenizeArgs)
def tokenize(args: TokenizeArgs) -> None:
    """Tokenize a corpus once into a memory-mapped token shard, the directory --out (tokens, offsets,
    manifest, the tokenizer): `mlmkit pretrain --shard DIR` trains from it."""
    from mlmkit.text.tokenizer import load_tokenizer
    from mlmkit.train.corpus.shards import tokenize_to

    c = tokenize_to(args.corpus, load_tokenizer(args.tokenizer), args.out, text_column=args.text_column,
                    workers=args.workers,
                    max_bytes=args.max_record_bytes)
    err.print(f"wrote {args.out}: {len(c.tokens):,} tokens, {len(c.sent_offsets) - 1:,} sentences, "
              f"{c.num_docs:,} documents")


@app.command()
@handle_errors
@with_args(PretrainArgs)
def pretrain(args: PretrainArgs) -> None:
    """Pre-train an encoder with masked language modelling (BERT: + next-sentence prediction; --arch roberta |
    modernbert). --out: the run directory to write (a Hugging Face checkpoint)."""
    from dataclasses import replace

    from mlmkit.train.pretrain import pretrain as run

    metrics = run(replace(args, train=replace(args.train, progress=err.is_terminal)))
    if os.environ.get("RANK", "0") == "0":  # under torchrun, one process reports
        print_metrics(metrics, f"pretraining {args.out}", as_json=False)


@app.command("tasks")
@handle_errors
def list_tasks(as_json: Json = False) -> None:
    """List the registered tasks: formats, metrics, options and the package providing each."""
    from mlmkit.registry import broken, tasks

    rows = [p.describe() for _, p in sorted(tasks().items())]
    bad = [{"name": n, "broken": reason, "package": dist} for n, (reason, dist) in sorted(broken().items())]
    if want_json(as_json):
        for r in rows + bad:
            print_json(r)
        return
    t = Table(title="registered tasks")
    for c in ("name", "description", "formats", "metrics", "options", "command", "package"):
        t.add_column(c)
    for r in rows:
        opts = "\n".join(f"{o['flag']} ({o['type']}, default {o['default']!r})" for o in r["options"])
        t.add_row(r["name"], r["description"], ", ".join(r["formats"]), ", ".join(r["metrics"]), opts or "-",
                  r["command"] or "predict", r["package"])
    for r in bad:
        t.add_row(r["name"], f"[red]broken[/red]: {escape(r['broken'])}", "-", "-", "-", "-", r["package"])
    out.print(t)


@app.command()
@handle_errors
@with_task_options("finetune")
@with_args(FinetuneArgs)
def finetune(args: FinetuneArgs, options: Options) -> None:
    """Fine-tune a task head on a pretrained encoder (task options: see `mlmkit tasks`). --out: the run
    directory to write."""
    from dataclasses import replace

    from mlmkit.train.finetune import finetune as run

    metrics = run(replace(args, options={**args.options, **options},
                          train=replace(args.train, progress=err.is_terminal)))
    print_metrics(metrics, f"fine-tuning {args.task} -> {args.out}", as_json=False)


@app.command()
@handle_errors
@with_args(DistillArgs)
def distill(args: DistillArgs) -> None:
    """Distil a fine-tuned run into a student with fewer layers trained on the teacher's outputs, or
    (--static) an embedding model into a table of token vectors. --out: the student's run directory
    (with --static: the bundle's)."""
    from dataclasses import replace

    from mlmkit.train.distill import distill as run

    metrics = run(replace(args, train=replace(args.train, progress=err.is_terminal)))
    print_metrics(metrics, f"distilling {args.teacher} -> {args.out}", as_json=False)


@app.command()
@handle_errors
@with_task_options("sweep")
@with_args(SweepArgs)
def sweep(args: SweepArgs, options: Options, as_json: Json = False) -> None:
    """Search fine-tuning settings with Optuna: a run per trial under --out (trial-NNN, beside the
    default storage), the best trial at the end."""
    from dataclasses import replace

    from mlmkit.train.sweep import sweep as run

    result = run(replace(args, options={**args.options, **options},
                         train=replace(args.train, progress=err.is_terminal)))
    if want_json(as_json):
        print_json({k: result[k] for k in ("best_run", "best_params", "best_value", "metric", "trial")})
        return
    t = Table(title=f"sweep {args.out}: {result['metric']} by trial")
    for c in ("trial", "state", result["metric"], "settings", "run"):
        t.add_column(c)
    for tr in result["trials"]:
        value = "-" if tr["value"] is None else f"{tr['value']:.4f}"
        t.add_row(str(tr["number"]), tr["state"], value,
                  ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                             for k, v in tr["params"].items()),
                  tr["run"] or "-")
    out.print(t)
    out.print(f"best: trial {result['trial']}, {result['metric']} {result['best_value']:.4f}, "
              f"{result['best_params']} -> {result['best_run']}")


@app.command()
@handle_errors
@with_args(PlotArgs)
def plot(args: PlotArgs) -> None:
    """Training curves of runs: loss, learning rate and each evaluation metric against the step. --out:
    the picture to write (.png, .svg or .pdf)."""
    from mlmkit.train.plots import plot_runs

    path = plot_runs(args.runs, args.out, title=args.title)
    err.print(f"wrote {path}")


@app.command()
@handle_errors
@with_task_options("evaluate")
@with_args(EvaluateArgs)
def evaluate(args: EvaluateArgs, options: Options, as_json: Json = False) -> None:
    """Score fine-tuned runs (PyTorch) or exported bundles (onnxruntime) with their task's metrics."""
    models, data = args.models, args.data
    if args.hybrid:
        from mlmkit.args import fusion_weights
        from mlmkit.retrieval.index.hybrid import evaluate_hybrid

        if options or not (models[0] / "manifest.json").is_file():
            raise MlmkitError(f"--hybrid: {models[0]} is not an index" if not options
                              else "--hybrid takes no --option",
                              "evaluate INDEX --data BEIR_DIR --hybrid bm25 (build INDEX with mlmkit index)")
        each = evaluate_hybrid(models[0], data, args.hybrid, fusion=args.fusion,
                               weights=fusion_weights(args.weights, args.hybrid, args.fusion),
                               device=args.device)
        if want_json(as_json):
            for name, r in each.items():
                print_json({"model": name, **r})
        else:
            print_comparison(list(each), list(each.values()),
                             f"{len(each) - 1} retrievers and their fusion on {data}")
        return
    # its path checked before the work: a picture that cannot be written loses nothing
    if args.plot is not None:
        from mlmkit.train.plots import check_picture

        check_picture(args.plot, "--plot")
    if args.chunk_agg != "max":
        from mlmkit.retrieval.index.search import chunk_aggregation

        chunk_aggregation(args.chunk_agg)
    if args.chunk_agg != "max" and any(not (m / "manifest.json").is_file() for m in models):
        raise MlmkitError(f"--chunk-agg {args.chunk_agg} ranks an index's documents by their chunks: "
                          f"{next(m for m in models if not (m / 'manifest.json').is_file())} is not an index",
                          "evaluate indexes built with --chunk-tokens, or leave --chunk-agg out")
    results = [_evaluate_one(m, data, options, args.predictions, args.device,
                             args.speed or args.plot is not None,
                             args.chunk_agg) for m in models]
    if len(models) == 1:
        print_metrics(results[0], f"{models[0]} on {data}", as_json)
    elif want_json(as_json):
        for m, r in zip(models, results):
            print_json({"model": str(m), **{k: v for k, v in r.items() if k != "confusion_matrix"}})
    else:
        print_comparison(models, results, f"{len(models)} models on {data}")
    if args.plot is not None:  # after the metrics are printed
        from mlmkit.train.plots import plot_trade_off

        err.print(f"wrote {plot_trade_off(models, results, args.plot)}")


def _evaluate_one(model: Path, data: Path, options: Options, predictions: Path | None, device: str,
                  speed: bool, chunk_agg: str = "max") -> Metrics:
    """One model's metrics: an index's stored vectors, a bundle through onnxruntime, a run through PyTorch."""
    if (model / "manifest.json").exists():
        from mlmkit.retrieval.index import evaluate_index

        if options or predictions is not None or speed:
            raise MlmkitError(f"{model} is an index: it takes --data alone",
                              "drop --option, --predictions and --speed")
        return evaluate_index(model, data, device=device, chunk_agg=chunk_agg)
    if (model / "model.onnx").exists():
        from mlmkit.retrieval.index import evaluate_bundle_by_index, through_index
        from mlmkit.runtime.pipeline import evaluate_bundle

        # bounded memory, any corpus
        if predictions is None and not speed and through_index(model, data, options):
            return evaluate_bundle_by_index(model, data, device=device)
        return evaluate_bundle(model, data, options=options, predictions=predictions, device=device,
                               speed=speed)
    from mlmkit.train.finetune import evaluate_run

    return evaluate_run(model, data, options=options, predictions=predictions, device=device, speed=speed)


@app.command()
@handle_errors
@with_args(QuickstartArgs)
def quickstart(args: QuickstartArgs) -> None:
    """The whole pipeline on built-in data, offline: corpus, tokenizer, pretraining, fine-tuning, export,
    inference, retrieval. --out: where its runs and bundles go."""
    from mlmkit.quickstart.demo import run

    run(args.out, steps=args.pretrain_steps, seed=args.seed, retrieval_documents=args.retrieval_documents,
        console=out)


@app.command()
@handle_errors
@with_args(DataArgs)
def data(args: DataArgs) -> None:
    """Write the built-in data sets to a directory (corpus, classification, tagging, qa, retrieval), each in
    the format the commands read, and print a command that uses each."""
    from mlmkit.quickstart.sets import write_sets

    with err.status(f"writing the built-in sets to {args.out} ..."):
        written = write_sets(args.out, args.sets, retrieval_documents=args.retrieval_documents)
    for w in written:
        out.print(f"[bold]{w.name}[/]: {escape(str(w.path))} [dim]({escape(w.holds)})[/]", highlight=False,
                  soft_wrap=True)
        for command in w.commands:
            out.print(f"  {escape(command)}", highlight=False, soft_wrap=True)
