"""`mlmkit index`: a corpus embedded into a new shard of an index (a new index, or ``--append``),
resumable after a kill (``--resume``), locally or on a Ray cluster. No torch.

Embedding is a batch job's windows (jobs/windows.py, jobs/batch.py: windows of documents in input
order, worker processes; embedding.py); each window goes straight into the shard being written under
``.pending/`` (pending.py: vectors written once, resumable after the last window on disk). When every
document is in, the ids are checked (each once, over the index and the shard), the shard is renamed
into the index, the ANN index built over every shard (ann.py), and the manifest written last,
atomically: a kill at any point leaves the index as it was (its manifest names only complete
shards), and ``--resume`` finishes the build.

Memory while building: a window of documents and their vectors (the first CALIBRATION_ROWS documents
of a new int8 or binary index, the first SAMPLE_TOKENS token vectors of a new multi-vector one; the
faiss structure, with --ann, held whole while it is built).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

import mlmkit.retrieval.index.multivector as multivector
from mlmkit.errors import ConfigError, DataFormatError, MlmkitError
from mlmkit.files import JSONObject
from mlmkit.locks import LOCK, exclusive
from mlmkit.retrieval import postings
from mlmkit.retrieval.index.ann import ann_settings, build_ann
from mlmkit.retrieval.index.build_args import BuildArgs
from mlmkit.retrieval.index.codecs import faiss_module
from mlmkit.retrieval.index.disk import id_hashes
from mlmkit.retrieval.index.embedding import (
    chunker,
    corpus_file,
    documents,
    embed_here,
    embed_on_ray,
    given,
    write_spans,
)
from mlmkit.retrieval.index.filters import field_kinds, write_meta
from mlmkit.retrieval.index.identity import query_bundle, record
from mlmkit.retrieval.index.live import commit, live_rows, sweep, with_deleted
from mlmkit.retrieval.index.manifest import (
    FORMAT,
    MANIFEST,
    BundleRecord,
    Manifest,
    SearchSettings,
    ShardEntry,
    shard_name,
)
from mlmkit.retrieval.index.pending import Pending
from mlmkit.retrieval.index.search import embedding_settings, index_kind
from mlmkit.retrieval.index.store import Documents, Progress, StoredIndex
from mlmkit.text.chunks import Chunking


def build_from(bundle: Path, corpus: Documents, out: Path, progress: Progress,
               settings: Mapping[str, Any]) -> Manifest:
    """Index.build and Index.add: ``corpus`` (a file, or records) embedded with ``bundle`` into ``out``,
    with ``settings`` (BuildArgs's fields)."""
    with corpus_file(corpus) as path:
        return build(BuildArgs(bundle, path, out, **settings), progress)


UPSERT_OWN = {"quantization": "float32", "ann": "flat", "rescore_copy": None, "bits": None}
"""The settings an upsert takes from the index (given others, it refuses them)."""


def own_settings(ix: StoredIndex) -> JSONObject:
    """The settings an append or an upsert of ``ix`` takes: the index's own."""
    return {"quantization": ix.quantization if ix.kind == "dense" else "float32", "ann": ix.ann,
            "rescore_copy": ix.copy if ix.quantization != "binary" else "int8"}


def add(ix: StoredIndex, corpus: Documents, bundle: Path | None, progress: Progress,
        settings: Mapping[str, Any]) -> Manifest:
    """Index.add: an append of ``corpus`` with the index's own bundle (or ``bundle``) and settings."""
    return build_from(query_bundle(ix, bundle), corpus, ix.path, progress,
                      {**own_settings(ix), **settings, "append": True})


def upsert(ix: StoredIndex, corpus: Documents, progress: Progress, settings: Mapping[str, Any]) -> Manifest:
    """`mlmkit index INDEX --upsert DOCS` and Index.upsert: an append of DOCS with the index's own bundle
    and settings, whose commit also deletes the index's documents of the same ids (_check_unique,
    _commit)."""
    if any(settings.get(k, v) != v for k, v in UPSERT_OWN.items()):
        raise ConfigError("--upsert adds documents with the index's own settings",
                          "drop --quantization, --ann, --rescore-copy and --bits")
    own = own_settings(ix)
    rest = {k: v for k, v in settings.items() if k not in (*UPSERT_OWN, "append", "replacing")}
    return build_from(query_bundle(ix, None), corpus, ix.path, progress, {**rest, **own, "append": True,
                                                                          "replacing": True})


def build(args: BuildArgs, progress: Progress = None) -> Manifest:
    """Embed the corpus into a new shard of ``args.out`` (a new index, or ``append``), then write the
    manifest that names it. ``progress(n)``: called as each window of n documents is embedded. Returns
    the manifest."""
    from mlmkit.runtime.pipeline import Pipeline
    from mlmkit.text.records import identity, input_files

    if args.upsert is not None:
        return upsert(StoredIndex.open(args.bundle), args.upsert, progress, args.settings())
    out, corpus = given(args.out), given(args.corpus)
    exists = _check_out(args, out)
    pipe = Pipeline.load(args.bundle, device=args.device, threads=args.threads, batch_size=args.batch_size,
                         command="embed", precision=args.precision)
    bundle = record(Path(args.bundle))  # the bundle's identity, read once: what a search checks cheaply
    kind = index_kind(pipe)
    args = _check_kind(args, kind)
    with exclusive(out):
        old = StoredIndex.open(out) if exists else None
        args = _with_chunking(args, old)
        args = _with_embedding(args, old)
        chunker(args, pipe)  # a bad --chunk-tokens is said before a document is read
        if old is not None:
            _check_append(args, old, bundle)
        pending = out / ".pending"
        if pending.exists() and not args.resume:
            raise ConfigError(f"an unfinished build is in {pending}",
                              "pass --resume to continue it, or delete that directory")
        if args.resume and not pending.exists():  # else it would add the corpus again, as an --append
            raise ConfigError(f"--resume: no unfinished build in {out}",
                              "drop --resume (--append adds documents to a finished index)")
        if args.resume and old is not None and Pending.committed(pending, len(old.shards)):
            shutil.rmtree(pending, ignore_errors=True)  # stopped after its manifest: the build is done
            sweep(out, old.manifest)  # and what the manifest replaced (an upsert's old bitmap)
            return old.manifest
        multi, sparse = kind == "multivector", kind == "sparse"
        what = {"bundle": pipe.identity(), "inputs": identity(input_files(corpus)),
                "options": documents(args, pipe),
                "window": args.window, "id_column": args.id_column, "text_column": args.text_column,
                "engine": args.engine, "quantization": args.quantization, "rescore_copy": args.rescore_copy,
                "precision": args.precision, "shards": len(old.shards) if old else 0,
                "replacing": args.replacing,
                "chunks": args.chunk_tokens, "chunk_overlap": args.chunk_overlap,
                **({"chunk_sentences": True} if args.chunk_sentences else {}),
                **({"bits": args.bits or 2, "centroids": args.centroids} if multi else {})}
        pending.mkdir(exist_ok=True)
        block = (old.manifest.block if old is not None else postings.BLOCK) if sparse or multi else None
        dims = int(pipe.meta.model.vocab_size or 0) if sparse else old.dims if old else 0
        try:  # --resume with another bundle, corpus or settings is refused here, what was done kept
            p = Pending(pending, shard_name(old.manifest.shards if old else ()), what,
                        quantization=args.quantization,
                        copy=args.rescore_copy, ranges=old.ranges if old else None, dims=dims, kind=kind,
                        block=block, resume=args.resume, codec=old.codec if old else None,
                        bits=args.bits or 2,
                        centroids=args.centroids)
        except BaseException:
            if not args.resume:
                shutil.rmtree(pending, ignore_errors=True)
            raise
        with p:
            manifest = _fill_and_commit(args, out, old, p, pipe, bundle, progress)
        shutil.rmtree(pending, ignore_errors=True)
        sweep(out, manifest)  # an upsert's old bitmap, a killed operation's leftovers
    return manifest


def _check_kind(args: BuildArgs, kind: str) -> BuildArgs:
    """The settings the bundle's kind of index (search.index_kind) takes: what it refuses said before a
    document is read."""
    sparse, multi = kind == "sparse", kind == "multivector"
    if sparse and (args.quantization, args.ann, args.rescore_copy) != ("float32", "flat", None):
        raise ConfigError(f"{args.bundle} gives sparse vectors (sparse-embedding): its index is an inverted "
                          "index, "
                          "which takes no --quantization, --ann or --rescore-copy", "drop them")
    if multi and (args.quantization, args.ann, args.rescore_copy) != ("float32", "flat", None):
        raise ConfigError(f"{args.bundle} gives a vector a token (colbert): its index codes each as a "
                          "centroid and a "
                          "residual (--bits 1 or 2), and takes no --quantization, --ann or --rescore-copy",
                          "drop them")
    if not multi and (args.bits is not None or args.centroids is not None):
        name = "--bits" if args.bits is not None else "centroids"
        raise ConfigError(f"{name} is for a colbert bundle's index; {args.bundle} builds a {kind} one",
                          f"drop {name}")
    if args.ann != "flat" or multi:
        faiss_module()  # said now, not after the corpus is embedded
    if multi:  # a document's results are a vector a token, as Python floats until they are coded
        args = replace(args, window=min(args.window, multivector.WINDOW))
    return args


def _check_append(args: BuildArgs, old: StoredIndex, bundle: BundleRecord) -> None:
    """An append takes the index's own bundle and settings: another is refused in one line."""
    out = old.path
    if old.manifest.bundle.sha256 != bundle.sha256:
        raise ConfigError(f"{out} was built with the bundle {old.manifest.bundle.path}, not {args.bundle} "
                          "(another graph or description)",
                          "append with the index's own bundle, or build a new index")
    if old.codec is not None and (args.bits not in (None, old.codec.bits)
                                  or args.centroids not in (None, len(old.codec.centroids))):
        raise ConfigError(f"{out} codes token vectors with {len(old.codec.centroids):,} centroids and "
                          f"{old.codec.bits}-bit residuals; --append takes the index's own",
                          f"pass --bits {old.codec.bits}, or leave it out")
    if old.codec is None and (args.quantization, args.ann, args.rescore_copy) != (old.quantization, old.ann,
                                                                                  old.copy):
        copy = f" --rescore-copy {old.copy}" if old.copy and old.quantization != "binary" else ""
        raise ConfigError(f"{out} is a {old.quantization} index with --ann {old.ann}"
                          f"{f' and a {old.copy} rescoring copy' if old.copy else ''}; --append takes the "
                          "index's "
                          "own settings", f"pass --quantization {old.quantization} --ann {old.ann}{copy}")


def _check_out(args: BuildArgs, out: Path) -> bool:
    """--out checked against --append and --resume, and made; whether it is an index already."""
    exists = (out / MANIFEST).is_file()
    if exists and not args.append and not args.resume:
        raise ConfigError(f"{out} is an index already",
                          "pass --append to add documents to it, or give a new --out")
    if args.append and not exists:
        raise ConfigError(f"--append: {out} is not an index", "build it first, without --append")
    if out.exists() and not exists and any(p.name not in (".pending", LOCK, multivector.CODEC)
                                           and not p.name.startswith(("shard-", "ann.faiss"))
                                           for p in out.iterdir()):
        raise ConfigError(f"--out {out} is a directory that is not an index", "give a new or empty directory")
    out.mkdir(parents=True, exist_ok=True)
    return exists


def _with_chunking(args: BuildArgs, old: StoredIndex | None) -> BuildArgs:
    """--chunk-tokens and --chunk-overlap resolved (the overlap's default), or an index's own for an
    append (another is refused)."""
    mine = Chunking.of(args.chunk_tokens, args.chunk_overlap, args.chunk_sentences)
    if old is not None:
        theirs = old.manifest.chunks
        if mine is not None and mine != theirs:
            raise ConfigError(f"{old.path} is {theirs.describe() if theirs else 'not chunked'}; --append and "
                              "--upsert take the "
                              "index's own chunks",
                              "drop --chunk-tokens, --chunk-overlap and --chunk-sentences")
        mine = theirs
    return replace(args, chunk_tokens=mine.tokens if mine else None,
                   chunk_overlap=mine.overlap if mine else None,
                   chunk_sentences=bool(mine and mine.sentences))


def _with_embedding(args: BuildArgs, old: StoredIndex | None) -> BuildArgs:
    """--prompt-name and --dimensions, or an index's own for an append (others are refused)."""
    if old is None:
        return args
    prompt, dims = embedding_settings(old.manifest)
    if (args.prompt_name or prompt, args.dimensions or dims) != (prompt, dims):
        raise ConfigError(f"{old.path} was built with --prompt-name {prompt or '(none)'} and --dimensions "
                          f"{dims or '(all)'}; "
                          "--append and --upsert take the index's own", "drop --prompt-name and --dimensions")
    return replace(args, prompt_name=prompt, dimensions=dims)


def _fill_and_commit(args: BuildArgs, out: Path, old: StoredIndex | None, p: Pending, pipe: Any,
                     bundle: BundleRecord,
                     progress: Progress) -> Manifest:
    """The shard's documents embedded (where a kill left them), checked, and put into the index. On an
    error .pending/ stays for --resume when windows are on disk; it goes when nothing was, or when the
    documents themselves are bad (an id twice: a resume would meet it again)."""
    try:
        if not p.complete:
            if args.engine == "ray":
                p.restart()  # a Ray build starts over
                embed_on_ray(args, p, pipe, progress)
            else:
                embed_here(args, p, pipe, progress)
            try:
                _check_unique(p.finish(given(args.corpus)), old, p.shard, given(args.corpus),
                              replacing=args.replacing)
                counts = write_spans(p.shard, args, chunker(args, pipe))
                write_meta(p.shard, given(args.corpus), args.id_column, args.text_column, p.rows, counts,
                           known=field_kinds(old) if old is not None else None)
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
                f"{p.rows:,} documents are in {p.dir}: --resume continues after them if the corpus stays as "
                "it is")
        raise


