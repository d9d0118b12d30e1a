"""The arguments of `mlmkit distill`: a smaller student trained on a teacher's outputs (see mlmkit.args)."""


from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlmkit.args.base import Args, Output, Runtime, Training, _check, arg
from mlmkit.args.training import TrainArgs

DISTILL_LR = 1e-4
"""distill's --lr default (with --static and --train the table's own, mlmkit.train.static.STATIC_LR)."""
DISTILL_HIDDEN, DISTILL_RELATIONS = 0.0, 0.0
"""distill's intermediate-loss weights by default (docs/make-it-fast.md measures each)."""
DISTILL_AUGMENT_BELOW = 10000
"""distill's --augment by default: one copy of each training text when there are fewer than this many, else
none (docs/make-it-fast.md: a copy gained 2 points of accuracy at 1,800 texts; at 18,000 the student was
within half a point of its teacher without any)."""


@dataclass
class DistillArgs(Args):
    """`mlmkit distill`: a student with fewer layers, trained on a fine-tuned teacher's outputs."""

    teacher: Path = arg(help="A fine-tuned run directory (any task but sparse-embedding); with --static, an "
                             "embedding "
                             "run, sentence-transformers directory or embedding bundle.", positional=True)
    out: Path = Output.out()
    train_file: Path | None = Training.train_file(None)
    layers: int | None = arg(None, "The student's layers, 1 to the teacher's (not with --static).")
    layer_map: str | None = arg(None,
                                "Which teacher layer starts each student layer, e.g. 0,2,4 (increasing, "
                                "distinct); default: every L/K-th from the first.")
    eval_file: Path | None = Training.eval_file()
    static: bool = arg(False, "Make a static-embedding bundle instead: a vector per token from the teacher, "
                              "PCA, SIF "
                              "weighting; a text's embedding is the mean of its tokens' (no transformer "
                              "runs).")
    dims: int | None = arg(None, "With --static: the vectors' dimensions (PCA), 1 to the teacher's; default "
                                 "256 or the "
                                 "teacher's, the smaller.")
    temperature: float = arg(2.0, "Softmax temperature of the distillation loss on logits (squared, it "
                                  "scales the loss).")
    hidden_weight: float | None = arg(None, "Weight of the hidden-state loss: each student layer's output "
                                            "against its "
                                            "teacher layer's (MSE; TinyBERT's uniform map). 0: off. "
                                            f"Default: {DISTILL_HIDDEN}.")
    relation_weight: float | None = arg(None, "Weight of MiniLMv2's self-attention relation loss "
                                              "(query-query, key-key, "
                                              "value-value of the last layers; KL). 0: off. Default: "
                                              f"{DISTILL_RELATIONS}.")
    augment: int | None = arg(None, "Copies of each training text with some of its words replaced by their "
                                    "neighbours in "
                                    "the teacher's word embeddings (TinyBERT's augmentation), labelled by "
                                    "the teacher "
                                    f"too. 0: none. Default: 1 below {DISTILL_AUGMENT_BELOW:,} training "
                                    "texts, else 0.")
    held_out: float = arg(0.1, "Share of the inputs kept out of training, on which the student's agreement "
                               "with the "
                               "teacher is measured (0: none).")
    batch_size: int = Runtime.batch_size()
    max_length: int | None = Training.max_length()
    options: Mapping[str, Any] = arg(factory=dict, help="Task options by name (see `mlmkit tasks`).",
                                     cli=False)
    train: TrainArgs = arg(factory=lambda: TrainArgs(epochs=3.0, lr=DISTILL_LR, warmup_ratio=0.1,
                                                     keep_last=1))

    def __post_init__(self) -> None:
        if self.static:
            _check(self.layers is None and self.layer_map is None,
                   "--layers and --layer-map make a transformer student, "
                   "--static a table", "drop --layers and --layer-map, or --static")
            _check(self.eval_file is None, "--eval scores a transformer student; a static table is scored by "
                   "`mlmkit evaluate BUNDLE --data D`", "drop --eval")
        else:
            _check(self.layers is not None, "distill needs --layers (the student's), or --static",
                   "e.g. --layers 3")
            _check(self.train_file is not None, "distill needs --train (what the teacher labels)",
                   "give a file of texts or the task's data: --train DATA")
            _check(self.dims is None, "--dims is a static table's size", "add --static, or drop --dims")
        _check(self.layers is None or self.layers >= 1, f"--layers must be at least 1, got {self.layers}")
        _check(self.train.early_stopping is None or self.eval_file is not None or self.held_out > 0,
               "--early-stopping needs held-out inputs or --eval (it stops on the held-out agreement)",
               "keep --held-out above 0, or add --eval FILE")
        for name in ("hidden_weight", "relation_weight"):
            w = getattr(self, name)
            _check(w is None or (math.isfinite(w) and w >= 0),
                   f"--{name.replace('_', '-')} must be 0 or more, got {w}")
        _check(self.augment is None or self.augment >= 0, f"--augment must be 0 or more, got {self.augment}")
        _check(not self.static or (self.hidden_weight, self.relation_weight, self.augment)
               == (None, None, None),
               "--hidden-weight, --relation-weight and --augment train a transformer student, not a static "
               "table",
               "drop them, or --static")
        _check(self.dims is None or self.dims >= 1, f"--dims must be at least 1, got {self.dims}")
        _check(math.isfinite(self.temperature) and self.temperature > 0,
               f"--temperature must be a positive number, got {self.temperature}")
        _check(0 <= self.held_out < 1,
               f"--held-out must be from 0 up to (not including) 1, got {self.held_out}")
        _check(self.batch_size >= 1, f"--batch-size must be at least 1, got {self.batch_size}")
        _check(self.max_length is None or self.max_length >= 8,
               f"--max-length {self.max_length} is too short", "use at least 8")
