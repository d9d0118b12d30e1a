"""The arguments of the commands that run bundles and retrieve (see mlmkit.args; `mlmkit serve`'s:
serve.py)."""


from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mlmkit.args.base import (
    Args,
    Chunks,
    Engine,
    Fusion,
    Inputs,
    Opt,
    Output,
    Runtime,
    Training,
    _check,
    _finite,
    arg,
    check_precision,
    fusion_weights,
)
from mlmkit.text.chunks import Chunking


# ---- options of the retrieval commands, declared once -------------------------------------------
class Embedding:
    """What an embedding bundle puts before the texts and keeps of its vectors: index and search, and the
    embedding task's options prompt_name and dimensions (their flags show this help)."""

    prompt_name = Opt(("--prompt-name",), None,
                      "A named prompt of the embedding bundle put before the texts, as "
                      "sentence-transformers' encode(prompt_name=...): index: before the documents "
                      "(default: its document prompt); search, evaluate: the queries (default: its query "
                      "prompt); embed, predict: the inputs.")
    dimensions = Opt(("--dimensions",), None,
                     "Keep the first N dimensions of each vector (Matryoshka; sentence-transformers' "
                     "truncate_dim), L2-normalised again where the model normalises (default: all; "
                     "finetune: the run's default; index: the vectors it stores, which search takes).")


class Search:
    """How many of the best are kept and how a search runs: search, mine, export's --top-k, and the task
    options of the same names (the embedding task's --index, fill-mask's --top-k), whose flags show this
    help."""

    top_k = Opt(("--top-k",), None,
                "The k best kept: search: hits per query (default 10, or every document of a smaller "
                "index); fill-mask, predict, evaluate: a masked LM's candidates per [MASK] in each result "
                "(at most the bundle's; 0: all); export: those its graph computes (a masked LM's "
                "candidates per [MASK], default 5; a sparse embedding's terms per text, 256).")
    method = Opt(("--index",), "exact",
                 "How an embedding bundle's vectors are searched: exact, or faiss (an HNSW index, "
                 "approximate, for corpora too large for exact search).", per_command=True)
    batch = Opt(("--batch",), 256,
                "Queries embedded and searched together (mine: their rows are written together, and "
                "--resume goes on after the last batch written).")


# ---- inference -------------------------------------------------------------------------------------
@dataclass
class InferenceArgs(Args):
    """What every inference command takes (classify, tag, qa, embed, predict, a task's own command): a
    batch job over a bundle (mlmkit.jobs.batch)."""

    bundle: Path = arg(help="A bundle directory written by `mlmkit export`.", positional=True)
    texts: list[str] | None = arg(None, "Input texts (or use --input, or pipe them on stdin).",
                                  positional=True)
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
    workers: int | None = Runtime.workers(None)
    on_error: str = arg("stop", "stop: a bad record ends the job, naming it; skip: it is listed in --errors "
                                "and the job goes on.")
    errors: Path | None = arg(None, "With --on-error skip: the JSON-lines list of bad records "
                                    "(default: OUTPUT.errors.jsonl, or a count on stderr).")
    resume: bool = Output.resume()
    id_column: str | None = Inputs.id_column()
    max_record_bytes: int = Inputs.max_record_bytes()
    engine: str = Engine.engine()
    address: str | None = Engine.address()

    def __post_init__(self) -> None:
        checks = [(self.batch_size >= 1, f"--batch-size must be at least 1, got {self.batch_size}"),
                  (self.batch_tokens is None or self.batch_tokens >= 0,
                   f"--batch-tokens must be 0 (no limit) or more, got {self.batch_tokens}"),
                  (self.threads is None or self.threads >= 1,
                   f"--threads must be at least 1, got {self.threads}"),
                  (self.window >= 1, f"--window must be at least 1, got {self.window}"),
                  (self.workers is None or self.workers >= 1,
                   f"--workers must be at least 1, got {self.workers}"),
                  (self.on_error in ("stop", "skip"), f"--on-error {self.on_error}: use stop or skip"),
                  (self.max_record_bytes >= 1,
                   f"--max-record-bytes must be at least 1, got {self.max_record_bytes}"),
                  (self.engine in ("local", "ray"), f"--engine {self.engine}: use local or ray"),
                  (self.engine == "local" or self.output is not None,
                   "--engine ray needs --output (a file or directory)"),
                  (self.errors is None or self.on_error == "skip",
                   "--errors goes with --on-error skip (with stop, the first bad record ends the job, naming "
                   "it)"),
                  (self.address is None or self.engine == "ray",
                   "--address goes with --engine ray (the cluster to join)")]
        for ok, message in checks:
            _check(ok, message)
        check_precision(self.precision, self.min_agreement)


