"""The `mlmkit` command line: parse, call the library, render with rich. Nothing else lives here.

Library errors (MlmkitError) become one red line on stderr and exit status 2; `--debug` shows the
traceback. Heavy modules (torch) are imported inside the commands that need them, so the
inference commands start fast.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.table import Table

from .errors import MlmkitError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)
tokenizer_app = typer.Typer(no_args_is_help=True, help="Train WordPiece tokenizers.")
app.add_typer(tokenizer_app, name="tokenizer")

out = Console()
err = Console(stderr=True, soft_wrap=True)
_state = {"debug": False}
F = TypeVar("F", bound=Callable[..., Any])

# ---- options shared between commands -----------------------------------------------------------
Seed = Annotated[int, typer.Option("--seed", help="Random seed; a run is reproducible with the same seed.")]
Device = Annotated[str, typer.Option("--device", help="cpu or cuda (falls back to the CPU, saying so, without a GPU).")]
BatchSize = Annotated[int, typer.Option("--batch-size", help="Examples per batch.")]
LR = Annotated[float, typer.Option("--lr", help="Peak learning rate (linear warmup, then linear decay).")]
BF16 = Annotated[bool, typer.Option("--bf16", help="bf16 autocast; refused on a CPU without native bf16.")]
Resume = Annotated[bool, typer.Option("--resume", help="Continue from the last checkpoint in --out.")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table (the default when piped).")]
TextColumn = Annotated[str | None, typer.Option("--text-column", help="Classification: the text column / field.")]
PairColumn = Annotated[str | None, typer.Option("--pair-column", help="Classification: the second text of a pair.")]
LabelColumn = Annotated[str | None, typer.Option("--label-column", help="Classification: the label column / field.")]
DocStride = Annotated[int | None, typer.Option("--doc-stride", help="QA: overlap of context windows, in tokens.")]
MaxAnswer = Annotated[int | None, typer.Option("--max-answer-length", help="QA: longest answer, in tokens.")]
LabelAll = Annotated[bool | None, typer.Option("--label-all-tokens/--label-first-token", help="Tagging: label every sub-token, or only each word's first.")]
Scheme = Annotated[str | None, typer.Option("--scheme", help="Tagging: tag scheme of the data: auto, iob1, iob2 or bioes.")]
Aggregation = Annotated[str | None, typer.Option("--aggregation", help="Tagging: word prediction from sub-tokens: first, average or max.")]


def _task_options(**kw: Any) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


def handle_errors(fn: F) -> F:
    """MlmkitError -> one red line on stderr, exit status 2 (the traceback only with --debug)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MlmkitError as e:
            if _state["debug"]:
                raise
            err.print(f"[bold red]error:[/] {escape(e.message)}" + (f" [dim]({escape(e.hint)})[/]" if e.hint else ""), highlight=False)
            raise typer.Exit(code=2) from None
        except OSError as e:  # a folder that does not exist, a full disk, no permission
            if _state["debug"]:
                raise
            where = f": {e.filename}" if getattr(e, "filename", None) else ""
            err.print(f"[bold red]error:[/] {escape(e.strerror or str(e))}{escape(where)}", highlight=False)
            raise typer.Exit(code=2) from None

    return wrapper  # type: ignore[return-value]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        out.print(f"mlmkit {version('mlmkit')}")
        raise typer.Exit()


@app.callback()
def root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of errors.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only warnings and errors on stderr.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")] = False,
) -> None:
    """mlmkit: pre-train BERT encoders, fine-tune task heads, export to ONNX and serve them fast."""
    _state["debug"] = debug
    logger = logging.getLogger("mlmkit")
    logger.handlers[:] = [RichHandler(console=err, show_time=False, show_path=False, markup=False)]
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
    logger.propagate = False


def want_json(flag: bool) -> bool:
    return flag or not sys.stdout.isatty()


