"""The machinery of the argument dataclasses (``arg``, ``Args``, the CLI's view of a field) and the
option groups several commands share, each option declared once (see mlmkit.args)."""


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

A = TypeVar("A", bound="Args")

PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8")
"""What --precision takes: auto, or a precision a bundle may run in (mlmkit.runtime.precision chooses)."""
PRECISION_HELP = ("auto, fp32, bf16, fp16 or int8. Running a bundle: auto (default; $MLMKIT_PRECISION "
                  "sets another) is the fastest precision this machine computes in hardware whose gate "
                  "passes (bf16 through OpenVINO on AMX / AVX512-BF16 CPUs), else the bundle's own; another "
                  "is that one, or one line saying why not. export: the bundle's graph and gates (auto: "
                  "an fp32 graph, its bf16 gate measured where this machine has bf16 units, each machine "
                  "picking again at run time; fp32: fp32 everywhere; bf16: its bf16 gate must pass here; "
                  "int8: --quantize int8; fp16: --fp16, for --device cuda).")
MIN_AGREEMENT_HELP = ("The gate's threshold: the agreement with fp32 below which a precision fails (top-1 "
                      "for outputs that choose, else the mean cosine of vectors, else the correlation of "
                      "scores), on the gate's sample. Running a bundle: a precision other than the bundle's "
                      "(default 0.99 top-1, 0.999 cosine or correlation). export: int8's gate, on the "
                      "--calibrate inputs, else the sample batch (below it no bundle is written), and "
                      "bf16's (recorded as failed; default as above).")


def check_precision(precision: str | None, min_agreement: float | None) -> None:
    """--precision and --min-agreement of a command that runs bundles, checked."""
    _check(precision is None or precision in PRECISIONS, f"--precision {precision} is not a precision",
           f"use one of {', '.join(PRECISIONS)}")
    _check(min_agreement is None or (math.isfinite(min_agreement) and 0 < min_agreement <= 1),
           f"--min-agreement must be above 0 and at most 1, got {min_agreement}", "e.g. --min-agreement 0.98")
    _check(min_agreement is None or precision != "fp32",
           "--min-agreement is a gate's threshold; --precision fp32 runs no gate",
           "leave --min-agreement out, or use --precision auto or bf16")


def arg(
    default: Any = MISSING, help: str = "", *, factory: Callable[[], Any] | None = None,
    flags: tuple[str, ...] | None = None, positional: bool = False, cli: bool = True,
    hide: tuple[str, ...] = (),
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


def cli_fields(cls: type, prefix: tuple[str, ...] = (), hide: tuple[str, ...] = (),
               defaults: Any = None) -> list[CliField]:
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
            out.append(CliField((*prefix, f.name), hints[f.name], default, f.metadata.get("help", ""),
                                _flags(f),
                                f.metadata.get("positional", False)))
    return out


def flag(cls: type, name: str) -> str:
    """The (first) CLI flag of field ``name`` of ``cls``, for messages."""
    return _flags(next(f for f in fields(cls) if f.name == name))[0]


class Args:
    """Base of the argument dataclasses: building from flat names."""

    # every subclass is a dataclass (declared, never set here)
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

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
                    own[f.name] = type(base)(**{**{g.name: getattr(base, g.name) for g in fields(sub)},
                                                **mine})
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
                                      "rename the file or directory with UTF-8 characters: a run records its "
                                      "paths in JSON (mlmkit.json), which cannot hold them")
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
_OWN: Any = object()  # an Opt called without a default of the command's own: the declared one
_DECLARED: dict[str, Opt] = {}  # every Opt, by its first flag


@dataclass(frozen=True)
class Opt:
    """An option declared once for every command that has it: flags, default, help. A dataclass takes it
    as a field, ``device: str = Runtime.device()`` (a new field each time). ``per_command`` (--out,
    --workers ...): one help that says what it is in every command, and a default each command may set,
    ``out: Path = Output.out(Path("curves.png"))`` (MISSING: required). A name is declared once (twice: a
    TypeError), and a task option's flag of that name shows this help (cli/common.py): one name, one
    meaning in every command (tests/cli/test_options.py)."""

    flags: tuple[str, ...]
    default: Any
    help: str
    per_command: bool = False

    def __post_init__(self) -> None:
        if self.flags[0] in _DECLARED:
            raise TypeError(f"{self.flags[0]} is declared twice: declare it once, with a help that fits "
                            "every command")
        _DECLARED[self.flags[0]] = self

    def __call__(self, default: Any = _OWN, *, factory: Callable[[], Any] | None = None) -> Any:
        if (default is not _OWN or factory is not None) and not self.per_command:
            raise TypeError(f"{self.flags[0]} has one default, {self.default!r}: declare it per_command")
        if factory is not None:
            return arg(help=self.help, flags=self.flags, factory=factory)
        return arg(self.default if default is _OWN else default, self.help, flags=self.flags)


def declared(flag: str) -> Opt | None:
    """The option declared with first flag ``flag``, if one is."""
    return _DECLARED.get(flag)


