"""`mlmkit finetune` and `mlmkit evaluate` (PyTorch side): any registered task, the one training loop."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .batching import bucket_batches, pad_features, scatter_outputs, shuffled_buckets
from .checkpoint import is_model_dir, load_state_dict, load_weights, read_json, save_run
from .config import BertConfig
from .errors import ConfigError, MlmkitError
from .registry import Task, get_task, task_options
from .tokenizer import load_tokenizer, special_ids
from .training import TrainArgs, Trainer

log = logging.getLogger("mlmkit")


class FeatureData:
    """Training data source over task features: length-bucketed batches, a new order each epoch."""

    def __init__(self, features: list[dict[str, Any]], task: Task, batch_size: int, pad_id: int, seed: int) -> None:
        if not features:
            raise MlmkitError("the training data has no examples", "check the --train file")
        self.features, self.task, self.batch_size, self.pad_id, self.seed = features, task, batch_size, pad_id, seed
        self.lengths = [len(f["input_ids"]) for f in features]
        self._plans: dict[int, list[list[int]]] = {}

    def plan(self, epoch: int) -> list[list[int]]:
        if epoch not in self._plans:
            self._plans = {epoch: shuffled_buckets(self.lengths, self.batch_size, random.Random(self.seed * 7919 + epoch))}
        return self._plans[epoch]

    def num_batches(self, epoch: int) -> int:
        return len(self.plan(epoch))

    def batch(self, epoch: int, index: int, seed: int) -> dict[str, torch.Tensor]:
        plan = self.plan(epoch)
        feats = [self.features[i] for i in plan[index % len(plan)]]
        arrays = pad_features(feats, self.pad_id, extra=self.task.label_names)
        return {k: torch.from_numpy(v) for k, v in arrays.items()}


@torch.no_grad()
def predict_torch(
    task: Task, model: torch.nn.Module, features: list[dict[str, Any]], pad_id: int, batch_size: int = 64
) -> dict[str, list[np.ndarray]]:
    """Raw task outputs per feature (the names of ``task.onnx_outputs()``), in feature order."""
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    axes = task.onnx_outputs()
    lengths = [len(f["input_ids"]) for f in features]
    into: dict[str, list[Any]] = {}
    for batch in bucket_batches(lengths, batch_size):
        arrays = pad_features([features[i] for i in batch], pad_id)
        out = model(**{k: torch.from_numpy(v).to(dev) for k, v in arrays.items()})
        scatter_outputs({k: out[k].float().cpu().numpy() for k in axes}, batch, lengths, axes, into)
    model.train(was_training)
    return into


def base_model_dir(model: str | Path) -> Path:
    d = Path(model)
    if not d.exists():
        raise MlmkitError(f"model directory not found: {d}", "pass an mlmkit run directory or a Hugging Face BERT directory")
    if not is_model_dir(d):
        raise MlmkitError(
            f"{d} is not a model directory",
            "it needs config.json, model.safetensors or pytorch_model.bin, and tokenizer.json or vocab.txt",
        )
    return d


class TaskEvaluator:
    """Scores a model on evaluation examples with the task's own postprocessing and metrics."""

    def __init__(
        self, task: Task, examples: list[dict[str, Any]], tok: Any, meta: dict[str, Any], batch_size: int = 64,
        *, calibrate: bool = False,
    ):
        """``calibrate``: let the task tune its decision settings on these examples (fine-tuning's
        evaluation set only: tuning them on test data would flatter the score)."""
        self.task, self.examples, self.meta, self.batch_size = task, examples, meta, batch_size
        self.calibrate = calibrate
        self.features = task.featurize(examples, tok, meta=meta, max_length=meta["max_length"], training=False)
        self.pad_id = special_ids(tok).pad
        self.predictions: list[dict[str, Any]] = []

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        outputs = predict_torch(self.task, model, self.features, self.pad_id, self.batch_size)
        calibrate = getattr(self.task, "calibrate", None) if self.calibrate else None
        if calibrate is not None:  # e.g. QA's null-score threshold, saved with the model
            self.meta.update(calibrate(outputs, self.features, self.examples, meta=self.meta))
        self.predictions = self.task.postprocess(outputs, self.features, self.examples, meta=self.meta)
        return self.task.compute_metrics(self.predictions, self.examples, meta=self.meta)