def print_metrics(metrics: dict[str, Any], title: str, as_json: bool) -> None:
    if want_json(as_json):
        sys.stdout.write(json.dumps(metrics) + "\n")
        return
    t = Table(title=title)
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in metrics.items():
        if isinstance(v, (int, float)):
            t.add_row(k, f"{v:.4f}" if isinstance(v, float) else str(v))
    out.print(t)


# ---- tokenizer ---------------------------------------------------------------------------------
@tokenizer_app.command("train")
@handle_errors
def tokenizer_train(
    corpus: Annotated[list[Path], typer.Argument(help="Corpus files (.txt, .txt.gz, .jsonl).")],
    out_file: Annotated[Path, typer.Option("--out", help="tokenizer.json to write (vocab.txt goes beside it), or a directory.")],
    vocab_size: Annotated[int, typer.Option("--vocab-size", help="Vocabulary size, special tokens included.")] = 8000,
    cased: Annotated[bool, typer.Option("--cased", help="Keep case and accents (default: lowercase, strip accents).")] = False,
) -> None:
    """Train a WordPiece tokenizer with BERT normalisation on a corpus."""
    from .checkpoint import atomic_write_text
    from .corpus import iter_sentences
    from .tokenizer import save_tokenizer, train_tokenizer

    tok = train_tokenizer(iter_sentences(corpus), vocab_size=vocab_size, cased=cased)
    if out_file.suffix == ".json" and out_file.name != "tokenizer.json":
        atomic_write_text(out_file, tok.to_str())  # just this file: never touch a tokenizer.json beside it
        err.print(f"wrote {out_file} ({tok.get_vocab_size()} tokens)")
        return
    d = out_file.parent if out_file.suffix == ".json" else out_file
    save_tokenizer(tok, d)
    err.print(f"wrote {d / 'tokenizer.json'} ({tok.get_vocab_size()} tokens), vocab.txt and tokenizer_config.json")


# ---- pretraining -------------------------------------------------------------------------------
@app.command()
@handle_errors
def pretrain(
    corpus: Annotated[list[Path], typer.Argument(help="Corpus files: one sentence per line, blank line between documents.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Run directory to write (a Hugging Face checkpoint).")],
    tokenizer: Annotated[Path | None, typer.Option("--tokenizer", help="tokenizer.json or vocab.txt; trained on the corpus if absent.")] = None,
    vocab_size: Annotated[int, typer.Option("--vocab-size", help="Vocabulary of the tokenizer trained when --tokenizer is absent.")] = 8000,
    cased: Annotated[bool, typer.Option("--cased", help="The trained tokenizer keeps case and accents.")] = False,
    preset: Annotated[str, typer.Option("--preset", help="Model size: tiny (L2/H128), mini (L4/H256), small (L4/H512), base (L12/H768).")] = "tiny",
    config: Annotated[Path | None, typer.Option("--config", help="A BERT config.json (overrides --preset).")] = None,
    steps: Annotated[int, typer.Option("--steps", help="Optimizer steps.")] = 1000,
    batch_size: BatchSize = 32,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Maximum sequence length in tokens.")] = 128,
    lr: LR = 5e-4,
    warmup_steps: Annotated[int | None, typer.Option("--warmup-steps", help="Linear warmup steps (default: 6% of --steps).")] = None,
    grad_accum: Annotated[int, typer.Option("--grad-accum", help="Micro-batches per optimizer step.")] = 1,
    mask_prob: Annotated[float, typer.Option("--mask-prob", help="Share of tokens selected for MLM (80% [MASK], 10% random, 10% kept).")] = 0.15,
    whole_word: Annotated[bool, typer.Option("--whole-word", help="Select all pieces of a word together.")] = False,
    no_nsp: Annotated[bool, typer.Option("--no-nsp", help="MLM only: pack consecutive sentences, no next-sentence task.")] = False,
    eval_file: Annotated[Path | None, typer.Option("--eval-file", help="Held-out corpus (default: the last documents of the corpus).")] = None,
    eval_every: Annotated[int, typer.Option("--eval-every", help="Evaluate every N steps.")] = 200,
    save_every: Annotated[int, typer.Option("--save-every", help="Checkpoint every N steps.")] = 500,
    keep_last: Annotated[int, typer.Option("--keep-last", help="Checkpoints to keep.")] = 2,
    resume: Resume = False,
    seed: Seed = 0,
    bf16: BF16 = False,
    device: Device = "cpu",
) -> None:
    """Pre-train a BERT encoder with masked language modelling and next-sentence prediction."""
    from .pretraining import pretrain as run

    metrics = run(
        list(corpus), out_dir, tokenizer=tokenizer, vocab_size=vocab_size, cased=cased, preset_name=preset, config=config,
        steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr, warmup_steps=warmup_steps, grad_accum=grad_accum, mask_prob=mask_prob,
        whole_word=whole_word, nsp=not no_nsp, eval_file=eval_file, eval_every=eval_every, save_every=save_every,
        keep_last=keep_last, resume=resume, seed=seed, bf16=bf16, device=device,
        progress=err.is_terminal,
    )
    if os.environ.get("RANK", "0") == "0":  # under torchrun, one process reports
        print_metrics(metrics, f"pretraining {out_dir}", as_json=False)


