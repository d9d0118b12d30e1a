"""`mlmkit finetune` and `mlmkit evaluate` of a run directory: any registered task, the one training
loop (train/loop.py) and the one prediction loop (runtime/prediction.py) on a PyTorch forward."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mlmkit.args import FinetuneArgs
from mlmkit.errors import ConfigError, MlmkitError, TaskError
from mlmkit.files import atomic_write_text, write_jsonl
from mlmkit.locks import exclusive
from mlmkit.models.config import ModelConfig
from mlmkit.registry import Example, Metrics, Options, Plugin, Prediction, TaskContext, TaskState, get_task
from mlmkit.rundir.checkpoint import (
    is_model_dir,
    load_state_dict,
    load_weights,
    read_run_meta,
    save_run,
)
from mlmkit.rundir.config import load_config
from mlmkit.rundir.hub import describe
from mlmkit.rundir.meta import RunMeta
from mlmkit.rundir.weights import weight_files
from mlmkit.runtime import prediction
from mlmkit.text.beir import split_spec
from mlmkit.text.tokenizer import load_tokenizer, special_ids
from mlmkit.train.data import FeatureData
from mlmkit.train.devices import resolve_device
from mlmkit.train.loop import Trainer
from mlmkit.train.timing import Timings
from mlmkit.train.tracking import Reporter, flat_params, parse_report_to

log = logging.getLogger("mlmkit")
ENCODER = ("bert.embeddings.", "bert.encoder.", "bert.pooler.")  # the weights a base model gives any task


def torch_forward(model: torch.nn.Module, names: Any) -> prediction.Forward:
    """A PyTorch model as the prediction loop's forward: padded numpy batch in, the named outputs out (fp32
    numpy)."""
    device = next(model.parameters()).device

    @torch.no_grad()
    def forward(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = model(**{k: torch.from_numpy(v).to(device) for k, v in batch.items()})
        return {n: out[n].float().cpu().numpy() for n in names}

    return forward


def ranks_spread() -> prediction.Spread | None:
    """torchrun's ranks as an evaluation's Spread (None in one process)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    world = dist.get_world_size()

    def gather(obj: Any) -> list[Any]:
        got: list[Any] = [None] * world
        dist.all_gather_object(got, obj)
        return got

    return prediction.Spread(dist.get_rank(), world, gather)


class TaskEvaluator:
    """The Trainer's evaluation of a task model: prediction.evaluate on its PyTorch forward. Keeps the
    last predictions and, with ``calibrate``, the decision settings tuned on these examples
    (fine-tuning's evaluation set only), which fine-tuning saves with the model.

    Under torchrun every rank calls it (``spreads``): each runs its share of the batches, the
    outputs are gathered to all, and every rank computes one process's metrics."""

    spreads = True

    def __init__(self, task: Plugin, examples: list[Example], tokenizer: Any, ctx: TaskContext, *,
                 batch_size: int = 64, calibrate: bool = False) -> None:
        self.task, self.examples, self.tokenizer, self.ctx = task, examples, tokenizer, ctx
        self.batch_size, self.calibrate = batch_size, calibrate
        self.predictions: list[Prediction] = []
        self.state: TaskState = {}

    def __call__(self, model: torch.nn.Module) -> Metrics:
        was_training = model.training
        model.eval()
        metrics, got = prediction.evaluate(self.task, self.examples, self.tokenizer, self.ctx,
                                           torch_forward(model, self.task.outputs),
                                           batch_size=self.batch_size,
                                           calibrate=self.calibrate, spread=ranks_spread())
        model.train(was_training)
        self.predictions, self.state = got.predictions, dict(got.ctx.state)
        return metrics


def base_model_dir(model: str | Path) -> Path:
    d = Path(model)
    if not d.exists():
        raise MlmkitError(f"model directory not found: {d}",
                          "pass an mlmkit run directory or a Hugging Face checkpoint directory")
    if not is_model_dir(d):
        raise MlmkitError(
            f"{d} is not a model directory",
            "it needs config.json, model.safetensors or pytorch_model.bin, and tokenizer.json or vocab.txt",
        )
    return d


