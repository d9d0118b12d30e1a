"""The arguments of the commands that train, evaluate and export (see mlmkit.args; `mlmkit distill`'s:
distill.py)."""


from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlmkit.args.base import (
    PRECISIONS,
    Args,
    Fusion,
    Inputs,
    Output,
    Runtime,
    Training,
    _check,
    _finite,
    arg,
    flag,
    fusion_weights,
)
from mlmkit.args.inference import Search
from mlmkit.text.tokenizer import KINDS as TOKENIZER_KINDS


# ---- training --------------------------------------------------------------------------------------
@dataclass
class TrainArgs(Args):
    """Settings of the training loop (training.Trainer), shared by pretraining and fine-tuning."""

    steps: int | None = arg(None, "Optimizer steps in all (the schedule spans them); overrides --epochs.",
                            flags=("--steps", "--max-steps"))
    epochs: float | None = arg(None, "Passes over the training data, when --steps is not given.")
    lr: float = arg(1e-4, "Peak learning rate (linear warmup, then linear decay to 0).")
    head_lr: float | None = arg(None, "Peak learning rate of the parameters outside the encoder (a task "
                                      "head, colbert's "
                                      "projection), on the same schedule; default: --lr.")
    warmup_steps: int | None = arg(None, "Linear warmup steps (default: --warmup-ratio of the steps).")
    warmup_ratio: float = arg(0.06, "Share of the steps spent warming up, when --warmup-steps is not given.")
    weight_decay: float = arg(0.01, "AdamW weight decay (not on biases and LayerNorm weights).")
    grad_accum: int = arg(1,
                          "Micro-batches per optimizer step: the effective batch is --batch-size times this.")
    max_grad_norm: float = arg(1.0, "Clip the gradient norm to this before each step (0: no clipping).")
    eval_every: int = arg(0, "Evaluate and checkpoint every N steps (0: at each epoch end).")
    save_every: int = arg(0, "Also checkpoint every N steps (0: only at evaluations and at the end).")
    keep_last: int = arg(2, "Complete checkpoints to keep under RUN/checkpoints (at least 1).")
    log_every: int = arg(10, "Write the training loss to metrics.jsonl every N steps.")
    early_stopping: int | None = arg(None, "Stop after N evaluations without gain in the main metric.")
    seed: int = Training.seed()
    device: str = Runtime.device()
    bf16: bool | None = arg(None, "bf16 autocast. Default: on a CPU with native bf16 (AVX512-BF16, AMX) for "
                                  "a model "
                                  "of hidden size 128 or more, where it was measured faster at the same "
                                  "loss; off "
                                  "elsewhere. --no-bf16 keeps fp32; --bf16 is refused on a CPU without "
                                  "native bf16.")
    resume: bool = Output.resume()
    resume_force: bool = arg(False, "With --resume, continue even though settings that decide the data order "
                                    "changed.")
    report_to: str = arg("none", "Tracking backends, comma-separated: tensorboard, mlflow (MLflow follows "
                                 "MLFLOW_TRACKING_URI / MLFLOW_EXPERIMENT_NAME / MLFLOW_RUN_ID), or none.")
    log_model: bool = arg(False, "With --report-to mlflow: send the model weights with the run's files.")
    progress: bool = arg(True, "A progress bar on stderr.", cli=False)
    metric_for_best: str | None = arg(None, "Keep the best model by this evaluation metric in the run root.",
                                      cli=False)
    greater_is_better: bool = arg(True, "Whether a larger metric_for_best is better.", cli=False)

    def __post_init__(self) -> None:
        f = lambda name: flag(TrainArgs, name)  # noqa: E731
        _check(self.steps is not None or self.epochs is not None, f"give {f('steps')} or {f('epochs')}")
        _check(self.steps is None or self.steps >= 1, f"{f('steps')} must be at least 1, got {self.steps}")
        _check(self.epochs is None or (_finite(self.epochs) and self.epochs > 0),
               f"{f('epochs')} must be positive, got {self.epochs}")
        _check(_finite(self.lr) and self.lr > 0, f"{f('lr')} must be a positive number, got {self.lr}")
        _check(self.head_lr is None or (_finite(self.head_lr) and self.head_lr > 0),
               f"{f('head_lr')} must be a positive number, got {self.head_lr}")
        _check(self.warmup_steps is None or self.warmup_steps >= 0,
               f"{f('warmup_steps')} must not be negative")
        _check(_finite(self.warmup_ratio) and 0 <= self.warmup_ratio <= 1,
               f"{f('warmup_ratio')} must be between 0 and 1")
        _check(_finite(self.weight_decay) and self.weight_decay >= 0,
               f"{f('weight_decay')} must not be negative")
        _check(_finite(self.max_grad_norm) and self.max_grad_norm >= 0,
               f"{f('max_grad_norm')} must not be negative")
        _check(self.grad_accum >= 1, f"{f('grad_accum')} must be at least 1, got {self.grad_accum}")
        # what torch.manual_seed takes
        _check(-2**63 <= self.seed < 2**64, f"{f('seed')} {self.seed} is past 64 bits",
               "give a seed from 0 to 18446744073709551615")
        for name in ("eval_every", "save_every"):
            _check(getattr(self, name) >= 0, f"{f(name)} must not be negative")
        _check(self.keep_last >= 1, f"{f('keep_last')} must be at least 1, got {self.keep_last}",
               "the last checkpoint is what --resume continues from")
        _check(self.log_every >= 1, f"{f('log_every')} must be at least 1")
        _check(self.early_stopping is None or self.early_stopping >= 1,
               f"{f('early_stopping')} must be at least 1")
        _check(self.resume or not self.resume_force, f"{f('resume_force')} goes with {f('resume')}",
               f"add {f('resume')} to continue the run in --out, or leave {f('resume_force')} out")
        _check(not self.log_model or "mlflow" in (n.strip() for n in self.report_to.split(",")),
               f"{f('log_model')} goes with {f('report_to')} mlflow (it sends the weights to MLflow)",
               f"add {f('report_to')} mlflow, or leave {f('log_model')} out")
        # --report-to's names are checked by the commands, against the reporters train/tracking.py registers


