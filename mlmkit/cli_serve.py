"""`mlmkit export` and the onnxruntime inference commands, registered on the app of cli.py.

The inference commands (fill-mask, classify, tag, qa, predict) import the runtime only, never
torch: a cold start stays under a second. Inputs come from arguments, --input (.txt, .jsonl,
.csv, .tsv) or stdin; results go out as a table on a terminal, as JSON lines with --output or
when stdout is piped, in input order.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import progress as rp
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .cli import (
    Aggregation,
    BatchSize,
    Device,
    DocStride,
    Json,
    MaxAnswer,
    PairColumn,
    TextColumn,
    _task_options,
    app,
    err,
    handle_errors,
    out,
    want_json,
)
from .errors import ConfigError

LONG_INPUT = 200  # inputs from which a progress bar is shown
CHUNK = 4096  # inputs per pipeline call: bounded memory, results streamed out chunk by chunk

Bundle = Annotated[Path, typer.Argument(help="A bundle directory written by `mlmkit export`.")]
Texts = Annotated[list[str] | None, typer.Argument(help="Input texts (or use --input, or pipe them on stdin).", show_default=False)]
InputFile = Annotated[Path | None, typer.Option("--input", "-i", help="Inputs: .txt (one per line), .jsonl, .csv or .tsv.")]
OutputFile = Annotated[Path | None, typer.Option("--output", "-o", help="Write the results as JSON lines to this file.")]
Threads = Annotated[int | None, typer.Option("--threads", help="onnxruntime intra-op threads (default: one per physical core).")]
TopK = Annotated[int | None, typer.Option("--top-k", help="fill-mask: candidates per [MASK] (at most the --top-k of the export).")]


# ---- export ------------------------------------------------------------------------------------
@app.command("export")
@handle_errors
def export_cmd(
    run: Annotated[Path, typer.Argument(help="A pretraining run (exported as fill-mask) or a fine-tuned run.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Bundle directory to write, e.g. exports/NAME.")],
    quantize: Annotated[str | None, typer.Option("--quantize", help="int8: dynamic int8 weights, for the CPU.")] = None,
    fp16: Annotated[bool, typer.Option("--fp16", help="fp16 weights and compute, for --device cuda.")] = False,
    no_optimize: Annotated[bool, typer.Option("--no-optimize", help="Skip onnxruntime's transformer fusions (the plain graph).")] = False,
    opset: Annotated[int, typer.Option("--opset", help="ONNX opset (17 or newer).")] = 17,
    top_k: Annotated[int, typer.Option("--top-k", help="fill-mask: candidates per [MASK] computed in the graph.")] = 5,
    as_json: Json = False,
) -> None:
    """Export a run to a self-contained ONNX bundle (model.onnx, tokenizer.json, mlmkit.json)."""
    from .export import export

    with err.status(f"exporting {run} ..."):
        meta = export(run, out_dir, quantize=quantize, fp16=fp16, optimize=not no_optimize, opset=opset, top_k=top_k)
    summary = {k: meta[k] for k in ("task", "precision", "opset", "optimizations", "fused_operators", "parity", "model_bytes")}
    summary["bundle"] = str(out_dir)
    if want_json(as_json):
        sys.stdout.write(json.dumps(summary) + "\n")
        return
    t = Table(title=f"{meta['task']} bundle {out_dir} ({meta['precision']}, opset {opset}, {meta['model_bytes'] / 1e6:.1f} MB)")
    t.add_column("check")
    t.add_column("result")
    fused = ", ".join(f"{k} {v}" for k, v in meta["fused_operators"].items()) or "none (--no-optimize)"
    t.add_row("fused operators", fused)
    p = meta["parity"]
    for name, diff in p["max_abs_diff"].items():
        t.add_row(f"max abs diff vs PyTorch: {name}", f"{diff:.2e}")
    t.add_row("top-1 agreement vs PyTorch", f"{p['top1_agreement']:.2%}")
    for key, label in (("int8_top1_agreement_vs_fp32", "int8 top-1 agreement vs fp32"),
                       ("fp16_top1_agreement_vs_fp32", "fp16 top-1 agreement vs fp32")):
        if key in p:
            t.add_row(label, "not measured (no CUDA here)" if p[key] is None else f"{p[key]:.2%}")
    s = p["sample"]
    t.add_row("sample", f"{s['rows']} inputs of {s['min_length']}-{s['max_length']} tokens in one padded batch")
    out.print(t)


# ---- inference ---------------------------------------------------------------------------------
def _inputs(texts: list[str] | None, input_file: Path | None) -> list[Any]:
    from .runtime import read_inputs, read_stdin

    if texts and input_file is not None:
        raise ConfigError("give input texts or --input, not both")
    if texts:
        return list(texts)
    if input_file is not None:
        return read_inputs(input_file)
    if sys.stdin.isatty():
        raise ConfigError("no inputs", "give texts as arguments, a file with --input, or pipe them on stdin")
    return read_stdin()


def _chunks(items: list[Any]) -> Iterator[list[Any]]:
    for i in range(0, len(items), CHUNK):
        yield items[i : i + CHUNK]


def _serve(
    command: str | None, bundle: Path, items: list[Any], *, output: Path | None, batch_size: int, device: str,
    threads: int | None, as_json: bool, **call: Any,
) -> None:
    """Load the bundle (refusing one of another task), run it over ``items``, write the results."""
    from .runtime import Pipeline

    pipe = Pipeline.load(bundle, device=device, threads=threads, batch_size=batch_size, command=command)
    call = _task_options(**call)  # options left unset take the bundle's
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
    sink = output.open("w", encoding="utf-8") if output is not None else None
    stream = sink if sink is not None else (sys.stdout if want_json(as_json) else None)
    results: list[dict[str, Any]] = []
    progress = rp.Progress(
        rp.TextColumn("{task.description}"), rp.BarColumn(), rp.MofNCompleteColumn(),
        rp.TextColumn("[cyan]{task.fields[rate]}"), rp.TimeElapsedColumn(),
        console=err, transient=True, disable=len(items) < LONG_INPUT or not err.is_terminal,
    )
    try:
        with progress:
            bar = progress.add_task(pipe.task, total=len(items), rate="")

            def advance(n: float) -> None:
                progress.advance(bar, n)
                speed = progress.tasks[0].speed
                progress.update(bar, rate=f"{speed:,.0f} items/s" if speed else "")

            for chunk in _chunks(items):
                got = pipe(chunk, progress=advance, **call)
                if stream is not None:
                    stream.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in got))
                    stream.flush()
                else:
                    results.extend(got)
    finally:
        if sink is not None:
            sink.close()
    if output is not None:
        err.print(f"wrote {len(items)} results to {output}")
    elif stream is None:
        print_results(pipe.task, items, results)


def _short(x: Any, n: int = 70) -> str:
    s = x if isinstance(x, str) else json.dumps(x, ensure_ascii=False)
    return escape(s if len(s) <= n else s[: n - 1] + "…")


def print_results(task: str, items: list[Any], results: list[dict[str, Any]], console: Console | None = None) -> None:
    """Results of a pipeline as a rich table (the quickstart prints its predictions with this too)."""
    console = console or out
    if not results:
        err.print("no inputs, no results")
        return
    t = Table(title=f"{task}: {len(results)} results")
    t.add_column("#", justify="right")
    if task == "fill-mask":
        for c in ("text", "[MASK]", "candidates"):
            t.add_column(c)
        for i, r in enumerate(results):
            if not r["masks"]:
                t.add_row(str(i), _short(r["text"]), "", f"[red]{escape(r.get('error', ''))}")
            for k, m in enumerate(r["masks"]):
                cands = ", ".join(f"{escape(c['token'])} [dim]{c['score']:.3f}[/]" for c in m["candidates"])
                t.add_row(str(i) if k == 0 else "", _short(r["text"]) if k == 0 else "", f"{k + 1} @{m['start']}", cands)
    elif task == "classification":
        for c in ("text", "label", "score"):
            t.add_column(c, justify="right" if c == "score" else "left")
        for i, (x, r) in enumerate(zip(items, results)):
            t.add_row(str(i), _short(x), escape(str(r.get("label"))), f"{r.get('score', 0):.3f}")
    elif task == "tagging":
        t.add_column("text")
        t.add_column("entities")
        for i, (x, r) in enumerate(zip(items, results)):
            ents = "; ".join(f"{escape(e['text'])} [bold]{escape(e['type'])}[/] [dim]{e['score']:.2f} {e['start']}:{e['end']}[/]"
                             for e in r.get("entities", []))
            t.add_row(str(i), _short(x), ents or "[dim]none")
    elif task == "qa":
        for c in ("question", "answer", "score", "span"):
            t.add_column(c)
        for i, (x, r) in enumerate(zip(items, results)):
            q = x.get("question", "") if isinstance(x, dict) else x
            span = f"{r['start']}:{r['end']}" if r.get("start", -1) >= 0 else "-"
            t.add_row(str(i), _short(q), escape(r.get("answer") or "(no answer)"), f"{r.get('score', 0):.3f}", span)
    else:
        t.add_column("input")
        t.add_column("result")
        for i, (x, r) in enumerate(zip(items, results)):
            t.add_row(str(i), _short(x), _short(r, 120))
    console.print(t)


@app.command("fill-mask")
@handle_errors
def fill_mask(
    bundle: Bundle,
    texts: Texts = None,
    input_file: InputFile = None,
    output: OutputFile = None,
    top_k: TopK = None,
    batch_size: BatchSize = 32,
    device: Device = "cpu",
    threads: Threads = None,
    as_json: Json = False,
) -> None:
    """Top-k tokens for every [MASK] in each text; a text without [MASK] gets an "error" field."""
    _serve("fill-mask", bundle, _inputs(texts, input_file), output=output, batch_size=batch_size, device=device,
           threads=threads, as_json=as_json, top_k=top_k)


@app.command()
@handle_errors
def classify(
    bundle: Bundle,
    texts: Texts = None,
    input_file: InputFile = None,
    output: OutputFile = None,
    batch_size: BatchSize = 32,
    device: Device = "cpu",
    threads: Threads = None,
    as_json: Json = False,
    text_column: TextColumn = None,
    pair_column: PairColumn = None,
) -> None:
    """Label each text (or text pair) with a classification bundle; long texts are truncated."""
    _serve("classify", bundle, _inputs(texts, input_file), output=output, batch_size=batch_size, device=device,
           threads=threads, as_json=as_json, text_column=text_column, pair_column=pair_column)


@app.command()
@handle_errors
def tag(
    bundle: Bundle,
    texts: Texts = None,
    input_file: InputFile = None,
    output: OutputFile = None,
    batch_size: BatchSize = 32,
    device: Device = "cpu",
    threads: Threads = None,
    as_json: Json = False,
    aggregation: Aggregation = None,
) -> None:
    """Tag the words of each text: entities with character offsets and scores (long texts windowed)."""
    _serve("tag", bundle, _inputs(texts, input_file), output=output, batch_size=batch_size, device=device,
           threads=threads, as_json=as_json, aggregation=aggregation)


@app.command()
@handle_errors
def qa(
    bundle: Bundle,
    questions: Annotated[list[str] | None, typer.Argument(help="Questions about --context (or records via --input / stdin).", show_default=False)] = None,
    context: Annotated[str | None, typer.Option("--context", help="The context the question arguments are asked about.")] = None,
    input_file: InputFile = None,
    output: OutputFile = None,
    batch_size: BatchSize = 32,
    device: Device = "cpu",
    threads: Threads = None,
    as_json: Json = False,
    doc_stride: DocStride = None,
    max_answer_length: MaxAnswer = None,
) -> None:
    """Answer questions with a span of their context: answer text, score and character span."""
    if questions and context is None:
        raise ConfigError("questions given without --context", "pass --context TEXT, or records with question and context via --input")
    if context is not None and not questions:
        raise ConfigError("--context given without questions", "add the questions as arguments")
    items = [{"question": q, "context": context} for q in questions] if questions else _inputs(None, input_file)
    _serve("qa", bundle, items, output=output, batch_size=batch_size, device=device, threads=threads,
           as_json=as_json, doc_stride=doc_stride, max_answer_length=max_answer_length)


@app.command()
@handle_errors
def predict(
    bundle: Bundle,
    texts: Texts = None,
    input_file: InputFile = None,
    output: OutputFile = None,
    batch_size: BatchSize = 32,
    device: Device = "cpu",
    threads: Threads = None,
    as_json: Json = False,
) -> None:
    """Run any bundle on its inputs: dispatches on the bundle's task (task options from the export)."""
    _serve(None, bundle, _inputs(texts, input_file), output=output, batch_size=batch_size, device=device,
           threads=threads, as_json=as_json)