# ---- tasks and fine-tuning ---------------------------------------------------------------------
@app.command("tasks")
@handle_errors
def list_tasks(as_json: Json = False) -> None:
    """List the registered tasks: formats, metrics and the package providing each."""
    from .registry import tasks

    rows = [
        {"name": n, "description": i.task.description, "formats": list(i.task.formats),
         "metrics": list(i.task.metrics), "package": i.distribution}
        for n, i in sorted(tasks().items())
    ]
    if want_json(as_json):
        for r in rows:
            sys.stdout.write(json.dumps(r) + "\n")
        return
    t = Table(title="registered tasks")
    for c in ("name", "description", "formats", "metrics", "package"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["name"], r["description"], ", ".join(r["formats"]), ", ".join(r["metrics"]), r["package"])
    out.print(t)


@app.command()
@handle_errors
def finetune(
    task: Annotated[str, typer.Argument(help="Task name (see `mlmkit tasks`).")],
    model: Annotated[Path, typer.Option("--model", help="An mlmkit run or a Hugging Face BERT directory.")],
    train: Annotated[Path, typer.Option("--train", help="Training data.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Run directory to write.")],
    eval_file: Annotated[Path | None, typer.Option("--eval", help="Evaluation data: scored each epoch; the best model is kept.")] = None,
    epochs: Annotated[float, typer.Option("--epochs", help="Passes over the training data.")] = 3.0,
    batch_size: BatchSize = 32,
    lr: LR = 5e-5,
    warmup_ratio: Annotated[float, typer.Option("--warmup-ratio", help="Share of steps spent warming up.")] = 0.1,
    weight_decay: Annotated[float, typer.Option("--weight-decay", help="AdamW weight decay (not on biases or LayerNorm).")] = 0.01,
    max_length: Annotated[int | None, typer.Option("--max-length", help="Maximum tokens per input (task default if absent).")] = None,
    max_steps: Annotated[int | None, typer.Option("--max-steps", help="Train exactly N optimizer steps (overrides --epochs; the schedule spans N).")] = None,
    early_stopping: Annotated[int | None, typer.Option("--early-stopping", help="Stop after N evaluations without gain.")] = None,
    seed: Seed = 0,
    device: Device = "cpu",
    bf16: BF16 = False,
    resume: Resume = False,
    text_column: TextColumn = None,
    pair_column: PairColumn = None,
    label_column: LabelColumn = None,
    doc_stride: DocStride = None,
    max_answer_length: MaxAnswer = None,
    label_all_tokens: LabelAll = None,
    aggregation: Aggregation = None,
    scheme: Scheme = None,
) -> None:
    """Fine-tune a task head on a pretrained encoder."""
    from .finetuning import finetune as run

    opts = _task_options(text_column=text_column, pair_column=pair_column, label_column=label_column,
                         doc_stride=doc_stride, max_answer_length=max_answer_length,
                         label_all_tokens=label_all_tokens, aggregation=aggregation, scheme=scheme)
    metrics = run(
        task, model, train, out_dir, eval_file=eval_file, epochs=epochs, batch_size=batch_size, lr=lr,
        warmup_ratio=warmup_ratio, weight_decay=weight_decay, max_length=max_length, max_steps=max_steps,
        early_stopping=early_stopping, seed=seed, device=device, bf16=bf16, resume=resume,
        progress=err.is_terminal, options=opts,
    )
    print_metrics(metrics, f"fine-tuning {task} -> {out_dir}", as_json=False)