def base_options(task: Plugin, base: Path, cfg: ModelConfig) -> Options:
    """The task's ``fixed`` options (built into a model) that a base model already has, which
    fine-tuning keeps unless told otherwise: a run of this task's (its mlmkit.json), or what a foreign
    checkpoint declares for it (``from_hf``: a sentence-transformers directory's pooling and
    normalisation, a classifier's problem type)."""
    if (base / "mlmkit.json").is_file():
        meta = read_run_meta(base, cfg)
        found = dict(meta.options) if meta.task == task.name else {}
    else:
        info = task.from_hf(cfg, base)
        found = dict(info.get("options") or {}) if info else {}
    fixed = {o.name for o in task.options if o.fixed}
    return {k: v for k, v in found.items() if k in fixed}


def finetune(args: FinetuneArgs, *, reporters: Sequence[Reporter] = ()) -> Metrics:
    """Fine-tune ``args.task`` from a pretraining run or Hugging Face checkpoint; write a run directory.

    The head starts fresh; with an evaluation file the best checkpoint by the task's main metric is
    kept in ``args.out``. Returns the final metrics. ``reporters``: more tracking reporters beside
    --report-to's (a sweep's pruner).
    """
    parse_report_to(args.train.report_to)  # before anything is read or built
    with exclusive(args.out) if int(os.environ.get("RANK", "0")) == 0 else contextlib.nullcontext():
        return _finetune(args, reporters)


def _finetune(args: FinetuneArgs, reporters: Sequence[Reporter]) -> Metrics:
    task = get_task(args.task)
    if not task.trainable:
        raise TaskError(f"the {task.name} task is not fine-tuned by mlmkit",
                        f"export a model as it is: mlmkit export MODEL --task {task.name}")
    task.resolve_options(args.options)  # an unknown or bad option is refused before any model is read
    base = base_model_dir(args.model)
    cfg = load_config(base)
    opts = task.resolve_options(args.options, saved=base_options(task, base, cfg))
    tok = load_tokenizer(base)
    check_vocabulary(tok, cfg, base)
    L = args.max_length or min(task.default_max_length, cfg.max_tokens)
    if L > cfg.max_tokens:
        raise ConfigError(f"--max-length {L} exceeds the model's {cfg.max_tokens} positions")
    timings = Timings()
    with timings.phase("read"):
        train_ex = task.read(Path(args.train_file), opts, training=True, max_bytes=args.max_record_bytes)
    if not train_ex:
        raise MlmkitError(f"{args.train_file}: no examples", "check the file and the column options")
    labels = task.label_list(train_ex)
    same_head = _same_head(cfg, task, labels, opts, claimed=task.from_hf(cfg, base) is not None)
    if labels is not None:
        cfg.id2label = dict(enumerate(labels))
        cfg.label2id = {v: k for k, v in cfg.id2label.items()}
    cfg.architectures = [task.hf_architecture]
    ctx = TaskContext(max_length=L, options=opts, labels=tuple(labels) if labels is not None else None,
                      state=task.fit_state(train_ex), tokenizer=tok)
    cfg.extra.update(task.hf_config(ctx))
    meta = RunMeta(task=task.name, labels=ctx.labels, max_length=L, options=task.saved_options(opts),
                   task_state=dict(ctx.state), base_model=str(base),
                   data={"train": str(args.train_file),
                         "eval": str(args.eval_file) if args.eval_file else None})

    torch.manual_seed(args.train.seed)
    with timings.phase("load"):
        net = task.build_model(cfg, ctx)
        fresh = _start_weights(task, net, base, cfg, same_head=same_head, resume=bool(args.train.resume))
    with timings.phase("tokenize"):
        features = task.featurize(train_ex, tok, ctx, training=True)
    # a grouped task's example is its features' group: one with none (or two under one index) is a featurize
    # bug
    prediction.check_features(task, features, len(train_ex), grouped=task.group_features,
                              complete=task.group_features)
    data = FeatureData(features, task, args.batch_size, special_ids(tok).pad, args.train.seed)
    evaluator = None
    if args.eval_file is not None:
        evaluator = TaskEvaluator(task, task.read(Path(args.eval_file), opts,
                                                  max_bytes=args.max_record_bytes), tok, ctx,
                                  calibrate=True)
    head_lr = args.train.head_lr
    if head_lr is None and fresh and task.fresh_head_lr is not None:
        head_lr = task.fresh_head_lr
        log.info("the fresh %s head trains at a peak learning rate of %g (the task's default; --head-lr "
                 "sets another)", task.name, head_lr)
    train_args = replace(args.train, metric_for_best=task.best_metric(ctx) if evaluator else None,
                         greater_is_better=task.greater_is_better, head_lr=head_lr)

    def save_model(m: torch.nn.Module, d: Path, meta_: RunMeta) -> None:
        calibrated = evaluator.state if evaluator is not None else {}
        for name, text in task.run_files(cfg, ctx).items():  # before save_run, which writes mlmkit.json last
            (d / name).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(d / name, text)
        save_run(m, d, config=cfg, tokenizer=tok,
                 meta=replace(meta_, task_state={**meta.task_state, **calibrated}))

    data_key = {"batch_size": args.batch_size, "max_length": L, "train": data_identity(args.train_file),
                "options": opts}
    return Trainer(net, data, train_args, args.out, save_model=save_model, evaluate=evaluator,
                   data_key=data_key, params=flat_params(args), reporters=reporters,
                   timings=timings).train(meta)


