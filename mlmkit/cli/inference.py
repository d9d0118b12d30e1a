"""`mlmkit export`, the onnxruntime inference commands (fill-mask, classify, tag, qa, embed, predict)
and `mlmkit serve`.

The inference commands import the runtime only, never torch: a cold start stays under a second.
Inputs come from arguments, --input (files, directories or globs of .txt, .jsonl, .csv, .tsv,
.parquet; streamed by jobs.batch) or stdin; results go out as a table on a terminal, as JSON lines
when stdout is piped, or to --output, in input order. Which bundles a
command serves is the tasks' declaration (``command``); `predict` serves any bundle.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import progress as rp
from rich.table import Table

from mlmkit.args import (
    MIN_AGREEMENT_HELP,
    PRECISION_HELP,
    Args,
    ExportArgs,
    MineArgs,
    ServeArgs,
    arg,
    check_precision,
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
from mlmkit.files import MAX_RECORD_BYTES
from mlmkit.infer.jobs import WINDOW

app = typer.Typer()



@dataclass
class InferenceArgs(Args):
    """What every inference command takes."""

    bundle: Path = arg(help="A bundle directory written by `mlmkit export`.", positional=True)
    texts: list[str] | None = arg(None, "Input texts (or use --input, or pipe them on stdin).", positional=True)
    input_file: Path | None = arg(None, "Inputs: a .txt (one per line), .jsonl, .csv, .tsv or .parquet file, a directory of them, or a glob (quoted).", flags=("--input", "-i"))
    output: Path | None = arg(None, "Write the results to this file: .jsonl (JSON lines; any other suffix too), .parquet, .csv, .tsv, or .npy (embeddings); "
                                    "- (stdout), a FIFO or a device: JSON lines, streamed.",
                              flags=("--output", "-o"))
    batch_size: int = arg(32, "Inputs per batch (length-bucketed).")
    batch_tokens: int | None = arg(None, "Most padded tokens per batch (0: no limit; default on the CPU: what keeps a "
                                         "batch in cache, 512 at hidden size 384; on CUDA no limit).")
    device: str = arg("cpu", "cpu or cuda (falls back to the CPU, saying so, without onnxruntime-gpu or a GPU).")
    precision: str | None = arg(None, PRECISION_HELP)
    min_agreement: float | None = arg(None, MIN_AGREEMENT_HELP)
    threads: int | None = arg(None, "onnxruntime intra-op threads (default: one per physical core).")
    as_json: bool = arg(False, "Print JSON lines instead of a table (the default when piped).", flags=("--json",))
    window: int = arg(WINDOW, "Records read, length-bucketed and written together: memory holds one window per worker.")
    workers: int | None = arg(None, "Processes, each with its own onnxruntime session and a share of the threads "
                                    "(default: what measured fastest, see docs/performance.md).")
    on_error: str = arg("stop", "stop: a bad record ends the job, naming it; skip: it is listed in --errors and the job goes on.")
    errors: Path | None = arg(None, "With --on-error skip: the JSON-lines list of bad records "
                                    "(default: OUTPUT.errors.jsonl, or a count on stderr).")
    resume: bool = arg(False, "Continue the unfinished job that writes --output, after the records it finished.")
    id_column: str | None = arg(None, "Carry this input field (JSONL, CSV, TSV, Parquet) into each result under its own name "
                                      "(Parquet output: with its type; JSON lines: timestamps ISO 8601, binary base64).")
    max_record_bytes: int = arg(MAX_RECORD_BYTES, "A longer input line or value is a bad record (never read whole; "
                                                  "--on-error skip steps over it).")
    engine: str = arg("local", "local, or ray: Ray Data map_batches on a cluster (pip install 'mlmkit[ray]').")
    address: str | None = arg(None, "With --engine ray: the cluster to join (e.g. auto); default: a Ray started here.")

    def __post_init__(self) -> None:
        checks = [(self.batch_size >= 1, f"--batch-size must be at least 1, got {self.batch_size}"),
                  (self.batch_tokens is None or self.batch_tokens >= 0, f"--batch-tokens must be 0 (no limit) or more, got {self.batch_tokens}"),
                  (self.threads is None or self.threads >= 1, f"--threads must be at least 1, got {self.threads}"),
                  (self.window >= 1, f"--window must be at least 1, got {self.window}"),
                  (self.workers is None or self.workers >= 1, f"--workers must be at least 1, got {self.workers}"),
                  (self.on_error in ("stop", "skip"), f"--on-error {self.on_error}: use stop or skip"),
                  (self.max_record_bytes >= 1, f"--max-record-bytes must be at least 1, got {self.max_record_bytes}"),
                  (self.engine in ("local", "ray"), f"--engine {self.engine}: use local or ray"),
                  (self.engine == "local" or self.output is not None, "--engine ray needs --output (a file or directory)"),
                  (self.errors is None or self.on_error == "skip",
                   "--errors goes with --on-error skip (with stop, the first bad record ends the job, naming it)"),
                  (self.address is None or self.engine == "ray", "--address goes with --engine ray (the cluster to join)")]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        check_precision(self.precision, self.min_agreement)


# ---- export ------------------------------------------------------------------------------------
@app.command("export")
@handle_errors
@with_task_options("export")
@with_args(ExportArgs)
def export_cmd(args: ExportArgs, options: dict[str, Any], as_json: Json = False) -> None:
    """Export an mlmkit run or a Hugging Face checkpoint (BERT, RoBERTa, DistilBERT, ELECTRA, DeBERTa-v2, ModernBERT) to an ONNX bundle."""
    from dataclasses import replace

    from mlmkit.exporter.bundle import export
    from mlmkit.infer.precision import said

    with err.status(f"exporting {args.run} ..."):
        meta = export(replace(args, options=options))
    summary = {k: getattr(meta, k) for k in ("task", "precision", "opset", "fused_operators", "parity", "model_bytes")}
    summary["optimizations"] = list(meta.optimizations)
    summary["bundle"] = str(args.out)
    gates = {k: v for k, v in meta.gate.items() if isinstance(v, dict)}  # a precision's gate (the sample stays in the file)
    summary["gates"] = gates
    if want_json(as_json):
        print_json(summary)
        return
    t = Table(title=f"{meta.task} bundle {args.out} ({meta.precision}, opset {args.opset}, {meta.model_bytes / 1e6:.1f} MB)")
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
    t.add_row("sample", f"{s['rows']} inputs of {s['min_length']}-{s['max_length']} tokens in one padded batch")
    for name, g in gates.items():
        t.add_row(f"{name} gate vs fp32", said(g) if g.get("passed") is not None else f"not measured: {g['not_measured']}")
    out.print(t)


def _share(x: float | None) -> str:
    return "n/a (no output makes a choice)" if x is None else f"{x:.2%}"


# ---- inference ---------------------------------------------------------------------------------
def run_inference(command: str | None, args: InferenceArgs, options: dict[str, Any], texts: list[Any] | None = None) -> None:
    """Load the bundle (refusing one that ``command`` does not serve), stream the inputs through it
    window by window (jobs.batch), and write the results: a file, JSON lines when piped, a table on a
    terminal."""
    from mlmkit.files import is_stream, json_line
    from mlmkit.infer.evaluation import warn_truncated
    from mlmkit.infer.jobs import batch, default_workers, steady_memory
    from mlmkit.infer.pipeline import Pipeline
    from mlmkit.text.readers import Record
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
        from mlmkit.infer.integrations.ray import run_cli

        return run_cli(pipe, args, options)
    stream = args.output is not None and is_stream(args.output)  # written through by jobs.batch, as JSON lines
    errors = args.errors or (args.output.with_name(args.output.name + ".errors.jsonl") if skip and args.output and not stream
                             else None)
    table = not want_json(args.as_json) and args.output is None
    shown: list[Any] = []
    results: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    progress = rp.Progress(
        rp.TextColumn("{task.description}"), rp.MofNCompleteColumn(), rp.TextColumn("[cyan]{task.fields[rate]}"),
        rp.TimeElapsedColumn(), console=err, transient=True, disable=texts is not None or not err.is_terminal,
    )
    n = bad = cut = 0
    with progress:
        bar = progress.add_task(pipe.task, total=None, rate="")
        for w, done in batch(pipe, items, options=options, window=args.window, workers=args.workers or default_workers(),
                             threads=args.threads, skip=skip, id_column=args.id_column, output=args.output, errors=errors,
                             resume=args.resume, inputs=files):
            n, bad, cut = n + len(done.results), bad + len(done.errors), cut + done.truncated
            if args.output is None and not table:
                sys.stdout.write("".join(map(json_line, done.results)))
                sys.stdout.flush()
            elif table:
                records = w.records
                shown.extend(records[i].data for i in done.kept)
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


def _report_errors(failed: list[dict[str, Any]], errors: Path | None) -> None:
    from mlmkit.files import write_jsonl

    if errors is not None:
        write_jsonl(errors, failed)
        err.print(f"skipped {len(failed)} bad records: see {errors}")
        return
    err.print(f"skipped {len(failed)} bad records (--errors FILE lists them), the first: {failed[0]['error']}")


@app.command("fill-mask")
@handle_errors
@with_task_options("fill-mask")
@with_args(InferenceArgs)
def fill_mask(args: InferenceArgs, options: dict[str, Any]) -> None:
    """Top-k tokens for every [MASK] in each text; a text without [MASK] gets an "error" field."""
    run_inference("fill-mask", args, options)


@app.command()
@handle_errors
@with_task_options("classify")
@with_args(InferenceArgs)
def classify(args: InferenceArgs, options: dict[str, Any]) -> None:
    """Label each text (or text pair) with a classification bundle; long texts are truncated."""
    run_inference("classify", args, options)


@app.command()
@handle_errors
@with_task_options("tag")
@with_args(InferenceArgs)
def tag(args: InferenceArgs, options: dict[str, Any]) -> None:
    """Tag the words of each text: entities with character offsets and scores (long texts windowed)."""
    run_inference("tag", args, options)


@app.command()
@handle_errors
@with_task_options("qa")
@with_args(InferenceArgs)
def qa(
    args: InferenceArgs, options: dict[str, Any],
    context: Annotated[str | None, typer.Option("--context", help="The context that the text arguments (questions) ask about.")] = None,
) -> None:
    """Answer questions with a span of their context: answer text, score and character span."""
    if args.texts and context is None:
        raise ConfigError("questions given without --context", "pass --context TEXT, or records with question and context via --input")
    if context is not None and not args.texts:
        raise ConfigError("--context given without questions", "add the questions as arguments")
    items = [{"question": q, "context": context} for q in args.texts] if args.texts else None
    run_inference("qa", args, options, items)


@app.command()
@handle_errors
@with_task_options("embed")
@with_args(InferenceArgs)
def embed(args: InferenceArgs, options: dict[str, Any]) -> None:
    """One vector per text with an embedding bundle (pooling and normalisation are the bundle's)."""
    run_inference("embed", args, options)


@app.command()
@handle_errors
def rerank(
    bundle: Annotated[Path, typer.Argument(help="A cross-encoder bundle (a one-label sequence classifier).")],
    documents: Annotated[list[str] | None, typer.Argument(help="Documents to rank (or --input).")] = None,
    query: Annotated[str, typer.Option("--query", help="What the documents are ranked for.")] = "",
    input: Annotated[Path | None, typer.Option("--input", help="A file of documents: .txt one per line, .jsonl/.csv/.tsv/.parquet.")] = None,
    text_column: Annotated[str, typer.Option("--text-column", help="The documents' field in --input records.")] = "text",
    top_n: Annotated[int | None, typer.Option("--top-n", min=1, help="Keep the N most relevant.")] = None,
    raw_scores: Annotated[bool, typer.Option("--raw-scores", help="The cross-encoder's logits, not their sigmoid.")] = False,
    precision: Annotated[str | None, typer.Option("--precision", help=PRECISION_HELP)] = None,
    as_json: Json = False,
) -> None:
    """Rank documents for a query with a cross-encoder, most relevant first (the score: the sigmoid of its logit)."""
    from mlmkit.infer.pipeline import Pipeline
    from mlmkit.infer.reranking import rerank_documents
    from mlmkit.text.records import iter_inputs

    if not query.strip():
        raise ConfigError("no --query", "pass --query TEXT")
    docs = list(documents or []) + ([rec.line_text(text_column) for rec in iter_inputs(input)] if input is not None else [])
    if not docs:
        raise ConfigError("no documents to rank", "give them as arguments or with --input FILE")
    ranked = rerank_documents(Pipeline.load(bundle, command="classify", precision=precision), query, docs, top_n=top_n,
                              raw=raw_scores)
    if want_json(as_json):
        for r in ranked:
            print_json(r)
        return
    table = Table("rank", "index", "score", "document")
    for k, r in enumerate(ranked, 1):
        table.add_row(str(k), str(r["index"]), f"{r['score']:.4f}", r["text"])
    out.print(table)


@app.command()
@handle_errors
@with_task_options("predict")
@with_args(InferenceArgs)
def predict(args: InferenceArgs, options: dict[str, Any]) -> None:
    """Run any bundle on its inputs: dispatches on the bundle's task (its options default to the export's)."""
    run_inference(None, args, options)


@app.command()
@handle_errors
@with_args(MineArgs)
def mine(args: MineArgs, as_json: Json = False) -> None:
    """Mine hard negatives for (query, positive) data: a BEIR directory or anchor, positive rows, ranked by BM25 or an embedding bundle."""
    from mlmkit.infer.mining import mine as run

    with err.status(f"mining {args.data} ..."):
        stats = run(args)
    if want_json(as_json):
        print_json(stats)
        return
    short = ", ".join(f"{n} ({why})" for why, n in stats["short"].items()) or "none"
    held = f" ({stats['held_out']:,} other splits' answers left out)" if stats["held_out"] else ""
    out.print(f"{stats['rows']:,} rows with {stats['negatives']:,} negatives from {stats['documents']:,} documents{held} "
              f"-> {stats['out']}; rows with fewer than {args.negatives}: {short}")


@app.command("index")
@handle_errors
def index_cmd(
    bundle: Annotated[Path, typer.Argument(help="An embedding bundle (mlmkit export); a sparse-embedding one builds an "
                                           "inverted index.")],
    corpus: Annotated[Path, typer.Option("--corpus", help="Documents: a BEIR corpus.jsonl (_id, title, text), JSON lines, "
                                         "Parquet or CSV with an id column, or .txt (one a line, its line number the id).")],
    out_dir: Annotated[Path, typer.Option("--out", help="The index directory.")],
    quantize: Annotated[str, typer.Option("--quantize", help="float32, float16, int8 (calibrated ranges) or binary "
                                          "(sign bits, with an int8 copy for rescoring).")] = "float32",
    ann: Annotated[str, typer.Option("--ann", help="flat (exact), hnsw or ivf (faiss, beside the vectors).")] = "flat",
    rescore_copy: Annotated[str | None, typer.Option("--rescore-copy", help="float16: keep the vectors as float16 beside an "
                                                     "int8 or binary index, and rescore its candidates from them (binary "
                                                     "keeps an int8 copy otherwise).")] = None,
    append: Annotated[bool, typer.Option("--append", help="Add the documents to the index at --out.")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the build that was killed, after its last window.")] = False,
    id_column: Annotated[str | None, typer.Option("--id-column", help="The documents' id field (default: _id, else id).")] = None,
    text_column: Annotated[str, typer.Option("--text-column", help="The documents' text field (a title goes before it).")] = "text",
    window: Annotated[int, typer.Option("--window", min=1, help="Documents embedded and written together.")] = WINDOW,
    workers: Annotated[int, typer.Option("--workers", min=1, help="Embedding processes, each with a share of the threads.")] = 1,
    threads: Annotated[int | None, typer.Option("--threads", min=1, help="onnxruntime threads in all.")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Documents per onnxruntime batch.")] = 32,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    precision: Annotated[str | None, typer.Option("--precision", help=PRECISION_HELP)] = None,
    engine: Annotated[str, typer.Option("--engine", help="local, or ray: embed on a Ray cluster, --workers actors "
                                        "(pip install 'mlmkit[ray]'); the same index as a local build.")] = "local",
    address: Annotated[str | None, typer.Option("--address", help="With --engine ray: the cluster to join (e.g. auto); "
                                                "default: a Ray started here.")] = None,
    as_json: Json = False,
) -> None:
    """Embed a corpus into an on-disk index that `mlmkit search` reads: vectors memory-mapped (or a SPLADE bundle's inverted
    index), ids beside them, a manifest."""
    import time

    from mlmkit.infer.index import BuildArgs, build

    args = BuildArgs(bundle, corpus, out_dir, quantization=quantize, ann=ann, append=append, resume=resume, id_column=id_column,
                     text_column=text_column, window=window, workers=workers, threads=threads, batch_size=batch_size, device=device,
                     engine=engine, address=address, rescore_copy=rescore_copy, precision=precision)
    t0, done = time.perf_counter(), [0]
    with err.status(f"indexing {corpus} ...") as status:
        def advance(n: int) -> None:
            done[0] += n
            status.update(f"indexing {corpus}: {done[0]:,} documents, {done[0] / (time.perf_counter() - t0):,.0f} docs/s")

        m = build(args, advance)
    summary = {"index": str(out_dir), "count": m["count"], "dims": m["dims"], "quantization": m["quantization"], "ann": m["ann"],
               "added": m["shards"][-1]["count"], "seconds": round(time.perf_counter() - t0, 2)}
    if want_json(as_json):
        print_json(summary)
        return
    out.print(f"{summary['added']:,} documents added to {out_dir} ({m['count']:,} in all, {m['dims']} dims, {m['quantization']}, "
              f"--ann {m['ann']}) in {summary['seconds']} s")


@app.command("search")
@handle_errors
def search_cmd(
    index: Annotated[Path, typer.Argument(help="An index directory (mlmkit index).")],
    queries: Annotated[list[str] | None, typer.Argument(help="Query texts (or --input).")] = None,
    input: Annotated[Path | None, typer.Option("--input", help="Queries: .txt one a line, or .jsonl/.csv/.parquet records.")] = None,
    text_column: Annotated[str, typer.Option("--text-column", help="The queries' field in --input records.")] = "text",
    top_k: Annotated[int | None, typer.Option("--top-k", help="Hits per query (default 10, or every document of a "
                                              "smaller index).")] = None,
    rescore: Annotated[int | None, typer.Option("--rescore", help="Binary, --rescore-copy or ANN indexes: candidates scored again "
                                                "with the rescoring vectors (default: 4 x top-k, at least 100).")] = None,
    bundle: Annotated[Path | None, typer.Option("--bundle", help="The bundle to embed queries with (default: the index's; "
                                                "another is refused).")] = None,
    export: Annotated[Path | None, typer.Option("--export", help="Write the index's ids and vectors as Parquet instead "
                                                "(id, vector: fixed-size list of float32) and exit.")] = None,
    batch: Annotated[int, typer.Option("--batch", min=1, help="Queries embedded and searched together.")] = 256,
    precision: Annotated[str | None, typer.Option("--precision", help=PRECISION_HELP)] = None,
    as_json: Json = False,
) -> None:
    """The top-k documents of each query in an index, best first: JSON lines {"query", "hits": [{"id", "score"}]} or a table."""

    from mlmkit.files import json_line
    from mlmkit.infer.index import Index, as_input, as_queries, hits, query_bundle, search_vectors
    from mlmkit.infer.pipeline import Pipeline
    from mlmkit.text.records import iter_inputs

    ix = Index.open(index)
    if export is not None:
        from mlmkit.infer.index import export_parquet

        n = export_parquet(ix, export)
        err.print(f"wrote {n:,} ids and vectors to {export}")
        return
    texts = list(queries or []) + ([r.line_text(text_column) for r in iter_inputs(input)] if input is not None else [])
    if not texts:
        raise ConfigError("no queries", "give them as arguments or with --input FILE")
    top_k = min(10, ix.count) if top_k is None else top_k
    if top_k < 1 or top_k > ix.count:
        raise ConfigError(f"--top-k {top_k}: give 1 to the index's {ix.count:,} documents")
    pipe = Pipeline.load(query_bundle(ix, bundle), command="embed", precision=precision)
    table = not want_json(as_json)
    t = Table("query", "rank", "id", "score") if table else None
    for a in range(0, len(texts), batch):
        part = texts[a:a + batch]
        rows, scores = search_vectors(ix, as_queries(ix, pipe(part, **as_input(pipe, "query"))), top_k, rescore=rescore)
        for text, found in zip(part, hits(ix, rows, scores)):
            if t is None:
                sys.stdout.write(json_line({"query": text, "hits": found}))
            else:
                for k, h in enumerate(found, 1):
                    t.add_row(text if k == 1 else "", str(k), h["id"], f"{h['score']:.4f}")
    if t is not None:
        out.print(t)


@app.command()
@handle_errors
@with_args(ServeArgs)
def serve(args: ServeArgs) -> None:
    r"""Serve bundles over HTTP with dynamic batching (FastAPI on uvicorn; pip install 'mlmkit\[serve]').

    POST /v1/models/NAME/predict {"inputs": [...], "options": {...}}; GET /v1/models, /health, /ready,
    /metrics, /docs. SIGTERM drains: requests in flight finish, new ones get 503."""
    from mlmkit.infer.serve.server import serve as run

    run(args)
