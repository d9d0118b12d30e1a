"""Pretraining data at corpus scale: does the time to the first step and the memory of `mlmkit pretrain`
stay flat as the corpus grows, and how fast is tokenization against Hugging Face datasets?

    python benchmarks/pretrain_data_scale.py           # 50 MB and 1 GB corpora (about 15 minutes, 3 GB of
                                                       # disk)
    python benchmarks/pretrain_data_scale.py --quick   # 5 MB and 50 MB

Corpus: the standard library's docstrings (mlmkit's quickstart corpus, about 3 MB), its documents
repeated in a shuffled order up to the size (a blank line between documents); one tokenizer trained
on it, given to every side.

- tokenize: `mlmkit tokenize CORPUS --tokenizer T --out SHARD` on the smaller corpus, MB/s of text,
  and on the same text split in 4 files with `--workers 1` and `--workers 2` (information: the
  tokenizer already runs on every core);
  against `datasets.load_dataset("text")` + `.map(tokenize, batched=True, num_proc=N)` (N = 1, 2)
  with the same tokenizer (transformers' fast tokenizer on the same tokenizer.json), caches cold;
  the faster datasets run is the reference.
- first step: `mlmkit pretrain --shard SHARD --preset tiny --steps 1 --batch-size 8 --seq-len 128`
  for each corpus, once to prepare (the instance units are computed and cached in the shard), then
  timed: wall time of the whole command (start-up, loading, one step, saving), and its peak RSS.

Every timed run waits for a quiet CPU (up to --patience s) and measures the CPU other processes
took; a run where they used more than 0.15 cores is marked *.

Last lines: ``target pretrain-rss-1gb-vs-50mb: X.XX (goal <= 1.20)``,
``target pretrain-first-step-1gb-vs-50mb: X.XX (goal <= 1.50)`` and
``target tokenize-vs-datasets-map: X.XX (goal >= 1.00)``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
from pathlib import Path
from typing import Any

from common import (
    log,
    mark,
    noisy_note,
    print_machine,
    run_watched,
    target,
)
from harness import parser

HERE = Path(__file__).resolve()

MLMKIT = [sys.executable, "-m", "mlmkit", "-q"]


def make_corpus(path: Path, size: int, docs: list[str]) -> None:
    """Documents in shuffled rounds until ``size`` bytes."""
    if path.exists() and path.stat().st_size >= size:
        return
    rng = random.Random(0)
    written = 0
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        while written < size:
            order = list(range(len(docs)))
            rng.shuffle(order)
            for i in order:
                text = docs[i] + "\n\n"
                f.write(text)
                written += len(text.encode("utf-8"))
                if written >= size:
                    break
    tmp.replace(path)


def split_corpus(src: Path, d: Path, parts: int) -> list[Path]:
    """``src`` in ``parts`` files of about equal size, cut between documents."""
    d.mkdir(exist_ok=True)
    docs = src.read_text(encoding="utf-8").split("\n\n")
    per = -(-len(docs) // parts)
    out = []
    for k in range(parts):
        out.append(d / f"part-{k}.txt")
        out[-1].write_text("\n\n".join(docs[k * per : (k + 1) * per]) + "\n", encoding="utf-8")
    return out


def run(name: str, cmd: list[str], patience: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``cmd`` once: wall seconds, peak RSS (MB, over its processes), other processes' load."""
    res = run_watched(name, cmd, patience, env, every=0.1)
    log(f"{name:44s} {res['seconds']:8.1f} s  peak {res['peak_mb']:7.0f} MB  (other processes busy: "
        f"{res['other']:.2f} cores)")
    return res


def datasets_side(corpus: Path, tokenizer: Path, cache: Path, procs: int) -> None:
    import datasets
    from transformers import PreTrainedTokenizerFast

    datasets.disable_progress_bars()
    tok = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer))
    ds = datasets.load_dataset("text", data_files=str(corpus), split="train", cache_dir=str(cache))
    ds.map(lambda b: tok(b["text"], add_special_tokens=False), batched=True,
           num_proc=procs if procs > 1 else None,
           remove_columns=["text"])


