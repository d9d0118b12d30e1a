"""`mlmkit index`'s arguments, ``BuildArgs``: a build, an append, a resume, or a change of an index
(--delete, --upsert, --compact), each checked before a document is read. No torch.

``Index.build``, ``Index.add`` and ``Index.upsert`` (store.py) take the same settings as keywords.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import mlmkit.retrieval.index.multivector as multivector
from mlmkit.args import (
    Args,
    Chunks,
    Embedding,
    Engine,
    Inputs,
    Output,
    Runtime,
    arg,
    check_precision,
    flag,
)
from mlmkit.errors import ConfigError
from mlmkit.files import JSONObject
from mlmkit.retrieval.index.codecs import QUANTIZATIONS, RESCORE_COPIES
from mlmkit.retrieval.index.manifest import ANNS
from mlmkit.text.chunks import Chunking

WHAT = ("bundle", "corpus", "out", "delete", "upsert", "compact", "replacing")
"""BuildArgs's fields that say what is built or changed; the others are its settings (settings())."""


@dataclass
class BuildArgs(Args):
    """`mlmkit index`: a corpus embedded into a new index at ``out`` (or a new shard of it: ``append``)."""

    bundle: Path = arg(help="An embedding bundle (mlmkit export); a sparse-embedding one builds an inverted "
                            "index, a "
                            "colbert one a multi-vector index. With --delete, --upsert or --compact: the "
                            "index.", positional=True)
    corpus: Path | None = Inputs.corpus()
    out: Path | None = Output.out(None)
    quantization: str = arg("float32",
                            "How the vectors are stored: float32, float16, int8 (calibrated ranges) or "
                            "binary (sign bits, with an int8 copy for rescoring).")
    ann: str = arg("flat", "flat (exact), hnsw or ivf (faiss, beside the vectors).")
    rescore_copy: str | None = arg(None, "float16: keep the vectors as float16 beside an int8 or binary "
                                         "index, and rescore "
                                         "its candidates from them (binary keeps an int8 copy otherwise).")
    """RESCORE_COPIES, for int8 and binary (None: binary keeps int8, int8 none)."""
    append: bool = arg(False, "Add the documents to the index at --out.")
    resume: bool = Output.resume()
    id_column: str | None = Inputs.id_column()
    text_column: str = Inputs.text_column()
    window: int = Runtime.window()
    workers: int = Runtime.workers()
    threads: int | None = Runtime.threads()
    batch_size: int = Runtime.batch_size()
    device: str = Runtime.device()
    # the documents' vectors are computed in it (mlmkit.runtime.precision)
    precision: str | None = Runtime.precision()
    engine: str = Engine.engine()
    address: str | None = Engine.address()
    bits: int | None = arg(None, "A colbert bundle's index: bits a dimension of each token vector's residual "
                                 "from its centroid "
                                 "(1 or 2; default 2).")
    centroids: int | None = arg(None, "A colbert bundle's index: its centroids (default: from the sample of "
                                      "token vectors, "
                                      "one per 40).", cli=False)
    hnsw_m: int = arg(32, "--ann hnsw: neighbours per node.", cli=False)
    ivf_lists: int | None = arg(None, "--ann ivf: the lists (default: from the corpus size).", cli=False)
    delete: Path | None = arg(None, "Delete these documents from the index (the first argument): a .txt of "
                                    "ids, one a line, "
                                    "or .jsonl / .csv / .parquet with an _id or id field.")
    upsert: Path | None = arg(None, "Add these documents to the index (the first argument) with its own "
                                    "bundle and settings, "
                                    "replacing those of the same ids (read as --corpus is).")
    compact: bool = arg(False, "Rewrite the index (the first argument) without its deleted documents, "
                               "reclaiming their space.")
    replacing: bool = arg(False, "An append whose documents replace the index's of the same ids (what "
                                 "--upsert runs).", cli=False)
    chunk_tokens: int | None = Chunks.tokens()
    chunk_overlap: int | None = Chunks.overlap()
    chunk_sentences: bool = Chunks.sentences()
    prompt_name: str | None = Embedding.prompt_name()
    dimensions: int | None = Embedding.dimensions()

    def __post_init__(self) -> None:
        if self.dimensions is not None and self.dimensions < 1:
            raise ConfigError(f"--dimensions must be at least 1, got {self.dimensions}")
        live = [f for f, v in (("--delete", self.delete), ("--upsert", self.upsert),
                               ("--compact", self.compact)) if v]
        if len(live) > 1:
            raise ConfigError(f"{' and '.join(live)}: one change of an index at a time")
        if live and (self.corpus is not None or self.out is not None or self.append):
            raise ConfigError(f"{live[0]} changes the index given as the first argument: it takes no "
                              "--corpus, --out or --append",
                              f"mlmkit index INDEX {live[0]}{'' if self.compact else ' FILE'}")
        if self.upsert and (self.quantization, self.ann, self.rescore_copy, self.bits) != ("float32", "flat",
                                                                                           None, None):
            raise ConfigError("--upsert adds documents with the index's own settings",
                              "drop --quantization, --ann, --rescore-copy and --bits")
        if live and self.resume and not self.upsert:
            raise ConfigError(f"{live[0]} takes no --resume (a delete or a compaction is done whole or not "
                              "at all)")
        if live and (self.chunk_tokens is not None or self.chunk_overlap is not None or self.chunk_sentences):
            raise ConfigError(f"{live[0]} keeps the index's chunks: drop --chunk-tokens, --chunk-overlap and "
                              "--chunk-sentences")
        # checked now, before a document is read
        Chunking.of(self.chunk_tokens, self.chunk_overlap, self.chunk_sentences)
        if not live and (self.corpus is None or self.out is None):
            raise ConfigError(f"mlmkit index {self.bundle} needs --corpus DOCS and --out INDEX",
                              "or change an index: mlmkit index INDEX --delete IDS | --upsert DOCS | "
                              "--compact")
        for name in ("window", "workers", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{flag(BuildArgs, name)} must be at least 1, got {getattr(self, name)}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"--threads must be at least 1, got {self.threads}")
        check_precision(self.precision, None)
        if self.rescore_copy is not None and (self.rescore_copy not in RESCORE_COPIES
                                              or self.quantization not in ("int8", "binary")
                                              or (self.quantization, self.rescore_copy) == ("int8", "int8")):
            raise ConfigError(f"--rescore-copy {self.rescore_copy} with --quantization {self.quantization}",
                              "--rescore-copy float16 keeps the vectors for rescoring beside an int8 or "
                              "binary index")
        if self.rescore_copy is None and self.quantization == "binary":
            self.rescore_copy = "int8"
        if self.engine not in ("local", "ray"):
            raise ConfigError(f"--engine {self.engine}: use local or ray")
        if self.quantization not in QUANTIZATIONS:
            raise ConfigError(f"--quantization {self.quantization}: use one of {', '.join(QUANTIZATIONS)}")
        if self.ann not in ANNS:
            raise ConfigError(f"--ann {self.ann}: use one of {', '.join(ANNS)}")
        if self.bits is not None and self.bits not in multivector.BITS:
            raise ConfigError(f"--bits {self.bits}: use 1 or 2")
        if self.centroids is not None and not 1 <= self.centroids <= multivector.MAX_CENTROIDS:
            raise ConfigError(f"centroids {self.centroids}: give 1 to {multivector.MAX_CENTROIDS:,}")
        if self.address is not None and self.engine != "ray":
            raise ConfigError("--address goes with --engine ray (the cluster to join)",
                              "add --engine ray, or leave --address out")

    def settings(self) -> JSONObject:
        """The fields that say how (not what): what Index.build, Index.add and Index.upsert take."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in WHAT}
