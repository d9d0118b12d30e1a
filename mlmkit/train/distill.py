"""`mlmkit distill`: a smaller student of a fine-tuned run, trained to give the teacher's outputs.

The student is an ordinary run of the teacher's task and family, with K of its layers: it starts from
the teacher's embeddings, its head and the K layers of the layer map (DistilBERT's recipe: every
L/K-th layer from the first by default), so training starts near the teacher, not from scratch. The
teacher labels the training inputs once (a torch forward over them, before training, kept in the cache:
teacher_outputs); the inputs may be the task's own data, labelled or not, or plain texts: the gold
labels are not used.

The loss, per output the task declares (the default of every task; a task may not need more):

    label outputs (batch, label) or (batch, sequence, label), more than one label
                      KL(teacher || student) of the softmaxes at temperature T, times T^2 (Hinton et
                      al. 2015), per token at the real tokens for tagging
    position scores (batch, sequence), QA's start / end logits
                      the same over the real positions of each row
    anything else     (a vector, one score: embeddings, a reranker's relevance) mean squared error

and, each weighted and off by default (measured in docs/make-it-fast.md), the intermediate states with
the teacher run beside the student: each student layer's output against its teacher layer's (TinyBERT's
uniform map, MSE; --hidden-weight) and MiniLMv2's self-attention relations of the last layers (KL;
--relation-weight). --augment adds copies of the texts with words swapped for the teacher's embedding
neighbours (one copy by default below DISTILL_AUGMENT_BELOW texts). The student kept is the one with
the best held-out agreement over the evaluations (each epoch).

The student's agreement with the teacher on the held-out inputs (top-1 for outputs that choose,
mean cosine for vectors: infer.prediction.agreement) goes into its mlmkit.json ("distill"), with the
teacher, the layer map, the loss and the temperature.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import random
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mlmkit.args import DISTILL_AUGMENT_BELOW, DISTILL_HIDDEN, DISTILL_RELATIONS, DistillArgs
from mlmkit.errors import ConfigError, MlmkitError
from mlmkit.files import JSONObject, atomic_write, atomic_write_text, cache_root, exclusive
from mlmkit.models.blocks import Attention
from mlmkit.registry import LABEL, SEQUENCE, Example, Feature, Metrics, Plugin, TaskContext, per_token
from mlmkit.rundir.checkpoint import load_weights, save_run
from mlmkit.rundir.meta import RunMeta, read_meta, write_meta
from mlmkit.rundir.weights import weights_digest
from mlmkit.runtime import prediction
from mlmkit.text.batching import pad_features
from mlmkit.text.records import iter_inputs
from mlmkit.text.tokenizer import special_ids
from mlmkit.train.data import FeatureData
from mlmkit.train.finetune import TaskEvaluator, base_model_dir, data_identity, load_finetuned, torch_forward
from mlmkit.train.loop import Trainer
from mlmkit.train.tracking import flat_params, parse_report_to

log = logging.getLogger("mlmkit")

TARGET = "teacher_"  # feature keys of the teacher's outputs: TARGET + output name


def layer_map(teacher_layers: int, k: int, spec: str | None = None) -> list[int]:
    """The teacher layer each of the student's ``k`` layers starts from: ``spec`` ("0,2,4"), else
    every L/K-th from the first (6 -> 3: 0, 2, 4)."""
    if not 1 <= k <= teacher_layers:
        raise ConfigError(f"--layers {k}: the student has 1 to the teacher's {teacher_layers} layers",
                          f"give --layers 1 to {teacher_layers}")
    if spec is None:
        return [i * teacher_layers // k for i in range(k)]
    try:
        got = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--layer-map {spec!r} is not a list of layer numbers", "e.g. --layer-map 0,2,4") from None
    if len(got) != k:
        raise ConfigError(f"--layer-map {spec!r} names {len(got)} layers, --layers is {k}", "name one teacher layer per student layer")
    if any(not 0 <= x < teacher_layers for x in got):
        raise ConfigError(f"--layer-map {spec!r}: the teacher's layers are 0 to {teacher_layers - 1}")
    if got != sorted(set(got)):
        raise ConfigError(f"--layer-map {spec!r}: each teacher layer once, in increasing order", "e.g. --layer-map 0,2,4")
    return got


def student_weights(teacher: dict[str, torch.Tensor], mapping: list[int]) -> dict[str, torch.Tensor]:
    """The teacher's weights with its layers ``mapping[i]`` as the student's layers ``i`` (the other
    layers dropped; embeddings, shared encoder modules and the head as they are)."""
    new = {f"bert.encoder.layer.{m}.": f"bert.encoder.layer.{i}." for i, m in enumerate(mapping)}
    out: dict[str, torch.Tensor] = {}
    for k, v in teacher.items():
        if not k.startswith("bert.encoder.layer."):
            out[k] = v
            continue
        prefix = ".".join(k.split(".")[:4]) + "."
        if prefix in new:
            out[new[prefix] + k[len(prefix):]] = v
    return out


class DistillData(FeatureData):
    """FeatureData whose batches also carry the teacher's outputs (TARGET + name), padded to the batch's
    longest feature where they are per token."""

    def __init__(self, features: list[Feature], task: Plugin, batch_size: int, pad_id: int, seed: int,
                 outputs: dict[str, tuple[str, ...]]) -> None:
        super().__init__(features, task, batch_size, pad_id, seed, extra=())  # no gold labels: the teacher's outputs
        self.outputs = outputs

    def batch(self, epoch: int, index: int, seed: int) -> dict[str, torch.Tensor]:
        out = super().batch(epoch, index, seed)
        plan = self.plan(epoch)
        feats = [self.features[i] for i in plan[index % len(plan)]]
        T = out["input_ids"].shape[1]
        for name, axes in self.outputs.items():
            rows = [np.asarray(f[TARGET + name], dtype=np.float32) for f in feats]
            if len(axes) > 1 and axes[1] == SEQUENCE:  # per token: padded to the batch's length
                rows = [np.pad(r, [(0, T - len(r))] + [(0, 0)] * (r.ndim - 1)) for r in rows]
            out[TARGET + name] = torch.from_numpy(np.stack(rows))
        return out


class Taps:
    """Forward hooks on an encoder that keep what the intermediate losses read: the output of each of
    its ``layers``, and for ``relations`` the query, key and value projections' outputs of that layer's
    attention (a family whose attention has no such projections gives none: relations are off for it)."""

    def __init__(self, bert: nn.Module, layers: list[int], relations: int | None) -> None:
        self.got: dict[Any, torch.Tensor] = {}
        self.handles: list[Any] = []
        blocks = bert.encoder.layer
        for i in layers:
            self.handles.append(blocks[i].register_forward_hook(lambda m, a, out, i=i: self.got.__setitem__(i, out)))
        self.relations = False
        if relations is not None:
            att = next((m for m in blocks[relations].modules() if isinstance(m, Attention)), None)
            projections = [x for x in (getattr(att, n, None) for n in ("query", "key", "value")) if isinstance(x, nn.Linear)]
            if len(projections) == 3:
                self.relations = True
                for n, lin in zip("qkv", projections):
                    self.handles.append(lin.register_forward_hook(lambda m, a, out, n=n: self.got.__setitem__(n, out)))

    def take(self) -> dict[Any, torch.Tensor]:
        got, self.got = self.got, {}
        return got


class Distiller(nn.Module):
    """The student in training: its outputs held to the teacher's (the module docstring's losses), and
    with ``teacher`` (the torch teacher, run here on every batch, frozen) its intermediate states:
    ``hidden_weight`` x the MSE of each student layer's output against its teacher layer's (TinyBERT's
    uniform map: student layer i of K against teacher layer (i + 1) L / K, the last against the last),
    ``relation_weight`` x MiniLMv2's self-attention relations of the last layers (the KL of the
    softmaxed query-query, key-key and value-value scaled dot products, over the teacher's heads)."""

    def __init__(self, student: nn.Module, outputs: dict[str, tuple[str, ...]], temperature: float,
                 teacher: nn.Module | None = None, hidden_weight: float = 0.0, relation_weight: float = 0.0) -> None:
        super().__init__()
        self.student, self.outputs, self.temperature = student, outputs, temperature
        self.hidden_weight, self.relation_weight = hidden_weight, relation_weight
        self.frozen: list[nn.Module] = []  # the teacher, kept out of the module tree: not trained, not saved
        if teacher is not None and (hidden_weight > 0 or relation_weight > 0):
            teacher.eval().requires_grad_(False)
            self.frozen.append(teacher)
            L, K = teacher.bert.config.num_hidden_layers, student.bert.config.num_hidden_layers
            self.targets = [(i + 1) * L // K - 1 for i in range(K)]
            self.heads = teacher.bert.config.num_attention_heads
            last = relation_weight > 0 or None
            self.s_taps = Taps(student.bert, list(range(K)) if hidden_weight > 0 else [], K - 1 if last else None)
            self.t_taps = Taps(teacher.bert, self.targets if hidden_weight > 0 else [], L - 1 if last else None)
            if relation_weight > 0 and not (self.s_taps.relations and self.t_taps.relations):
                log.warning("the %s family's attention has no query, key and value projections to relate: "
                            "no relation loss", teacher.bert.config.model_type)
                self.relation_weight = 0.0

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, **teacher: torch.Tensor) -> dict[str, torch.Tensor]:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        got = self.student(input_ids, attention_mask, token_type_ids)
        if not teacher:  # an evaluation's batch: the student's outputs alone
            if self.frozen:
                self.s_taps.take()
            return got
        mask = attention_mask.bool()
        losses = {name: self.loss(got[name].float(), teacher[TARGET + name].float(), axes, mask)
                  for name, axes in self.outputs.items()}
        if self.frozen:
            losses.update(self.intermediate(input_ids, attention_mask, token_type_ids, mask))
        return {**got, "loss": torch.stack(list(losses.values())).sum(),
                **{f"log_{k}_loss": v.detach() for k, v in losses.items()}}

    def intermediate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None,
                     mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """The hidden-state and relation losses of this batch (the student's states, tapped during its
        forward; the teacher's, from its forward here)."""
        teacher = self.frozen[0]
        if next(teacher.parameters()).device != input_ids.device:
            teacher.to(input_ids.device)
        with torch.no_grad():
            teacher.bert(input_ids, attention_mask, token_type_ids)
        s, t = self.s_taps.take(), self.t_taps.take()
        out: dict[str, torch.Tensor] = {}
        if self.hidden_weight > 0:
            real = mask.unsqueeze(-1).float()
            n = real.sum() * s[0].shape[-1]
            out["hidden"] = self.hidden_weight * sum(((s[i].float() - t[j].float()) ** 2 * real).sum() / n
                                                     for i, j in enumerate(self.targets)) / len(self.targets)
        if self.relation_weight > 0:
            out["relations"] = self.relation_weight * sum(relation_kl(s[x].float(), t[x].float(), mask, self.heads)
                                                          for x in "qkv") / 3
        return out

    def loss(self, s: torch.Tensor, t: torch.Tensor, axes: tuple[str, ...], mask: torch.Tensor) -> torch.Tensor:
        T = self.temperature
        if axes[-1] == LABEL and s.shape[-1] > 1:  # (B, L) or (B, T, L): KL of the softmaxes
            if len(axes) == 3:
                s, t = s[mask], t[mask]  # the real tokens
            return F.kl_div(F.log_softmax(s / T, -1), F.log_softmax(t / T, -1), log_target=True,
                            reduction="batchmean") * T * T
        if tuple(axes[1:]) == (SEQUENCE,):  # (B, T) position scores: a softmax over each row's real positions
            fill = torch.finfo(s.dtype).min
            s, t = s.masked_fill(~mask, fill), t.masked_fill(~mask, fill)
            logp, logq = F.log_softmax(s / T, -1), F.log_softmax(t / T, -1)
            return (logq.exp() * (logq - logp)).masked_fill(~mask, 0.0).sum(-1).mean() * T * T
        return F.mse_loss(s, t)


