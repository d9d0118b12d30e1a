"""The multi-vector (colbert) index: its quality against exact MaxSim, its memory and speed at corpus
scale, and PyLate's PLAID index on the same token vectors.

    python benchmarks/colbert_index.py                      # N = 100,000
    python benchmarks/colbert_index.py --quick              # N = 10,000
    python benchmarks/colbert_index.py --parts quality      # or scale, plaid (comma-separated)

- quality: all-MiniLM-L6-v2 trained as a colbert model on the built-in set as a user trains one
  (late_interaction.py's `mlmkit-colbert-defaults` side: the task's defaults with the recipe's data,
  epochs, batch and learning rate), exported; nDCG@10 of `mlmkit evaluate INDEX` at 2 and 1 bits a
  dimension against exact MaxSim over every document (`mlmkit evaluate BUNDLE`), the same 200 test
  queries.
- scale: a tiny random BERT with a 128-dimension projection (corpus_scale.tiny_bert; what is measured
  is the index, not the encoder) over corpus_scale's generated documents: `mlmkit index` of N / 10 and
  N documents, each in its own process after a quiet CPU (docs/s over the whole process, peak RSS,
  bytes a document and a token vector, and `colbert-index-rss-10x`: memory bounded by a window, the
  k-means sample and a block of postings, not by the corpus); `mlmkit search` of 200 queries (peak
  RSS); latency of the search alone, one query at a time (queries embedded once): p50 and p99.
- plaid: the same N documents' token vectors (the tiny bundle's, computed once and written as .npy)
  indexed by PyLate's PLAID index in its own venv (benchmarks/plaid_peer.py, 2 bits): build seconds
  (vectors given; mlmkit's build time includes its encoder, so its encode time alone is printed
  beside it), bytes a token, p50 / p99 of a search; and each side's top-10 overlap with exact MaxSim
  over every document's vectors, on 20 queries.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import (
    log,
    mark,
    print_machine,
    run_watched,
    target,
    thread_env,
)
from corpus_scale import corpus, queries, tiny_bert
from harness import parser, peers_python

HERE = Path(__file__).resolve()
MLMKIT = [sys.executable, "-m", "mlmkit"]
THREADS = 2
PYLATE = ["pylate==1.2.0"]
"""PyLate's venv (harness.peers_python): 1.2.0, the last without fast-plaid, whose wheels pin a CUDA torch
(plaid_peer.py says why)."""


def quality(work: Path, patience: float) -> list[str]:
    """nDCG@10 through the index at 2 and 1 bits against exact MaxSim, on the built-in set."""
    from mlmkit.quickstart.retrieval_set import write_retrieval_set

    data, run, b = work / "set", work / "colbert-run", work / "colbert-bundle"
    if not (data / "corpus.jsonl").is_file():
        write_retrieval_set(data, max_documents=1000)  # late_interaction.py's default --documents
    if not (b / "model.onnx").is_file():
        late = HERE.parent / "late_interaction.py"
        run_watched("train colbert",
                    [sys.executable, str(late), "--role", "mlmkit-colbert-defaults", "--work", str(work),
                     "--out", str(run)], patience, env=thread_env(THREADS))
        run_watched("export", [*MLMKIT, "export", str(run), "--out", str(b)], patience,
                    env=thread_env(THREADS))
    exact = json.loads(subprocess.run([*MLMKIT, "evaluate", str(b), "--data", str(data), "--json"],
                                      check=True,
                                      capture_output=True, text=True).stdout)["ndcg@10"]
    lines = ["built-in set, colbert from all-MiniLM-L6-v2, exact MaxSim over every document: nDCG@10 "
             f"{exact:.4f}"]
    for bits in (2, 1):
        out = work / f"set-index-{bits}"
        shutil.rmtree(out, ignore_errors=True)
        built = json.loads(subprocess.run([*MLMKIT, "index", str(b), "--corpus", str(data / "corpus.jsonl"),
                                           "--out", str(out),
                                           "--bits", str(bits), "--json"], check=True, capture_output=True,
                                          text=True).stdout)
        got = json.loads(subprocess.run([*MLMKIT, "evaluate", str(out), "--data", str(data), "--json"],
                                        check=True,
                                        capture_output=True, text=True).stdout)["ndcg@10"]
        lines.append(f"  through the index, {bits} bits: nDCG@10 {got:.4f} ({got - exact:+.4f}), "
                     f"{built['bytes_per_token_vector']} "
                     f"bytes a token vector, {built['bytes_per_token']} bytes a token with the postings and "
                     "the codec")
        if bits == 2:
            lines.append(target("colbert-index-ndcg-gap", abs(got - exact), "<=", 0.01, ".4f"))
    return lines


def scale(work: Path, n: int, patience: float) -> tuple[list[str], dict]:
    """`mlmkit index` of n / 10 and n documents, `mlmkit search`, and the latency of a search."""
    import numpy as np

    from mlmkit.retrieval.index import Index, footprint, query_vectors, search_vectors

    _, b = tiny_bert(work, "colbert")
    lines, peaks = [], {}
    for size in (n // 10, n):
        docs, out = corpus(work, size), work / f"colbert-{size}"
        shutil.rmtree(out, ignore_errors=True)
        r = run_watched(f"colbert index {size}",
                        [*MLMKIT, "index", str(b), "--corpus", str(docs), "--out", str(out), "--json"],
                        patience, env=thread_env(THREADS))
        peaks[size] = r["peak_mb"]
        m = Index.open(out).manifest
        f = footprint(out, m)
        lines.append(f"mlmkit index (colbert), {size:,} documents ({f['tokens'] / size:.0f} token vectors a "
                     "document, "
                     f"{m['centroids']:,} centroids, 2 bits): {size / r['seconds']:,.0f} docs/s (whole "
                     "process, encoder "
                     f"included), peak RSS {r['peak_mb']:,.0f} MB{mark(r['other'])}; "
                     f"{f['bytes_per_document']:,.0f} bytes a "
                     f"document, {f['bytes_per_token_vector']} bytes a token vector ({f['bytes_per_token']} "
                     "with the postings "
                     "and the codec)")
        log(lines[-1])
    lines.append(target("colbert-index-rss-10x", peaks[n] / peaks[n // 10], "<=", 1.25))
    big = work / f"colbert-{n}"
    qs = queries(work, corpus(work, n))
    r = run_watched("colbert search",
                    [*MLMKIT, "search", str(big), "--input", str(qs), "--top-k", "10", "--json"], patience,
                    env=thread_env(THREADS))
    ix = Index.open(big)
    q = query_vectors(ix, qs.read_text().splitlines())
    for v in q[:3]:
        search_vectors(ix, [v], 10)  # warm the pages
    ms = []
    for v in q:
        t0 = time.perf_counter()
        search_vectors(ix, [v], 10)
        ms.append(1000 * (time.perf_counter() - t0))
    p50, p99 = float(np.percentile(ms, 50)), float(np.percentile(ms, 99))
    lines.append(f"mlmkit search (colbert), {len(q)} queries one at a time, top 10, {n:,} documents: p50 "
                 f"{p50:.1f} ms, "
                 f"p99 {p99:.1f} ms (search alone); `mlmkit search` peak RSS {r['peak_mb']:,.0f} "
                 f"MB{mark(r['other'])}")
    return lines, {"p50": p50, "p99": p99}


def dump_vectors(work: Path, n: int) -> tuple[Path, float]:
    """The tiny bundle's token vectors of the n documents and the queries, as plaid_peer.py reads them
    (written once); and the seconds the documents' encoding took."""
    import numpy as np

    from mlmkit.runtime.pipeline import Pipeline

    out = work / f"vectors-{n}"
    done = out / "encode_seconds.txt"
    if done.is_file():
        return out, float(done.read_text())
    out.mkdir(parents=True, exist_ok=True)
    _, b = tiny_bert(work, "colbert")
    pipe = Pipeline.load(b, threads=THREADS)
    docs = corpus(work, n)
    lengths, t = [], 0.0
    with open(out / "doc_vectors.f32", "wb") as f, open(docs, encoding="utf-8") as src:
        batch: list[str] = []
        for line in [*src, None]:
            if line is not None:
                batch.append(json.loads(line)["text"])
            if batch and (line is None or len(batch) == 1024):
                t0 = time.perf_counter()
                got = [np.asarray(r["vectors"], dtype=np.float32) for r in pipe(batch, input_type="document")]
                t += time.perf_counter() - t0
                lengths += [len(v) for v in got]
                f.write(np.concatenate(got).tobytes())
                batch = []
    np.save(out / "doc_lengths.npy", np.asarray(lengths, dtype=np.int32))
    flat = np.memmap(out / "doc_vectors.f32", dtype=np.float32, mode="r").reshape(-1, 128)
    np.save(out / "doc_vectors.npy", flat)  # plaid_peer.py reads .npy (memory-mapped)
    (out / "doc_vectors.f32").unlink()
    qv = [np.asarray(r["vectors"], dtype=np.float32)
          for r in pipe(queries(work, docs).read_text().splitlines(), input_type="query")]
    np.save(out / "query_lengths.npy", np.asarray([len(v) for v in qv], dtype=np.int32))
    np.save(out / "query_vectors.npy", np.concatenate(qv))
    done.write_text(str(t))
    return out, t