def _start_weights(task: Plugin, net: torch.nn.Module, base: Path, cfg: ModelConfig, *, same_head: bool,
                   resume: bool) -> bool:
    """``net``'s weights from ``base``: the encoder carries over; the head too when ``base`` is a model
    of this task with these very labels (a fine-tuned run, or a transformers checkpoint), otherwise it
    starts fresh. Returns whether some of the head starts fresh."""
    full = load_state_dict(base, cfg)
    for prefix in task.base_heads:
        if not any(k.startswith(prefix) for k in full):
            raise TaskError(f"{base} has no {prefix.rstrip('.')} weights, which the {task.name} task starts "
                            "from",
                            "fine-tune from a masked-LM checkpoint or pretraining run"
                            if "predictions" in prefix
                            else "fine-tune from a model that has them")
    sd = full if same_head else {k: v for k, v in full.items()
                                 if k.startswith((*ENCODER, *task.base_heads, *task.kept_heads))}
    head = tuple(k for k in net.state_dict() if not k.startswith(("bert.embeddings", "bert.encoder")))
    missing, unexpected = load_weights(net, sd, allow_missing=head)
    if same_head and not missing and not resume:
        log.info("the %s head carries over from %s (a model of this task with the same labels)", task.name,
                 base)
    elif missing and not resume:
        log.info("the %s head starts fresh: %s", task.name, ", ".join(missing))
    dropped = [k for k in full if k not in sd] + unexpected
    if dropped:
        log.info("dropping %d weights the %s model does not use (e.g. %s)", len(dropped), task.name,
                 dropped[0])
    return bool(missing)


def data_identity(path: Path) -> list[list[Any]]:
    """[absolute path, size] of a training file, or of a directory (`datasets`, BEIR: its files' total
    size); a BEIR split (DIR:SPLIT) is its directory's with the split named."""
    p, split = split_spec(path)
    if p.is_dir():
        return [[str(p.resolve()) + (f":{split}" if split else ""),
                 sum(f.stat().st_size for f in sorted(p.rglob("*")) if f.is_file())]]
    return [[str(p.resolve()), p.stat().st_size]]


def _same_head(base: ModelConfig, task: Plugin, labels: list[str] | None, opts: Mapping[str, Any], *,
               claimed: bool = False) -> bool:
    """Whether a base model's head is this task's, for these labels (in this order) and options: its
    architecture is the task's, or the task's ``from_hf`` claims the directory (a sentence-transformers
    MultiVectorEncoder keeps the colbert projection in a module of its own)."""
    if task.hf_architecture == "BertModel" or not (claimed
                                                   or task.hf_architecture in (base.architectures or [])):
        return False
    base_labels = [base.id2label[i] for i in sorted(base.id2label)] if base.id2label else None
    wanted = task.hf_config(TaskContext(max_length=1, options=opts))
    return base_labels == labels and all(base.extra.get(k, v) == v for k, v in wanted.items())


def check_vocabulary(tok: Any, cfg: ModelConfig, d: Path) -> None:
    """A tokenizer with more tokens than the model's embedding table (a tokenizer of another model put
    in the directory) is refused before any text reaches the model: its ids would index past the table."""
    if tok.get_vocab_size() > cfg.vocab_size:
        raise ConfigError(f"the tokenizer in {d} has {tok.get_vocab_size():,} tokens; the model's embeddings "
                          "hold "
                          f"{cfg.vocab_size:,} (config.json's vocab_size): a tokenizer of another model",
                          "put back the tokenizer the model was trained with")