def relation_kl(s: torch.Tensor, t: torch.Tensor, mask: torch.Tensor, heads: int) -> torch.Tensor:
    """MiniLMv2's relation loss for one kind of vector (queries, keys or values), (B, T, H) each: split
    into ``heads`` relation heads, each position's softmax over the real positions of its scaled dot
    products with them; KL(teacher || student), averaged over the real positions and the heads."""

    def relations(x: torch.Tensor) -> torch.Tensor:
        B, T, H = x.shape
        x = x.view(B, T, heads, H // heads).transpose(1, 2)  # (B, h, T, d)
        scores = x @ x.transpose(-1, -2) / math.sqrt(H // heads)
        return F.log_softmax(scores.masked_fill(~mask[:, None, None, :], torch.finfo(scores.dtype).min), -1)

    ls, lt = relations(s), relations(t)
    kl = (lt.exp() * (lt - ls)).sum(-1)  # (B, h, T)
    real = mask[:, None, :].float()
    return (kl * real).sum() / (real.sum() * heads)


def distill(args: DistillArgs) -> Metrics:
    """Distil ``args.teacher`` into a student of ``args.layers`` layers; write its run directory.
    Returns the final training metrics with the held-out agreement ("agreement_...")."""
    parse_report_to(args.train.report_to)
    if args.static:
        from mlmkit.train.static import distill_static

        return distill_static(args)
    with exclusive(args.out) if int(os.environ.get("RANK", "0")) == 0 else contextlib.nullcontext():
        return _distill(args)


INPUT_SUFFIXES = (".txt", ".jsonl", ".csv", ".tsv", ".parquet")


def _examples(task: Plugin, path: Path, options: Mapping[str, Any]) -> list[Example]:
    """The inputs the teacher labels: a file of inputs as `mlmkit predict --input` reads them (texts,
    or records of the task's input fields; any labels in them are not used), else the task's own data
    format (a BEIR directory, SQuAD JSON, CoNLL), read as evaluation data."""
    if path.suffix.lower() in INPUT_SUFFIXES:
        return [task.from_input(r.data, options) for r in iter_inputs(path)]
    return task.read(path, options, training=False)


def _distill(args: DistillArgs) -> Metrics:
    assert args.layers is not None and args.train_file is not None  # (DistillArgs checks them without --static)
    labeller, teacher_id, init = bundle_teacher(Path(args.teacher))
    task, teacher, tok, meta = load_finetuned(init)
    if any(not axes or axes[0] != "batch" for axes in task.outputs.values()) or "indices" in task.outputs:
        raise ConfigError(f"the {task.name} task's outputs are not distilled yet", "distil a classification, tagging, "
                          "qa, embedding or rerank run")
    cfg = teacher.bert.config
    mapping = layer_map(cfg.num_hidden_layers, args.layers, args.layer_map)
    opts = task.resolve_options(args.options, saved=meta.options, model=True)
    L = args.max_length or meta.max_length
    if L > cfg.max_tokens:
        raise ConfigError(f"--max-length {L} exceeds the model's {cfg.max_tokens} positions")
    ctx = replace(meta.context(opts, max_length=L), tokenizer=tok)
    examples = _examples(task, Path(args.train_file), opts)
    if len(examples) < 2:
        raise MlmkitError(f"{args.train_file}: {len(examples)} inputs", "the teacher needs inputs to label: give more")
    random.Random(args.train.seed).shuffle(examples)
    n_held = int(len(examples) * args.held_out)
    held, train_ex = examples[:n_held], examples[n_held:]
    hidden_w, relation_w, copies = recipe(args, len(train_ex))
    train_ex, copies = _with_copies(args, train_ex, copies, teacher, tok)
    outputs = {name: tuple(axes) for name, axes in task.outputs.items()}
    pad = special_ids(tok).pad
    features = task.featurize(train_ex, tok, ctx, training=False)
    prediction.check_features(task, features, len(train_ex), complete=False)
    forward = labeller or torch_forward(teacher, outputs)
    key = {"teacher": teacher_id or weights_digest(base_model_dir(args.teacher)), "inputs": data_identity(Path(args.train_file)),
           "max_length": L, "options": task.saved_options(opts), "seed": args.train.seed, "held_out": args.held_out,
           "features": len(features), "augment": copies, "format": 1}
    got = teacher_outputs(key, features, forward, outputs, pad)
    for i, f in enumerate(features):
        f.update({TARGET + name: got[name][i] for name in outputs})

    student_cfg = replace(cfg, num_hidden_layers=args.layers, extra=dict(cfg.extra))
    torch.manual_seed(args.train.seed)
    student = task.build_model(student_cfg, ctx)
    load_weights(student, student_weights(teacher.state_dict(), mapping))
    info: JSONObject = {"teacher": str(args.teacher), **({"initialised_from": str(init)} if labeller else {}),
                        "labelled_by": "onnxruntime" if labeller else "pytorch", "layer_map": mapping, "temperature": args.temperature,
                        "loss": "kl on logits and positions, mse on vectors and scores", "hidden_weight": hidden_w,
                        "relation_weight": relation_w, "augment": copies, "inputs": str(args.train_file)}
    run_meta = RunMeta(task=meta.task, labels=meta.labels, task_state=meta.task_state, max_length=L,
                       options=task.saved_options(opts), distill=info)

    def save_model(m: nn.Module, d: Path, meta_: RunMeta) -> None:
        for name, text in task.run_files(student_cfg, ctx).items():  # before save_run, which writes mlmkit.json last
            (d / name).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(d / name, text)
        save_run(m.student if isinstance(m, Distiller) else m, d, config=student_cfg, tokenizer=tok,
                 meta=meta_)

    data = DistillData(features, task, args.batch_size, pad, args.train.seed, outputs)
    data_key = {"batch_size": args.batch_size, "max_length": L, "teacher": str(Path(args.teacher).resolve()),
                "inputs": str(Path(args.train_file).resolve()), "layer_map": mapping, "held_out": args.held_out,
                "augment": copies}
    model = Distiller(student, outputs, args.temperature, teacher, hidden_weight=hidden_w, relation_weight=relation_w)
    labelled = None
    if args.eval_file is not None:  # the teacher's decision settings stay (no calibration on the student)
        labelled = TaskEvaluator(task, task.read(Path(args.eval_file), opts), tok, ctx)
        info["eval"] = str(args.eval_file)
    evaluator = HeldOut(task, held, tok, ctx, forward, outputs, pad, labelled) if held or labelled else None  # held: the teacher runs on it once
    train_args = args.train
    if held:  # the epochs are chosen by the held-out agreement: the best is kept, --early-stopping stops on it
        train_args = replace(args.train, metric_for_best="agreement", greater_is_better=True)
    elif labelled is not None:
        train_args = replace(args.train, metric_for_best=task.best_metric(ctx), greater_is_better=task.greater_is_better)
    metrics = Trainer(model, data, train_args, args.out, save_model=save_model, evaluate=evaluator, data_key=data_key,
                      params=flat_params(args)).train(run_meta)
    if held:
        assert evaluator is not None
        agree = evaluator.agreement(load_finetuned(args.out)[1])  # the run root holds the best evaluation's student
        info["agreement"] = {**agree, "held_out": len(held)}
        write_meta(args.out, replace(read_meta(args.out), distill=info))
        metrics = {**metrics, **{f"agreement_{k}": v for k, v in agree.items() if v is not None}}
    return metrics


def recipe(args: DistillArgs, texts: int) -> tuple[float, float, int]:
    """(hidden-state weight, relation weight, augmentation copies): the arguments', else the defaults;
    the copies by default fit the data: one of each of ``texts`` training texts below DISTILL_AUGMENT_BELOW."""
    copies = int(texts < DISTILL_AUGMENT_BELOW) if args.augment is None else args.augment
    return (DISTILL_HIDDEN if args.hidden_weight is None else args.hidden_weight,
            DISTILL_RELATIONS if args.relation_weight is None else args.relation_weight, copies)


def _with_copies(args: DistillArgs, examples: list[Example], copies: int, teacher: nn.Module,
                 tok: Any) -> tuple[list[Example], int]:
    """``examples`` and ``copies`` augmented copies of each (augmented), and the copies made: the
    default's are none where there is nothing to swap; --augment's are refused then."""
    if not copies:
        return examples, 0
    extra = augmented(examples, teacher.bert.embeddings.word_embeddings.weight, tok, copies, args.train.seed)
    if extra is None and args.augment is not None:
        raise ConfigError("--augment swaps whole words of the teacher's vocabulary, and this one has none (a byte-level "
                          "BPE vocabulary marks them)", "distil without --augment (--augment 0)")
    return examples + (extra or []), len(extra or []) // max(1, len(examples))


class HeldOut:
    """The Trainer's evaluation of a student: its agreement with the teacher on the held-out inputs
    (the teacher's outputs on them computed once), and with --eval the task's metrics on labelled
    data; each evaluation logged in one line. Under torchrun every rank calls it (``spreads``: the
    labelled evaluation spreads its batches over the ranks; the agreement is each rank's own, the same)."""

    spreads = True

    def __init__(self, task: Plugin, held: list[Example], tok: Any, ctx: TaskContext, teach: prediction.Forward,
                 outputs: dict[str, tuple[str, ...]], pad: int, labelled: TaskEvaluator | None) -> None:
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
    whole = torch.tensor(sorted(i for w, i in vocab.items() if w.isalpha() and w.islower() and not w.startswith("##")))
    if not len(whole):
        return None
    unit = F.normalize(table.detach().float(), dim=-1)
    near: dict[int, list[int]] = {}
    words = {w.lower() for ex in examples for f in ("text", "text_pair") if isinstance(ex.get(f), str) for w in ex[f].split()}
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
        raise ConfigError(f"{path} is a {pipe.task} bundle, a task that is not fine-tuned", "distil a bundle of a fine-tuned task")
    source = pipe.meta.source
    run = Path(str(source.get("path", "")))
    fix = f"give the run {path} was exported from as the teacher, or export it again from the run"
    if not source.get("path") or not (run / "config.json").is_file():
        raise ConfigError(f"{path}: the student starts from the teacher's weights, and the run it was exported from "
                          f"({source.get('path', 'not recorded')}) is not there", fix)
    if source.get("weights_sha256") and source["weights_sha256"] != weights_digest(run):
        raise ConfigError(f"{path} was exported from other weights than {run} holds now", fix)
    return pipe.run_batch, json.dumps(pipe.identity(), sort_keys=True), run


def teacher_outputs(key: JSONObject, features: list[Feature], forward: prediction.Forward,
                    outputs: dict[str, tuple[str, ...]], pad: int) -> dict[str, list[np.ndarray]]:
    """The teacher's outputs for each feature, computed once: kept under $MLMKIT_CACHE/teacher-outputs,
    keyed by the teacher's weights, the inputs (path and size), the max length, the options and the
    held-out split, so a --resume or another student of the same teacher and data reuses them."""
    path = cache_root() / "teacher-outputs" / (hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24] + ".npz")
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
    arrays: dict[str, Any] = {}  # arrays by name (Any: numpy's stubs read np.savez's **arrays as its own keywords)
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


def held_out_agreement(task: Plugin, held: list[Example], tok: Any, ctx: TaskContext, teach: prediction.Forward,
                       student: nn.Module, outputs: dict[str, tuple[str, ...]], pad: int) -> dict[str, float | None]:
    """The student's agreement with the teacher (its forward: ``teach``) on inputs neither trained on
    (prediction.agreement)."""
    return HeldOut(task, held, tok, ctx, teach, outputs, pad, None).agreement(student)