@app.command()
@handle_errors
def evaluate(
    model: Annotated[Path, typer.Argument(help="A fine-tuned run directory or an exported bundle.")],
    data: Annotated[Path, typer.Option("--data", help="Labelled data in the task's format.")],
    predictions: Annotated[Path | None, typer.Option("--predictions", help="Write per-example predictions as JSON lines.")] = None,
    as_json: Json = False,
    text_column: TextColumn = None,
    pair_column: PairColumn = None,
    label_column: LabelColumn = None,
    doc_stride: DocStride = None,
    max_answer_length: MaxAnswer = None,
    label_all_tokens: LabelAll = None,
    aggregation: Aggregation = None,
    scheme: Scheme = None,
    device: Device = "cpu",
) -> None:
    """Score a fine-tuned run (PyTorch) or an exported bundle (onnxruntime) with its task's metrics."""
    opts = _task_options(text_column=text_column, pair_column=pair_column, label_column=label_column,
                         doc_stride=doc_stride, max_answer_length=max_answer_length,
                         label_all_tokens=label_all_tokens, aggregation=aggregation, scheme=scheme)
    if not model.exists():
        raise MlmkitError(f"not found: {model}", "pass a fine-tuned run directory or an exported bundle")
    if (model / "model.onnx").exists():
        from .runtime import evaluate_bundle

        result = evaluate_bundle(model, data, options=opts, predictions=predictions, device=device)
    else:
        from .finetuning import evaluate_run

        result = evaluate_run(model, data, options=opts, predictions=predictions, device=device)
    metrics = {k: v for k, v in result.items() if k != "confusion_matrix"}
    print_metrics(metrics, f"{model} on {data}", as_json)
    if "confusion_matrix" in result and not want_json(as_json):
        print_confusion(result["confusion_matrix"], result.get("labels", []))


def print_confusion(matrix: list[list[int]], labels: list[str]) -> None:
    t = Table(title="confusion matrix (rows: gold, columns: predicted)")
    t.add_column("gold \\ pred")
    for lab in labels:
        t.add_column(lab, justify="right")
    for lab, row in zip(labels, matrix):
        t.add_row(lab, *[str(x) for x in row])
    out.print(t)


@app.command()
@handle_errors
def quickstart(
    out_dir: Annotated[Path, typer.Option("--out", help="Where the quickstart writes its runs and bundles.")] = Path("runs/quickstart"),
    steps: Annotated[int, typer.Option("--steps", help="Pretraining steps.")] = 1500,
    seed: Seed = 0,
) -> None:
    """The whole pipeline on built-in data, offline: corpus, tokenizer, pretraining, fine-tuning, export, inference."""
    from .quickstart import run

    run(out_dir, steps=steps, seed=seed, console=out)


# export and the inference commands live in cli_serve.py; importing it registers them on `app`
from . import cli_serve  # noqa: E402,F401


def main() -> None:
    app()


if __name__ == "__main__":  # `python -m mlmkit.cli`: use the package's app, where cli_serve registered
    from mlmkit.cli import main as _main

    _main()