@dataclass
class EmbedArgs(InferenceArgs):
    """`mlmkit embed`: a vector per text, or with --chunk-tokens a vector per chunk of each text."""

    chunk_tokens: int | None = Chunks.tokens()
    chunk_overlap: int | None = Chunks.overlap()
    chunk_sentences: bool = Chunks.sentences()

    def __post_init__(self) -> None:
        super().__post_init__()
        chunking = Chunking.of(self.chunk_tokens, self.chunk_overlap, self.chunk_sentences)
        _check(chunking is None or self.output is None or self.output.suffix.lower() != ".npy",
               f"--output {self.output}: a .npy holds a vector per text, and --chunk-tokens gives each text "
               "several",
               "write .jsonl or .parquet: each result holds its chunks, each with its span and vector")

    def chunk_options(self) -> dict[str, int | bool]:
        """--chunk-tokens and the rest as the embedding task's options (none without it)."""
        chunking = Chunking.of(self.chunk_tokens, self.chunk_overlap, self.chunk_sentences)
        return {} if chunking is None else {"chunk_tokens": chunking.tokens,
                                            "chunk_overlap": chunking.overlap,
                                            "chunk_sentences": chunking.sentences}


@dataclass
class QaArgs(InferenceArgs):
    """`mlmkit qa`: questions as arguments ask about one --context (or question, context records)."""

    context: str | None = arg(None, "The context that the text arguments (questions) ask about.")

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(not self.texts or self.context is not None, "questions given without --context",
               "pass --context TEXT, or records with question and context via --input")
        _check(self.context is None or bool(self.texts), "--context given without questions",
               "add the questions as arguments")


@dataclass
class RerankArgs(Args):
    """`mlmkit rerank`: documents ranked for a query by a cross-encoder or a colbert bundle."""

    bundle: Path = arg(help="A cross-encoder bundle (a one-label sequence classifier), or a colbert bundle "
                            "(MaxSim).",
                       positional=True)
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
    top_k: int | None = Search.top_k()
    rescore: int | None = arg(None, "Binary, --rescore-copy or ANN indexes: candidates scored again with the "
                                    "rescoring "
                                    "vectors (default: 4 x top-k, at least 100).")
    bundle: Path | None = arg(None,
                              "The bundle to embed queries with (default: the index's; another is refused).")
    prompt_name: str | None = Embedding.prompt_name()
    export: Path | None = arg(None, "Write the index's ids and vectors as Parquet instead (id, vector: "
                                    "fixed-size list "
                                    "of float32) and exit.")
    batch: int = Search.batch()
    precision: str | None = Runtime.precision()
    where: list[str] | None = arg(None, "Only documents whose fields pass: FIELD=VALUE, FIELD!=VALUE, "
                                        "FIELD>=N, FIELD<=N, "
                                        "FIELD>N, FIELD<N, 'FIELD in A,B' or 'FIELD in @FILE' (id: the "
                                        "document's id); "
                                        "repeatable, all must hold.")
    chunk_agg: str = Fusion.chunk_agg()
    hybrid: list[str] | None = Fusion.hybrid()
    fusion: str = Fusion.fusion()
    weights: str | None = Fusion.weights()
    corpus: Path | None = Inputs.corpus()
    id_column: str | None = Inputs.id_column()
    corpus_column: str = arg("text", "--corpus: the documents' text field (a title goes before it).",
                             flags=("--corpus-column",))

    def __post_init__(self) -> None:
        _check(self.batch >= 1, f"--batch must be at least 1, got {self.batch}")
        check_precision(self.precision, None)
        fusion_weights(self.weights, self.hybrid, self.fusion)
        _check(self.corpus is None or "bm25" in (self.hybrid or []),
               "--corpus gives BM25 its texts: it goes with --hybrid bm25",
               "add --hybrid bm25, or leave --corpus out")
        _check(self.export is None or not self.hybrid,
               "--export writes the index's vectors: it takes no --hybrid")
        _check(not self.hybrid or self.chunk_agg == "max",
               "--chunk-agg goes without --hybrid (a fused ranking takes each "
               "retriever's documents by their best chunk)", "drop --chunk-agg or --hybrid")