def _check_ceiling(max_bytes: int) -> None:
    _check(max_bytes >= 1, f"--max-record-bytes must be at least 1, got {max_bytes}")


CORPUS_HELP = ("Corpus files, directories or quoted globs: .txt/.txt.gz (a sentence per line, a blank line "
               "between documents), .jsonl/.jsonl.gz or .parquet (a document per line or row).")


@dataclass
class TokenizerArgs(Args):
    """`mlmkit tokenizer train`."""

    corpus: list[Path] = arg(help=CORPUS_HELP, positional=True)
    out: Path = Output.out()
    text_column: str = Inputs.text_column()
    vocab_size: int = Training.vocab_size()
    cased: bool = Training.cased()
    kind: str = arg("wordpiece", "wordpiece (BERT), bpe (byte-level, as RoBERTa and ModernBERT) or unigram "
                                 "(SentencePiece style, as XLM-R).")
    special_tokens: str = arg("auto", "Special-token names: bert ([PAD] [UNK] [CLS] [SEP] [MASK]) or roberta "
                                      "(<pad> <unk> <s> </s> <mask>); auto: bert for wordpiece, roberta "
                                      "otherwise.")

    def __post_init__(self) -> None:
        _check(self.kind in TOKENIZER_KINDS, f"--kind {self.kind} is not a tokenizer kind",
               f"use one of: {', '.join(TOKENIZER_KINDS)}")
        _check(self.special_tokens in ("auto", "bert", "roberta"),
               f"--special-tokens {self.special_tokens} is not known",
               "use auto, bert or roberta")


