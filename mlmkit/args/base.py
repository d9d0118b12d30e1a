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
PRECISION_HELP = ("auto (default; $MLMKIT_PRECISION sets another): the fastest precision this machine "
                  "computes in "
                  "hardware whose gate passes (bf16 through OpenVINO on AMX / AVX512-BF16 CPUs), else the "
                  "bundle's own; "
                  "fp32, bf16, fp16 or int8: that one, or one line saying why not.")
MIN_AGREEMENT_HELP = ("The gate's threshold for a precision other than the bundle's (default: 0.99 top-1 "
                      "agreement "
                      "with fp32, 0.999 mean cosine of vectors or correlation of scores), on the gate's "
                      "sample.")


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
                                      "paths in "
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

    engine = Opt(("--engine",), "local",
                 "local, or ray: the job on a Ray cluster, --workers actors (pip install "
                 "'mlmkit[ray]'), with the same results as a local run.")
    address = Opt(("--address",), None,
                  "With --engine ray: the cluster to join (e.g. auto); default: a Ray started here.")


class Chunks:
    """Long texts cut into chunks of the bundle's own tokens (mlmkit.text.chunks): index, embed."""

    tokens = Opt(("--chunk-tokens",), None,
                 "Cut each text into chunks of at most this many of the bundle's tokens, at word "
                 "boundaries (index: a row each, a search ranks documents by "
                 "their best chunk; "
                 "embed: a vector each, with its span).")
    overlap = Opt(("--chunk-overlap",), None,
                  "--chunk-tokens: tokens each chunk repeats of the one before (default: an eighth).")
    sentences = Opt(("--chunk-sentences",), False,
                    "--chunk-tokens: end each chunk at a sentence end where one is in its second "
                    "half, and start the overlap at a sentence start.")


class Embedding:
    """What an embedding bundle puts before the texts and keeps of its vectors (the embedding task's
    prompt_name and dimensions): index, search."""

    prompt_name = Opt(("--prompt-name",), None,
                      "The bundle's named prompt put before the texts (index: the documents, "
                     "search: the queries; default: its document or query prompt).")
    dimensions = Opt(("--dimensions",), None,
                     "index: keep the first N dimensions of each vector (Matryoshka), "
                    "L2-normalised again where the model normalises; search takes "
                    "the index's.")


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
                    "the sum of its best N), each of a candidate's chunks scored "
                    "exactly; not with "
                    "--hybrid.")


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
    precision = Opt(("--precision",), None, PRECISION_HELP)
    min_agreement = Opt(("--min-agreement",), None, MIN_AGREEMENT_HELP)
    threads = Opt(("--threads",), None,
                  "onnxruntime intra-op threads (default: one per physical core), shared out among "
                  "the worker processes where there are several.")
    batch_size = Opt(("--batch-size",), 32, "Inputs per onnxruntime batch (length-bucketed).")
    batch_tokens = Opt(("--batch-tokens",), None,
                       "Most padded tokens per onnxruntime batch (0: no limit; default on the "
                       "CPU: what keeps a batch in cache, 512 at hidden size 384; "
                       "on CUDA no limit).")
    window = Opt(("--window",), 4096,
                 "Records read, length-bucketed and written together: memory holds one window per "
                 "worker.")  # 4096: mlmkit.jobs.windows.WINDOW (a test holds them equal)


class Output:
    """Where results go: a file, or stdout as a table or JSON."""

    output = Opt(("--output", "-o"), None,
                 "Write the results to this file: .jsonl (JSON lines; any other suffix too), "
                 ".parquet, .csv, .tsv, or .npy (embeddings); - (stdout), a FIFO "
                 "or a device: "
                 "JSON lines, streamed.")
    as_json = Opt(("--json",), False,
                  "Print JSON instead of a table (the default when piped): an object per line.")


class Inputs:
    """Input files and the ceiling on what is read of them."""

    input_file = Opt(("--input", "-i"), None,
                     "Inputs: a .txt (one per line), .jsonl, .csv, .tsv or .parquet file, a "
                     "directory of them, or a glob (quoted).")
    text_column = Opt(("--text-column",), "text", "The field of --input records that holds the texts.")
    corpus_column = Opt(("--text-column",), "text",
                        "The text field of .jsonl and the column of .parquet corpus files.")
    max_record_bytes = Opt(("--max-record-bytes",), MAX_RECORD_BYTES,
                           "A longer line, record or value is an error that names it (never read whole; 64 "
                           "MB by "
                           "default, the ceiling of every reader); --on-error skip, where a command has it, "
                           "steps over it.")


class Training:
    """What the training commands, the quickstart and `mlmkit data` share beyond TrainArgs."""

    seed = Opt(("--seed",), 0, "Random seed: the same seed gives the same run.")
    eval_file = Opt(("--eval",), None,
                    "Labelled evaluation data in the task's format: scored at each evaluation, the "
                    "best model kept.")
    max_length = Opt(("--max-length",), None,
                     "Maximum tokens per input (default: the task's; distill: the teacher's).")
    vocab_size = Opt(("--vocab-size",), DEFAULT_VOCAB_SIZE,
                     "Vocabulary size of the tokenizer trained, special tokens "
                     "included.")
    cased = Opt(("--cased",), False,
                "The tokenizer trained keeps case and accents (default: lowercase, strip accents; "
                "WordPiece only).")
    retrieval_documents = Opt(("--retrieval-documents",), 1000,
                              "Documents of the built-in retrieval set (the "
                              "quickstart's 1,000; the standard library "
                              "has about 2,900).")