def _check_unique(seen: list[np.ndarray], old: StoredIndex | None, shard: Path, corpus: Path, *,
                  replacing: bool = False) -> None:
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
            again = "once in the index already" if i in set(before) else "earlier in the corpus"
            raise DataFormatError(corpus, f"the id {i!r} comes twice ({where}; {again})",
                                  field="_id",
                                  hint="give every document its own id; nothing was added to the index")
        seen_ids.add(i)


def _commit(args: BuildArgs, out: Path, old: StoredIndex | None, p: Pending, pipe: Any,
            bundle: BundleRecord) -> Manifest:
    """The finished shard renamed into the index, the ANN index rebuilt over every shard, then the
    manifest that names them, written last: a kill before its rename leaves the index as it was (a
    shard or an ann.faiss it does not name; a resume does this again)."""
    name, n = p.name, p.rows
    total = (old.count if old else 0) + n
    m = old.manifest if old is not None else None
    chunks = Chunking(args.chunk_tokens, int(args.chunk_overlap or 0),
                      args.chunk_sentences) if args.chunk_tokens else None
    manifest = Manifest(
        format=FORMAT, kind=p.kind, block=p.block, chunks=chunks, bundle=bundle,  # type: ignore[arg-type]
        prompts={k: str(pipe.meta.options.get(k, "") or "") for k in ("query_prompt", "document_prompt")},
        prompt_name=args.prompt_name or None, dimensions=args.dimensions or None,
        normalized=bool(pipe.meta.options.get("normalize")) if args.dimensions else None,
        dims=p.dims, count=total, quantization="residual" if p.multi else args.quantization,
        ranges=p.state.ranges, rescore_copy=args.rescore_copy, ann=args.ann,  # type: ignore[arg-type]
        ann_settings=m.ann_settings if m
        else ann_settings(args.ann, total, hnsw_m=args.hnsw_m, ivf_lists=args.ivf_lists),
        shards=(*(m.shards if m else ()), ShardEntry(name, n)),
        deleted=m.deleted if m else None,  # the rows deleted stay deleted; the new shard's are live
    )
    if p.codec:
        search = m.search if m and m.search else SearchSettings(multivector.NPROBE, multivector.CANDIDATES)
        manifest = replace(manifest, bits=p.codec.bits, centroids=len(p.codec.centroids), search=search,
                           tokens=(m.tokens or 0 if m else 0) + p.state.tokens)
    if p.shard.is_dir():  # else a commit killed after this rename left it in the index already
        shutil.rmtree(out / name, ignore_errors=True)  # a killed build's shard that no manifest names
        os.replace(p.shard, out / name)  # named by no manifest yet: harmless if what follows is killed
    # a new multi-vector index's codec, named by no manifest yet either
    if (p.dir / multivector.CODEC).is_file():
        os.replace(p.dir / multivector.CODEC, out / multivector.CODEC)
    # the index's documents of the new ids: deleted in this same manifest
    if args.replacing and old is not None:
        import pyarrow as pa

        ids = set(pa.ipc.open_file(pa.memory_map(str(out / name / "ids.arrow"))).read_all().column(
            0).to_pylist())
        replaced = live_rows(old, ids)
        if replaced:
            mask = np.zeros(total, dtype=np.bool_)
            mask[:old.count] = old.deleted if old.deleted is not None else False
            mask[[r for found in replaced.values() for r in found]] = True
            manifest = with_deleted(out, manifest, mask)
    if args.ann != "flat":
        build_ann(out, manifest)
    return commit(out, manifest)
