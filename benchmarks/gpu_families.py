"""The GPU check of the model families: run it once whenever a CUDA machine is at hand.

    python benchmarks/gpu_families.py --work /tmp/gpu_fam

For RoBERTa and ModernBERT, a MiniLM-sized classifier (L6/H384, random weights, a tokenizer of the
family's kind) saved by transformers:
1. one fine-tuning step in bf16 autocast on CUDA (`mlmkit finetune --device cuda --bf16 --steps 1`),
   the loss and the step time printed;
2. export fp32 and fp16 bundles; run each through onnxruntime's CUDA execution provider on 1,024
   mixed-length sentences, batch 32 (sentences/s), and print the fp16 graph's top-1 agreement and max
   difference against fp32 (the export measures them on the CUDA provider).
It needs torch with CUDA, onnxruntime-gpu and transformers; without a GPU every step says what it
fell back to, and the figures are the CPU's (not what this script is for). Each timed pass first
waits (up to --patience seconds) for other processes to leave the CPUs alone (they tokenize and
feed the GPU); a pass during which they used more than 0.15 cores is marked *.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

from common import (
    MINILM,
    busy_seconds,
    mark,
    noisy_note,
    other_cores,
    wait_for_quiet,
)
from harness import parser

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the family fixtures of the tests

WORDS = ("the a film movie plot story was is good great fine bad dull poor very not and john paris went "
         "to").split()


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40))) for _ in range(n)]


def main() -> None:
    ap = parser(__doc__, work="/tmp/gpu_families", patience=60.0, before="each timed pass", whole_doc=True)
    ap.add_argument("--families", default="roberta,modernbert",
                    help="comma-separated (default roberta,modernbert)")
    a = ap.parse_args()
    import onnxruntime as ort
    import torch
    from conftest import run_export, run_finetune
    from test_families import FAMILIES, save_checkpoint

    from mlmkit.runtime.pipeline import Pipeline

    print(f"torch {torch.__version__}, cuda available: {torch.cuda.is_available()}"
          f"{' (' + torch.cuda.get_device_name(0) + ')' if torch.cuda.is_available() else ''}; "
          f"onnxruntime providers: {ort.get_available_providers()}")
    texts = sentences(1024)
    for fam in a.families.split(","):
        d = a.work / fam
        FAMILIES[fam][2].update(MINILM, max_position_embeddings=514 if "roberta" in fam else 512)
        save_checkpoint(d / "src", fam, "ForSequenceClassification", perturb=False,
                        id2label={0: "neg", 1: "pos"})
        train = d / "train.jsonl"
        train.write_text("".join(json.dumps({"text": t, "label": "pos" if "good" in t else "neg"}) + "\n"
                                 for t in texts[:256]))
        t0 = time.perf_counter()
        m = run_finetune("classification", d / "src", train, d / "run", steps=1, batch_size=32, device="cuda",
                         bf16=True,
                         progress=False)
        print(f"{fam}: one bf16 fine-tuning step on cuda: loss "
              f"{m.get('loss', m.get('last_step_metrics', {}).get('loss'))}, "
              f"{time.perf_counter() - t0:.1f} s with the run's setup")
        for precision, kw in (("fp32", {}), ("fp16", {"fp16": True})):
            meta = run_export(d / "run", d / f"bundle-{precision}", **kw)
            pipe = Pipeline.load(d / f"bundle-{precision}", device="cuda", batch_size=32)
            pipe(texts[:64])  # warm-up
            wait_for_quiet(a.patience)
            busy, cpu, t0 = busy_seconds(), time.process_time(), time.perf_counter()
            pipe(texts)
            dt = time.perf_counter() - t0
            other = other_cores(busy, time.process_time() - cpu, dt)
            extra = {k: v for k, v in meta["parity"].items() if k.startswith("fp16")}
            print(f"{fam} {precision}: {len(texts) / dt:.1f} sentences/s{mark(other)} on {pipe.providers[0]} "
                  "(one pass after a "
                  f"warm-up, batch 32 on mlmkit's cuts, max length {meta.get('max_length', 512)}); "
                  f"fused {meta['fused_operators']}{'; ' + json.dumps(extra) if extra else ''}")
    print(noisy_note(counted=False))


if __name__ == "__main__":
    main()