@dataclass
class TokenizeArgs(Args):
    """`mlmkit tokenize`: a corpus into a token shard at --out, for `mlmkit pretrain --shard`."""

    corpus: list[Path] = arg(help=CORPUS_HELP, positional=True)
    out: Path = Output.out()
    tokenizer: Path = Training.tokenizer()
    text_column: str = Inputs.text_column()
    workers: int = Runtime.workers()
    max_record_bytes: int = Inputs.max_record_bytes()

    def __post_init__(self) -> None:
        _check(bool(self.corpus), "no corpus files given", "pass one or more text files")
        _check(self.workers >= 1, f"--workers must be at least 1, got {self.workers}")
        _check_ceiling(self.max_record_bytes)


@dataclass
class PretrainArgs(Args):
    """`mlmkit pretrain`: masked language modelling (+ next-sentence prediction)."""

    out: Path = Output.out()
    corpus: list[Path] = arg(help=CORPUS_HELP, positional=True, factory=list)
    text_column: str = Inputs.text_column()
    data: Path | None = arg(None, "A token shard written by `mlmkit tokenize`, instead of corpus files.",
                            flags=("--shard",))
    tokenizer: Path | None = Training.tokenizer(None)
    vocab_size: int = Training.vocab_size()
    cased: bool = Training.cased()
    arch: str | None = arg(None, "Model family: bert (MLM + NSP, WordPiece), roberta (MLM on packed "
                                 "sequences, byte-level "
                                 "BPE) or modernbert (MLM, pre-LN, rotary + local attention, BPE); default: "
                                 "the "
                                 "--config's, else bert.")
    preset: str = arg("tiny", "Model size: tiny (L2/H128), mini (L4/H256), small (L4/H512), base (L12/H768).")
    config: Path | None = arg(None, "A config.json of the family (overrides --preset).")
    batch_size: int = Runtime.batch_size()
    seq_len: int = arg(128, "Maximum sequence length in tokens.")
    mask_prob: float = arg(0.15, "Share of tokens selected for MLM (80% [MASK], 10% random, 10% kept).")
    whole_word: bool = arg(False, "Select all pieces of a word together.")
    nsp: bool | None = arg(None, "Next-sentence prediction (BERT's; on by default for bert); --no-nsp packs "
                                 "consecutive sentences for MLM only.")
    eval_file: Path | None = arg(None, "Held-out corpus (default: the last documents of the corpus).")
    cache_dir: Path | None = arg(None, "Tokenized-corpus cache (default: $MLMKIT_CACHE or ~/.cache/mlmkit).")
    max_record_bytes: int = Inputs.max_record_bytes()
    train: TrainArgs = arg(
        factory=lambda: TrainArgs(steps=1000, lr=5e-4, warmup_ratio=0.06, eval_every=200, save_every=500,
                                  keep_last=2),
        hide=("epochs", "early_stopping"),
    )

    def __post_init__(self) -> None:
        _check(bool(self.corpus) != (self.data is not None), "give corpus files or --shard DIR (one of them)",
               "pass one or more text files, or a token shard written by `mlmkit tokenize`")
        _check(self.batch_size >= 1, f"--batch-size must be at least 1, got {self.batch_size}")
        _check(self.seq_len >= 8, f"--seq-len {self.seq_len} is too short", "use at least 8")
        # --arch and --nsp are checked against the families where pretraining starts (train/pretrain.py):
        # the families declare whether and how they pretrain, and models/ is above this module
        _check(_finite(self.mask_prob) and 0.0 < self.mask_prob < 1.0,
               f"--mask-prob must be between 0 and 1, got {self.mask_prob}")
        _check_ceiling(self.max_record_bytes)