def finetune(
    task_name: str,
    model: str | Path,
    train: str | Path,
    out: str | Path,
    *,
    eval_file: str | Path | None = None,
    epochs: float = 3.0,
    batch_size: int = 32,
    lr: float = 5e-5,
    warmup_ratio: float = 0.1,
    weight_decay: float = 0.01,
    max_length: int | None = None,
    seed: int = 0,
    max_steps: int | None = None,
    early_stopping: int | None = None,
    device: str = "cpu",
    bf16: bool = False,
    resume: bool = False,
    progress: bool = True,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Fine-tune ``task_name`` from a pretraining run or HF BERT directory; write a run directory.

    The head starts fresh; the best checkpoint by the task's main metric (when ``eval_file`` is
    given) is kept in ``out``. Returns the final metrics.
    """
    task = get_task(task_name)
    opts = task_options(task, options or {})
    base = base_model_dir(model)
    cfg = BertConfig.load(base)
    tok = load_tokenizer(base)
    if tok.get_vocab_size() > cfg.vocab_size:
        raise ConfigError(f"the tokenizer in {base} has {tok.get_vocab_size()} tokens, the model {cfg.vocab_size}")
    L = max_length or min(task.default_max_length, cfg.max_position_embeddings)
    if L > cfg.max_position_embeddings:
        raise ConfigError(f"--max-length {L} exceeds the model's {cfg.max_position_embeddings} positions")
    train_ex = task.read(Path(train), **opts)
    if not train_ex:
        raise MlmkitError(f"{train}: no examples", "check the file and the column options")
    labels = task.label_list(train_ex)
    if labels is not None:
        cfg.id2label = dict(enumerate(labels))
        cfg.label2id = {v: k for k, v in cfg.id2label.items()}
    cfg.architectures = [task.hf_architecture]
    meta: dict[str, Any] = {"task": task.name, "labels": labels, "max_length": L, "options": opts, "base_model": str(base)}

    torch.manual_seed(seed)
    net = task.build_model(cfg)
    # only the encoder carries over: the head starts fresh even when --model is a fine-tuned run
    # (its labels, and their number, may differ)
    full = load_state_dict(base)
    sd = {k: v for k, v in full.items() if k.startswith(("bert.embeddings.", "bert.encoder.", "bert.pooler."))}
    missing, unexpected = load_weights(net, sd, allow_missing=tuple(k for k in net.state_dict() if not k.startswith("bert.embeddings") and not k.startswith("bert.encoder")))
    if missing and not resume:
        log.info("the %s head starts fresh: %s", task.name, ", ".join(missing))
    dropped = [k for k in full if k not in sd] + unexpected
    if dropped:
        log.info("dropping %d weights the %s model does not use (e.g. %s)", len(dropped), task.name, dropped[0])

    features = task.featurize(train_ex, tok, meta=meta, max_length=L, training=True)
    data = FeatureData(features, task, batch_size, special_ids(tok).pad, seed)
    evaluator = None
    if early_stopping is not None and eval_file is None:
        raise ConfigError("--early-stopping needs --eval", "give an evaluation file to measure progress on")
    if eval_file is not None:
        evaluator = TaskEvaluator(task, task.read(Path(eval_file), **opts), tok, meta, calibrate=True)
    args = TrainArgs(
        epochs=epochs, steps=max_steps, lr=lr, warmup_ratio=warmup_ratio, weight_decay=weight_decay, seed=seed,
        device=device, bf16=bf16, progress=progress, log_every=10, keep_last=1,
        metric_for_best=task.metrics[0] if evaluator else None,
        greater_is_better=getattr(task, "greater_is_better", True),
        early_stopping_patience=early_stopping,
    )

    def save_model(m: torch.nn.Module, d: Path, meta_: dict[str, Any]) -> None:
        save_run(m, d, config=cfg, tokenizer=tok, meta={**meta_, **meta})

    result = Trainer(net, data, args, out, save_model=save_model, evaluate=evaluator).train(resume=resume, meta=meta)
    return result


def load_finetuned(run_dir: str | Path) -> tuple[Task, torch.nn.Module, Any, dict[str, Any]]:
    """(task, model, tokenizer, meta) of a fine-tuned run directory."""
    d = base_model_dir(run_dir)
    meta = read_json(d / "mlmkit.json")
    name = meta.get("task")
    if name in (None, "pretraining"):
        raise MlmkitError(f"{d} is a pretraining run, not a fine-tuned model", "fine-tune it first: mlmkit finetune TASK")
    task = get_task(name)
    cfg = BertConfig.load(d)
    net = task.build_model(cfg)
    load_weights(net, load_state_dict(d))
    net.eval()
    return task, net, load_tokenizer(d), meta


def evaluate_run(
    run_dir: str | Path,
    data: str | Path,
    *,
    options: dict[str, Any] | None = None,
    predictions: str | Path | None = None,
    device: str = "cpu",
) -> dict[str, float]:
    """Metrics of a fine-tuned run directory on ``data`` (PyTorch); optionally write predictions."""
    from .training import resolve_device

    task, net, tok, meta = load_finetuned(run_dir)
    net.to(resolve_device(device))
    opts = task_options(task, options or {}, saved=meta.get("options"))
    meta = {**meta, "options": opts}
    ev = TaskEvaluator(task, task.read(Path(data), **opts), tok, meta)
    metrics = ev(net)
    if predictions is not None:
        write_jsonl(predictions, ev.predictions)
    return metrics


def write_jsonl(path: str | Path, rows: list[dict[str, Any]]) -> None:
    import json

    from .checkpoint import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
