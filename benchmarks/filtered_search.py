"""Filtered search (`mlmkit search --where`) at 1M documents, against faiss with an IDSelectorBitmap.

    python benchmarks/filtered_search.py                  # 1,000,000 documents, 384 dims
    python benchmarks/filtered_search.py --documents 100000 --queries 20
    python benchmarks/filtered_search.py --ann hnsw       # and an HNSW index of the same vectors

The documents are random unit vectors (what is measured is the search, not an encoder), written as a
float32 index (`mlmkit/retrieval/index/`'s own files: vectors, ids, a meta.arrow with a ``bucket`` field
of 100 values and a ``half`` boolean), then searched one query at a time, after a quiet CPU:

- mlmkit: search_vectors with the rows of ``--where bucket=7`` (1%: at most 65,536 rows, each scored
  alone from the memory-mapped vectors) and ``--where half=true`` (50%: the flat scan with the other
  half scored -inf), the filter's evaluation (filters.rows) timed apart, and unfiltered;
- faiss: IndexFlatIP over the same vectors in memory, searched with SearchParameters(sel=
  IDSelectorBitmap(the same rows)), and unfiltered.

p50 / p99 latency of each, the ratios, and whether both sides return the same top 10 (exact search
on both: they must).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from common import (
    log,
    print_machine,
    wait_for_quiet,
)
from harness import parser

THREADS = 2


def write_index(out: Path, n: int, dims: int) -> None:
    """A float32 index of ``n`` random unit vectors, with a bucket (row % 100) and a half (row % 2) field."""
    import pyarrow as pa

    if (out / "manifest.json").is_file():
        return
    shard = out / "shard-000000"
    shard.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    with open(shard / "vectors.bin", "wb") as f:
        for a in range(0, n, 65536):
            x = rng.standard_normal((min(65536, n - a), dims), dtype=np.float32)
            f.write((x / np.linalg.norm(x, axis=1, keepdims=True)).tobytes())
    rows = np.arange(n)
    with pa.ipc.new_file(str(shard / "ids.arrow"), pa.schema([("id", pa.string())])) as w:
        w.write_table(pa.table({"id": pa.array([f"d{i}" for i in rows], pa.string())}))
    with pa.ipc.new_file(str(shard / "meta.arrow"),
                         pa.schema([("bucket", pa.float64()), ("half", pa.bool_())])) as w:
        w.write_table(pa.table({"bucket": (rows % 100).astype(np.float64), "half": rows % 2 == 0}))
    manifest = {"format": 1, "kind": "dense", "bundle": {"path": "none", "sha256": "none"}, "prompts": {},
                "dims": dims,
                "count": n, "quantization": "float32", "ranges": None, "rescore_copy": None, "ann": "flat",
                "ann_settings": {},
                "shards": [{"name": shard.name, "count": n}]}
    (out / "manifest.json").write_text(json.dumps(manifest))


def latencies(fn, queries: np.ndarray) -> tuple[list[float], list[np.ndarray]]:
    times, tops = [], []
    for q in queries:
        t0 = time.perf_counter()
        tops.append(fn(q[None]))
        times.append(time.perf_counter() - t0)
    return times, tops


def pct(times: list[float], p: float) -> float:
    return float(np.percentile(times, p) * 1000)


def main() -> None:
    ap = parser(__doc__, work="/tmp/mlmkit-bench-filtered", patience=120.0, before="each query batch")
    ap.add_argument("--documents", type=int, default=1_000_000, help="documents indexed (default 1,000,000)")
    ap.add_argument("--dims", type=int, default=384, help="dimensions of the random vectors (default 384)")
    ap.add_argument("--queries", type=int, default=50, help="queries timed (default 50)")
    ap.add_argument("--ann", choices=("flat", "hnsw"), default="flat",
                    help="hnsw: also an HNSW index of the same "
                    "vectors (built once, kept in --work), mlmkit's filtered search of it against faiss's")
    args = ap.parse_args()
    print_machine(THREADS)
    import faiss

    from mlmkit.retrieval.index import Index, search_vectors
    from mlmkit.retrieval.index.filters import parse, rows

    faiss.omp_set_num_threads(THREADS)
    out = args.work / f"index-{args.documents}-{args.dims}"
    write_index(out, args.documents, args.dims)
    ix = Index.open(out)
    rng = np.random.default_rng(1)
    q = rng.standard_normal((args.queries, args.dims), dtype=np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    flat = faiss.IndexFlatIP(args.dims)
    for _, chunk in ix.chunks():
        flat.add(np.ascontiguousarray(chunk))
    lines: list[str] = []
    exact_tops: dict[str, list[np.ndarray]] = {}
    for name, where in (("1%", "bucket=7"), ("50%", "half=true"), ("none", None)):
        wait_for_quiet(args.patience)
        t0 = time.perf_counter()
        mask = rows(ix, parse([where])) if where else None
        filter_ms = (time.perf_counter() - t0) * 1000
        ours, our_tops = latencies(lambda x, mask=mask: search_vectors(ix, x, 10, where=mask)[0][0], q)
        params = None
        if mask is not None:
            bits = np.packbits(mask, bitorder="little")
            params = faiss.SearchParameters(sel=faiss.IDSelectorBitmap(len(mask), faiss.swig_ptr(bits)))
        theirs, their_tops = latencies(lambda x, params=params: flat.search(x, 10, params=params)[1][0], q)
        same = np.mean([set(a.tolist()) == set(b.tolist()) for a, b in zip(our_tops, their_tops)])
        exact_tops[name] = their_tops
        kept = int(mask.sum()) if mask is not None else ix.count
        lines.append(f"{name:>4} ({kept:,} documents kept; the filter evaluated in {filter_ms:.1f} ms): "
                     f"mlmkit p50 {pct(ours, 50):.1f} ms "
                     f"p99 {pct(ours, 99):.1f} ms; faiss IndexFlatIP + IDSelectorBitmap p50 "
                     f"{pct(theirs, 50):.1f} ms p99 "
                     f"{pct(theirs, 99):.1f} ms "
                     f"(filtered-search-p50-ratio-{name.rstrip('%')}={pct(theirs, 50) / pct(ours, 50):.2f}x "
                     f"faiss/mlmkit); the same top 10: {same:.0%}")
        log(lines[-1])
    if args.ann == "hnsw":
        lines += hnsw(out, ix, q, exact_tops, args.patience)
    print(f"{args.documents:,} documents of {args.dims} dims, one query at a time, {THREADS} threads:")
    print("\n".join(lines), flush=True)


def hnsw(flat_dir: Path, ix, q: np.ndarray, exact: dict[str, list[np.ndarray]], patience: float) -> list[str]:
    """The same vectors with an HNSW index (mlmkit's settings, built by its build_ann): mlmkit's filtered
    search
    (a subset of at most 65,536 rows scored exactly; else the graph with efSearch widened by the fraction
    kept, through IDSelectorBitmap) against faiss's search of the same graph with IDSelectorBitmap at the
    index's efSearch; p50 / p99 and recall@10 against the exact filtered top 10."""
    import faiss

    from mlmkit.retrieval.index import Index, search_vectors
    from mlmkit.retrieval.index.ann import ann_settings, build_ann, load_ann
    from mlmkit.retrieval.index.filters import parse, rows
    from mlmkit.retrieval.index.manifest import read_manifest

    out = flat_dir.with_name(flat_dir.name + "-hnsw")
    if not (out / "manifest.json").is_file():
        out.mkdir(exist_ok=True)
        (out / "shard-000000").unlink(missing_ok=True)
        (out / "shard-000000").symlink_to(flat_dir / "shard-000000")
        m = replace(read_manifest(flat_dir), ann="hnsw",
                    ann_settings=ann_settings("hnsw", ix.count, hnsw_m=32, ivf_lists=None))
        t0 = time.perf_counter()
        build_ann(out, m)
        log(f"HNSW (M 32, efConstruction 80) built in {time.perf_counter() - t0:.0f} s")
        (out / "manifest.json").write_text(json.dumps(m.to_json()))
    hx = Index.open(out)
    graph, ef = load_ann(hx), int(hx.manifest.ann_settings.ef_search or 0)
    lines = []
    for name, where in (("1%", "bucket=7"), ("50%", "half=true"), ("none", None)):
        wait_for_quiet(patience)
        mask = rows(hx, parse([where])) if where else None
        ours, our_tops = latencies(lambda x, mask=mask: search_vectors(hx, x, 10, where=mask)[0][0], q)
        sel = None
        if mask is not None:
            bits = np.packbits(mask, bitorder="little")
            sel = faiss.IDSelectorBitmap(len(mask), faiss.swig_ptr(bits))
        params = (faiss.SearchParametersHNSW(sel=sel, efSearch=ef) if sel is not None
                  else faiss.SearchParametersHNSW(efSearch=ef))
        theirs, their_tops = latencies(lambda x, params=params: graph.search(x, 10, params=params)[1][0], q)

        def recall(tops: list[np.ndarray], name: str = name) -> float:
            return float(np.mean([len(set(a.tolist()) & set(b.tolist())) / 10
                                  for a, b in zip(tops, exact[name])]))

        lines.append(f"HNSW {name:>4}: mlmkit p50 {pct(ours, 50):.1f} ms p99 {pct(ours, 99):.1f} ms "
                     f"recall@10 {recall(our_tops):.3f}; "
                     f"faiss HNSW + IDSelectorBitmap (efSearch {ef}) p50 {pct(theirs, 50):.1f} ms p99 "
                     f"{pct(theirs, 99):.1f} ms "
                     f"recall@10 {recall(their_tops):.3f}")
        log(lines[-1])
    return lines


if __name__ == "__main__":
    main()