def load_finetuned(run_dir: str | Path) -> tuple[Plugin, torch.nn.Module, Any, RunMeta]:
    """(task, model in eval mode, tokenizer, mlmkit.json as a RunMeta) of a fine-tuned run directory, or of a
    Hugging Face or sentence-transformers checkpoint of a task (its description read as `mlmkit export` reads
    it)."""
    d = base_model_dir(run_dir)
    cfg = load_config(d)
    meta = read_run_meta(d, cfg) if (d / "mlmkit.json").is_file() else describe(d, cfg)
    if meta.pretraining:
        raise MlmkitError(f"{d} is a pretraining run, not a fine-tuned model",
                          "fine-tune it first: mlmkit finetune TASK")
    task = get_task(meta.task)
    tok = load_tokenizer(d)
    check_vocabulary(tok, cfg, d)
    net = task.build_model(cfg,
                           replace(meta.context(task.resolve_options(saved=meta.options)), tokenizer=tok))
    load_weights(net, load_state_dict(d, cfg))
    net.eval()
    return task, net, tok, meta


def evaluate_base(
    task_name: str, model: str | Path, data: str | Path, *, options: Mapping[str, Any] | None = None,
    max_length: int | None = None, device: str = "cpu", batch_size: int = 64, keep_head: bool = False,
) -> Metrics:
    """Metrics of a base model (a run or a checkpoint) with ``task_name``'s head as built, before any
    fine-tuning: the zero-shot score of a task whose head has no parameters (the embedding task's
    pooling) or starts from the base's (the SPLADE task's masked-LM head, ``base_heads``; the module
    weights of ``kept_heads``, which a model may derive its head from: the rerank task's answer tokens);
    for any other task, a fresh random head's. ``keep_head``: the checkpoint's own head where it has one of
    this task's names (a model of the task trained elsewhere, e.g. a CrossEncoder directory)."""
    task = get_task(task_name)
    base = base_model_dir(model)
    cfg, tok = load_config(base), load_tokenizer(base)
    # the ones built into the base, as fine-tuning
    opts = task.resolve_options(options, saved=base_options(task, base, cfg))
    ctx = TaskContext(max_length=max_length or min(task.default_max_length, cfg.max_tokens), options=opts,
                      tokenizer=tok)
    torch.manual_seed(0)
    net = task.build_model(cfg, ctx)
    kept = load_state_dict(base, cfg)
    if not keep_head:
        kept = {k: v for k, v in kept.items() if k.startswith((*ENCODER, *task.base_heads, *task.kept_heads))}
    load_weights(net, kept, allow_missing=tuple(net.state_dict()))  # what the model does not use is left out
    net.to(resolve_device(device)).eval()
    metrics, _ = prediction.evaluate(task, task.read(Path(data), opts), tok, ctx,
                                     torch_forward(net, task.outputs),
                                     batch_size=batch_size)
    return metrics


def evaluate_run(
    run_dir: str | Path, data: str | Path, *, options: Mapping[str, Any] | None = None,
    predictions: str | Path | None = None, device: str = "cpu", batch_size: int = 64, speed: bool = False,
) -> Metrics:
    """Metrics of a fine-tuned run directory on labelled ``data`` (PyTorch); optionally write the
    predictions as JSON lines. The decision settings saved at fine-tuning are used as they are.
    ``speed``: with the examples per second of the prediction and the bytes of the weights."""
    task, net, tok, meta = load_finetuned(run_dir)
    net.to(resolve_device(device))
    opts = task.resolve_options(options, saved=meta.options, model=True)
    ctx = meta.context(opts)
    metrics, got = prediction.evaluate(task, task.read(Path(data), opts), tok, ctx,
                                       torch_forward(net, task.outputs),
                                       batch_size=batch_size, speed=speed)
    if speed:
        metrics["model_bytes"] = sum(f.stat().st_size for f in weight_files(Path(run_dir)))
    if predictions is not None:
        write_jsonl(predictions, got.predictions)
    return metrics
