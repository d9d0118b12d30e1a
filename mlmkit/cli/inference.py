"""`mlmkit export` and the onnxruntime inference commands: fill-mask, classify, tag, qa and predict.

The inference commands import the runtime only, never torch: a cold start stays under a second.
Inputs come from arguments, --input (.txt, .jsonl, .csv, .tsv) or stdin; results go out as a table
on a terminal, as JSON lines with --output or when stdout is piped, in input order. Which bundles a
command serves is the tasks' declaration (``command``); `predict` serves any bundle.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import progress as rp
from rich.table import Table

from ..args import Args, ExportArgs, arg
from ..errors import ConfigError
from .common import (
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

app = typer.Typer()

LONG_INPUT = 200  # inputs from which a progress bar is shown
CHUNK = 4096  # inputs per pipeline call: results streamed out chunk by chunk


@dataclass
class InferenceArgs(Args):
    """What every inference command takes."""

    bundle: Path = arg(help="A bundle directory written by `mlmkit export`.", positional=True)
    texts: list[str] | None = arg(None, "Input texts (or use --input, or pipe them on stdin).", positional=True)
    input_file: Path | None = arg(None, "Inputs: .txt (one per line), .jsonl, .csv or .tsv.", flags=("--input", "-i"))
    output: Path | None = arg(None, "Write the results to this file: .jsonl (JSON lines), .parquet, or .npy (embeddings).",
                              flags=("--output", "-o"))
    batch_size: int = arg(32, "Inputs per batch (length-bucketed).")
    device: str = arg("cpu", "cpu or cuda (falls back to the CPU, saying so, without onnxruntime-gpu or a GPU).")
    threads: int | None = arg(None, "onnxruntime intra-op threads (default: one per physical core).")
    as_json: bool = arg(False, "Print JSON lines instead of a table (the default when piped).", flags=("--json",))

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size must be at least 1, got {self.batch_size}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"--threads must be at least 1, got {self.threads}")


# ---- export ------------------------------------------------------------------------------------
@app.command("export")
@handle_errors
@with_task_options("pooling", "normalize", "problem_type")
@with_args(ExportArgs)
def export_cmd(args: ExportArgs, options: dict[str, Any], as_json: Json = False) -> None:
    """Export an mlmkit run or any Hugging Face BERT checkpoint to a self-contained ONNX bundle."""
    from dataclasses import replace

    from ..export import export

    with err.status(f"exporting {args.run} ..."):
        meta = export(replace(args, options=options))
    summary = {k: meta[k] for k in ("task", "precision", "opset", "optimizations", "fused_operators", "parity", "model_bytes")}
    summary["bundle"] = str(args.out)
    if want_json(as_json):
        print_json(summary)
        return
    t = Table(title=f"{meta['task']} bundle {args.out} ({meta['precision']}, opset {args.opset}, {meta['model_bytes'] / 1e6:.1f} MB)")
    t.add_column("check")
    t.add_column("result")
    fused = ", ".join(f"{k} {v}" for k, v in meta["fused_operators"].items()) or "none (--no-optimize)"
    t.add_row("fused operators", fused)
    p = meta["parity"]
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
    out.print(t)


def _share(x: float | None) -> str:
    return "n/a (no output makes a choice)" if x is None else f"{x:.2%}"


# ---- inference ---------------------------------------------------------------------------------
def _inputs(texts: list[str] | None, input_file: Path | None) -> list[Any]:
    from ..runtime import read_inputs, read_stdin

    if texts and input_file is not None:
        raise ConfigError("give input texts or --input, not both")
    if texts:
        return list(texts)
    if input_file is not None:
        return read_inputs(input_file)
    if sys.stdin.isatty():
        raise ConfigError("no inputs", "give texts as arguments, a file with --input, or pipe them on stdin")
    return read_stdin()


def _chunks(items: list[Any]) -> Iterator[tuple[int, list[Any]]]:
    """(number of the first input, inputs) of each chunk."""
    for i in range(0, len(items), CHUNK):
        yield i + 1, items[i : i + CHUNK]


def run_inference(command: str | None, args: InferenceArgs, options: dict[str, Any], items: list[Any] | None = None) -> None:
    """Load the bundle (refusing one that ``command`` does not serve), run it over the inputs, write
    the results."""
    from ..files import json_line
    from ..records import result_writer
    from ..runtime import Pipeline

    items = _inputs(args.texts, args.input_file) if items is None else items
    pipe = Pipeline.load(args.bundle, device=args.device, threads=args.threads, batch_size=args.batch_size, command=command)
    results: list[dict[str, Any]] = []
    progress = rp.Progress(
        rp.TextColumn("{task.description}"), rp.BarColumn(), rp.MofNCompleteColumn(),
        rp.TextColumn("[cyan]{task.fields[rate]}"), rp.TimeElapsedColumn(),
        console=err, transient=True, disable=len(items) < LONG_INPUT or not err.is_terminal,
    )
    with progress, (result_writer(args.output) if args.output is not None else contextlib.nullcontext()) as sink:
        bar = progress.add_task(pipe.task, total=len(items), rate="")

        def advance(n: float) -> None:
            progress.advance(bar, n)
            speed = progress.tasks[0].speed
            progress.update(bar, rate=f"{speed:,.0f} items/s" if speed else "")

        to_stdout = sink is None and want_json(args.as_json)
        for first, chunk in _chunks(items):
            got = pipe(chunk, progress=advance, first=first, **options)
            if sink is not None:
                sink(got)
            elif to_stdout:
                sys.stdout.write("".join(map(json_line, got)))
                sys.stdout.flush()
            else:
                results.extend(got)
    if args.output is not None:
        err.print(f"wrote {len(items)} results to {args.output}")
    elif not want_json(args.as_json):
        print_results(pipe.task, items, results, pipe.summary)


@app.command("fill-mask")
@handle_errors
@with_task_options("top_k")
@with_args(InferenceArgs)
def fill_mask(args: InferenceArgs, options: dict[str, Any]) -> None:
    """Top-k tokens for every [MASK] in each text; a text without [MASK] gets an "error" field."""
    run_inference("fill-mask", args, options)


@app.command()
@handle_errors
@with_task_options("text_column", "pair_column", "threshold")
@with_args(InferenceArgs)
def classify(args: InferenceArgs, options: dict[str, Any]) -> None:
    """Label each text (or text pair) with a classification bundle; long texts are truncated."""
    run_inference("classify", args, options)


@app.command()
@handle_errors
@with_task_options("aggregation")
@with_args(InferenceArgs)
def tag(args: InferenceArgs, options: dict[str, Any]) -> None:
    """Tag the words of each text: entities with character offsets and scores (long texts windowed)."""
    run_inference("tag", args, options)


@app.command()
@handle_errors
@with_task_options("doc_stride", "max_answer_length")
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
@with_task_options()
@with_args(InferenceArgs)
def embed(args: InferenceArgs, options: dict[str, Any]) -> None:
    """One vector per text with an embedding bundle (pooling and normalisation are the bundle's)."""
    run_inference("embed", args, options)


@app.command()
@handle_errors
@with_task_options("text_column", "pair_column", "doc_stride", "max_answer_length", "aggregation", "top_k", "threshold")
@with_args(InferenceArgs)
def predict(args: InferenceArgs, options: dict[str, Any]) -> None:
    """Run any bundle on its inputs: dispatches on the bundle's task (its options default to the export's)."""
    run_inference(None, args, options)
