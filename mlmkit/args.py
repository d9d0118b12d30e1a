"""The arguments of every command: one dataclass each, one source for each setting.

Every field is declared with ``arg(default, help)``, so its default and its help text are written
once, here. The CLI builds its options from these fields (cli/common.py: flags are the field names
in kebab case unless ``flags`` says otherwise) and the Python API takes the dataclasses:

    from mlmkit.args import PretrainArgs, TrainArgs
    from mlmkit.train.pretrain import pretrain
    pretrain(PretrainArgs(corpus=["corpus.txt"], out="runs/a", train=TrainArgs(steps=200)))

``TrainArgs`` (the training loop's settings) is composed into ``PretrainArgs`` and ``FinetuneArgs``
as their ``train`` field, whose factory holds that command's defaults. ``Args.from_flat`` builds
any of them from flat names (``PretrainArgs.from_flat(corpus=[...], out=..., steps=200)``), as the
CLI does. Cross-field rules live in ``__post_init__`` and name the CLI flags. No torch here.

An option that means the same thing in several commands is declared once, as an ``Opt`` of a group
(``Engine``: --engine, --address; ``Runtime``: --device, --precision, --min-agreement, --threads,
--batch-size, --batch-tokens, --window of a bundle's session; ``Output``: --output, --json;
``Inputs``; ``Training``), and each dataclass takes it as a field: ``device: str = Runtime.device()``.
``BuildArgs`` (`mlmkit index`) lives with the index it builds, mlmkit.infer.index.building.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from mlmkit.errors import ConfigError
from mlmkit.files import MAX_RECORD_BYTES
from mlmkit.text.tokenizer import DEFAULT_VOCAB_SIZE
from mlmkit.text.tokenizer import KINDS as TOKENIZER_KINDS

A = TypeVar("A", bound="Args")

PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8")
"""What --precision takes: auto, or a precision a bundle may run in (mlmkit.infer.precision chooses)."""
PRECISION_HELP = ("auto (default; $MLMKIT_PRECISION sets another): the fastest precision this machine computes in "
                  "hardware whose gate passes (bf16 through OpenVINO on AMX / AVX512-BF16 CPUs), else the bundle's own; "
                  "fp32, bf16, fp16 or int8: that one, or one line saying why not.")
MIN_AGREEMENT_HELP = ("The gate's threshold for a precision other than the bundle's (default: 0.99 top-1 agreement "
                      "with fp32, 0.999 mean cosine of vectors or correlation of scores), on the gate's sample.")


def check_precision(precision: str | None, min_agreement: float | None) -> None:
    """--precision and --min-agreement of a command that runs bundles, checked."""
    _check(precision is None or precision in PRECISIONS, f"--precision {precision} is not a precision",
           f"use one of {', '.join(PRECISIONS)}")
    _check(min_agreement is None or (math.isfinite(min_agreement) and 0 < min_agreement <= 1),
           f"--min-agreement must be above 0 and at most 1, got {min_agreement}", "e.g. --min-agreement 0.98")
    _check(min_agreement is None or precision != "fp32", "--min-agreement is a gate's threshold; --precision fp32 runs no gate",
           "leave --min-agreement out, or use --precision auto or bf16")


def arg(
    default: Any = MISSING, help: str = "", *, factory: Callable[[], Any] | None = None,
    flags: tuple[str, ...] | None = None, positional: bool = False, cli: bool = True, hide: tuple[str, ...] = (),
) -> Any:
    """A dataclass field with its help text. ``flags``: the CLI spellings (default ``--field-name``);
    ``positional``: a CLI argument; ``cli``: False keeps it off the command line; ``hide``: fields of a
    composed dataclass that this command does not offer."""
    meta = {"help": help, "flags": flags, "positional": positional, "cli": cli, "hide": hide}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class CliField:
    """A field as the command line sees it: nested fields flattened to their own name."""

    path: tuple[str, ...]
    type: Any
    default: Any
    help: str
    flags: tuple[str, ...]
    positional: bool

    @property
    def name(self) -> str:
        return self.path[-1]

    @property
    def required(self) -> bool:
        return self.default is MISSING


def _flags(f: Field) -> tuple[str, ...]:
    return f.metadata.get("flags") or ("--" + f.name.replace("_", "-"),)


def _default(f: Field) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def cli_fields(cls: type, prefix: tuple[str, ...] = (), hide: tuple[str, ...] = (), defaults: Any = None) -> list[CliField]:
    """The command-line fields of an Args dataclass, nested dataclasses flattened (their defaults taken
    from the enclosing field's factory)."""
    hints = typing.get_type_hints(cls)
    out: list[CliField] = []
    for f in fields(cls):
        if not f.metadata.get("cli", True) or f.name in hide:
            continue
        default = getattr(defaults, f.name) if defaults is not None else _default(f)
        if is_dataclass(hints[f.name]):
            out += cli_fields(hints[f.name], (*prefix, f.name), f.metadata.get("hide", ()), default)
        else:
            out.append(CliField((*prefix, f.name), hints[f.name], default, f.metadata.get("help", ""), _flags(f),
                                f.metadata.get("positional", False)))
    return out


def flag(cls: type, name: str) -> str:
    """The (first) CLI flag of field ``name`` of ``cls``, for messages."""
    return _flags(next(f for f in fields(cls) if f.name == name))[0]


class Args:
    """Base of the argument dataclasses: building from flat names."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # every subclass is a dataclass (declared, never set here)

    @classmethod
    def from_flat(cls: type[A], **values: Any) -> A:
        """An instance from flat field names: a nested dataclass's fields are given by their own
        names (``steps=`` for ``train.steps``). An unknown name is an error."""
        hints = typing.get_type_hints(cls)
        own: dict[str, Any] = {}
        rest = dict(values)
        for f in fields(cls):
            sub = hints[f.name]
            if is_dataclass(sub) and f.name not in rest:
                names = {g.name for g in fields(sub)}
                mine = {k: rest.pop(k) for k in list(rest) if k in names}
                if mine:
                    base = _default(f)
                    own[f.name] = type(base)(**{**{g.name: getattr(base, g.name) for g in fields(sub)}, **mine})
            elif f.name in rest:
                own[f.name] = rest.pop(f.name)
        if rest:
            raise ConfigError(f"{cls.__name__} has no setting {', '.join(sorted(rest))}")
        for name, value in values.items():
            for p in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(p, Path) and not _utf8(str(p)):
                    field_ = next((c for c in cli_fields(cls) if c.name == name), None)
                    what = name.upper() if field_ is None or field_.positional else field_.flags[0]
                    raise ConfigError(f"{what} {ascii(str(p))}: the name holds bytes that are not UTF-8",
                                      "rename the file or directory with UTF-8 characters: a run records its paths in "
                                      "JSON (mlmkit.json), which cannot hold them")
        return cls(**own)


def _check(ok: bool, message: str, hint: str | None = None) -> None:
    if not ok:
        raise ConfigError(message, hint)


def _utf8(text: str) -> bool:
    """Whether ``text`` is UTF-8 text (a name with bytes that are not arrives with lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


# ---- options shared by several commands ---------------------------------------------------------------
@dataclass(frozen=True)
class Opt:
    """An option declared once for every command whose option means the same thing: its flags, default
    and help. A dataclass takes it as a field, ``device: str = Runtime.device()`` (a new field each
    time). An option that shares its name with another but means something else (each command's
    --out, a training --batch-size and an onnxruntime one) is declared by its command, its help
    saying what it is there; tests/cli/test_options.py holds both to this."""

    flags: tuple[str, ...]
    default: Any
    help: str

    def __call__(self) -> Any:
        return arg(self.default, self.help, flags=self.flags)


class Engine:
    """Where a batch job runs (the inference commands, index): here, or on a Ray cluster."""

    engine = Opt(("--engine",), "local", "local, or ray: the job on a Ray cluster, --workers actors (pip install "
                                         "'mlmkit[ray]'), with the same results as a local run.")
    address = Opt(("--address",), None, "With --engine ray: the cluster to join (e.g. auto); default: a Ray started here.")


class Runtime:
    """How a model runs: a bundle's onnxruntime session (the inference commands, index, mine, rerank,
    search, serve, evaluate), or the device a model trains on."""

    device = Opt(("--device",), "cpu", "cpu or cuda (falls back to the CPU, saying so, without a GPU, or for a bundle "
                                       "without onnxruntime-gpu).")
    precision = Opt(("--precision",), None, PRECISION_HELP)
    min_agreement = Opt(("--min-agreement",), None, MIN_AGREEMENT_HELP)
    threads = Opt(("--threads",), None, "onnxruntime intra-op threads (default: one per physical core), shared out among "
                                        "the worker processes where there are several.")
    batch_size = Opt(("--batch-size",), 32, "Inputs per onnxruntime batch (length-bucketed).")
    batch_tokens = Opt(("--batch-tokens",), None, "Most padded tokens per onnxruntime batch (0: no limit; default on the "
                                                  "CPU: what keeps a batch in cache, 512 at hidden size 384; on CUDA no limit).")
    window = Opt(("--window",), 4096, "Records read, length-bucketed and written together: memory holds one window per "
                                      "worker.")  # 4096: mlmkit.infer.windows.WINDOW (a test holds them equal)


class Output:
    """Where results go: a file, or stdout as a table or JSON."""

    output = Opt(("--output", "-o"), None, "Write the results to this file: .jsonl (JSON lines; any other suffix too), "
                                           ".parquet, .csv, .tsv, or .npy (embeddings); - (stdout), a FIFO or a device: "
                                           "JSON lines, streamed.")
    as_json = Opt(("--json",), False, "Print JSON instead of a table (the default when piped): an object per line.")


class Inputs:
    """Input files and the ceiling on what is read of them."""

    input_file = Opt(("--input", "-i"), None, "Inputs: a .txt (one per line), .jsonl, .csv, .tsv or .parquet file, a "
                                              "directory of them, or a glob (quoted).")
    text_column = Opt(("--text-column",), "text", "The field of --input records that holds the texts.")
    corpus_column = Opt(("--text-column",), "text", "The text field of .jsonl and the column of .parquet corpus files.")
    max_record_bytes = Opt(("--max-record-bytes",), MAX_RECORD_BYTES,
                           "A longer line, record or value is an error that names it (never read whole; 64 MB by "
                           "default, the ceiling of every reader); --on-error skip, where a command has it, steps over it.")


class Training:
    """What the training commands, the quickstart and `mlmkit data` share beyond TrainArgs."""

    seed = Opt(("--seed",), 0, "Random seed: the same seed gives the same run.")
    eval_file = Opt(("--eval",), None, "Labelled evaluation data in the task's format: scored at each evaluation, the "
                                       "best model kept.")
    max_length = Opt(("--max-length",), None, "Maximum tokens per input (default: the task's; distill: the teacher's).")
    vocab_size = Opt(("--vocab-size",), DEFAULT_VOCAB_SIZE, "Vocabulary size of the tokenizer trained, special tokens "
                                                            "included.")
    cased = Opt(("--cased",), False, "The tokenizer trained keeps case and accents (default: lowercase, strip accents; "
                                     "WordPiece only).")
    retrieval_documents = Opt(("--retrieval-documents",), 1000, "Documents of the built-in retrieval set (the "
                                                                "quickstart's 1,000; the standard library has about 2,900).")


# ---- training --------------------------------------------------------------------------------------
@dataclass
class TrainArgs(Args):
    """Settings of the training loop (training.Trainer), shared by pretraining and fine-tuning."""

    steps: int | None = arg(None, "Optimizer steps in all (the schedule spans them); overrides --epochs.",
                            flags=("--steps", "--max-steps"))
    epochs: float | None = arg(None, "Passes over the training data, when --steps is not given.")
    lr: float = arg(1e-4, "Peak learning rate (linear warmup, then linear decay to 0).")
    warmup_steps: int | None = arg(None, "Linear warmup steps (default: --warmup-ratio of the steps).")
    warmup_ratio: float = arg(0.06, "Share of the steps spent warming up, when --warmup-steps is not given.")
    weight_decay: float = arg(0.01, "AdamW weight decay (not on biases and LayerNorm weights).")
    grad_accum: int = arg(1, "Micro-batches per optimizer step: the effective batch is --batch-size times this.")
    max_grad_norm: float = arg(1.0, "Clip the gradient norm to this before each step (0: no clipping).")
    eval_every: int = arg(0, "Evaluate and checkpoint every N steps (0: at each epoch end).")
    save_every: int = arg(0, "Also checkpoint every N steps (0: only at evaluations and at the end).")
    keep_last: int = arg(2, "Complete checkpoints to keep under RUN/checkpoints (at least 1).")
    log_every: int = arg(10, "Write the training loss to metrics.jsonl every N steps.")
    early_stopping: int | None = arg(None, "Stop after N evaluations without gain in the main metric.")
    seed: int = Training.seed()
    device: str = Runtime.device()
    bf16: bool | None = arg(None, "bf16 autocast. Default: on a CPU with native bf16 (AVX512-BF16, AMX) for a model "
                                  "of hidden size 128 or more, where it was measured faster at the same loss; off "
                                  "elsewhere. --no-bf16 keeps fp32; --bf16 is refused on a CPU without native bf16.")
    resume: bool = arg(False, "Continue from the last checkpoint in --out.")
    resume_force: bool = arg(False, "With --resume, continue even though settings that decide the data order changed.")
    report_to: str = arg("none", "Tracking backends, comma-separated: tensorboard, mlflow (MLflow follows "
                                 "MLFLOW_TRACKING_URI / MLFLOW_EXPERIMENT_NAME / MLFLOW_RUN_ID), or none.")
    log_model: bool = arg(False, "With --report-to mlflow: send the model weights with the run's files.")
    progress: bool = arg(True, "A progress bar on stderr.", cli=False)
    metric_for_best: str | None = arg(None, "Keep the best model by this evaluation metric in the run root.", cli=False)
    greater_is_better: bool = arg(True, "Whether a larger metric_for_best is better.", cli=False)

    def __post_init__(self) -> None:
        f = lambda name: flag(TrainArgs, name)  # noqa: E731
        _check(self.steps is not None or self.epochs is not None, f"give {f('steps')} or {f('epochs')}")
        _check(self.steps is None or self.steps >= 1, f"{f('steps')} must be at least 1, got {self.steps}")
        _check(self.epochs is None or (_finite(self.epochs) and self.epochs > 0), f"{f('epochs')} must be positive, got {self.epochs}")
        _check(_finite(self.lr) and self.lr > 0, f"{f('lr')} must be a positive number, got {self.lr}")
        _check(self.warmup_steps is None or self.warmup_steps >= 0, f"{f('warmup_steps')} must not be negative")
        _check(_finite(self.warmup_ratio) and 0 <= self.warmup_ratio <= 1, f"{f('warmup_ratio')} must be between 0 and 1")
        _check(_finite(self.weight_decay) and self.weight_decay >= 0, f"{f('weight_decay')} must not be negative")
        _check(_finite(self.max_grad_norm) and self.max_grad_norm >= 0, f"{f('max_grad_norm')} must not be negative")
        _check(self.grad_accum >= 1, f"{f('grad_accum')} must be at least 1, got {self.grad_accum}")
        _check(-2**63 <= self.seed < 2**64, f"{f('seed')} {self.seed} is past 64 bits",  # what torch.manual_seed takes
               "give a seed from 0 to 18446744073709551615")
        for name in ("eval_every", "save_every"):
            _check(getattr(self, name) >= 0, f"{f(name)} must not be negative")
        _check(self.keep_last >= 1, f"{f('keep_last')} must be at least 1, got {self.keep_last}",
               "the last checkpoint is what --resume continues from")
        _check(self.log_every >= 1, f"{f('log_every')} must be at least 1")
        _check(self.early_stopping is None or self.early_stopping >= 1, f"{f('early_stopping')} must be at least 1")
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
    out: Path = arg(help="tokenizer.json to write (vocab.txt goes beside it), or a directory.")
    text_column: str = Inputs.corpus_column()
    vocab_size: int = Training.vocab_size()
    cased: bool = Training.cased()
    kind: str = arg("wordpiece", "wordpiece (BERT), bpe (byte-level, as RoBERTa and ModernBERT) or unigram "
                                 "(SentencePiece style, as XLM-R).")
    special_tokens: str = arg("auto", "Special-token names: bert ([PAD] [UNK] [CLS] [SEP] [MASK]) or roberta "
                                      "(<pad> <unk> <s> </s> <mask>); auto: bert for wordpiece, roberta otherwise.")

    def __post_init__(self) -> None:
        _check(self.kind in TOKENIZER_KINDS, f"--kind {self.kind} is not a tokenizer kind", f"use one of: {', '.join(TOKENIZER_KINDS)}")
        _check(self.special_tokens in ("auto", "bert", "roberta"), f"--special-tokens {self.special_tokens} is not known",
               "use auto, bert or roberta")


@dataclass
class TokenizeArgs(Args):
    """`mlmkit tokenize`: a corpus into a token shard, for `mlmkit pretrain --data`."""

    corpus: list[Path] = arg(help=CORPUS_HELP, positional=True)
    out: Path = arg(help="Directory to write the shard to (tokens, offsets, manifest, the tokenizer).")
    tokenizer: Path = arg(help="tokenizer.json or vocab.txt (`mlmkit tokenizer train` makes one).")
    text_column: str = Inputs.corpus_column()
    workers: int = arg(1, "Processes, each tokenizing a run of the files with its share of the cores (one file: one "
                          "process; the tokenizer already uses every core, see docs/cli.md).")
    max_record_bytes: int = Inputs.max_record_bytes()

    def __post_init__(self) -> None:
        _check(bool(self.corpus), "no corpus files given", "pass one or more text files")
        _check(self.workers >= 1, f"--workers must be at least 1, got {self.workers}")
        _check_ceiling(self.max_record_bytes)


@dataclass
class PretrainArgs(Args):
    """`mlmkit pretrain`: masked language modelling (+ next-sentence prediction)."""

    out: Path = arg(help="Run directory to write (a Hugging Face checkpoint).")
    corpus: list[Path] = arg(help=CORPUS_HELP, positional=True, factory=list)
    text_column: str = Inputs.corpus_column()
    data: Path | None = arg(None, "A token shard written by `mlmkit tokenize`, instead of corpus files.")
    tokenizer: Path | None = arg(None, "tokenizer.json or vocab.txt; trained on the corpus if absent "
                                       "(with --data: the shard's own).")
    vocab_size: int = Training.vocab_size()
    cased: bool = Training.cased()
    arch: str | None = arg(None, "Model family: bert (MLM + NSP, WordPiece), roberta (MLM on packed sequences, byte-level "
                                 "BPE) or modernbert (MLM, pre-LN, rotary + local attention, BPE); default: the "
                                 "--config's, else bert.")
    preset: str = arg("tiny", "Model size: tiny (L2/H128), mini (L4/H256), small (L4/H512), base (L12/H768).")
    config: Path | None = arg(None, "A config.json of the family (overrides --preset).")
    batch_size: int = arg(32, "Sequences per micro-batch.")
    seq_len: int = arg(128, "Maximum sequence length in tokens.")
    mask_prob: float = arg(0.15, "Share of tokens selected for MLM (80% [MASK], 10% random, 10% kept).")
    whole_word: bool = arg(False, "Select all pieces of a word together.")
    nsp: bool | None = arg(None, "Next-sentence prediction (BERT's; on by default for bert); --no-nsp packs "
                                 "consecutive sentences for MLM only.")
    eval_file: Path | None = arg(None, "Held-out corpus (default: the last documents of the corpus).")
    cache_dir: Path | None = arg(None, "Tokenized-corpus cache (default: $MLMKIT_CACHE or ~/.cache/mlmkit).")
    max_record_bytes: int = Inputs.max_record_bytes()
    train: TrainArgs = arg(
        factory=lambda: TrainArgs(steps=1000, lr=5e-4, warmup_ratio=0.06, eval_every=200, save_every=500, keep_last=2),
        hide=("epochs", "early_stopping"),
    )

    def __post_init__(self) -> None:
        _check(bool(self.corpus) != (self.data is not None), "give corpus files or --data DIR (one of them)",
               "pass one or more text files, or a token shard written by `mlmkit tokenize`")
        _check(self.batch_size >= 1, f"--batch-size must be at least 1, got {self.batch_size}")
        _check(self.seq_len >= 8, f"--seq-len {self.seq_len} is too short", "use at least 8")
        # --arch and --nsp are checked against the families where pretraining starts (train/pretrain.py):
        # the families declare whether and how they pretrain, and models/ is above this module
        _check(_finite(self.mask_prob) and 0.0 < self.mask_prob < 1.0, f"--mask-prob must be between 0 and 1, got {self.mask_prob}")
        _check_ceiling(self.max_record_bytes)


@dataclass
class FinetuneArgs(Args):
    """`mlmkit finetune`: a task head on a pretrained encoder."""

    task: str = arg(help="Task name (see `mlmkit tasks`).", positional=True)
    model: Path = arg(help="An mlmkit run, or a Hugging Face checkpoint directory of a supported family.")
    train_file: Path = arg(help="Training data in the task's format.", flags=("--train",))
    out: Path = arg(help="Run directory to write.")
    eval_file: Path | None = Training.eval_file()
    batch_size: int = arg(32, "Features per micro-batch: an example is one feature, or several (QA's windows of a "
                              "long context, a plugin's choices).")
    max_length: int | None = Training.max_length()
    options: dict[str, Any] = arg(factory=dict, help="Task options by name (see `mlmkit tasks`).", cli=False)
    max_record_bytes: int = Inputs.max_record_bytes()
    train: TrainArgs = arg(factory=lambda: TrainArgs(epochs=3.0, lr=5e-5, warmup_ratio=0.1, keep_last=1))

    def __post_init__(self) -> None:
        _check(self.batch_size >= 1, f"--batch-size must be at least 1, got {self.batch_size}")
        _check(self.max_length is None or self.max_length >= 8, f"--max-length {self.max_length} is too short", "use at least 8")
        _check(self.train.early_stopping is None or self.eval_file is not None,
               "--early-stopping needs --eval", "give an evaluation file to measure progress on")
        _check_ceiling(self.max_record_bytes)


DISTILL_LR = 1e-4
"""distill's --lr default (with --static and --train the table's own, mlmkit.train.static.STATIC_LR)."""


@dataclass
class DistillArgs(Args):
    """`mlmkit distill`: a student with fewer layers, trained on a fine-tuned teacher's outputs."""

    teacher: Path = arg(help="A fine-tuned run directory (any task but sparse-embedding); with --static, an embedding "
                             "run, sentence-transformers directory or embedding bundle.", positional=True)
    out: Path = arg(help="The student's run directory (with --static: the bundle's).")
    train_file: Path | None = arg(None, "What the teacher labels: inputs as `mlmkit predict --input` reads them (.txt, "
                                        ".jsonl, .csv, .tsv, .parquet; labels in them are not used), or the task's own "
                                        "data format (a BEIR directory, SQuAD JSON, CoNLL). With --static: optional "
                                        "training data of `finetune embedding` (rows, scored pairs, a BEIR directory) "
                                        "that tunes the table.", flags=("--train",))
    layers: int | None = arg(None, "The student's layers, 1 to the teacher's (not with --static).")
    layer_map: str | None = arg(None, "Which teacher layer starts each student layer, e.g. 0,2,4 (increasing, "
                                      "distinct); default: every L/K-th from the first.")
    eval_file: Path | None = Training.eval_file()
    static: bool = arg(False, "Make a static-embedding bundle instead: a vector per token from the teacher, PCA, SIF "
                              "weighting; a text's embedding is the mean of its tokens' (no transformer runs).")
    dims: int | None = arg(None, "With --static: the vectors' dimensions (PCA), 1 to the teacher's; default 256 or the "
                                 "teacher's, the smaller.")
    temperature: float = arg(2.0, "Softmax temperature of the distillation loss on logits (squared, it scales the loss).")
    held_out: float = arg(0.1, "Share of the inputs kept out of training, on which the student's agreement with the "
                               "teacher is measured (0: none).")
    batch_size: int = arg(32, "Features per micro-batch.")
    max_length: int | None = Training.max_length()
    options: dict[str, Any] = arg(factory=dict, help="Task options by name (see `mlmkit tasks`).", cli=False)
    train: TrainArgs = arg(factory=lambda: TrainArgs(epochs=3.0, lr=DISTILL_LR, warmup_ratio=0.1, keep_last=1))

    def __post_init__(self) -> None:
        if self.static:
            _check(self.layers is None and self.layer_map is None, "--layers and --layer-map make a transformer student, "
                   "--static a table", "drop --layers and --layer-map, or --static")
            _check(self.eval_file is None, "--eval scores a transformer student; a static table is scored by "
                   "`mlmkit evaluate BUNDLE --data D`", "drop --eval")
        else:
            _check(self.layers is not None, "distill needs --layers (the student's), or --static", "e.g. --layers 3")
            _check(self.train_file is not None, "distill needs --train (what the teacher labels)",
                   "give a file of texts or the task's data: --train DATA")
            _check(self.dims is None, "--dims is a static table's size", "add --static, or drop --dims")
        _check(self.layers is None or self.layers >= 1, f"--layers must be at least 1, got {self.layers}")
        _check(self.train.early_stopping is None or self.eval_file is not None,
               "--early-stopping needs --eval (it stops on the evaluation metric)", "add --eval FILE")
        _check(self.dims is None or self.dims >= 1, f"--dims must be at least 1, got {self.dims}")
        _check(math.isfinite(self.temperature) and self.temperature > 0,
               f"--temperature must be a positive number, got {self.temperature}")
        _check(0 <= self.held_out < 1, f"--held-out must be from 0 up to (not including) 1, got {self.held_out}")
        _check(self.batch_size >= 1, f"--batch-size must be at least 1, got {self.batch_size}")
        _check(self.max_length is None or self.max_length >= 8, f"--max-length {self.max_length} is too short", "use at least 8")


@dataclass
class SweepArgs(FinetuneArgs):
    """`mlmkit sweep`: fine-tuning trials chosen by Optuna; --out is the sweep's directory (a run per trial)."""

    out: Path = arg(help="The sweep's directory: a run directory per trial (trial-NNN) and the default storage.")

    trials: int = arg(10, "Trials to finish (complete or pruned) in the study, over every process that shares it.")
    search: list[str] = arg(factory=list, help="A setting to search, repeatable: NAME=LOW:HIGH (uniform), "
                                               "NAME=LOW:HIGH:log, or NAME=A,B,C (a choice); e.g. lr=1e-5:1e-3:log.")
    storage: str | None = arg(None, "Optuna storage URL shared by several processes or machines (sqlite:///sweep.db, "
                                    "postgresql://..., mysql://...); default: OUT/sweep.db.")
    study: str = arg("mlmkit-sweep", "Study name in the storage: processes with the same storage and study share trials.")
    prune: bool = arg(True, "Stop unpromising trials early (Optuna's median pruner on the evaluation metric).")

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.trials >= 1, f"--trials must be at least 1, got {self.trials}")
        _check(self.eval_file is not None, "mlmkit sweep needs --eval", "trials are compared on the evaluation metric")
        _check(bool(self.search), "give at least one --search NAME=SPACE", "e.g. --search lr=1e-5:1e-3:log")


@dataclass
class EvaluateArgs(Args):
    """`mlmkit evaluate`: fine-tuned runs, bundles or indexes scored on labelled data, side by side."""

    models: list[Path] = arg(help="Fine-tuned run directories or exported bundles; several are scored on the same data, "
                                  "side by side.", positional=True)
    data: Path = arg(help="Labelled data in the task's format.")
    predictions: Path | None = arg(None, "Write per-example predictions as JSON lines (one model).")
    speed: bool = arg(False, "Also time each model's prediction of the data (examples/s on this machine) and give its size.")
    plot: Path | None = arg(None, "Draw quality against speed (implies --speed): .png, .svg or .pdf "
                                  "(pip install 'mlmkit[plots]').")
    device: str = Runtime.device()

    def __post_init__(self) -> None:
        _check(len(self.models) <= 1 or self.predictions is None, "--predictions takes one model",
               "evaluate the model whose predictions you want alone")
        for m in self.models:
            _check(Path(m).exists(), f"not found: {m}", "pass a fine-tuned run directory or an exported bundle")


@dataclass
class PlotArgs(Args):
    """`mlmkit plot`: runs' training curves, overlaid."""

    runs: list[Path] = arg(help="Run directories (or their metrics.jsonl) to draw, overlaid.", positional=True)
    out: Path = arg(Path("curves.png"), "The picture to write: .png, .svg or .pdf.")
    title: str | None = arg(None, "A title above the panels.")


@dataclass
class ExportArgs(Args):
    """`mlmkit export`: a run directory -> an ONNX bundle."""

    run: Path = arg(help="An mlmkit run, or a Hugging Face checkpoint directory of a supported family.", positional=True)
    out: Path = arg(help="Bundle directory to write, e.g. exports/NAME.")
    task: str | None = arg(None, "Export as this task (fill-mask or a registered task); default: the run's, "
                                 "or what the checkpoint's config.json says.")
    quantize: str | None = arg(None, "int8: int8 weights, for the CPU (activations quantised per call, or with "
                                     "--calibrate ranges measured beforehand).")
    calibrate: Path | None = arg(None, "--quantize int8: inputs as `mlmkit predict --input` reads them (.txt, .jsonl, "
                                       ".csv, .tsv, .parquet; the first 512) on which the activations' ranges are "
                                       "measured (static int8, QDQ) and the agreement with fp32 is measured.")
    min_agreement: float | None = arg(None, "The gates' threshold: the agreement with fp32 below which a precision "
                                            "fails (top-1 for outputs that choose, else the mean cosine of vectors, else "
                                            "the correlation of scores; on the --calibrate inputs, else the sample batch). "
                                            "int8: the bundle is refused, nothing written; bf16: its gate is recorded as "
                                            "failed (default for bf16: 0.99 top-1, 0.999 cosine).")
    precision: str = arg("auto", "auto: an fp32 graph, with the bf16 gate measured where this machine has bf16 units "
                                 "(each machine picks again at run time); fp32: an fp32 graph that runs in fp32 "
                                 "everywhere; bf16: an fp32 graph whose bf16 gate must pass here; int8: --quantize int8; "
                                 "fp16: --fp16 (for --device cuda).")
    fp16: bool = arg(False, "fp16 weights and compute, for --device cuda.")
    optimize: bool = arg(True, "onnxruntime's transformer fusions (--no-optimize: the plain graph).")
    opset: int = arg(17, "ONNX opset, 17 to 23.")
    top_k: int | None = arg(None, "fill-mask: candidates per [MASK] computed in the graph (5); sparse-embedding: "
                                  "the terms kept per text (its max_terms option).")
    options: dict[str, Any] = arg(factory=dict, help="Task options by name (see `mlmkit tasks`).", cli=False)

    def __post_init__(self) -> None:
        _check(self.precision in PRECISIONS, f"--precision {self.precision} is not a precision",
               f"use one of {', '.join(PRECISIONS)}")
        _check(self.quantize in (None, "int8"), f"--quantize {self.quantize} is not supported", "use --quantize int8")
        graph = "int8" if self.quantize else "fp16" if self.fp16 else None  # what the older flags ask for
        _check(graph is None or self.precision in ("auto", graph),
               f"--precision {self.precision} and --{'quantize int8' if self.quantize else 'fp16'} disagree", "give one of them")
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
        _check(self.min_agreement is None or (math.isfinite(self.min_agreement) and 0 < self.min_agreement <= 1),
               f"--min-agreement must be above 0 and at most 1, got {self.min_agreement}", "e.g. --min-agreement 0.98")


# ---- inference -------------------------------------------------------------------------------------
@dataclass
class InferenceArgs(Args):
    """What every inference command takes (fill-mask, classify, tag, qa, embed, predict): a batch job
    over a bundle (mlmkit.infer.jobs)."""

    bundle: Path = arg(help="A bundle directory written by `mlmkit export`.", positional=True)
    texts: list[str] | None = arg(None, "Input texts (or use --input, or pipe them on stdin).", positional=True)
    input_file: Path | None = Inputs.input_file()
    output: Path | None = Output.output()
    batch_size: int = Runtime.batch_size()
    batch_tokens: int | None = Runtime.batch_tokens()
    device: str = Runtime.device()
    precision: str | None = Runtime.precision()
    min_agreement: float | None = Runtime.min_agreement()
    threads: int | None = Runtime.threads()
    as_json: bool = Output.as_json()
    window: int = Runtime.window()
    workers: int | None = arg(None, "Processes, each with its own onnxruntime session and a share of the threads "
                                    "(default: what measured fastest, see docs/performance.md).")
    on_error: str = arg("stop", "stop: a bad record ends the job, naming it; skip: it is listed in --errors and the job goes on.")
    errors: Path | None = arg(None, "With --on-error skip: the JSON-lines list of bad records "
                                    "(default: OUTPUT.errors.jsonl, or a count on stderr).")
    resume: bool = arg(False, "Continue the unfinished job that writes --output, after the records it finished.")
    id_column: str | None = arg(None, "Carry this input field (JSONL, CSV, TSV, Parquet) into each result under its own name "
                                      "(Parquet output: with its type; JSON lines: timestamps ISO 8601, binary base64).")
    max_record_bytes: int = Inputs.max_record_bytes()
    engine: str = Engine.engine()
    address: str | None = Engine.address()

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
            _check(ok, message)
        check_precision(self.precision, self.min_agreement)


@dataclass
class QaArgs(InferenceArgs):
    """`mlmkit qa`: questions as arguments ask about one --context (or question, context records)."""

    context: str | None = arg(None, "The context that the text arguments (questions) ask about.")

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(not self.texts or self.context is not None, "questions given without --context",
               "pass --context TEXT, or records with question and context via --input")
        _check(self.context is None or bool(self.texts), "--context given without questions", "add the questions as arguments")


@dataclass
class RerankArgs(Args):
    """`mlmkit rerank`: documents ranked for a query by a cross-encoder bundle."""

    bundle: Path = arg(help="A cross-encoder bundle (a one-label sequence classifier).", positional=True)
    documents: list[str] | None = arg(None, "Documents to rank (or --input).", positional=True)
    query: str = arg("", "What the documents are ranked for.")
    input_file: Path | None = Inputs.input_file()
    text_column: str = Inputs.text_column()
    top_n: int | None = arg(None, "Keep the N most relevant.")
    raw_scores: bool = arg(False, "The cross-encoder's logits, not their sigmoid.")
    precision: str | None = Runtime.precision()

    def __post_init__(self) -> None:
        _check(self.top_n is None or self.top_n >= 1, f"--top-n must be at least 1, got {self.top_n}")
        check_precision(self.precision, None)
        _check(bool(self.query.strip()), "no --query", "pass --query TEXT")


@dataclass
class SearchArgs(Args):
    """`mlmkit search`: the top-k documents of each query in an index (mlmkit index)."""

    index: Path = arg(help="An index directory (mlmkit index).", positional=True)
    queries: list[str] | None = arg(None, "Query texts (or --input).", positional=True)
    input_file: Path | None = Inputs.input_file()
    text_column: str = Inputs.text_column()
    top_k: int | None = arg(None, "Hits per query (default 10, or every document of a smaller index).")
    rescore: int | None = arg(None, "Binary, --rescore-copy or ANN indexes: candidates scored again with the rescoring "
                                    "vectors (default: 4 x top-k, at least 100).")
    bundle: Path | None = arg(None, "The bundle to embed queries with (default: the index's; another is refused).")
    export: Path | None = arg(None, "Write the index's ids and vectors as Parquet instead (id, vector: fixed-size list "
                                    "of float32) and exit.")
    batch: int = arg(256, "Queries embedded and searched together.")
    precision: str | None = Runtime.precision()

    def __post_init__(self) -> None:
        _check(self.batch >= 1, f"--batch must be at least 1, got {self.batch}")
        check_precision(self.precision, None)


@dataclass
class MineArgs(Args):
    """`mlmkit mine`: hard negatives for (query, positive) data, from a retriever's ranking of a corpus."""

    data: Path = arg(help="A BEIR directory (DIR, or DIR:SPLIT; its train split by default), or a .jsonl / "
                          ".csv / .tsv / .parquet file of anchor, positive rows.", positional=True)
    out: Path = arg(help="The rows to write (.jsonl): anchor, positive, negative_1 ... negative_K.")
    corpus: Path | None = arg(None, "The documents to mine: a .txt (one per line) or a .jsonl with a text field "
                                    "(a BEIR corpus.jsonl too); default: the BEIR directory's corpus, or the rows' positives.")
    retriever: str = arg("bm25", "bm25 (the bm25s library), the directory of an embedding bundle, or an index (mlmkit index) "
                                 "of the data's corpus (a BEIR directory's: its ids).")
    negatives: int = arg(5, "Negatives per row.")
    rank_range: str = arg("0:100", "The ranks negatives are taken from, A:B (rank 0 is the best match); the "
                                   "query's positives are passed over wherever they rank.", flags=("--range",))
    margin: float | None = arg(None, "Keep a negative only if its score is at most the positive's minus this.")
    max_score_ratio: float | None = arg(None, "Keep a negative only if its score is at most this times the positive's.")
    with_scores: bool = arg(False, "Add each row's scores: [positive, negative_1, ...] (for distillation losses).")
    score_with: Path | None = arg(None, "A cross-encoder bundle (rerank or one-label classification) whose logits are "
                                        "each row's scores instead of the retriever's (margin-mse distils it).")
    keep_other_splits: bool = arg(False, "A BEIR directory: mine the documents judged relevant in its other splits too "
                                         "(by default they are left out: a negative that is a test answer teaches the "
                                         "model the test set).")
    anchor_column: str = arg("anchor", "Rows: the anchor (query) field.")
    positive_column: str = arg("positive", "Rows: the positive field.")
    batch_size: int = arg(256, "Queries searched at once (and written together: --resume goes on after the last batch written).")
    device: str = Runtime.device()
    precision: str | None = Runtime.precision()
    index: str = arg("exact", "With an embedding bundle: exact search, or faiss (an HNSW index, approximate, for corpora "
                              "too large for exact search).")
    resume: bool = arg(False, "Continue the unfinished mining job that writes --out, after the batches it finished.")

    def __post_init__(self) -> None:
        _check(self.negatives >= 1, f"--negatives must be at least 1, got {self.negatives}")
        _check(self.batch_size >= 1, f"--batch-size must be at least 1, got {self.batch_size}")
        _check(not (self.margin is not None and self.max_score_ratio is not None),
               "--margin and --max-score-ratio exclude each other", "filter by one of them")
        _check(self.max_score_ratio is None or (_finite(self.max_score_ratio) and self.max_score_ratio > 0),
               f"--max-score-ratio must be a positive number, got {self.max_score_ratio}")
        _check(self.margin is None or _finite(self.margin), f"--margin must be a number, got {self.margin}")
        _check(self.index in ("exact", "faiss"), f"--index {self.index}: use exact or faiss")
        check_precision(self.precision, None)
        _check(self.index == "exact" or (self.retriever != "bm25" and not (Path(self.retriever) / "manifest.json").is_file()),
               f"--index {self.index} is for an embedding bundle; --retriever {self.retriever} searches its own way "
               "(an index built with mlmkit index --ann hnsw is approximate already)")
        _check(self.out.suffix.lower() == ".jsonl", f"--out {self.out}: mined rows are written as .jsonl",
               "give a file name ending in .jsonl")
        self.window()

    def window(self) -> tuple[int, int]:
        """--range A:B as (A, B), 0 <= A < B."""
        a, sep, b = self.rank_range.partition(":")
        try:
            lo, hi = int(a or 0), int(b)
        except ValueError:
            lo = hi = -1
        _check(sep == ":" and 0 <= lo < hi, f"--range {self.rank_range} is not A:B with 0 <= A < B", "e.g. --range 10:100")
        return lo, hi


@dataclass
class DataArgs(Args):
    """`mlmkit data`: the built-in data sets written to a directory (mlmkit/quickstart/sets.py)."""

    out: Path = arg(help="Directory to write the sets into (made if absent; files of an earlier run are replaced).",
                    positional=True)
    sets: list[str] = arg(factory=list, flags=("--set",), help="A set to write, repeatable: corpus, classification, "
                                                              "tagging, qa or retrieval (default: every one).")
    retrieval_documents: int = Training.retrieval_documents()

    def __post_init__(self) -> None:
        _check(self.retrieval_documents >= 1, f"--retrieval-documents must be at least 1, got {self.retrieval_documents}")


@dataclass
class QuickstartArgs(Args):
    """`mlmkit quickstart`: the whole pipeline on the built-in data (mlmkit/quickstart/demo.py)."""

    out: Path = arg(Path("runs/quickstart"), "Where the quickstart writes its runs and bundles.")
    steps: int = arg(1500, "Steps of its pretraining stage.")
    seed: int = Training.seed()
    retrieval_documents: int = Training.retrieval_documents()

    def __post_init__(self) -> None:
        _check(self.steps >= 1, f"--steps must be at least 1, got {self.steps}")
        _check(self.retrieval_documents >= 50, f"--retrieval-documents must be at least 50, got {self.retrieval_documents}",
               "the quickstart's retrieval step needs a set of 50 documents or more")


@dataclass
class ServeArgs(Args):
    """`mlmkit serve`'s settings."""

    bundles: list[str] = arg(help="Bundle directories to serve, each as PATH (named after the directory) or NAME=PATH.",
                             positional=True)
    host: str = arg("127.0.0.1", "Address to listen on (0.0.0.0: every interface).")
    port: int = arg(8000, "Port to listen on.")
    device: str = Runtime.device()
    precision: str | None = Runtime.precision()
    min_agreement: float | None = Runtime.min_agreement()
    threads: int | None = Runtime.threads()
    batch_size: int = Runtime.batch_size()
    batch_tokens: int | None = Runtime.batch_tokens()
    max_batch_size: int = arg(256, "Most inputs merged from queued requests into one call.")
    max_wait_ms: float = arg(2.0, "How long the first queued request waits for others to join its call (ms).")
    max_inputs: int = arg(1024, "Most inputs in one request (more: 413).")
    max_body_bytes: int = arg(8 * 1024 * 1024, "Largest request body (more: 413).")
    drain_seconds: float = arg(30.0, "On SIGTERM, how long requests in flight may take to finish.")
    access_log: bool = arg(False, "Log every request (uvicorn's access log; the query string's values are left out).")
    api_key: list[str] = arg(help="An API key clients must send as 'Authorization: Bearer KEY' (repeatable; default: "
                                  "$MLMKIT_API_KEY; none: no check). The probes /health and /ready never need one.", factory=list)
    public_metrics: bool = arg(False, "Serve /metrics without an API key.")
    index: list[str] = arg(help="An index (mlmkit index) that POST /v1/search answers from, as PATH or NAME=PATH "
                                "(repeatable); its queries are embedded by the served bundle that built it.", factory=list)
    max_queue: int = arg(0, "Most inputs waiting per model; more: 429 with Retry-After (0: 4 x --max-batch-size).")
    request_timeout: float = arg(30.0, "Seconds a request may wait in the queue; then 503, and it leaves the queue.")
    timeout_keep_alive: float = arg(5.0, "Seconds an idle keep-alive connection stays open between requests.")
    header_timeout: float = arg(10.0, "Seconds a client has to send a request's line and headers; then the "
                                      "connection is closed (slow or silent clients cannot hold connections).")
    max_connections: int = arg(0, "Most open connections, idle ones too; more are answered 503 and closed (0: the "
                                  "process's open-file limit less 64, at most 4096).")
    ssl_keyfile: Path | None = arg(None, "TLS: the private key file (with --ssl-certfile: serve https).")
    ssl_certfile: Path | None = arg(None, "TLS: the certificate file (with --ssl-keyfile).")

    def __post_init__(self) -> None:
        if not self.bundles:
            raise ConfigError("no bundles to serve", "give one or more bundle directories, as PATH or NAME=PATH")
        check_precision(self.precision, self.min_agreement)
        for name in ("port", "batch_size", "max_batch_size", "max_inputs", "max_body_bytes"):
            low = 0 if name == "port" else 1
            if getattr(self, name) < low:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least {low}, got {getattr(self, name)}")
        if self.batch_tokens is not None and self.batch_tokens < 0:
            raise ConfigError(f"--batch-tokens must be 0 (no limit) or more, got {self.batch_tokens}")
        if self.port > 65535:
            raise ConfigError(f"--port must be at most 65535, got {self.port}")
        if not 0 <= self.max_wait_ms <= 10_000 or not 0 <= self.drain_seconds <= 3600:
            raise ConfigError("--max-wait-ms must be 0 to 10000 and --drain-seconds 0 to 3600")
        for name in ("timeout_keep_alive", "header_timeout"):
            value = getattr(self, name)
            if not (_finite(value) and 0 < value <= 3600):
                raise ConfigError(f"{flag(ServeArgs, name)} must be between 0 and 3600 seconds, got {value}")
        if self.max_queue < 0:
            raise ConfigError(f"--max-queue must be 0 (the default size) or more, got {self.max_queue}")
        if self.max_connections < 0:
            raise ConfigError(f"--max-connections must be 0 (from the open-file limit) or more, got {self.max_connections}")
        if not _finite(self.request_timeout) or not 0 < self.request_timeout <= 3600:
            raise ConfigError(f"--request-timeout must be more than 0 and at most 3600 seconds, got {self.request_timeout}")
        if (self.ssl_keyfile is None) != (self.ssl_certfile is None):
            raise ConfigError("TLS needs both --ssl-keyfile and --ssl-certfile")
        for f in (self.ssl_keyfile, self.ssl_certfile):
            if f is not None and not Path(f).is_file():
                raise ConfigError(f"{f} is not a file", "give the PEM key and certificate files")
        if any(not k or k != k.strip() for k in self.api_key):
            raise ConfigError("an --api-key is empty or has spaces around it", "give the key itself")
