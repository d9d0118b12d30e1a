"""The one prediction loop: examples -> features -> length-bucketed batches -> a forward -> calibration
-> postprocessing -> metrics. PyTorch evaluation (train/finetune.py) and the onnxruntime runtime
(runtime/pipeline.py) both run it; they differ only in the forward function they pass.

No torch here: the runtime imports this module. A forward takes one padded batch, int64 arrays
{"input_ids", "attention_mask", "token_type_ids"} of shape (B, T), and returns the task's outputs as
numpy arrays with B rows. Batches hold features of similar length, padded to their longest only;
outputs come back in feature order, per-token outputs trimmed to each feature's length.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from mlmkit.errors import TaskError
from mlmkit.registry import (
    BATCH,
    EXAMPLE,
    LABEL,
    SEQUENCE,
    TRUNCATED,
    Example,
    Feature,
    Metrics,
    Plugin,
    Prediction,
    TaskContext,
    per_token,
)
from mlmkit.text.batching import bucket_batches, pad_features
from mlmkit.text.tokenizer import special_ids

log = logging.getLogger("mlmkit")

Forward = Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]]
Progress = Callable[[float], None]
"""Called with the number of examples (possibly fractional, for windowed tasks) each batch completed."""


@dataclass(frozen=True)
class Spread:
    """A prediction spread across ``world`` processes (torchrun's ranks, each with the same model):
    this one runs batches ``rank``, ``rank + world``, ... of the one batching, and ``gather`` (every
    process calls it together) hands each process every process's object, in rank order. Then every
    process holds all the outputs and goes on as one process would, so the metrics are one
    process's (train/finetune.py's TaskEvaluator builds it from torch.distributed)."""

    rank: int
    world: int
    gather: Callable[[Any], list[Any]]


def run_features(
    features: Sequence[Feature], forward: Forward, outputs: Mapping[str, Sequence[str]], *, pad_id: int,
    batch_size: int, max_tokens: int | None = None, run_tokens: int | None = None,
    progress: Progress | None = None,
    per_feature: float = 1.0, spread: Spread | None = None,
) -> dict[str, list[np.ndarray]]:
    """The ``outputs`` of ``forward`` for each feature, in feature order (row r of a batch output is
    the feature at that batch's position r; per-token outputs are cut to the feature's length).
    Batches: see batching.bucket_batches; with ``spread``, this process runs its share of them and
    every process gets all the outputs."""
    lengths = [len(f["input_ids"]) for f in features]
    into: dict[str, list[Any]] = {name: [None] * len(features) for name in outputs}
    mine: list[int] = []
    for n, batch in enumerate(bucket_batches(lengths, batch_size, max_tokens, run_tokens)):
        if spread is not None and n % spread.world != spread.rank:
            continue
        mine.extend(batch)
        got = forward(pad_features([features[i] for i in batch], pad_id))
        for name, axes in outputs.items():
            arr, slot, trim = got[name], into[name], per_token(axes)
            for r, i in enumerate(batch):
                slot[i] = arr[r, : lengths[i]] if trim else arr[r]
        if progress is not None:
            progress(len(batch) * per_feature)
    if spread is not None:
        for done, values in spread.gather((mine, {name: [into[name][i] for i in mine] for name in outputs})):
            for name, got_values in values.items():
                for i, v in zip(done, got_values):
                    into[name][i] = v
    return into


@dataclass
class Predicted:
    predictions: list[Prediction]
    """One per example, in order; "truncated": true where featurize cut the example."""
    ctx: TaskContext
    """The context used, with whatever ``calibrate`` returned merged into its state."""
    features: list[Feature]


def predict(
    task: Plugin, examples: list[Example], tokenizer: Any, ctx: TaskContext, forward: Forward, *,
    batch_size: int = 64, max_tokens: int | None = None, run_tokens: int | None = None,
    calibrate: bool = False,
    progress: Progress | None = None, spread: Spread | None = None,
) -> Predicted:
    """Predictions of ``forward`` for ``examples``. ``calibrate``: let the task tune its decision
    settings on these examples first (fine-tuning's evaluation set only: tuning them on the data
    being scored would flatter the score). ``spread``: the forward passes shared across processes
    (run_features), everything else done by each as by one."""
    if not examples:
        return Predicted([], ctx, [])
    if ctx.tokenizer is None:  # for the hooks that read tokens back (TaskContext)
        ctx = replace(ctx, tokenizer=tokenizer)
    features = task.featurize(examples, tokenizer, ctx, training=False)
    check_features(task, features, len(examples))
    outputs = run_features(features, forward, task.outputs, pad_id=special_ids(tokenizer).pad,
                           batch_size=batch_size,
                           max_tokens=max_tokens, run_tokens=run_tokens, progress=progress,
                           per_feature=len(examples) / max(1, len(features)), spread=spread)
    if calibrate:
        ctx = ctx.with_state(task.calibrate(outputs, features, examples, ctx))
    preds = task.postprocess(outputs, features, examples, ctx)
    if len(preds) != len(examples):
        raise TaskError(f"task '{task.name}' returned {len(preds)} predictions for {len(examples)} examples",
                        "postprocess must return one prediction per example")
    cut = sorted({f[EXAMPLE] for f in features if f.get(TRUNCATED)})
    for i in cut:
        preds[i] = {**preds[i], TRUNCATED: True}
    warn_truncated(len(cut), len(examples), ctx.max_length)
    return Predicted(preds, ctx, features)


_tally: ContextVar[list[int] | None] = ContextVar("mlmkit_truncated", default=None)


@contextmanager
def truncations_counted() -> Iterator[list[int]]:
    """Within the block (in this thread), truncated inputs are counted into the yielded [count]
    instead of a warning per call: a batch job or a server says it once, or per request."""
    box = [0]
    token = _tally.set(box)
    try:
        yield box
    finally:
        _tally.reset(token)


def warn_truncated(n: int, total: int, max_length: int) -> None:
    box = _tally.get()
    if box is not None:
        box[0] += n
    elif n:
        # "at most": a task may cut some inputs shorter than the max length (a colbert query, at query_length)
        log.warning('%d of %d inputs were truncated to at most %d tokens (their results say "truncated": '
                    'true)',
                    n, total, max_length)


WARM_UP = 8  # examples predicted once before a timed evaluation


def evaluate(
    task: Plugin, examples: list[Example], tokenizer: Any, ctx: TaskContext, forward: Forward, *,
    batch_size: int = 64, max_tokens: int | None = None, run_tokens: int | None = None,
    calibrate: bool = False,
    speed: bool = False, spread: Spread | None = None,
) -> tuple[Metrics, Predicted]:
    """The task's metrics of ``forward`` on labelled ``examples``, and the predictions behind them.
    ``speed``: also "examples_per_second", the examples over the time of their prediction (featurize,
    forward, postprocess; after a warm-up on a few of them), and "seconds"."""
    if not examples:
        raise TaskError("no examples to score", "check the evaluation data")
    if speed:  # first calls allocate and plan
        predict(task, examples[:WARM_UP], tokenizer, ctx, forward, batch_size=batch_size,
                max_tokens=max_tokens,
                run_tokens=run_tokens)
    start = time.perf_counter()
    got = predict(task, examples, tokenizer, ctx, forward, batch_size=batch_size, max_tokens=max_tokens,
                  run_tokens=run_tokens, calibrate=calibrate, spread=spread)
    took = time.perf_counter() - start
    metrics = task.compute_metrics(got.predictions, examples, got.ctx)
    if speed:
        metrics.update(examples_per_second=len(examples) / took if took > 0 else float("inf"), seconds=took)
    return metrics, got


def check_features(task: Plugin, features: list[Feature], n_examples: int, *, grouped: bool = False,
                   complete: bool = True) -> None:
    """Every feature must say which example it belongs to, and (``complete``) every example must have
    one; with ``grouped`` (a task's training features, group_features), an example's features come one
    after another: features interleaved with another example's would be merged without a word."""
    seen: set[int] = set()
    last = None
    for n, f in enumerate(features):
        i = f.get(EXAMPLE) if isinstance(f, dict) else None
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_examples:
            raise TaskError(f"task '{task.name}' ({task.distribution}): feature {n} has no valid '{EXAMPLE}' "
                            f"index ({i!r})",
                            f"featurize must set feature['{EXAMPLE}'] to the index of its example, 0 to "
                            f"{n_examples - 1}")
        if grouped and i != last and i in seen:
            raise TaskError(f"task '{task.name}' ({task.distribution}): the features of example {i} are not "
                            "together "
                            f"(feature {n} follows another example's)",
                            "featurize must give an example's features one after another (group_features)")
        seen.add(i)
        last = i
    if complete and len(seen) != n_examples:
        first = next(i for i in range(n_examples) if i not in seen)
        raise TaskError(f"task '{task.name}' ({task.distribution}): {n_examples - len(seen)} of {n_examples} "
                        "examples got no "
                        f"feature (the first: example {first})",
                        "featurize must give every example at least one feature, "
                        f"each under its own '{EXAMPLE}' index (two examples' features under one index merge "
                        "them)")


# ---- agreement of two models' outputs -----------------------------------------------------------
def _vectors(name: str, a: np.ndarray, axes: tuple[str, ...]) -> bool:
    """Whether output ``name`` holds vectors, compared by their cosine: one a row (an embedding) or
    one a token (late interaction's), not labels' scores, positions' or top terms' values."""
    shaped = len(axes) == 2 or (len(axes) == 3 and per_token(axes))
    return a.dtype.kind == "f" and shaped and axes[-1] not in (LABEL, SEQUENCE) and name not in ("values",
                                                                                                 "indices")


def real_rows(arr: np.ndarray, axes: tuple[str, ...], mask: np.ndarray) -> np.ndarray:
    """Per-token outputs at the real (unpadded) tokens only; others unchanged."""
    return arr[mask.astype(bool)] if per_token(axes) else arr  # (tokens, ...)


def decisions(name: str, a: np.ndarray, b: np.ndarray, axes: tuple[str, ...],
              mask: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The top-1 choices two models' output ``name`` stands for, side by side: argmax over its last axis
    (labels), over positions for (batch, sequence) scores (QA); for top terms ("indices": ids best
    first, -1 for none), the first id of each row (of each real token, for per-token terms) that
    either side chose (a fill-mask graph's tokens without a [MASK] choose nothing); None for an
    output that makes no choice (one number per row, such as a regression score, or top terms' values)."""
    if name == "values" or (a.dtype.kind == "f" and len(axes) == 1) or _vectors(name, a, axes):
        return None
    if name == "indices":
        da, db = (real_rows(x, axes, mask)[..., 0].reshape(-1) for x in (a, b))
        chose = (da >= 0) | (db >= 0)
        return da[chose], db[chose]
    if tuple(axes) == (BATCH, SEQUENCE):
        return np.where(mask.astype(bool), a, -np.inf).argmax(axis=1), np.where(mask.astype(bool), b,
                                                                                -np.inf).argmax(axis=1)
    return real_rows(a, axes, mask).argmax(axis=-1).reshape(-1), real_rows(b, axes,
                                                                           mask).argmax(axis=-1).reshape(-1)


def agreement(ref: Sequence[Mapping[str, np.ndarray]], got: Sequence[Mapping[str, np.ndarray]],
              axes: Mapping[str, tuple[str, ...]], masks: Sequence[np.ndarray]) -> dict[str, float | None]:
    """How far one model's outputs (int8, fp16, a distilled student) agree with another's (fp32, the
    teacher) over batches of real inputs: the top-1 agreement of the outputs that choose (among labels,
    or positions: tags, QA spans, top terms' first ids), the mean cosine of the rows of vector outputs
    (embeddings; sparse vectors as term maps are held to their top terms' ids), and the Pearson
    correlation of one-number outputs (a reranker's relevance, a regression). ``value`` is the one a
    gate reads: top-1 where the model chooses, else the cosine, else the correlation."""
    agree = total = 0
    cosines: list[np.ndarray] = []
    scores: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
    for r, g, mask in zip(ref, got, masks):
        for name, a in r.items():
            b, ax = g[name], axes[name]
            # one number a row
            if a.dtype.kind == "f" and (len(ax) == 1 or (ax[1:] == (LABEL,) and a.shape[1] == 1)):
                scores[0].append(a.reshape(-1))
                scores[1].append(b.reshape(-1))
                continue
            if _vectors(name, a, ax):  # a vector a row, or a vector a real token (late interaction)
                x, y = (real_rows(v, ax, mask).astype(np.float64) for v in (a, b))
                den = np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1)
                cosines.append(np.where(den > 0, (x * y).sum(1) / np.where(den > 0, den, 1.0), 1.0))
                continue
            chosen = decisions(name, a, b, ax, mask)
            if chosen is not None:
                agree += int((chosen[0] == chosen[1]).sum())
                total += chosen[0].size
    top1 = agree / total if total else None
    cosine = float(np.concatenate(cosines).mean()) if cosines else None
    pearson = None
    if scores[0]:
        x, y = np.concatenate(scores[0]).astype(np.float64), np.concatenate(scores[1]).astype(np.float64)
        pearson = float(np.corrcoef(x, y)[0, 1]) if len(x) > 1 and x.std() > 0 and y.std() > 0 else None
    value = top1 if top1 is not None else cosine if cosine is not None else pearson
    return {"top1": top1, "cosine": cosine, "pearson": pearson, "value": value}
