"""Devices and memory (mlmkit/train/devices.py): the freed memory a CPU run keeps."""

from __future__ import annotations

import pytest

_STEP_FAULTS = """
import json, os, resource, torch
from mlmkit.models.config import ModelConfig
from mlmkit.models.core import BertForLabels
from mlmkit.train.devices import keep_freed_memory

cfg = ModelConfig.from_dict({"vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 1,
                             "num_attention_heads": 4, "intermediate_size": 128,
                             "max_position_embeddings": 512, "model_type": "bert",
                             "id2label": {0: "a", 1: "b"}})
m = BertForLabels(cfg, per_token=False).train()
ids = torch.randint(5, 100, (16, 384))  # attention's (16, 4, 384, 384) blocks: 38 MB, over glibc's 32 MB


def later_step_faults():
    faults = []
    for _ in range(4):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        labels = torch.zeros(16, dtype=torch.long)
        m(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)["loss"].backward()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return min(faults[1:])  # a step after the first: what every later step of a run costs


# glibc's defaults first, as nothing asked to keep; then asking with MLMKIT_KEEP_FREED_MEMORY=0 (nothing
# may change); keeping last, as it applies to the whole process from then on
got = {"default": [False, later_step_faults()]}
os.environ["MLMKIT_KEEP_FREED_MEMORY"] = "0"
got["opted-out"] = [keep_freed_memory(), later_step_faults()]
os.environ["MLMKIT_KEEP_FREED_MEMORY"] = "1"
got["kept"] = [keep_freed_memory(), later_step_faults()]
print(json.dumps(got))
"""


@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc", reason="glibc's allocator")
def test_kept_freed_memory_spares_every_later_step_its_page_faults() -> None:
    """What the Trainer sets on the CPU (keep_freed_memory): a training step whose attention blocks
    are over 32 MB reuses the previous step's memory (next to no page faults); glibc's default maps
    and zeroes those blocks afresh each step (tens of thousands of faults), and so does a process
    that opted out with MLMKIT_KEEP_FREED_MEMORY=0 though it asked to keep. One process measures the
    three in turn (a process each cost two more torch imports)."""
    import json
    import os
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _STEP_FAULTS], capture_output=True, text=True, check=True,
                       env={**os.environ, "MLMKIT_KEEP_FREED_MEMORY": "1"})
    modes = json.loads(r.stdout)
    assert {mode: kept for mode, (kept, _) in modes.items()} == {"default": False, "opted-out": False,
                                                                 "kept": True}, modes
    got = {mode: faults for mode, (_, faults) in modes.items()}
    assert got["default"] > 20_000, got  # 4 KB pages of the blocks freed and re-allocated
    assert got["opted-out"] > 20_000, got
    assert got["kept"] < got["default"] / 10, got  # ~0 on a quiet machine; a few thousand seen under load