def main() -> None:
    ap = parser(__doc__, work="runs/bench-data", quick="5 MB and 50 MB instead of 50 MB and 1 GB",
                before="each timed run", role=True)
    ap.add_argument("--procs", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    work = a.work
    if a.role == "datasets":
        datasets_side(work / "small.txt", work / "tok" / "tokenizer.json", work / f"hf-cache-{a.procs}",
                      a.procs)
        return
    # both tokenizers use every core (the tokenizers library is multithreaded)
    print_machine(os.cpu_count() or 1)
    small_mb, large_mb = (5, 50) if a.quick else (50, 1000)
    from mlmkit.quickstart.stdlib_corpus import docstring_documents
    from mlmkit.text.tokenizer import save_tokenizer, train_tokenizer

    docs = ["\n".join(d) for d in docstring_documents()]
    if not (work / "tok" / "tokenizer.json").exists():
        save_tokenizer(train_tokenizer((s for d in docs for s in d.split("\n")), vocab_size=8000),
                       work / "tok")
    tok = work / "tok" / "tokenizer.json"
    sizes = {"small": small_mb, "large": large_mb}
    for name, mb in sizes.items():
        make_corpus(work / f"{name}.txt", mb * 1_000_000, docs)
    log(f"corpora: {small_mb} MB and {large_mb} MB of standard-library docstrings ({len(docs)} documents, "
        "repeated)")

    # tokenization: mlmkit vs datasets.map, on the small corpus, cold
    text_mb = (work / "small.txt").stat().st_size / 1e6
    speed: dict[str, tuple[float, str]] = {}
    for procs in (1, 2):
        shutil.rmtree(work / f"hf-cache-{procs}", ignore_errors=True)
        r = run(f"datasets.map num_proc={procs} ({small_mb} MB)",
                [sys.executable, str(HERE), "--role", "datasets", "--procs", str(procs), "--work", str(work)],
                a.patience,
                env={"HF_DATASETS_OFFLINE": "1"})
        speed[f"datasets num_proc={procs}"] = (text_mb / r["seconds"], mark(r["other"]))
    shards: dict[str, Path] = {}
    for name, mb in sizes.items():
        shards[name] = work / f"shard-{name}"
        r = run(f"mlmkit tokenize ({mb} MB)",
                [*MLMKIT, "tokenize", str(work / f"{name}.txt"), "--tokenizer", str(tok),
                                              "--out", str(shards[name])], a.patience)
        speed[f"mlmkit tokenize ({mb} MB)"] = ((work / f"{name}.txt").stat().st_size / 1e6 / r["seconds"],
                                               mark(r["other"]))

    split = split_corpus(work / "small.txt", work / "small-split", 4)
    for w in (1, 2):
        r = run(f"mlmkit tokenize 4 files --workers {w}",
                [*MLMKIT, "tokenize", *map(str, split), "--tokenizer", str(tok),
                                                          "--out", str(work / f"shard-split-{w}"),
                 "--workers", str(w)],
                a.patience)
        speed[f"mlmkit tokenize 4 files, --workers {w}"] = (text_mb / r["seconds"], mark(r["other"]))

    # time to the first step and peak memory, the data prepared
    first: dict[str, dict[str, Any]] = {}
    for name, mb in sizes.items():
        cmd = [*MLMKIT, "pretrain", "--shard", str(shards[name]), "--preset", "tiny", "--steps", "1",
               "--batch-size", "8",
               "--seq-len", "128", "--eval-every", "1000"]
        prep = run(f"pretrain --steps 1, {mb} MB, preparing", [*cmd, "--out", str(work / f"prep-{name}")],
                   a.patience)
        shutil.rmtree(work / f"prep-{name}", ignore_errors=True)
        first[name] = run(f"pretrain --steps 1, {mb} MB, prepared",
                          [*cmd, "--out", str(work / f"run-{name}")], a.patience)
        first[name]["prep"] = prep["seconds"]
        shutil.rmtree(work / f"run-{name}", ignore_errors=True)

    report(speed, first, sizes, text_mb, small_mb)

def report(speed: dict[str, tuple[float, str]], first: dict[str, dict[str, Any]], sizes: dict[str, int],
           text_mb: float, small_mb: int) -> None:
    """The tokenization speeds, the first steps and the target lines."""
    print(f"\ntokenization ({text_mb:.0f} MB of text unless said), MB/s; each a whole command run once (not "
          "alternating), "
          f"every CPU core ({os.cpu_count()}) to both sides: datasets' map batched (1,000 lines a call) in 1 "
          "process or "
          "num_proc processes, the same tokenizer.json without special tokens; mlmkit tokenize with its "
          "default workers:")
    for k, (v, m) in speed.items():
        print(f"  {k:34s} {v:8.2f}{m}")
    print("first training step (`pretrain --shard SHARD --steps 1`, tiny model, batch 8 x 128):")
    for name, mb in sizes.items():
        r = first[name]
        print(f"  {mb:>5} MB corpus: {r['seconds']:6.1f} s prepared ({r['prep']:.1f} s the first time, units "
              "computed), "
              f"peak {r['peak_mb']:.0f} MB{mark(r['other'])}")
    print(noisy_note("run", counted=False))
    ref = max(v for k, (v, _) in speed.items() if k.startswith("datasets"))
    print()
    print(target("pretrain-rss-1gb-vs-50mb", first["large"]["peak_mb"] / first["small"]["peak_mb"], "<=",
                 1.2))
    print(target("pretrain-first-step-1gb-vs-50mb", first["large"]["seconds"] / first["small"]["seconds"],
                 "<=", 1.5))
    print(target("tokenize-vs-datasets-map", speed[f"mlmkit tokenize ({small_mb} MB)"][0] / ref, ">=", 1.0))


if __name__ == "__main__":
    main()
