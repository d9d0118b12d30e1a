"""`mlmkit index`: a corpus embedded into a new shard of an index (a new index, or ``--append``),
resumable after a kill (``--resume``), locally or on a Ray cluster. No torch.

Embedding is a batch job's windows (jobs/windows.py, jobs/batch.py: windows of documents in input
order, worker processes); each window goes straight into the shard being written under ``.pending/``
(pending.py: vectors written once, resumable after the last window on disk). When every document is
in, the ids are checked (each once, over the index and the shard), the shard is renamed into the
index, the ANN index built over every shard (ann.py), and the manifest written last, atomically: a
kill at any point leaves the index as it was (its manifest names only complete shards), and
``--resume`` finishes the build.

Memory while building: a window of documents and their vectors (the first CALIBRATION_ROWS documents
of a new int8 or binary index, the first SAMPLE_TOKENS token vectors of a new multi-vector one; the
faiss structure, with --ann, held whole while it is built).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

import mlmkit.retrieval.index.multivector as multivector
from mlmkit.args import Args, Chunks, Embedding, Engine, Runtime, arg, check_precision, flag
from mlmkit.errors import ConfigError, DataFormatError, MlmkitError
from mlmkit.files import LOCK, exclusive
from mlmkit.retrieval import postings
from mlmkit.retrieval.index.ann import ann_settings, build_ann
from mlmkit.retrieval.index.codecs import QUANTIZATIONS, RESCORE_COPIES, faiss_module
from mlmkit.retrieval.index.filters import write_meta
from mlmkit.retrieval.index.identity import query_bundle, record
from mlmkit.retrieval.index.live import commit, live_rows, sweep, with_deleted
from mlmkit.retrieval.index.pending import Pending
from mlmkit.retrieval.index.search import as_input, embedding_settings, index_kind
from mlmkit.retrieval.index.store import ANNS, CHUNK, CHUNKS, FORMAT, MANIFEST, Index, id_hashes, shard_name
from mlmkit.text.chunks import Chunker, Chunking, chunk_records
from mlmkit.text.readers import Record


def corpus_records(items: Iterable[Any], id_column: str | None, text_column: str) -> Iterator[Any]:
    """Records as the index takes them, {"id", "text"}: a BEIR corpus's ``_id`` (or ``id``), its
    ``title`` before its ``text``; a text line's id is its line number. A record without an id, or
    with an empty text, names its file and line."""
    for rec in items:
        if not isinstance(rec, Record):
            yield rec
            continue
        if isinstance(rec.data, str):
            if id_column is not None:
                raise rec.error(f"a text line has no id column {id_column!r}", hint="give JSON lines or Parquet with that column")
            yield replace(rec, data={"id": str(rec.line), "text": rec.data})
            continue
        f = rec.fields()
        col = id_column or next((c for c in ("_id", "id") if c in f), None)
        value = f.get(col) if col is not None else None
        if value is None or isinstance(value, (dict, list, bool)) or str(value) == "":
            raise rec.error("no document id" if col is None or col not in f else f"its id is {value!r}", col or "_id",
                            hint="every document needs an id: _id (BEIR) or id, or name the column with --id-column")
        title = f.get("title")
        title = title.strip() if isinstance(title, str) else ""
        text = rec.text(text_column, required=not title)  # a title alone is a document, as in BEIR
        yield replace(rec, data={"id": str(value), "text": f"{title} {text or ''}".strip() if title else text}, schema=None)


@dataclass
class BuildArgs(Args):
    """`mlmkit index`: a corpus embedded into a new index at ``out`` (or a new shard of it: ``append``)."""

    bundle: Path = arg(help="An embedding bundle (mlmkit export); a sparse-embedding one builds an inverted index, a "
                            "colbert one a multi-vector index. With --delete, --upsert or --compact: the index.", positional=True)
    corpus: Path | None = arg(None, "Documents: a BEIR corpus.jsonl (_id, title, text), JSON lines, Parquet or CSV with an id "
                                    "column, or .txt (one a line, its line number the id).")
    out: Path | None = arg(None, "The index directory.")
    quantization: str = arg("float32", "float32, float16, int8 (calibrated ranges) or binary (sign bits, with an int8 "
                                       "copy for rescoring).", flags=("--quantize",))
    ann: str = arg("flat", "flat (exact), hnsw or ivf (faiss, beside the vectors).")
    rescore_copy: str | None = arg(None, "float16: keep the vectors as float16 beside an int8 or binary index, and rescore "
                                         "its candidates from them (binary keeps an int8 copy otherwise).")
    """RESCORE_COPIES, for int8 and binary (None: binary keeps int8, int8 none)."""
    append: bool = arg(False, "Add the documents to the index at --out.")
    resume: bool = arg(False, "Continue the build that was killed, after its last window.")
    id_column: str | None = arg(None, "The documents' id field (default: _id, else id).")
    text_column: str = arg("text", "The documents' text field (a title goes before it).")
    window: int = Runtime.window()
    workers: int = arg(1, "Embedding processes, each with a share of the threads.")
    threads: int | None = Runtime.threads()
    batch_size: int = Runtime.batch_size()
    device: str = Runtime.device()
    precision: str | None = Runtime.precision()  # the documents' vectors are computed in it (mlmkit.runtime.precision)
    engine: str = Engine.engine()
    address: str | None = Engine.address()
    bits: int | None = arg(None, "A colbert bundle's index: bits a dimension of each token vector's residual from its centroid "
                                 "(1 or 2; default 2).")
    centroids: int | None = arg(None, "A colbert bundle's index: its centroids (default: from the sample of token vectors, "
                                      "one per 40).", cli=False)
    hnsw_m: int = arg(32, "--ann hnsw: neighbours per node.", cli=False)
    ivf_lists: int | None = arg(None, "--ann ivf: the lists (default: from the corpus size).", cli=False)
    delete: Path | None = arg(None, "Delete these documents from the index (the first argument): a .txt of ids, one a line, "
                                    "or .jsonl / .csv / .parquet with an _id or id field.")
    upsert: Path | None = arg(None, "Add these documents to the index (the first argument) with its own bundle and settings, "
                                    "replacing those of the same ids (read as --corpus is).")
    compact: bool = arg(False, "Rewrite the index (the first argument) without its deleted documents, reclaiming their space.")
    replacing: bool = arg(False, "An append whose documents replace the index's of the same ids (what --upsert runs).", cli=False)
    chunk_tokens: int | None = Chunks.tokens()
    chunk_overlap: int | None = Chunks.overlap()
    chunk_sentences: bool = Chunks.sentences()
    prompt_name: str | None = Embedding.prompt_name()
    dimensions: int | None = Embedding.dimensions()

    def __post_init__(self) -> None:
        if self.dimensions is not None and self.dimensions < 1:
            raise ConfigError(f"--dimensions must be at least 1, got {self.dimensions}")
        live = [f for f, v in (("--delete", self.delete), ("--upsert", self.upsert), ("--compact", self.compact)) if v]
        if len(live) > 1:
            raise ConfigError(f"{' and '.join(live)}: one change of an index at a time")
        if live and (self.corpus is not None or self.out is not None or self.append):
            raise ConfigError(f"{live[0]} changes the index given as the first argument: it takes no --corpus, --out or --append",
                              f"mlmkit index INDEX {live[0]}{'' if self.compact else ' FILE'}")
        if self.upsert and (self.quantization, self.ann, self.rescore_copy, self.bits) != ("float32", "flat", None, None):
            raise ConfigError("--upsert adds documents with the index's own settings", "drop --quantize, --ann, --rescore-copy and --bits")
        if live and self.resume and not self.upsert:
            raise ConfigError(f"{live[0]} takes no --resume (a delete or a compaction is done whole or not at all)")
        if live and (self.chunk_tokens is not None or self.chunk_overlap is not None or self.chunk_sentences):
            raise ConfigError(f"{live[0]} keeps the index's chunks: drop --chunk-tokens, --chunk-overlap and --chunk-sentences")
        Chunking.of(self.chunk_tokens, self.chunk_overlap, self.chunk_sentences)  # checked now, before a document is read
        if not live and (self.corpus is None or self.out is None):
            raise ConfigError(f"mlmkit index {self.bundle} needs --corpus DOCS and --out INDEX",
                              "or change an index: mlmkit index INDEX --delete IDS | --upsert DOCS | --compact")
        for name in ("window", "workers", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{flag(BuildArgs, name)} must be at least 1, got {getattr(self, name)}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"--threads must be at least 1, got {self.threads}")
        check_precision(self.precision, None)
        if self.rescore_copy is not None and (self.rescore_copy not in RESCORE_COPIES
                                              or self.quantization not in ("int8", "binary")
                                              or (self.quantization, self.rescore_copy) == ("int8", "int8")):
            raise ConfigError(f"--rescore-copy {self.rescore_copy} with --quantize {self.quantization}",
                              "--rescore-copy float16 keeps the vectors for rescoring beside an int8 or binary index")
        if self.rescore_copy is None and self.quantization == "binary":
            self.rescore_copy = "int8"
        if self.engine not in ("local", "ray"):
            raise ConfigError(f"--engine {self.engine}: use local or ray")
        if self.quantization not in QUANTIZATIONS:
            raise ConfigError(f"--quantize {self.quantization}: use one of {', '.join(QUANTIZATIONS)}")
        if self.ann not in ANNS:
            raise ConfigError(f"--ann {self.ann}: use one of {', '.join(ANNS)}")
        if self.bits is not None and self.bits not in multivector.BITS:
            raise ConfigError(f"--bits {self.bits}: use 1 or 2")
        if self.centroids is not None and not 1 <= self.centroids <= multivector.MAX_CENTROIDS:
            raise ConfigError(f"centroids {self.centroids}: give 1 to {multivector.MAX_CENTROIDS:,}")
        if self.address is not None and self.engine != "ray":
            raise ConfigError("--address goes with --engine ray (the cluster to join)", "add --engine ray, or leave --address out")


def build(args: BuildArgs, progress: Any = None) -> dict[str, Any]:
    """Embed the corpus into a new shard of ``args.out`` (a new index, or ``append``), then write the
    manifest that names it. ``progress(n)``: called as each window of n documents is embedded. Returns
    the manifest."""
    from mlmkit.runtime.pipeline import Pipeline
    from mlmkit.text.records import identity, input_files

    if args.upsert is not None:
        args = _as_upsert(args)
    out, corpus = _given(args.out), _given(args.corpus)
    exists = _check_out(args, out)
    pipe = Pipeline.load(args.bundle, device=args.device, threads=args.threads, batch_size=args.batch_size, command="embed",
                         precision=args.precision)
    bundle = record(Path(args.bundle))  # the bundle's identity, read once: what a search checks cheaply
    kind = index_kind(pipe)
    sparse, multi = kind == "sparse", kind == "multivector"
    if sparse and (args.quantization, args.ann, args.rescore_copy) != ("float32", "flat", None):
        raise ConfigError(f"{args.bundle} gives sparse vectors (sparse-embedding): its index is an inverted index, which takes "
                          "no --quantize, --ann or --rescore-copy", "drop them")
    if multi and (args.quantization, args.ann, args.rescore_copy) != ("float32", "flat", None):
        raise ConfigError(f"{args.bundle} gives a vector a token (colbert): its index codes each as a centroid and a residual "
                          "(--bits 1 or 2), and takes no --quantize, --ann or --rescore-copy", "drop them")
    if not multi and (args.bits is not None or args.centroids is not None):
        given = "--bits" if args.bits is not None else "centroids"
        raise ConfigError(f"{given} is for a colbert bundle's index; {args.bundle} builds a {kind} one", f"drop {given}")
    if args.ann != "flat" or multi:
        faiss_module()  # said now, not after the corpus is embedded
    if multi:  # a document's results are a vector a token, as Python floats until they are coded
        args = replace(args, window=min(args.window, multivector.WINDOW))
    with exclusive(out):
        old = Index.open(out) if exists else None
        args = _with_chunking(args, old)
        args = _with_embedding(args, old)
        _chunker(args, pipe)  # a bad --chunk-tokens is said before a document is read
        if old is not None:
            if old.manifest["bundle"].get("sha256") != bundle["sha256"]:
                raise ConfigError(f"{out} was built with the bundle {old.manifest['bundle'].get('path')}, not {args.bundle} "
                                  "(another graph or description)", "append with the index's own bundle, or build a new index")
            if old.codec is not None and (args.bits not in (None, old.codec.bits)
                                          or args.centroids not in (None, len(old.codec.centroids))):
                raise ConfigError(f"{out} codes token vectors with {len(old.codec.centroids):,} centroids and {old.codec.bits}-bit "
                                  "residuals; --append takes the index's own", f"pass --bits {old.codec.bits}, or leave it out")
            if old.codec is None and (args.quantization, args.ann, args.rescore_copy) != (old.quantization, old.ann, old.copy):
                copy = f" --rescore-copy {old.copy}" if old.copy and old.quantization != "binary" else ""
                raise ConfigError(f"{out} is a {old.quantization} index with --ann {old.ann}"
                                  f"{f' and a {old.copy} rescoring copy' if old.copy else ''}; --append takes the index's own "
                                  "settings", f"pass --quantize {old.quantization} --ann {old.ann}{copy}")
        pending = out / ".pending"
        if pending.exists() and not args.resume:
            raise ConfigError(f"an unfinished build is in {pending}", "pass --resume to continue it, or delete that directory")
        if args.resume and not pending.exists():  # else it would add the corpus again, as an --append
            raise ConfigError(f"--resume: no unfinished build in {out}", "drop --resume (--append adds documents to a finished index)")
        if args.resume and old is not None and Pending.committed(pending, len(old.shards)):
            shutil.rmtree(pending, ignore_errors=True)  # stopped after its manifest: the build is done
            sweep(out, old.manifest)  # and what the manifest replaced (an upsert's old bitmap)
            return dict(old.manifest)
        files = input_files(corpus)
        what = {"bundle": pipe.identity(), "inputs": identity(files), "options": _documents(args, pipe),
                "window": args.window, "id_column": args.id_column, "text_column": args.text_column, "engine": args.engine,
                "quantization": args.quantization, "rescore_copy": args.rescore_copy, "precision": args.precision,
                "shards": len(old.shards) if old else 0, "replacing": args.replacing, "chunks": args.chunk_tokens,
                "chunk_overlap": args.chunk_overlap, **({"chunk_sentences": True} if args.chunk_sentences else {}), **({"bits": args.bits or 2, "centroids": args.centroids} if multi else {})}
        pending.mkdir(exist_ok=True)
        block = (old.manifest.get("block") if old is not None else postings.BLOCK) if sparse or multi else None
        dims = int(pipe.meta.model.vocab_size or 0) if sparse else old.dims if old else 0
        try:  # --resume with another bundle, corpus or settings is refused here, what was done kept
            p = Pending(pending, shard_name(old.manifest if old else None), what, quantization=args.quantization,
                        copy=args.rescore_copy, ranges=old.ranges if old else None, dims=dims, kind=kind, block=block,
                        resume=args.resume, codec=old.codec if old else None, bits=args.bits or 2, centroids=args.centroids)
        except BaseException:
            if not args.resume:
                shutil.rmtree(pending, ignore_errors=True)
            raise
        with p:
            manifest = _fill_and_commit(args, out, old, p, pipe, bundle, progress)
        shutil.rmtree(pending, ignore_errors=True)
        sweep(out, manifest)  # an upsert's old bitmap, a killed operation's leftovers
    return manifest


def _check_out(args: BuildArgs, out: Path) -> bool:
    """--out checked against --append and --resume, and made; whether it is an index already."""
    exists = (out / MANIFEST).is_file()
    if exists and not args.append and not args.resume:
        raise ConfigError(f"{out} is an index already", "pass --append to add documents to it, or give a new --out")
    if args.append and not exists:
        raise ConfigError(f"--append: {out} is not an index", "build it first, without --append")
    if out.exists() and not exists and any(p.name not in (".pending", LOCK, multivector.CODEC)
                                           and not p.name.startswith(("shard-", "ann.faiss"))
                                           for p in out.iterdir()):
        raise ConfigError(f"--out {out} is a directory that is not an index", "give a new or empty directory")
    out.mkdir(parents=True, exist_ok=True)
    return exists


def _with_chunking(args: BuildArgs, old: Index | None) -> BuildArgs:
    """--chunk-tokens and --chunk-overlap resolved (the overlap's default), or an index's own for an
    append (another is refused)."""
    mine = Chunking.of(args.chunk_tokens, args.chunk_overlap, args.chunk_sentences)
    if old is not None:
        theirs = Chunking.read(old.manifest.get("chunks"))
        if mine is not None and mine != theirs:
            raise ConfigError(f"{old.path} is {theirs.describe() if theirs else 'not chunked'}; --append and --upsert take the "
                              "index's own chunks", "drop --chunk-tokens, --chunk-overlap and --chunk-sentences")
        mine = theirs
    return replace(args, chunk_tokens=mine.tokens if mine else None, chunk_overlap=mine.overlap if mine else None,
                   chunk_sentences=bool(mine and mine.sentences))


def _with_embedding(args: BuildArgs, old: Index | None) -> BuildArgs:
    """--prompt-name and --dimensions, or an index's own for an append (others are refused)."""
    if old is None:
        return args
    prompt, dims = embedding_settings(old.manifest)
    if (args.prompt_name or prompt, args.dimensions or dims) != (prompt, dims):
        raise ConfigError(f"{old.path} was built with --prompt-name {prompt or '(none)'} and --dimensions {dims or '(all)'}; "
                          "--append and --upsert take the index's own", "drop --prompt-name and --dimensions")
    return replace(args, prompt_name=prompt, dimensions=dims)


def _documents(args: BuildArgs, pipe: Any) -> dict[str, Any]:
    """The pipeline options that embed the corpus: as documents, with --prompt-name and --dimensions."""
    return as_input(pipe, "document", args.prompt_name, args.dimensions)


def _chunker(args: BuildArgs, pipe: Any) -> Chunker | None:
    chunking = Chunking.of(args.chunk_tokens, args.chunk_overlap, args.chunk_sentences)
    prompt = str(pipe.meta.options.get("document_prompt", "") or "")
    if args.prompt_name:  # the named prompt takes its share of each chunk's tokens instead
        prompt = str(json.loads(pipe.meta.options.get("prompts") or "{}").get(args.prompt_name, prompt))
    return Chunker(pipe.tokenizer, pipe.max_length, chunking, prompt, str(pipe.path)) if chunking else None


def write_spans(shard: Path, args: BuildArgs, chunker: Chunker | None) -> np.ndarray | None:
    """A chunked shard's chunks.arrow: each row's chunk number and its span in its document's text (the
    corpus cut again, as it was embedded); returns each document's number of chunks. None unchunked."""
    if chunker is None:
        return None
    import pyarrow as pa

    from mlmkit.text.records import iter_inputs

    schema = pa.schema([("chunk", pa.int32()), ("start", pa.int32()), ("end", pa.int32())])
    counts: list[int] = []
    rows: list[tuple[int, int, int]] = []
    with pa.ipc.new_file(str(shard / CHUNKS), schema) as w:
        for rec in corpus_records(iter_inputs(_given(args.corpus)), args.id_column, args.text_column):
            spans = chunker.spans(rec.data["text"])
            counts.append(len(spans))
            rows += [(k, a, b) for k, (a, b) in enumerate(spans)]
            if len(rows) >= CHUNK:
                w.write_table(pa.Table.from_arrays([pa.array(c, pa.int32()) for c in zip(*rows)], schema=schema))
                rows = []
        if rows:
            w.write_table(pa.Table.from_arrays([pa.array(c, pa.int32()) for c in zip(*rows)], schema=schema))
    return np.asarray(counts, dtype=np.int64)


def _given(path: Path | None) -> Path:
    """--corpus or --out of a build (BuildArgs checks both are given when neither --delete nor --compact is)."""
    if path is None:
        raise ConfigError("mlmkit index BUNDLE needs --corpus DOCS and --out INDEX")
    return Path(path)


def _as_upsert(args: BuildArgs) -> BuildArgs:
    """`mlmkit index INDEX --upsert DOCS`: an append of DOCS with the index's own bundle and settings,
    whose commit also deletes the index's documents of the same ids (_check_unique, _commit)."""
    ix = Index.open(args.bundle)
    return replace(args, bundle=query_bundle(ix, None), corpus=args.upsert, out=Path(args.bundle), append=True, upsert=None, replacing=True,
                   quantization=ix.quantization if ix.kind == "dense" else "float32", ann=ix.ann,
                   rescore_copy=ix.copy if ix.quantization != "binary" else "int8")


def _fill_and_commit(args: BuildArgs, out: Path, old: Index | None, p: Pending, pipe: Any, bundle: dict[str, Any],
                     progress: Any) -> dict[str, Any]:
    """The shard's documents embedded (where a kill left them), checked, and put into the index. On an
    error .pending/ stays for --resume when windows are on disk; it goes when nothing was, or when the
    documents themselves are bad (an id twice: a resume would meet it again)."""
    try:
        if not p.complete:
            if args.engine == "ray":
                p.restart()  # a Ray build starts over
                _embed_on_ray(args, p, pipe, progress)
            else:
                _embed_here(args, p, pipe, progress)
            try:
                _check_unique(p.finish(_given(args.corpus)), old, p.shard, _given(args.corpus), replacing=args.replacing)
                counts = write_spans(p.shard, args, _chunker(args, pipe))
                write_meta(p.shard, _given(args.corpus), args.id_column, args.text_column, p.rows, counts)
            except MlmkitError:
                shutil.rmtree(p.dir, ignore_errors=True)
                raise
            p.mark_complete()
        return _commit(args, out, old, p, pipe, bundle)
    except BaseException as e:
        if not p.complete and p.windows == 0:
            shutil.rmtree(p.dir, ignore_errors=True)  # nothing finished: nothing to resume
        elif isinstance(e, MlmkitError) and p.dir.exists():
            e.hint = (f"{e.hint}; " if e.hint else "") + (
                f"{p.rows:,} documents are in {p.dir}: --resume continues after them if the corpus stays as it is")
        raise


def _embed_here(args: BuildArgs, p: Pending, pipe: Any, progress: Any) -> None:
    """The corpus's windows after those on disk, embedded here (``--workers`` processes), into ``p``."""
    from mlmkit.jobs.batch import run_windows, split_threads
    from mlmkit.jobs.windows import windows
    from mlmkit.text.records import iter_inputs

    items = corpus_records(iter_inputs(_given(args.corpus)), args.id_column, args.text_column)
    chunker = _chunker(args, pipe)
    items = chunk_records(items, chunker) if chunker is not None else items
    for w, done in run_windows(windows(items, args.window, skip=p.windows), pipe, workers=args.workers,
                               threads=split_threads(args.threads, args.workers), options=_documents(args, pipe),
                               skip=False, id_column="id"):
        ids = [str(r["id"]) for r in done.results]
        if p.multi:
            x: Any = [np.asarray(r["vectors"], dtype=np.float32) for r in done.results]
        elif p.sparse:
            x = (np.asarray([len(r["indices"]) for r in done.results], dtype=np.int64),
                      np.asarray([t for r in done.results for t in r["indices"]], dtype=np.int32),
                      np.asarray([v for r in done.results for v in r["values"]], dtype=np.float32))
        else:
            x = np.asarray([r["embedding"] for r in done.results], dtype=np.float32)
        p.add(w.index, len(w.items), ids, x)
        if progress is not None:
            progress(len(w.items))


def _embed_on_ray(args: BuildArgs, p: Pending, pipe: Any, progress: Any) -> None:
    """--engine ray: the documents read and checked here (ids, titles: each bad one names its file and
    line, as in a local build) into Parquet files of ``args.window`` documents under .pending/documents,
    which the cluster reads (on a cluster of several machines ``--out`` must be on storage they share),
    then embedded there and streamed back, in order, into ``p``. A resumed Ray build starts over."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mlmkit.jobs.ray import embed_in_order
    from mlmkit.text.records import iter_inputs

    docs = p.dir / "documents"
    shutil.rmtree(docs, ignore_errors=True)
    docs.mkdir()
    files: list[Path] = []
    part: list[dict[str, str]] = []

    def flush() -> None:
        files.append(docs / f"part-{len(files):06d}.parquet")
        pq.write_table(pa.Table.from_pylist(part, schema=pa.schema([("id", pa.string()), ("text", pa.string())])), files[-1])
        part.clear()

    chunker = _chunker(args, pipe)
    records = corpus_records(iter_inputs(_given(args.corpus)), args.id_column, args.text_column)
    for rec in chunk_records(records, chunker) if chunker is not None else records:
        part.append(rec.data if isinstance(rec, Record) else rec)
        if len(part) == args.window:
            flush()
    if part:
        flush()
    if not files:
        raise DataFormatError(_given(args.corpus), "no documents", hint="one document per line or record")
    k = 0
    for b in embed_in_order(files, args.bundle, options=_documents(args, pipe), address=args.address,
                            workers=args.workers, threads=args.threads, batch_size=args.batch_size, rows_per_batch=args.window):
        if not b.num_rows:
            continue
        ids = [str(v) for v in b.column("id").to_pylist()]
        if p.sparse:
            terms, weights = _lists(b, "indices", pa.int32()), _lists(b, "values", pa.float32())
            x: Any = (np.diff(terms.offsets.to_numpy()), terms.flatten().to_numpy(), weights.flatten().to_numpy())
        elif p.multi:  # each document's token vectors: a list of lists
            tokens = _lists(b, "vectors", pa.list_(pa.float32()))
            flat = tokens.flatten()
            x = np.split(flat.flatten().to_numpy().reshape(len(flat), -1), np.cumsum(np.diff(tokens.offsets.to_numpy()))[:-1])
        else:
            x = _lists(b, "embedding", pa.float32()).flatten().to_numpy().reshape(b.num_rows, -1)
        p.add(k, b.num_rows, ids, x)
        k += 1
        if progress is not None:
            progress(b.num_rows)
    shutil.rmtree(docs, ignore_errors=True)


def _lists(batch: Any, name: str, value: Any) -> Any:
    """A column of Ray's batch as one Arrow list array of ``value`` (whatever its chunks and list type)."""
    import pyarrow as pa

    col = batch.column(name)
    return (col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col).cast(pa.list_(value))


def _check_unique(seen: list[np.ndarray], old: Index | None, shard: Path, corpus: Path, *, replacing: bool = False) -> None:
    """Every id once, over the index's live documents and the new shard (8-byte hashes held, not the
    ids; an equal hash is looked up by id, so a collision is never an error); ``replacing`` (an
    upsert): the index's documents of the new shard's ids do not count, they are to be deleted."""
    new_h = np.concatenate(seen) if seen else np.zeros(0, np.uint64)
    old_h = np.zeros(0, np.uint64)
    if old is not None:
        old_h = np.concatenate([id_hashes(ids.to_pylist()) for _, ids, _ in old.shards] or [old_h])
        old_h = old_h[~old.deleted] if old.deleted is not None else old_h
        old_h = old_h[~np.isin(old_h, new_h)] if replacing else old_h
    h = np.sort(np.concatenate([old_h, new_h]))
    if not (h[1:] == h[:-1]).any():
        return
    import pyarrow as pa

    new = pa.ipc.open_file(pa.memory_map(str(shard / "ids.arrow"))).read_all().column(0).to_pylist()
    live = old.allowed() if old is not None else None
    before = [i for r, i in enumerate(i for _, ids, _ in (old.shards if old else []) for i in ids.to_pylist())
              if live is None or live[r]]
    if replacing:
        replaced = set(new)
        before = [i for i in before if i not in replaced]
    seen_ids: set[str] = set()
    for k, i in enumerate([*before, *new]):
        if i in seen_ids:
            where = f"document {k - len(before) + 1} of the corpus" if k >= len(before) else "the index"
            raise DataFormatError(corpus, f"the id {i!r} comes twice ({where}; {'once in the index already' if i in set(before) else 'earlier in the corpus'})",
                                  field="_id", hint="give every document its own id; nothing was added to the index")
        seen_ids.add(i)


def _commit(args: BuildArgs, out: Path, old: Index | None, p: Pending, pipe: Any, bundle: dict[str, Any]) -> dict[str, Any]:
    """The finished shard renamed into the index, the ANN index rebuilt over every shard, then the
    manifest that names them, written last: a kill before its rename leaves the index as it was (a
    shard or an ann.faiss it does not name; a resume does this again)."""
    name, n = p.name, p.rows
    total = (old.count if old else 0) + n
    codec = {"bits": p.codec.bits, "centroids": len(p.codec.centroids), "tokens": (old.manifest.get("tokens", 0) if old else 0)
             + p.state["tokens"], "search": old.manifest.get("search") if old else {"nprobe": multivector.NPROBE, "candidates": multivector.CANDIDATES}} \
        if p.codec else {}
    manifest = {
        "format": FORMAT, "kind": p.kind, **({"block": p.block} if p.block else {}), **codec,
        **({"chunks": Chunking(args.chunk_tokens, int(args.chunk_overlap or 0), args.chunk_sentences).manifest()}
           if args.chunk_tokens else {}),
        "bundle": bundle,
        "prompts": {k: pipe.meta.options.get(k, "") for k in ("query_prompt", "document_prompt")},
        **({"prompt_name": args.prompt_name} if args.prompt_name else {}),
        **({"dimensions": args.dimensions, "normalized": bool(pipe.meta.options.get("normalize"))} if args.dimensions else {}),
        "dims": p.dims, "count": total, "quantization": "residual" if p.multi else args.quantization,
        "ranges": p.state["ranges"], "rescore_copy": args.rescore_copy, "ann": args.ann,
        "ann_settings": old.manifest.get("ann_settings", {}) if old else ann_settings(args.ann, total, hnsw_m=args.hnsw_m,
                                                                                      ivf_lists=args.ivf_lists),
        "shards": [*(old.manifest["shards"] if old else []), {"name": name, "count": n}],
    }
    if p.shard.is_dir():  # else a commit killed after this rename left it in the index already
        shutil.rmtree(out / name, ignore_errors=True)  # a killed build's shard that no manifest names
        os.replace(p.shard, out / name)  # named by no manifest yet: harmless if what follows is killed
    if (p.dir / multivector.CODEC).is_file():  # a new multi-vector index's codec, named by no manifest yet either
        os.replace(p.dir / multivector.CODEC, out / multivector.CODEC)
    if old is not None and old.deleted is not None:  # the rows deleted stay deleted; the new shard's are live
        manifest["deleted"] = old.manifest["deleted"]
    if args.replacing and old is not None:  # the index's documents of the new ids: deleted in this same manifest
        import pyarrow as pa

        ids = set(pa.ipc.open_file(pa.memory_map(str(out / name / "ids.arrow"))).read_all().column(0).to_pylist())
        replaced = live_rows(old, ids)
        if replaced:
            mask = np.zeros(total, dtype=np.bool_)
            mask[:old.count] = old.deleted if old.deleted is not None else False
            mask[[r for found in replaced.values() for r in found]] = True
            manifest = with_deleted(out, manifest, mask)
    if args.ann != "flat":
        build_ann(out, manifest)
    return commit(out, manifest)