@dataclass
class MineArgs(Args):
    """`mlmkit mine`: hard negatives for (query, positive) data, from a retriever's ranking of a corpus."""

    data: Path = arg(help="A BEIR directory (DIR, or DIR:SPLIT; its train split by default), or a .jsonl / "
                          ".csv / .tsv / .parquet file of anchor, positive rows.", positional=True)
    out: Path = Output.out()
    corpus: Path | None = Inputs.corpus()
    retriever: str = arg("bm25", "bm25 (the bm25s library), the directory of an embedding bundle, or an "
                                 "index (mlmkit index) "
                                 "of the data's corpus (a BEIR directory's: its ids).")
    negatives: int = arg(5, "Negatives per row.")
    rank_range: str = arg("0:100", "The ranks negatives are taken from, A:B (rank 0 is the best match); the "
                                   "query's positives are passed over wherever they rank.",
                          flags=("--range",))
    margin: float | None = arg(None,
                               "Keep a negative only if its score is at most the positive's minus this.")
    max_score_ratio: float | None = arg(None, "Keep a negative only if its score is at most this times the "
                                              "positive's.")
    with_scores: bool = arg(False,
                            "Add each row's scores: [positive, negative_1, ...] (for distillation losses).")
    score_with: Path | None = arg(None, "A cross-encoder bundle (rerank or one-label classification) whose "
                                        "logits are "
                                        "each row's scores instead of the retriever's (margin-mse distils "
                                        "it).")
    keep_other_splits: bool = arg(False, "A BEIR directory: mine the documents judged relevant in its other "
                                         "splits too "
                                         "(by default they are left out: a negative that is a test answer "
                                         "teaches the "
                                         "model the test set).")
    anchor_column: str = arg("anchor", "Rows: the anchor (query) field.")
    positive_column: str = arg("positive", "Rows: the positive field.")
    batch_size: int = Search.batch()
    device: str = Runtime.device()
    precision: str | None = Runtime.precision()
    index: str = Search.method()
    resume: bool = Output.resume()
    hybrid: list[str] | None = Fusion.hybrid()
    fusion: str = Fusion.fusion()
    weights: str | None = Fusion.weights()

    def __post_init__(self) -> None:
        fusion_weights(self.weights, self.hybrid, self.fusion)
        _check(not self.hybrid or (self.margin is None and self.max_score_ratio is None
                                   and (not self.with_scores or self.score_with is not None)),
               "--hybrid ranks by a fused score, which is no similarity: it takes no --margin or "
               "--max-score-ratio, and "
               "--with-scores only from --score-with",
               "filter and score the negatives with --score-with CROSS_ENCODER")
        _check(self.negatives >= 1, f"--negatives must be at least 1, got {self.negatives}")
        _check(self.batch_size >= 1, f"--batch must be at least 1, got {self.batch_size}")
        _check(not (self.margin is not None and self.max_score_ratio is not None),
               "--margin and --max-score-ratio exclude each other", "filter by one of them")
        _check(self.max_score_ratio is None or (_finite(self.max_score_ratio) and self.max_score_ratio > 0),
               f"--max-score-ratio must be a positive number, got {self.max_score_ratio}")
        _check(self.margin is None or _finite(self.margin), f"--margin must be a number, got {self.margin}")
        _check(self.index in ("exact", "faiss"), f"--index {self.index}: use exact or faiss")
        check_precision(self.precision, None)
        _check(self.index == "exact"
               or (self.retriever != "bm25" and not (Path(self.retriever) / "manifest.json").is_file()),
               f"--index {self.index} is for an embedding bundle; --retriever {self.retriever} searches its "
               "own way "
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
        _check(sep == ":" and 0 <= lo < hi, f"--range {self.rank_range} is not A:B with 0 <= A < B",
               "e.g. --range 10:100")
        return lo, hi


@dataclass
class DataArgs(Args):
    """`mlmkit data`: the built-in data sets written to a directory (mlmkit/quickstart/sets.py)."""

    out: Path = arg(help="Directory to write the sets into (made if absent; files of an earlier run are "
                         "replaced).",
                    positional=True)
    sets: list[str] = arg(factory=list, flags=("--set",),
                          help="A set to write, repeatable: corpus, classification, "
                              "tagging, qa or retrieval (default: every "
                              "one).")
    retrieval_documents: int = Training.retrieval_documents()

    def __post_init__(self) -> None:
        _check(self.retrieval_documents >= 1,
               f"--retrieval-documents must be at least 1, got {self.retrieval_documents}")


@dataclass
class QuickstartArgs(Args):
    """`mlmkit quickstart`: the whole pipeline on the built-in data (mlmkit/quickstart/demo.py)."""

    out: Path = Output.out(Path("runs/quickstart"))
    pretrain_steps: int = arg(1500, "Optimizer steps of the quickstart's pretraining stage.")
    seed: int = Training.seed()
    retrieval_documents: int = Training.retrieval_documents()

    def __post_init__(self) -> None:
        _check(self.pretrain_steps >= 1, f"--pretrain-steps must be at least 1, got {self.pretrain_steps}")
        _check(self.retrieval_documents >= 50,
               f"--retrieval-documents must be at least 50, got {self.retrieval_documents}",
               "the quickstart's retrieval step needs a set of 50 documents or more")