def per_command_flags() -> frozenset[str]:
    """The options whose default each command sets (``Opt.per_command``): one help, several defaults."""
    return frozenset(f for f, o in _DECLARED.items() if o.per_command)


class Engine:
    """Where a batch job runs (the inference commands, index): here, or on a Ray cluster."""

    engine = Opt(("--engine",), "local",
                 "local, or ray: the job on a Ray cluster, --workers actors (pip install "
                 "'mlmkit[ray]'), with the same results as a local run.")
    address = Opt(("--address",), None,
                  "With --engine ray: the cluster to join (e.g. auto); default: a Ray started here.")


class Chunks:
    """Long texts cut into chunks of the bundle's own tokens (mlmkit.text.chunks): index, embed."""

    tokens = Opt(("--chunk-tokens",), None,
                 "Cut each text into chunks of at most this many of the bundle's tokens, at word "
                 "boundaries (index: a row each, a search ranks documents by their best chunk; embed: a "
                 "vector each, with its span).")
    overlap = Opt(("--chunk-overlap",), None,
                  "--chunk-tokens: tokens each chunk repeats of the one before (default: an eighth).")
    sentences = Opt(("--chunk-sentences",), False,
                    "--chunk-tokens: end each chunk at a sentence end where one is in its second "
                    "half, and start the overlap at a sentence start.")


class Fusion:
    """Hybrid retrieval (mlmkit.retrieval.index.hybrid): other retrievers of the same corpus, fused with the
    first (search, evaluate, mine)."""

    hybrid = Opt(("--hybrid",), None,
                 "Fuse with another retriever of the same documents: bm25, or an index (mlmkit index); "
                 "repeatable.")
    fusion = Opt(("--fusion",), "rrf",
                 "--hybrid: how the rankings are fused: rrf (reciprocal rank, k = 60) or weighted "
                 "(each retriever's scores min-max normalised, summed by --weights).")
    weights = Opt(("--weights",), None,
                  "--hybrid: a weight a retriever, comma-separated, the first retriever first, then "
                  "each --hybrid in order (default: 1 each).")
    chunk_agg = Opt(("--chunk-agg",), "max",
                    "A chunked index: a document's score from its chunks' (max, mean, or sum-top-N: "
                    "the sum of its best N), each of a candidate's chunks scored exactly; not with --hybrid.")


def fusion_weights(weights: str | None, hybrid: list[str] | None, fusion: str) -> list[float] | None:
    """--weights as numbers (None: the default), checked (check_weights), with --fusion; both need
    --hybrid."""
    _check(fusion in ("rrf", "weighted"), f"--fusion {fusion}: use rrf or weighted")
    _check(bool(hybrid) or (weights is None and fusion == "rrf"),
           "--fusion and --weights fuse retrievers: they need --hybrid",
           "add --hybrid bm25 (or --hybrid INDEX), or leave them out")
    if weights is None:
        return None
    try:
        w = [float(x) for x in weights.split(",")]
    except ValueError:
        raise ConfigError(f"--weights {weights}: give numbers separated by commas, e.g. 1,0.5") from None
    return check_weights(w, len(hybrid or []) + 1)


def check_weights(weights: list[float] | None, retrievers: int) -> list[float]:
    """One fusion weight a retriever (default 1 each), checked: as many as retrievers, each finite and
    >= 0, one above 0."""
    if weights is None:
        return [1.0] * retrievers
    _check(len(weights) == retrievers, f"--weights gives {len(weights)} weights for {retrievers} retrievers",
           "one a retriever: the first, then each --hybrid in order")
    _check(all(_finite(x) and x >= 0 for x in weights) and any(weights),
           f"--weights {','.join(map(str, weights))}: each must be a number >= 0, and one above 0")
    return [float(x) for x in weights]


class Runtime:
    """How a model runs: a bundle's onnxruntime session (the inference commands, index, mine, rerank,
    search, serve, evaluate), or the device a model trains on."""

    device = Opt(("--device",), "cpu",
                 "cpu or cuda (falls back to the CPU, saying so, without a GPU, or for a bundle "
                 "without onnxruntime-gpu).")
    precision = Opt(("--precision",), None, PRECISION_HELP, per_command=True)
    min_agreement = Opt(("--min-agreement",), None, MIN_AGREEMENT_HELP)
    threads = Opt(("--threads",), None,
                  "onnxruntime intra-op threads (default: $OMP_NUM_THREADS where it is set, as for "
                  "torch, else one per physical core), shared out among the worker processes where "
                  "there are several.")
    batch_size = Opt(("--batch-size",), 32,
                     "Inputs the model runs on at once: a training micro-batch (pretrain: sequences; "
                     "finetune, sweep, distill: features, each of a QA context's windows or a plugin's "
                     "choices one), or an onnxruntime batch (length-bucketed).")
    workers = Opt(("--workers",), 1,
                  "Processes working in parallel, each with a share of the cores: tokenize's each "
                  "tokenize a run of the files (one file: one process; the tokenizer already uses every "
                  "core, see docs/cli.md); index's and the inference commands' each run an onnxruntime "
                  "session with a share of the threads (the inference commands' default: what measured "
                  "fastest, see docs/performance.md); with --engine ray, Ray actors.", per_command=True)
    batch_tokens = Opt(("--batch-tokens",), None,
                       "Most padded tokens per onnxruntime batch (0: no limit; default on the "
                       "CPU: what keeps a batch in cache, 512 at hidden size 384; "
                       "on CUDA no limit).")
    window = Opt(("--window",), 4096,
                 "Records read, length-bucketed and written together: memory holds one window per "
                 "worker.")  # 4096: mlmkit.jobs.windows.WINDOW (a test holds them equal)


