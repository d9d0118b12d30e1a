"""`mlmkit index` and `mlmkit search`: an on-disk index built, changed (--append, --delete, --upsert,
--compact) and searched, each through the ``Index`` object (retrieval/index/api.py) that Python
users call. No torch: the runtime only.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer
from rich.table import Table

from mlmkit.args import SearchArgs
from mlmkit.cli.common import Json, err, handle_errors, out, print_json, want_json, with_args
from mlmkit.errors import ConfigError
from mlmkit.files import JSONObject
from mlmkit.retrieval.index import BuildArgs, Index

app = typer.Typer()


@app.command("index")
@handle_errors
@with_args(BuildArgs)
def index_cmd(args: BuildArgs, as_json: Json = False) -> None:
    """Embed a corpus into an on-disk index that `mlmkit search` reads: vectors memory-mapped (a SPLADE
    bundle's inverted index, a colbert bundle's token vectors as centroids and residuals), ids beside them,
    a manifest. --out: the index directory to write."""
    if args.delete is not None or args.compact:
        return _change_index(args, as_json)
    t0, done = time.perf_counter(), [0]
    corpus = args.upsert or args.corpus
    with err.status(f"indexing {corpus} ...") as status:
        def advance(n: int) -> None:
            done[0] += n
            rate = done[0] / (time.perf_counter() - t0)
            status.update(f"indexing {corpus}: {done[0]:,} documents, {rate:,.0f} docs/s")

        if args.upsert is not None:
            ix = Index.open(args.bundle)
            ix.upsert(args.upsert, progress=advance, **args.settings())
        elif args.corpus is not None and args.out is not None:  # BuildArgs: given unless the index is changed
            # a new index, --append or --resume: as the flags say (building.build checks them)
            ix = Index.build(args.bundle, args.corpus, args.out, progress=advance, **args.settings())
        else:
            raise ConfigError(f"mlmkit index {args.bundle} needs --corpus DOCS and --out INDEX")
    m, stats = ix.manifest, ix.stats()
    summary = {"index": str(ix.path), "count": m.count, "dims": m.dims, "quantization": m.quantization,
               "ann": m.ann, "added": m.shards[-1].count, "deleted": stats.deleted,
               "seconds": round(time.perf_counter() - t0, 2), **stats.disk}
    if want_json(as_json):
        print_json(summary)
        return
    how = (f"{m.centroids or 0:,} centroids, {m.bits}-bit residuals, {summary['bytes_per_token_vector']} "
           "bytes a token vector" if m.kind == "multivector" else f"{m.quantization}, --ann {m.ann}")
    gone = f", {stats.deleted:,} of them deleted" if stats.deleted else ""
    out.print(f"{summary['added']:,} documents added to {ix.path} ({m.count:,} in all{gone}, {m.dims} dims, "
              f"{how}) in {summary['seconds']} s; {stats.disk['bytes'] / 2**20:,.1f} MiB, "
              f"{summary['bytes_per_document']:,} bytes a document")


def _change_index(args: BuildArgs, as_json: bool) -> None:
    """`mlmkit index INDEX --delete IDS` or `--compact`: the index changed, what it holds printed."""
    ix = Index.open(args.bundle)
    before = ix.stats().disk["bytes"]
    if args.delete is not None:
        ix.delete(Path(args.delete))
    else:
        ix.compact()
    stats = ix.stats()
    freed_bytes = before - stats.disk["bytes"]
    summary = {"index": str(ix.path), "count": stats.count, "deleted": stats.deleted, "live": stats.live,
               "freed_bytes": freed_bytes, **stats.disk}
    if want_json(as_json):
        print_json(summary)
        return
    what = (f"{stats.deleted:,} of its {stats.count:,} documents deleted" if stats.deleted
            else f"{stats.count:,} documents, none deleted")
    freed = f"; {freed_bytes / 2**20:,.1f} MiB freed" if args.compact else ""
    out.print(f"{ix.path}: {what}, {stats.live:,} searched{freed} ({stats.disk['bytes'] / 2**20:,.1f} MiB)")


@app.command("search")
@handle_errors
@with_args(SearchArgs)
def search_cmd(args: SearchArgs, as_json: Json = False) -> None:
    """The top-k documents of each query in an index, best first: JSON lines {"query", "hits": [{"id",
    "score"}]} or a table."""
    from mlmkit.files import json_line
    from mlmkit.retrieval.index.filters import parse, rows
    from mlmkit.retrieval.index.search import chunk_aggregation
    from mlmkit.text.records import iter_inputs

    ix = Index.open(args.index)
    if args.export is not None:
        from mlmkit.retrieval.index import export_parquet

        n = export_parquet(ix, args.export)
        err.print(f"wrote {n:,} ids and vectors to {args.export}")
        return
    texts = list(args.queries or []) + ([r.line_text(args.text_column) for r in iter_inputs(args.input_file)]
                                        if args.input_file is not None else [])
    if not texts:
        raise ConfigError("no queries", "give them as arguments or with --input FILE")
    top_k = min(10, ix.count) if args.top_k is None else args.top_k
    if top_k < 1 or top_k > ix.count:
        raise ConfigError(f"--top-k {top_k}: give 1 to the index's {ix.count:,} documents")
    if args.rescore is not None and args.rescore < top_k:  # said before any query is embedded
        raise ConfigError(f"--rescore {args.rescore} is below --top-k {top_k}",
                          "rescore at least as many candidates as are kept")
    where = rows(ix, parse(args.where))  # said before any query is embedded
    chunk_aggregation(args.chunk_agg, ix)
    if args.hybrid:
        from mlmkit.retrieval.index.hybrid import hybrid_search

        search = hybrid_search(args, where)
    else:
        def search(part: list[str], k: int) -> list[list[JSONObject]]:
            return ix.search(part, k, where=where, rescore=args.rescore, chunk_agg=args.chunk_agg,
                             bundle=args.bundle, prompt_name=args.prompt_name, precision=args.precision)
    table = Table("query", "rank", "id", "score") if not want_json(as_json) else None
    for a in range(0, len(texts), args.batch):
        part = texts[a:a + args.batch]
        for text, found in zip(part, search(part, top_k)):
            if table is None:
                sys.stdout.write(json_line({"query": text, "hits": found}))
            else:
                for k, h in enumerate(found, 1):
                    table.add_row(text if k == 1 else "", str(k), h["id"], f"{h['score']:.4f}")
    if table is not None:
        out.print(table)
