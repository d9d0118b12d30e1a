"""`mlmkit export`, the onnxruntime inference commands (classify, tag, qa, embed, predict, and the
command of any other task that names one), `mlmkit mine`, `mlmkit rerank` and `mlmkit serve`; `mlmkit
index` and `mlmkit search` are indexes.py's.

The inference commands import the runtime only, never torch: a cold start stays under a second.
Inputs come from arguments, --input (files, directories or globs of .txt, .jsonl, .csv, .tsv,
.parquet; streamed by jobs.batch) or stdin; results go out as a table on a terminal, as JSON lines
when stdout is piped, or to --output, in input order. Which bundles a
command serves is the tasks' declaration (``command``); `predict` serves any bundle.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer
from rich import progress as rp
from rich.table import Table

from mlmkit.args import (
    EmbedArgs,
    ExportArgs,
    InferenceArgs,
    MineArgs,
    QaArgs,
    RerankArgs,
    ServeArgs,
)
from mlmkit.cli.common import (
    Json,
    err,
    handle_errors,
    out,
    print_json,
    print_results,
    want_json,
    with_args,
    with_task_options,
)
from mlmkit.errors import ConfigError
from mlmkit.files import JSONObject
from mlmkit.registry import Options, Prediction, tasks

app = typer.Typer()


# ---- export ------------------------------------------------------------------------------------
@app.command("export")
@handle_errors
@with_task_options("export")
@with_args(ExportArgs)
def export_cmd(args: ExportArgs, options: Options, as_json: Json = False) -> None:
    """Export an mlmkit run or a Hugging Face checkpoint (BERT, RoBERTa, DistilBERT, ELECTRA, DeBERTa-v2,
    ModernBERT) to an ONNX bundle. --out: the bundle directory to write, e.g. exports/NAME."""
    from dataclasses import replace

    from mlmkit.exporter.bundle import export
    from mlmkit.runtime.precision import said

    with err.status(f"exporting {args.run} ..."):
        meta = export(replace(args, options=options))
    summary = {k: getattr(meta, k)
               for k in ("task", "precision", "opset", "fused_operators", "parity", "model_bytes")}
    summary["optimizations"] = list(meta.optimizations)
    summary["bundle"] = str(args.out)
    # a precision's gate (the sample stays in the file)
    gates = {k: v for k, v in meta.gate.items() if isinstance(v, dict)}
    summary["gates"] = gates
    if want_json(as_json):
        print_json(summary)
        return
    t = Table(title=f"{meta.task} bundle {args.out} ({meta.precision}, opset {args.opset}, "
                    f"{meta.model_bytes / 1e6:.1f} MB)")
    t.add_column("check")
    t.add_column("result")
    fused = ", ".join(f"{k} {v}" for k, v in meta.fused_operators.items()) or "none (--no-optimize)"
    t.add_row("fused operators", fused)
    p = meta.parity
    for name, diff in p["max_abs_diff"].items():
        t.add_row(f"max abs diff vs PyTorch: {name}", f"{diff:.2e}")
    t.add_row("top-1 agreement vs PyTorch", _share(p["top1_agreement"]))
    if "int8_top1_agreement_vs_fp32" in p:
        t.add_row("int8 top-1 agreement vs fp32", _share(p["int8_top1_agreement_vs_fp32"]))
    if "fp16_check" in p:
        t.add_row("fp16 vs fp32", p["fp16_check"] if p["fp16_top1_agreement_vs_fp32"] is None
                  else f"top-1 agreement {_share(p['fp16_top1_agreement_vs_fp32'])}")
    s = p["sample"]
    t.add_row("sample",
              f"{s['rows']} inputs of {s['min_length']}-{s['max_length']} tokens in one padded batch")
    for name, g in gates.items():
        t.add_row(f"{name} gate vs fp32",
                  said(g) if g.get("passed") is not None else f"not measured: {g['not_measured']}")
    out.print(t)


def _share(x: float | None) -> str:
    return "n/a (no output makes a choice)" if x is None else f"{x:.2%}"


# ---- inference ---------------------------------------------------------------------------------
def run_inference(command: str | None, args: InferenceArgs, options: Options,
                  texts: list[Any] | None = None) -> None:
    """Load the bundle (refusing one that ``command`` does not serve), stream the inputs through it
    window by window (jobs.batch), and write the results: a file, JSON lines when piped, a table on a
    terminal."""
    from mlmkit.files import is_stream, json_line
    from mlmkit.jobs.batch import batch, default_workers, steady_memory
    from mlmkit.runtime.pipeline import Pipeline
    from mlmkit.runtime.prediction import warn_truncated
    from mlmkit.text.record import Record
    from mlmkit.text.records import input_files, iter_inputs, stdin_inputs

    skip = args.on_error == "skip"
    texts = texts if texts is not None else args.texts
    if texts and args.input_file is not None:
        raise ConfigError("give input texts or --input, not both")
    if args.resume and args.output is None:
        raise ConfigError("--resume needs --output", "a job writing to stdout starts over")
    files = None
    if texts:
        items: Any = [Record("<arguments>", n, t) for n, t in enumerate(texts, start=1)]
    elif args.input_file is not None:
        files = input_files(args.input_file)
        items = iter_inputs(args.input_file, skip=skip, max_bytes=args.max_record_bytes)
    elif sys.stdin.isatty():
        raise ConfigError("no inputs", "give texts as arguments, a file with --input, or pipe them on stdin")
    else:
        items = stdin_inputs(skip=skip, max_bytes=args.max_record_bytes)
    steady_memory()  # this process is the job's: before the session's and the tokenizer's threads start
    pipe = Pipeline.load(args.bundle, device=args.device, threads=args.threads, batch_size=args.batch_size,
                         batch_tokens=args.batch_tokens, command=command, precision=args.precision,
                         min_agreement=args.min_agreement)
    if args.engine == "ray":
        from mlmkit.jobs.ray import run_cli

        return run_cli(pipe, args, options)
    stream = args.output is not None and is_stream(args.output)  # written through by jobs.batch, as JSON
    errors = args.errors or (args.output.with_name(args.output.name + ".errors.jsonl")
                             if skip and args.output and not stream else None)
    table = not want_json(args.as_json) and args.output is None
    shown: list[Any] = []
    results: list[Prediction] = []
    failed: list[JSONObject] = []  # the lines of --errors
    progress = rp.Progress(rp.TextColumn("{task.description}"), rp.MofNCompleteColumn(),
                           rp.TextColumn("[cyan]{task.fields[rate]}"), rp.TimeElapsedColumn(), console=err,
                           transient=True, disable=texts is not None or not err.is_terminal)
    n = bad = cut = 0
    with progress:
        bar = progress.add_task(pipe.task, total=None, rate="")
        for w, done in batch(pipe, items, options=options, window=args.window,
                             workers=args.workers or default_workers(),
                             threads=args.threads, skip=skip, id_column=args.id_column, output=args.output,
                             errors=errors, resume=args.resume, inputs=files):
            n, bad, cut = n + len(done.results), bad + len(done.errors), cut + done.truncated
            if args.output is None and not table:
                sys.stdout.write("".join(map(json_line, done.results)))
                sys.stdout.flush()
            elif table:
                shown.extend(w.records[i].data for i in done.kept)
                results.extend(done.results)
            if args.output is None or stream:
                failed.extend(done.errors)
            progress.advance(bar, len(w.items))
            speed = progress.tasks[0].speed
            progress.update(bar, rate=f"{speed:,.0f} items/s" if speed else "")
    if cut:
        warn_truncated(cut, n, pipe.max_length)
    if args.output is not None and str(args.output) != "-":
        err.print(f"wrote {n} results to {args.output}")
    if failed:
        _report_errors(failed, errors)
    elif bad:
        err.print(f"skipped {bad} bad records: see {errors}")
    if table:
        print_results(pipe.task, shown, results, pipe.summary)


def _report_errors(failed: list[JSONObject], errors: Path | None) -> None:
    from mlmkit.files import write_jsonl

    if errors is not None:
        write_jsonl(errors, failed)
        err.print(f"skipped {len(failed)} bad records: see {errors}")
        return
    err.print(f"skipped {len(failed)} bad records (--errors FILE lists them), the first: "
              f"{failed[0]['error']}")


@app.command()
@handle_errors
@with_task_options("qa")
@with_args(QaArgs)
def qa(args: QaArgs, options: Options) -> None:
    """Answer questions with a span of their context: answer text, score and character span."""
    items = [{"question": q, "context": args.context} for q in args.texts] if args.texts else None
    run_inference("qa", args, options, items)


@app.command()
@handle_errors
@with_task_options("embed")
@with_args(EmbedArgs)
def embed(args: EmbedArgs, options: Options) -> None:
    """One vector per text with an embedding bundle (pooling and normalisation are the bundle's); with
    --chunk-tokens, a vector per chunk of each text, with its span."""
    chunks = args.chunk_options()
    # else Pipeline.load says what is wrong, in one line
    if chunks and (args.bundle / "mlmkit.json").is_file():
        from mlmkit.runtime.bundle import read_bundle_meta

        task = read_bundle_meta(args.bundle).task
        if task != "embedding":
            raise ConfigError(f"--chunk-tokens: {args.bundle} is a {task} bundle, and embed chunks texts for "
                              "embedding "
                              "bundles", "an index chunks documents for every kind: mlmkit index BUNDLE "
                                         "--chunk-tokens N")
    run_inference("embed", args, {**options, **chunks})


@app.command()
@handle_errors
@with_args(RerankArgs)
def rerank(args: RerankArgs, as_json: Json = False) -> None:
    """Rank documents for a query with a cross-encoder (the score: the sigmoid of its logit) or a colbert
    bundle (MaxSim), most relevant first."""
    from mlmkit.retrieval.reranking import late_interaction, rerank_documents
    from mlmkit.runtime.bundle import read_bundle_meta
    from mlmkit.runtime.pipeline import Pipeline
    from mlmkit.text.records import iter_inputs

    docs = list(args.documents
                or []) + ([rec.line_text(args.text_column) for rec in iter_inputs(args.input_file)]
                          if args.input_file is not None else [])
    if not docs:
        raise ConfigError("no documents to rank", "give them as arguments or with --input FILE")
    # else Pipeline.load says what is wrong, in one line
    described = (Path(args.bundle) / "mlmkit.json").is_file()
    # else a classifier, or why not
    late = described and late_interaction(read_bundle_meta(args.bundle).outputs)
    pipe = Pipeline.load(args.bundle, command=None if late else "classify", precision=args.precision)
    ranked = rerank_documents(pipe, args.query, docs, top_n=args.top_n, raw=args.raw_scores)
    if want_json(as_json):
        for r in ranked:
            print_json(r)
        return
    table = Table("rank", "index", "score", "document")
    for k, r in enumerate(ranked, 1):
        table.add_row(str(k), str(r["index"]), f"{r['score']:.4f}", r["text"])
    out.print(table)


def _task_command(command: str, description: str) -> None:
    """`mlmkit COMMAND BUNDLE`: the inference command a registered task names (``Task.command``) where
    none is written above (the built-in fill-mask's, a plugin's), run as predict runs its bundles."""
    def run(args: InferenceArgs, options: Options) -> None:
        run_inference(command, args, options)

    run.__doc__ = description
    app.command(command)(handle_errors(with_task_options(command)(with_args(InferenceArgs)(run))))


def add_task_commands() -> None:
    """`mlmkit COMMAND BUNDLE` for every registered task that names an inference command
    (``Task.command``: classify, tag, fill-mask, a plugin's) and has none written above, each run as
    predict runs its bundles. Called once, when the command line is built (the tasks discovered then)."""
    written = {c.name or c.callback.__name__ for c in app.registered_commands if c.callback}
    for command in sorted({p.command for p in tasks().values() if p.command} - written):
        described = next(p.description for _, p in sorted(tasks().items()) if p.command == command)
        _task_command(command, described)


@app.command()
@handle_errors
@with_task_options("predict")
@with_args(InferenceArgs)
def predict(args: InferenceArgs, options: Options) -> None:
    """Run any bundle on its inputs: dispatches on the bundle's task (its options default to the export's)."""
    run_inference(None, args, options)


@app.command()
@handle_errors
@with_args(MineArgs)
def mine(args: MineArgs, as_json: Json = False) -> None:
    """Mine hard negatives for (query, positive) data: a BEIR directory or anchor, positive rows, ranked by
    BM25 or an embedding bundle. --out: the rows to write (.jsonl): anchor, positive, negative_1 ...
    negative_K."""
    from mlmkit.retrieval.mining import mine as run

    with err.status(f"mining {args.data} ..."):
        stats = run(args)
    if want_json(as_json):
        print_json(stats)
        return
    short = ", ".join(f"{n} ({why})" for why, n in stats["short"].items()) or "none"
    held = f" ({stats['held_out']:,} other splits' answers left out)" if stats["held_out"] else ""
    out.print(f"{stats['rows']:,} rows with {stats['negatives']:,} negatives from {stats['documents']:,} "
              f"documents{held} "
              f"-> {stats['out']}; rows with fewer than {args.negatives}: {short}")


@app.command()
@handle_errors
@with_args(ServeArgs)
def serve(args: ServeArgs) -> None:
    r"""Serve bundles over HTTP with dynamic batching (FastAPI on uvicorn; pip install 'mlmkit\[serve]').

    POST /v1/models/NAME/predict {"inputs": [...], "options": {...}}; GET /v1/models, /health, /ready,
    /metrics, /docs. SIGTERM drains: requests in flight finish, new ones get 503."""
    from mlmkit.serve.server import serve as run

    run(args)
