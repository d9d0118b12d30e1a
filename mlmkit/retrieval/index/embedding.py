"""A corpus read and embedded into the shard being written (pending.py), window by window: here
(``--workers`` processes) or on a Ray cluster (``--engine ray``); a chunked corpus's spans. No torch.

A corpus is a file `mlmkit index --corpus` reads (corpus_records: a BEIR corpus.jsonl, JSON lines,
Parquet, CSV, .txt), or records given as Python values (corpus_file writes them as JSON lines first).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from mlmkit.errors import ConfigError, DataFormatError
from mlmkit.retrieval.index.build_args import BuildArgs
from mlmkit.retrieval.index.disk import CHUNKS
from mlmkit.retrieval.index.pending import Pending
from mlmkit.retrieval.index.search import as_input
from mlmkit.retrieval.index.store import CHUNK
from mlmkit.text.chunks import Chunker, Chunking, chunk_records
from mlmkit.text.record import Record


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
                raise rec.error(f"a text line has no id column {id_column!r}",
                                hint="give JSON lines or Parquet with that column")
            yield replace(rec, data={"id": str(rec.line), "text": rec.data})
            continue
        f = rec.fields()
        col = id_column or next((c for c in ("_id", "id") if c in f), None)
        value = f.get(col) if col is not None else None
        if value is None or isinstance(value, (dict, list, bool)) or str(value) == "":
            raise rec.error("no document id" if col is None or col not in f else f"its id is {value!r}",
                            col or "_id",
                            hint="every document needs an id: _id (BEIR) or id, or name the column with "
                                 "--id-column")
        title = f.get("title")
        title = title.strip() if isinstance(title, str) else ""
        text = rec.text(text_column, required=not title)  # a title alone is a document, as in BEIR
        yield replace(rec, data={"id": str(value),
                                 "text": f"{title} {text or ''}".strip() if title else text}, schema=None)


@contextlib.contextmanager
def corpus_file(corpus: str | Path | Iterable[Mapping[str, Any]]) -> Iterator[Path]:
    """``corpus`` as a file: a path as it is; records ({"id" or "_id", "text", "title", other fields kept
    for --where}) written as JSON lines into a temporary directory, removed after (a build of records is
    not resumable: a resume reads the same corpus file again)."""
    if isinstance(corpus, (str, Path)):
        yield Path(corpus)
        return
    from mlmkit.files import json_line

    with tempfile.TemporaryDirectory(prefix="mlmkit-records-") as tmp:
        path = Path(tmp) / "documents.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for n, rec in enumerate(corpus, 1):
                if not isinstance(rec, Mapping):
                    raise DataFormatError("the documents given", f"{type(rec).__name__} is not a record",
                                          line=n,
                                          unit="document", hint='give each as {"id": ..., "text": ...}')
                f.write(json_line(dict(rec)))
        yield path


def documents(args: BuildArgs, pipe: Any) -> dict[str, Any]:
    """The pipeline options that embed the corpus: as documents, with --prompt-name and --dimensions."""
    return as_input(pipe, "document", args.prompt_name, args.dimensions)


def chunker(args: BuildArgs, pipe: Any) -> Chunker | None:
    chunking = Chunking.of(args.chunk_tokens, args.chunk_overlap, args.chunk_sentences)
    prompt = str(pipe.meta.options.get("document_prompt", "") or "")
    if args.prompt_name:  # the named prompt takes its share of each chunk's tokens instead
        prompt = str(json.loads(pipe.meta.options.get("prompts") or "{}").get(args.prompt_name, prompt))
    return Chunker(pipe.tokenizer, pipe.max_length, chunking, prompt, str(pipe.path)) if chunking else None


def write_spans(shard: Path, args: BuildArgs, cut: Chunker | None) -> np.ndarray | None:
    """A chunked shard's chunks.arrow: each row's chunk number and its span in its document's text (the
    corpus cut again, as it was embedded); returns each document's number of chunks. None unchunked."""
    if cut is None:
        return None
    import pyarrow as pa

    from mlmkit.text.records import iter_inputs

    schema = pa.schema([("chunk", pa.int32()), ("start", pa.int32()), ("end", pa.int32())])
    counts: list[int] = []
    rows: list[tuple[int, int, int]] = []
    with pa.ipc.new_file(str(shard / CHUNKS), schema) as w:
        for rec in corpus_records(iter_inputs(given(args.corpus)), args.id_column, args.text_column):
            spans = cut.spans(rec.data["text"])
            counts.append(len(spans))
            rows += [(k, a, b) for k, (a, b) in enumerate(spans)]
            if len(rows) >= CHUNK:
                w.write_table(pa.Table.from_arrays([pa.array(c, pa.int32()) for c in zip(*rows)],
                                                   schema=schema))
                rows = []
        if rows:
            w.write_table(pa.Table.from_arrays([pa.array(c, pa.int32()) for c in zip(*rows)], schema=schema))
    return np.asarray(counts, dtype=np.int64)


def given(path: Path | None) -> Path:
    """--corpus or --out of a build (BuildArgs checks both are given when neither --delete nor --compact
    is)."""
    if path is None:
        raise ConfigError("mlmkit index BUNDLE needs --corpus DOCS and --out INDEX")
    return Path(path)


def embed_here(args: BuildArgs, p: Pending, pipe: Any, progress: Any) -> None:
    """The corpus's windows after those on disk, embedded here (``--workers`` processes), into ``p``."""
    from mlmkit.jobs.batch import run_windows, split_threads
    from mlmkit.jobs.windows import windows
    from mlmkit.text.records import iter_inputs

    items = corpus_records(iter_inputs(given(args.corpus)), args.id_column, args.text_column)
    cut = chunker(args, pipe)
    items = chunk_records(items, cut) if cut is not None else items
    for w, done in run_windows(windows(items, args.window, skip=p.windows), pipe, workers=args.workers,
                               threads=split_threads(args.threads, args.workers),
                               options=documents(args, pipe),
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


def embed_on_ray(args: BuildArgs, p: Pending, pipe: Any, progress: Any) -> None:
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
        pq.write_table(pa.Table.from_pylist(part, schema=pa.schema([("id", pa.string()),
                                                                    ("text", pa.string())])), files[-1])
        part.clear()

    cut = chunker(args, pipe)
    records = corpus_records(iter_inputs(given(args.corpus)), args.id_column, args.text_column)
    for rec in chunk_records(records, cut) if cut is not None else records:
        part.append(rec.data if isinstance(rec, Record) else rec)
        if len(part) == args.window:
            flush()
    if part:
        flush()
    if not files:
        raise DataFormatError(given(args.corpus), "no documents", hint="one document per line or record")
    k = 0
    for b in embed_in_order(files, args.bundle, options=documents(args, pipe), address=args.address,
                            workers=args.workers, threads=args.threads, batch_size=args.batch_size,
                            rows_per_batch=args.window):
        if not b.num_rows:
            continue
        ids = [str(v) for v in b.column("id").to_pylist()]
        if p.sparse:
            terms, weights = _lists(b, "indices", pa.int32()), _lists(b, "values", pa.float32())
            x: Any = (np.diff(terms.offsets.to_numpy()), terms.flatten().to_numpy(),
                      weights.flatten().to_numpy())
        elif p.multi:  # each document's token vectors: a list of lists
            tokens = _lists(b, "vectors", pa.list_(pa.float32()))
            flat = tokens.flatten()
            x = np.split(flat.flatten().to_numpy().reshape(len(flat), -1),
                         np.cumsum(np.diff(tokens.offsets.to_numpy()))[:-1])
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