def exact_top10(vectors: Path, count: int) -> list[list[int]]:
    """Exact MaxSim top 10 of the first ``count`` queries over every document's vectors."""
    import numpy as np

    from mlmkit.retrieval.maxsim import maxsim, padded

    lengths = np.load(vectors / "doc_lengths.npy")
    flat = np.load(vectors / "doc_vectors.npy", mmap_mode="r")
    ql, qf = np.load(vectors / "query_lengths.npy"), np.load(vectors / "query_vectors.npy")
    qs = np.split(qf, np.cumsum(ql)[:-1])[:count]
    Q, qm = padded(qs, qf.shape[1])
    starts = np.concatenate([[0], np.cumsum(lengths)])
    scores = []
    for a in range(0, len(lengths), 4096):
        e = min(len(lengths), a + 4096)
        chunk = np.asarray(flat[starts[a]:starts[e]])
        D, dm = padded(np.split(chunk, np.cumsum(lengths[a:e])[:-1]), qf.shape[1])
        scores.append(maxsim(Q, D, qm, dm))
    s = np.concatenate(scores, axis=1)
    return [list(np.argsort(-row, kind="stable")[:10]) for row in s]


def plaid(work: Path, n: int, patience: float, ours: dict, venv: Path | None) -> list[str]:
    """PyLate's PLAID index of the same token vectors, against mlmkit's index of the same documents."""
    import numpy as np

    from mlmkit.retrieval.index import Index, search_vectors

    vectors, encode = dump_vectors(work, n)
    py = peers_python(venv or work / "pylate-venv", PYLATE)
    out = work / f"plaid-{n}"
    shutil.rmtree(out, ignore_errors=True)
    r = run_watched("plaid",
                    [py, str(HERE.parent / "plaid_peer.py"), "--vectors", str(vectors), "--out", str(out),
                     "--k", "10",
                              "--nbits", "2", "--threads", str(THREADS), "--result",
                     str(work / "plaid.json")], patience,
                    env=thread_env(THREADS))
    theirs = json.loads((work / "plaid.json").read_text())
    ix = Index.open(work / f"colbert-{n}")
    ql, qf = np.load(vectors / "query_lengths.npy"), np.load(vectors / "query_vectors.npy")
    qs = np.split(qf, np.cumsum(ql)[:-1])
    count = 20
    want = exact_top10(vectors, count)
    mine = search_vectors(ix, qs[:count], 10)[0]
    overlap = lambda got: float(np.mean([len(set(map(int, g)) & set(map(int, w))) / 10  # noqa: E731
                                         for g, w in zip(got, want)]))
    return [f"PyLate PLAID ({theirs.get('pylate')}, {theirs.get('nbits')} bits), {n:,} documents' vectors "
            "given: built in "
            f"{theirs['build_seconds']:.1f} s (whole process {r['seconds']:.1f} s, peak RSS "
            f"{r['peak_mb']:,.0f} MB{mark(r['other'])}), "
            f"{theirs['bytes_per_token']:.1f} bytes a token, search p50 {theirs['p50_ms']:.1f} ms, p99 "
            f"{theirs['p99_ms']:.1f} ms; "
            f"mlmkit's encoder alone took {encode:.1f} s of its build",
            f"search p99, mlmkit / PyLate: {ours['p99'] / theirs['p99_ms']:.2f}x; p50 "
            f"{ours['p50'] / theirs['p50_ms']:.2f}x",
            f"top-10 overlap with exact MaxSim over every document, {count} queries: mlmkit "
            f"{overlap(mine):.3f}, "
            f"PyLate {overlap(theirs['hits'][:count]):.3f}"]


def main() -> None:
    ap = parser(__doc__, work="/tmp/mlmkit-colbert-index", quick="N = 10,000", whole_doc=True)
    ap.add_argument("--documents", type=int, default=100_000, help="N")
    ap.add_argument("--parts", default="quality,scale,plaid", help="which parts, comma-separated")
    ap.add_argument("--pylate-venv", type=Path, default=None,
                    help="PyLate's venv (default: WORK/pylate-venv, made once)")
    args = ap.parse_args()
    print_machine(THREADS)
    n = 10_000 if args.quick else args.documents
    parts = set(args.parts.split(","))
    if "quality" in parts:
        print("\n".join(quality(args.work, args.patience * 5)), flush=True)
    ours: dict = {}
    if "scale" in parts or "plaid" in parts:
        got, ours = scale(args.work, n, args.patience * 5)
        print("\n".join(got), flush=True)
    if "plaid" in parts:
        print("\n".join(plaid(args.work, n, args.patience * 5, ours, args.pylate_venv)), flush=True)


if __name__ == "__main__":
    main()
