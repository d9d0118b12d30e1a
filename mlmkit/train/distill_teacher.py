"""The teacher's side of `mlmkit distill`: a bundle as the teacher, its outputs on the inputs computed
once and cached, augmented copies of the inputs, and the student's held-out agreement with it."""

from __future__ import annotations

import hashlib
import json
import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mlmkit.errors import ConfigError
from mlmkit.files import JSONObject, atomic_write, cache_root
from mlmkit.registry import Example, Feature, Metrics, Plugin, TaskContext, per_token
from mlmkit.rundir.weights import weights_digest
from mlmkit.runtime import prediction
from mlmkit.text.batching import pad_features
from mlmkit.train.finetune import TaskEvaluator, torch_forward

log = logging.getLogger("mlmkit")


class HeldOut:
    """The Trainer's evaluation of a student: its agreement with the teacher on the held-out inputs
    (the teacher's outputs on them computed once), and with --eval the task's metrics on labelled
    data; each evaluation logged in one line. Under torchrun every rank calls it (``spreads``: the
    labelled evaluation spreads its batches over the ranks; the agreement is each rank's own, the same)."""

    spreads = True

    def __init__(self, task: Plugin, held: list[Example], tok: Any, ctx: TaskContext,
                 teach: prediction.Forward, outputs: dict[str, tuple[str, ...]], pad: int,
                 labelled: TaskEvaluator | None) -> None:
        self.outputs, self.labelled, self.evaluations = outputs, labelled, 0
        features = task.featurize(held, tok, ctx, training=False) if held else []
        self.batches = [pad_features(features[i:i + 64], pad) for i in range(0, len(features), 64)]
        self.ref = [teach(b) for b in self.batches]

    def agreement(self, model: nn.Module) -> dict[str, float | None]:
        """``model``'s agreement with the teacher on the held-out inputs (prediction.agreement)."""
        learn = torch_forward(model, self.outputs)
        return prediction.agreement(self.ref, [learn(b) for b in self.batches], self.outputs,
                                    [b["attention_mask"] for b in self.batches])

    def __call__(self, model: nn.Module) -> Metrics:
        was = model.training
        model.eval()
        out: Metrics = {"agreement": float(self.agreement(model)["value"] or 0.0)} if self.batches else {}
        model.train(was)
        if self.labelled is not None:
            out.update(self.labelled(model))
        self.evaluations += 1
        log.info("distill evaluation %d: %s", self.evaluations,
                 ", ".join(f"{k} {v:.4f}" for k, v in out.items() if isinstance(v, float)))
        return out


def augmented(examples: list[Example], table: torch.Tensor, tok: Any, copies: int, seed: int,
              share: float = 0.4, neighbours: int = 15) -> list[Example] | None:
    """``copies`` copies of each example whose ``text`` (and ``text_pair``) is a string, each word that
    is one token of the vocabulary replaced, at random with probability ``share``, by one of its
    ``neighbours`` nearest whole-word tokens by cosine in ``table`` (the teacher's word embeddings:
    TinyBERT replaces words by a masked LM's guesses, or GloVe's neighbours for words a masked LM
    cannot; a fine-tuned teacher has no masked-LM head, its own embeddings stand in for GloVe).
    Other examples (QA's question and context, whose answers are positions) get no copies; None: the
    vocabulary has no whole-word tokens to swap (byte-level BPE)."""
    vocab = tok.get_vocab()
    whole = torch.tensor(sorted(i for w, i in vocab.items()
                                if w.isalpha() and w.islower() and not w.startswith("##")))
    if not len(whole):
        return None
    unit = F.normalize(table.detach().float(), dim=-1)
    near: dict[int, list[int]] = {}
    words = {w.lower() for ex in examples for f in ("text", "text_pair") if isinstance(ex.get(f), str)
             for w in ex[f].split()}
    ids = sorted({vocab[w] for w in words if w in vocab and w.isalpha()})
    for a in range(0, len(ids), 1024):  # neighbours of the corpus's words, a block at a time
        block = torch.tensor(ids[a:a + 1024])
        sims = unit[block] @ unit[whole].T
        sims[sims > 0.9999] = -1.0  # not itself
        for i, row in zip(block.tolist(), sims.topk(min(neighbours, len(whole)), dim=-1).indices.tolist()):
            near[i] = [int(whole[j]) for j in row]
    inverse = {i: w for w, i in vocab.items()}
    rng = random.Random(seed)

    def swap(text: str) -> str:
        out = []
        for w in text.split():
            i = vocab.get(w.lower())
            out.append(inverse[rng.choice(near[i])] if i in near and rng.random() < share else w)
        return " ".join(out)

    return [{**ex, **{f: swap(ex[f]) for f in ("text", "text_pair") if isinstance(ex.get(f), str)}}
            for _ in range(copies) for ex in examples
            if isinstance(ex.get("text"), str) and not any(k in ex for k in ("question", "context"))]