@dataclass
class FinetuneArgs(Args):
    """`mlmkit finetune`: a task head on a pretrained encoder."""

    task: str = arg(help="Task name (see `mlmkit tasks`).", positional=True)
    model: Path = arg(help="An mlmkit run, or a Hugging Face checkpoint directory of a supported family.")
    train_file: Path = Training.train_file()
    out: Path = Output.out()
    eval_file: Path | None = Training.eval_file()
    batch_size: int = Runtime.batch_size()
    max_length: int | None = Training.max_length()
    options: Mapping[str, Any] = arg(factory=dict, help="Task options by name (see `mlmkit tasks`).",
                                     cli=False)
    max_record_bytes: int = Inputs.max_record_bytes()
    train: TrainArgs = arg(factory=lambda: TrainArgs(epochs=3.0, lr=5e-5, warmup_ratio=0.1, keep_last=1))

    def __post_init__(self) -> None:
        _check(self.batch_size >= 1, f"--batch-size must be at least 1, got {self.batch_size}")
        _check(self.max_length is None or self.max_length >= 8,
               f"--max-length {self.max_length} is too short", "use at least 8")
        _check(self.train.early_stopping is None or self.eval_file is not None,
               "--early-stopping needs --eval", "give an evaluation file to measure progress on")
        _check_ceiling(self.max_record_bytes)


@dataclass
class SweepArgs(FinetuneArgs):
    """`mlmkit sweep`: fine-tuning trials chosen by Optuna; --out is the sweep's directory (a run
    directory per trial, trial-NNN, and the default storage)."""

    trials: int = arg(10, "Trials to finish (complete or pruned) in the study, over every process that "
                          "shares it.")
    search: list[str] = arg(factory=list, help="A setting to search, repeatable: NAME=LOW:HIGH (uniform), "
                                               "NAME=LOW:HIGH:log, or NAME=A,B,C (a choice); e.g. "
                                               "lr=1e-5:1e-3:log.")
    storage: str | None = arg(None, "Optuna storage URL shared by several processes or machines "
                                    "(sqlite:///sweep.db, "
                                    "postgresql://..., mysql://...); default: OUT/sweep.db.")
    study: str = arg("mlmkit-sweep",
                     "Study name in the storage: processes with the same storage and study share trials.")
    prune: bool = arg(True,
                      "Stop unpromising trials early (Optuna's median pruner on the evaluation metric).")

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.trials >= 1, f"--trials must be at least 1, got {self.trials}")
        _check(self.eval_file is not None, "mlmkit sweep needs --eval",
               "trials are compared on the evaluation metric")
        _check(bool(self.search), "give at least one --search NAME=SPACE", "e.g. --search lr=1e-5:1e-3:log")


@dataclass
class EvaluateArgs(Args):
    """`mlmkit evaluate`: fine-tuned runs, bundles or indexes scored on labelled data, side by side."""

    models: list[Path] = arg(help="Fine-tuned run directories or exported bundles; several are scored on the "
                                  "same data, "
                                  "side by side.", positional=True)
    data: Path = arg(help="Labelled data in the task's format.")
    predictions: Path | None = arg(None, "Write per-example predictions as JSON lines (one model).")
    speed: bool = arg(False, "Also time each model's prediction of the data (examples/s on this machine) and "
                             "give its size.")
    plot: Path | None = arg(None, "Draw quality against speed (implies --speed): .png, .svg or .pdf "
                                  "(pip install 'mlmkit[plots]').")
    device: str = Runtime.device()
    chunk_agg: str = Fusion.chunk_agg()
    hybrid: list[str] | None = Fusion.hybrid()
    fusion: str = Fusion.fusion()
    weights: str | None = Fusion.weights()

    def __post_init__(self) -> None:
        _check(len(self.models) <= 1 or self.predictions is None, "--predictions takes one model",
               "evaluate the model whose predictions you want alone")
        fusion_weights(self.weights, self.hybrid, self.fusion)
        _check(not self.hybrid or self.chunk_agg == "max",
               "--chunk-agg goes without --hybrid (a fused ranking takes each "
               "retriever's documents by their best chunk)", "drop --chunk-agg or --hybrid")
        _check(not self.hybrid or (len(self.models) == 1 and self.predictions is None and not self.speed
                                   and self.plot is None),
               "--hybrid fuses one index with other retrievers: it takes one index and --data alone",
               "evaluate INDEX --data BEIR_DIR --hybrid bm25; drop --predictions, --speed and --plot")
        for m in self.models:
            _check(Path(m).exists(), f"not found: {m}",
                   "pass a fine-tuned run directory or an exported bundle")


