"""`mlmkit distill`: a smaller student of a fine-tuned run, trained to give the teacher's outputs.

The student is an ordinary run of the teacher's task and family, with K of its layers: it starts from
the teacher's embeddings, its head and the K layers of the layer map (DistilBERT's recipe: every
L/K-th layer from the first by default), each attending as its teacher layer did (its layer type:
distill_student.student_config), so training starts near the teacher, not from scratch. The teacher
labels the training inputs once (a torch forward over them, before training, kept in the cache:
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
import os
import random
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mlmkit.args import DISTILL_AUGMENT_BELOW, DISTILL_HIDDEN, DISTILL_RELATIONS, DistillArgs, TrainArgs
from mlmkit.errors import ConfigError, MlmkitError
from mlmkit.files import JSONObject, atomic_write_text
from mlmkit.locks import exclusive
from mlmkit.registry import Example, Feature, Metrics, Plugin, TaskContext
from mlmkit.rundir.checkpoint import load_weights, save_run
from mlmkit.rundir.meta import RunMeta, read_meta, write_meta
from mlmkit.rundir.weights import weights_digest
from mlmkit.runtime import prediction
from mlmkit.text.records import iter_inputs
from mlmkit.text.tokenizer import special_ids
from mlmkit.train.distill_student import (
    TARGET,
    DistillData,
    Distiller,
    layer_map,
    student_config,
    student_weights,
)
from mlmkit.train.distill_teacher import HeldOut, augmented, bundle_teacher, teacher_outputs
from mlmkit.train.finetune import TaskEvaluator, base_model_dir, data_identity, load_finetuned, torch_forward
from mlmkit.train.loop import Trainer
from mlmkit.train.tracking import flat_params, parse_report_to


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
    # (DistillArgs checks them without --static)
    assert args.layers is not None and args.train_file is not None
    labeller, teacher_id, init = bundle_teacher(Path(args.teacher))
    task, teacher, tok, meta = load_finetuned(init)
    if any(not axes or axes[0] != "batch" for axes in task.outputs.values()) or "indices" in task.outputs:
        raise ConfigError(f"the {task.name} task's outputs are not distilled yet",
                          "distil a classification, tagging, qa, embedding or rerank run")
    cfg = teacher.bert.config
    mapping = layer_map(cfg.num_hidden_layers, args.layers, args.layer_map)
    opts = task.resolve_options(args.options, saved=meta.options, model=True)
    L = args.max_length or meta.max_length
    if L > cfg.max_tokens:
        raise ConfigError(f"--max-length {L} exceeds the model's {cfg.max_tokens} positions")
    ctx = replace(meta.context(opts, max_length=L), tokenizer=tok)
    examples = _examples(task, Path(args.train_file), opts)
    if len(examples) < 2:
        raise MlmkitError(f"{args.train_file}: {len(examples)} inputs",
                          "the teacher needs inputs to label: give more")
    random.Random(args.train.seed).shuffle(examples)
    n_held = int(len(examples) * args.held_out)
    held, train_ex = examples[:n_held], examples[n_held:]
    hidden_w, relation_w, copies = recipe(args, len(train_ex))
    train_ex, copies = _with_copies(args, train_ex, copies, teacher, tok)
    outputs = {name: tuple(axes) for name, axes in task.outputs.items()}
    pad = special_ids(tok).pad
    forward = labeller or torch_forward(teacher, outputs)
    key = {"teacher": teacher_id or weights_digest(base_model_dir(args.teacher)),
           "inputs": data_identity(Path(args.train_file)), "max_length": L,
           "options": task.saved_options(opts),
           "seed": args.train.seed, "held_out": args.held_out, "augment": copies, "format": 1}
    features = _labelled(task, train_ex, tok, ctx, key, forward, outputs, pad)

    student_cfg = student_config(cfg, mapping)
    torch.manual_seed(args.train.seed)
    student = task.build_model(student_cfg, ctx)
    load_weights(student, student_weights(teacher.state_dict(), mapping))
    info: JSONObject = {"teacher": str(args.teacher), **({"initialised_from": str(init)} if labeller else {}),
                        "labelled_by": "onnxruntime" if labeller else "pytorch", "layer_map": mapping,
                        "temperature": args.temperature,
                        "loss": "kl on logits and positions, mse on vectors and scores",
                        "hidden_weight": hidden_w, "relation_weight": relation_w, "augment": copies,
                        "inputs": str(args.train_file)}
    run_meta = RunMeta(task=meta.task, labels=meta.labels, task_state=meta.task_state, max_length=L,
                       options=task.saved_options(opts), distill=info)

    def save_model(m: nn.Module, d: Path, meta_: RunMeta) -> None:
        # before save_run, which writes mlmkit.json last
        for name, text in task.run_files(student_cfg, ctx).items():
            (d / name).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(d / name, text)
        save_run(m.student if isinstance(m, Distiller) else m, d, config=student_cfg, tokenizer=tok,
                 meta=meta_)

    data = DistillData(features, task, args.batch_size, pad, args.train.seed, outputs)
    data_key = {"batch_size": args.batch_size, "max_length": L, "teacher": str(Path(args.teacher).resolve()),
                "inputs": str(Path(args.train_file).resolve()), "layer_map": mapping,
                "held_out": args.held_out,
                "augment": copies}
    model = Distiller(student, outputs, args.temperature, teacher, hidden_weight=hidden_w,
                      relation_weight=relation_w)
    labelled = None
    if args.eval_file is not None:  # the teacher's decision settings stay (no calibration on the student)
        labelled = TaskEvaluator(task, task.read(Path(args.eval_file), opts), tok, ctx)
        info["eval"] = str(args.eval_file)
    # held: the teacher runs on it once
    evaluator = HeldOut(task, held, tok, ctx, forward, outputs, pad, labelled) if held or labelled else None
    metrics = Trainer(model, data, _train_args(args, task, ctx, bool(held), labelled), args.out,
                      save_model=save_model, evaluate=evaluator,
                      data_key=data_key, params=flat_params(args)).train(run_meta)
    if held:
        assert evaluator is not None
        agree = evaluator.agreement(load_finetuned(args.out)[1])  # the run root holds the best student
        info["agreement"] = {**agree, "held_out": len(held)}
        write_meta(args.out, replace(read_meta(args.out), distill=info))
        metrics = {**metrics, **{f"agreement_{k}": v for k, v in agree.items() if v is not None}}
    return metrics


def _train_args(args: DistillArgs, task: Plugin, ctx: TaskContext, held: bool,
                labelled: TaskEvaluator | None) -> TrainArgs:
    """The training loop's arguments: the epochs chosen by the held-out agreement (the best kept,
    --early-stopping stops on it), else by the labelled evaluation's metric."""
    if held:
        return replace(args.train, metric_for_best="agreement", greater_is_better=True)
    if labelled is not None:
        return replace(args.train, metric_for_best=task.best_metric(ctx),
                       greater_is_better=task.greater_is_better)
    return args.train


def _labelled(task: Plugin, train_ex: list[Example], tok: Any, ctx: TaskContext, key: JSONObject,
              forward: prediction.Forward, outputs: dict[str, tuple[str, ...]], pad: int) -> list[Feature]:
    """The training inputs' features, each with the teacher's outputs as its targets (computed once per
    teacher and inputs: ``key``, with the features' count, names the cache)."""
    features = task.featurize(train_ex, tok, ctx, training=False)
    prediction.check_features(task, features, len(train_ex), complete=False)
    got = teacher_outputs({**key, "features": len(features)}, features, forward, outputs, pad)
    for i, f in enumerate(features):
        f.update({TARGET + name: got[name][i] for name in outputs})
    return features


def recipe(args: DistillArgs, texts: int) -> tuple[float, float, int]:
    """(hidden-state weight, relation weight, augmentation copies): the arguments', else the defaults;
    the copies by default fit the data: one of each of ``texts`` training texts below
    DISTILL_AUGMENT_BELOW."""
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
        raise ConfigError("--augment swaps whole words of the teacher's vocabulary, and this one has none (a "
                          "byte-level BPE vocabulary marks them)", "distil without --augment (--augment 0)")
    return examples + (extra or []), len(extra or []) // max(1, len(examples))
