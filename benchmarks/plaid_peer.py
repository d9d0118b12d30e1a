"""PyLate's PLAID index as a late-interaction peer: build it over given token vectors, time the build
and each query's search, and print one JSON line.

Run by the python of its own venv, never mlmkit's: this script imports neither mlmkit nor common.py.

    PINS = ["pylate==1.2.0", "torch==2.13.0"]   # for harness.peers_python(venv, PINS)

Why PyLate 1.2.0: every PyLate from 1.3.0 on needs fast-plaid, each of whose wheels pins one torch
release exactly (its version's suffix: fast-plaid 1.4.6.2110 needs torch==2.11.0; there are builds for
torch 2.6.0 to 2.11.0, none for 2.13.0), and PyPI's torch for those is the CUDA build with its nvidia-*
wheels; fast-plaid built for 2.11 segfaults under torch 2.13. PyLate 1.2.0 is the last release without
fast-plaid: its PLAID is the Stanford NLP ColBERT engine in PyLate's copy, whose C++ kernels torch
compiles on first use (g++ and ninja, about 3 minutes on 2 cores), cached in $TORCH_EXTENSIONS_DIR,
by default the venv's folder torch_extensions.

Usage:

    python plaid_peer.py --vectors DIR --out DIR [--k 10] [--nbits 2] [--threads 2] [--result FILE]

DIR (--vectors) holds doc_lengths.npy (int32, one token count per document), doc_vectors.npy
(float32, all documents' token vectors concatenated, unit length, shape (tokens, dim)), and
query_lengths.npy, query_vectors.npy the same for the queries. --out is where the index is written
(its folder "plaid" is made anew). Documents get the ids "0".."n-1"; each hit is the document's
index. Progress goes to stderr; stdout gets only the JSON line:

    {"build_seconds", "index_bytes", "bytes_per_token", "tokens", "documents", "queries", "dim",
     "p50_ms", "p99_ms", "hits": [[doc index, ...], ...], "nbits", "centroids", "pylate", "torch", ...}

build_seconds is add_documents() alone (k-means, compression, the inverted lists, loading the
searcher), after torch has compiled (or loaded) PLAID's C++ kernels, which extensions_seconds times.
index_bytes counts every file under the index's folder, PyLate's two SQLite id maps included
(id_map_bytes of them); files gives each file's bytes. Each query is searched alone through
pylate.retrieve.ColBERT(index).retrieve(k), after 3 untimed warm-up queries (the first queries).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from harness import parser


def parse() -> argparse.Namespace:
    ap = parser(__doc__, patience=None)
    ap.add_argument("--vectors", type=Path, required=True,
                    help="folder of doc_/query_ lengths and vectors .npy")
    ap.add_argument("--out", type=Path, required=True, help="folder the index is written under")
    ap.add_argument("--k", type=int, default=10, help="documents returned per query")
    ap.add_argument("--nbits", type=int, default=2, help="residual bits per dimension (1, 2 or 4)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch/OpenMP threads (default: $OMP_NUM_THREADS, else 2)")
    ap.add_argument("--kmeans-niters", type=int, default=4, help="k-means iterations (PyLate's default 4)")
    ap.add_argument("--ndocs", type=int, default=8192, help="PLAID candidate documents (PyLate's default)")
    ap.add_argument("--ncells", type=int, default=8,
                    help="centroids probed per query token (PyLate's default)")
    ap.add_argument("--centroid-score-threshold", type=float, default=0.35,
                    help="centroid pruning threshold (PyLate's default)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed queries before the timed ones")
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--result", type=Path, default=None, help="also write the JSON line to this file")
    return ap.parse_args()


def folder_bytes(path: Path) -> tuple[int, dict[str, int]]:
    """All files' bytes under ``path``, and each file's."""
    files = {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()}
    return sum(files.values()), files


def redirect(args: argparse.Namespace) -> tuple[object, int]:
    """Threads set before torch is imported; stdout kept for the answer alone (the Stanford code and
    ninja print to it: fd 1 goes to stderr). Returns (the answer's file, threads)."""
    threads = args.threads or int(os.environ.get("OMP_NUM_THREADS") or 2)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MAX_JOBS"):
        os.environ[var] = str(threads)  # MAX_JOBS: ninja's compile jobs
    # The compiled kernels live in the venv, so that a venv made anew (other pins, another torch) builds anew.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return answer, threads


def load_kernels() -> float:
    """PLAID's C++ kernels, compiled by torch on the first run (then cached), loaded on later ones:
    the seconds it took."""
    t = time.perf_counter()
    from pylate.indexes.stanford_nlp.indexing.codecs.residual import ResidualCodec
    from pylate.indexes.stanford_nlp.modeling import colbert as stanford_colbert
    from pylate.indexes.stanford_nlp.search.index_storage import IndexScorer
    from pylate.indexes.stanford_nlp.search.strided_tensor import StridedTensor

    ResidualCodec.try_load_torch_extensions(False)
    IndexScorer.try_load_torch_extensions(False)
    StridedTensor.try_load_torch_extensions(False)
    if stanford_colbert._segmented_maxsim is None:
        stanford_colbert._segmented_maxsim = stanford_colbert.try_load_torch_extensions(False)
    return time.perf_counter() - t


def load_vectors(folder: Path) -> tuple[list, list, int, int]:
    """(documents' token vectors, queries', dim, tokens) from the .npy files."""
    import numpy as np

    doc_lengths = np.load(folder / "doc_lengths.npy").astype(np.int64)
    doc_vectors = np.load(folder / "doc_vectors.npy").astype(np.float32, copy=False)
    query_lengths = np.load(folder / "query_lengths.npy").astype(np.int64)
    query_vectors = np.load(folder / "query_vectors.npy").astype(np.float32, copy=False)
    assert doc_lengths.sum() == len(doc_vectors) and query_lengths.sum() == len(query_vectors)
    return (np.split(doc_vectors, np.cumsum(doc_lengths)[:-1]),
            np.split(query_vectors, np.cumsum(query_lengths)[:-1]),
            int(doc_vectors.shape[1]), int(doc_lengths.sum()))


def build(args: argparse.Namespace, documents: list, dim: int) -> tuple[object, Path, float]:
    """The PLAID index of ``documents`` under OUT/plaid: (the index, its folder, add_documents' seconds)."""
    from pylate import indexes

    root = args.out / "plaid"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    index = indexes.PLAID(
        index_folder=str(root), index_name="index", override=True, embedding_size=dim, nbits=args.nbits,
        kmeans_niters=args.kmeans_niters, ndocs=args.ndocs, ncells=args.ncells,
        centroid_score_threshold=args.centroid_score_threshold,
    )
    t = time.perf_counter()
    index.add_documents(documents_ids=[str(i) for i in range(len(documents))], documents_embeddings=documents)
    return index, root, time.perf_counter() - t


def search(args: argparse.Namespace, index: object, queries: list) -> tuple[list[float], list[list[int]]]:
    """Each query searched alone after the warm-up ones: (milliseconds, hits) per query."""
    from pylate import retrieve

    retriever = retrieve.ColBERT(index=index)
    for q in (queries * args.warmup)[: args.warmup]:
        retriever.retrieve(queries_embeddings=[q], k=args.k)
    times, hits = [], []
    for q in queries:
        t = time.perf_counter()
        result = retriever.retrieve(queries_embeddings=[q], k=args.k)
        times.append((time.perf_counter() - t) * 1000)
        hits.append([int(r["id"]) for r in result[0]])
    return times, hits


def main() -> None:
    args = parse()
    answer, threads = redirect(args)

    import random

    import numpy as np
    import torch

    torch.set_num_threads(threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    import pylate

    documents, queries, dim, tokens = load_vectors(args.vectors)
    extensions_seconds = load_kernels()
    index, root, build_seconds = build(args, documents, dim)
    index_bytes, files = folder_bytes(root)
    id_map_bytes = sum(n for name, n in files.items() if name.endswith(".sqlite"))
    metadata = next(iter(root.rglob("metadata.json")), None)
    centroids = json.loads(metadata.read_text()).get("num_partitions") if metadata else None
    times, hits = search(args, index, queries)
    report = {
        "build_seconds": round(build_seconds, 3),
        "index_bytes": index_bytes,
        "bytes_per_token": round(index_bytes / tokens, 3),
        "tokens": tokens,
        "documents": len(documents),
        "queries": len(queries),
        "dim": int(dim),
        "p50_ms": round(float(np.percentile(times, 50)), 3),
        "p99_ms": round(float(np.percentile(times, 99)), 3),
        "hits": hits,
        "k": args.k,
        "nbits": args.nbits,
        "centroids": centroids,
        "kmeans_niters": args.kmeans_niters,
        "ndocs": args.ndocs,
        "ncells": args.ncells,
        "centroid_score_threshold": args.centroid_score_threshold,
        "id_map_bytes": id_map_bytes,
        "files": files,
        "extensions_seconds": round(extensions_seconds, 3),
        "threads": threads,
        "engine": "pylate.indexes.PLAID (Stanford NLP ColBERT PLAID, CPU)",
        "pylate": pylate.__version__,
        "torch": torch.__version__,
    }
    answer.write(json.dumps(report) + "\n")
    answer.flush()
    if args.result is not None:
        args.result.write_text(json.dumps(report) + "\n")


if __name__ == "__main__":
    main()