@dataclass
class PlotArgs(Args):
    """`mlmkit plot`: runs' training curves, overlaid."""

    runs: list[Path] = arg(help="Run directories (or their metrics.jsonl) to draw, overlaid.",
                           positional=True)
    out: Path = Output.out(Path("curves.png"))
    title: str | None = arg(None, "A title above the panels.")


@dataclass
class ExportArgs(Args):
    """`mlmkit export`: a run directory -> an ONNX bundle."""

    run: Path = arg(help="An mlmkit run, or a Hugging Face checkpoint directory of a supported family.",
                    positional=True)
    out: Path = Output.out()
    task: str | None = arg(None, "Export as this registered task (`mlmkit tasks`); default: the run's (a "
                                 "pretraining run's: the masked-LM task), or what the checkpoint's "
                                 "config.json says.")
    quantize: str | None = arg(None,
                               "int8: int8 weights, for the CPU (activations quantised per call, or with "
                               "--calibrate ranges measured beforehand).")
    calibrate: Path | None = arg(None, "--quantize int8: inputs as `mlmkit predict --input` reads them "
                                       "(.txt, .jsonl, "
                                       ".csv, .tsv, .parquet; the first 512) on which the activations' "
                                       "ranges are "
                                       "measured (static int8, QDQ) and the agreement with fp32 is measured.")
    min_agreement: float | None = Runtime.min_agreement()
    precision: str = Runtime.precision("auto")
    fp16: bool = arg(False, "fp16 weights and compute, for --device cuda.")
    optimize: bool = arg(True, "onnxruntime's transformer fusions (--no-optimize: the plain graph).")
    opset: int = arg(17, "ONNX opset, 17 to 23.")
    top_k: int | None = Search.top_k()
    options: Mapping[str, Any] = arg(factory=dict, help="Task options by name (see `mlmkit tasks`).",
                                     cli=False)

    def __post_init__(self) -> None:
        _check(self.precision in PRECISIONS, f"--precision {self.precision} is not a precision",
               f"use one of {', '.join(PRECISIONS)}")
        _check(self.quantize in (None, "int8"), f"--quantize {self.quantize} is not supported",
               "use --quantize int8")
        graph = "int8" if self.quantize else "fp16" if self.fp16 else None  # what the older flags ask for
        _check(graph is None or self.precision in ("auto", graph),
               f"--precision {self.precision} and --{'quantize int8' if self.quantize else 'fp16'} disagree",
               "give one of them")
        if self.precision == "int8":
            self.quantize = "int8"
        elif self.precision == "fp16":
            self.fp16 = True
        elif graph is not None:
            self.precision = graph
        _check(not (self.quantize and self.fp16), "--quantize int8 and --fp16 exclude each other",
               "int8 is for the CPU, fp16 for CUDA")
        _check(self.top_k is None or self.top_k >= 1, f"--top-k must be at least 1, got {self.top_k}")
        _check(self.calibrate is None or self.quantize == "int8", "--calibrate is for --quantize int8",
               "add --quantize int8, or leave --calibrate out")
        _check(self.min_agreement is None
               or (math.isfinite(self.min_agreement) and 0 < self.min_agreement <= 1),
               f"--min-agreement must be above 0 and at most 1, got {self.min_agreement}",
               "e.g. --min-agreement 0.98")