def bundle_teacher(path: Path) -> tuple[prediction.Forward | None, str | None, Path]:
    """(the forward that labels the inputs, the teacher's identity for the cache, the run the student
    starts from): for a bundle, onnxruntime labels and the student starts from the run the bundle was
    exported from (its mlmkit.json's source, checked to hold the same weights); for a run, (None,
    None, the run)."""
    if not (path / "model.onnx").is_file():
        return None, None, path
    from mlmkit.runtime.pipeline import Pipeline

    pipe = Pipeline.load(path)
    if not pipe.plugin.trainable:
        raise ConfigError(f"{path} is a {pipe.task} bundle, a task that is not fine-tuned",
                          "distil a bundle of a fine-tuned task")
    source = pipe.meta.source
    run = Path(str(source.get("path", "")))
    fix = f"give the run {path} was exported from as the teacher, or export it again from the run"
    if not source.get("path") or not (run / "config.json").is_file():
        raise ConfigError(f"{path}: the student starts from the teacher's weights, and the run it was "
                          f"exported from ({source.get('path', 'not recorded')}) is not there", fix)
    if source.get("weights_sha256") and source["weights_sha256"] != weights_digest(run):
        raise ConfigError(f"{path} was exported from other weights than {run} holds now", fix)
    return pipe.run_batch, json.dumps(pipe.identity(), sort_keys=True), run


def teacher_outputs(key: JSONObject, features: list[Feature], forward: prediction.Forward,
                    outputs: dict[str, tuple[str, ...]], pad: int) -> dict[str, list[np.ndarray]]:
    """The teacher's outputs for each feature, computed once: kept under $MLMKIT_CACHE/teacher-outputs,
    keyed by the teacher's weights, the inputs (path and size), the max length, the options and the
    held-out split, so a --resume or another student of the same teacher and data reuses them."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    path = cache_root() / "teacher-outputs" / (digest[:24] + ".npz")
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as z:
                got = {name: np.split(z[name], z[name + ".offsets"][1:-1]) if name + ".offsets" in z.files
                       else list(z[name]) for name in outputs}
            if all(len(v) == len(features) for v in got.values()):
                log.info("the teacher's outputs for these %d features: %s", len(features), path)
                return got
        except (OSError, ValueError, KeyError) as e:  # a damaged or older file is computed again
            log.warning("%s is unreadable (%s): the teacher labels the inputs again", path, e)
    log.info("the teacher labels %d features", len(features))
    got = prediction.run_features(features, forward, outputs, pad_id=pad, batch_size=64)
    # arrays by name (Any: numpy's stubs read np.savez's **arrays as its own keywords)
    arrays: dict[str, Any] = {}
    for name, rows in got.items():
        if per_token(outputs[name]):  # rows of different lengths: concatenated, with their offsets
            arrays[name] = np.concatenate(rows)
            arrays[name + ".offsets"] = np.cumsum([0, *map(len, rows)])
        else:
            arrays[name] = np.stack(rows)
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)

    atomic_write(path, write)
    return got


def held_out_agreement(task: Plugin, held: list[Example], tok: Any, ctx: TaskContext,
                       teach: prediction.Forward, student: nn.Module, outputs: dict[str, tuple[str, ...]],
                       pad: int) -> dict[str, float | None]:
    """The student's agreement with the teacher (its forward: ``teach``) on inputs neither trained on
    (prediction.agreement)."""
    return HeldOut(task, held, tok, ctx, teach, outputs, pad, None).agreement(student)