class Output:
    """Where results go (a file, or stdout as a table or JSON; what a command makes, at --out), and a job
    that stopped continued."""

    out = Opt(("--out",), MISSING,
              "Where the command writes what it makes: the command's description says what (a run "
              "directory, a bundle, a token shard, a tokenizer, an index, mined rows, a picture ...).",
              per_command=True)
    resume = Opt(("--resume",), False,
                 "Continue the unfinished job that writes --out (or --output) after what it finished: a "
                 "training run from its last checkpoint, a batch job after its records, an index build "
                 "after its last window, a mining job after its batches.")

    output = Opt(("--output", "-o"), None,
                 "Write the results to this file: .jsonl (JSON lines; any other suffix too), "
                 ".parquet, .csv, .tsv, or .npy (embeddings); - (stdout), a FIFO or a device: JSON lines, "
                 "streamed.")
    as_json = Opt(("--json",), False,
                  "Print JSON instead of a table (the default when piped): an object per line.")


class Inputs:
    """Input files and the ceiling on what is read of them."""

    input_file = Opt(("--input", "-i"), None,
                     "Inputs: a .txt (one per line), .jsonl, .csv, .tsv or .parquet file, a "
                     "directory of them, or a glob (quoted).")
    text_column = Opt(("--text-column",), "text",
                      "The field or column that holds the texts: of .jsonl and .parquet corpus files "
                      "(tokenizer train, tokenize, pretrain), of the documents (index: a title goes before "
                      "it), of --input records (rerank, search), of a task's data and inputs (a pair's first "
                      "text).", per_command=True)
    id_column = Opt(("--id-column",), None,
                    "The records' id field: the inference commands carry it into each result under its own "
                    "name (Parquet output: with its type; JSON lines: timestamps ISO 8601, binary base64); "
                    "index and search's --corpus read the documents' ids from it (default: _id, else id).")
    corpus = Opt(("--corpus",), None,
                 "The documents: a BEIR corpus.jsonl (_id, title, text), other JSON lines, Parquet or CSV "
                 "with an id column, or .txt (one a line; mine: .txt or .jsonl). index embeds them; mine "
                 "takes its negatives from them (default: the BEIR directory's corpus, or the rows' "
                 "positives); search --hybrid bm25 and serve's /v1/search with \"hybrid\": \"bm25\" rank "
                 "their texts, those the index was built from (serve: NAME=FILE, FILE alone with one index; "
                 "repeatable).", per_command=True)
    max_record_bytes = Opt(("--max-record-bytes",), MAX_RECORD_BYTES,
                           "A longer line, record or value is an error that names it (never read whole; "
                           "64 MB by default, the ceiling of every reader); --on-error skip, where a command "
                           "has it, steps over it.")


class Training:
    """What the training commands, the quickstart and `mlmkit data` share beyond TrainArgs."""

    seed = Opt(("--seed",), 0, "Random seed: the same seed gives the same run.")
    train_file = Opt(("--train",), MISSING,
                     "The training data: finetune, sweep: in the task's format; distill: what the teacher "
                     "labels, inputs as `mlmkit predict --input` reads them (.txt, .jsonl, .csv, .tsv, "
                     ".parquet; labels in them are not used) or the task's own format (a BEIR directory, "
                     "SQuAD JSON, CoNLL); distill --static: optional training data of `finetune embedding` "
                     "(rows, scored pairs, a BEIR directory) that tunes the table.", per_command=True)
    tokenizer = Opt(("--tokenizer",), MISSING,
                    "tokenizer.json or vocab.txt (`mlmkit tokenizer train` makes one); pretrain without one "
                    "trains one on its corpus (with --shard: takes the shard's own).", per_command=True)
    eval_file = Opt(("--eval",), None,
                    "Labelled evaluation data in the task's format: scored at each evaluation, the "
                    "best model kept.")
    max_length = Opt(("--max-length",), None,
                     "Maximum tokens per input (default: the task's; distill: the teacher's).")
    vocab_size = Opt(("--vocab-size",), DEFAULT_VOCAB_SIZE,
                     "Vocabulary size of the tokenizer trained, special tokens included.")
    cased = Opt(("--cased",), False,
                "The tokenizer trained keeps case and accents (default: lowercase, strip accents; "
                "WordPiece only).")
    retrieval_documents = Opt(("--retrieval-documents",), 1000,
                              "Documents of the built-in retrieval set (the quickstart's 1,000; the "
                              "standard library has about 2,900).")
