"""The parity gates: the exported graph against PyTorch on a sample batch, per output and per
decision, in fp32, int8 and fp16.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import torch
from torch import nn

from mlmkit.errors import ParityError
from mlmkit.models.core import set_attention_impl
from mlmkit.rundir.meta import RunMeta
from mlmkit.runtime.precision import SAMPLE_ROWS, sample_batch  # noqa: F401 - the gate's sample, made where the runtime makes it
from mlmkit.runtime.prediction import decisions, real_rows

log = logging.getLogger("mlmkit")

ATOL = 1e-4  # fp32 ONNX vs PyTorch, per output (optimum uses the same for BERT)


# ---- comparing outputs -----------------------------------------------------------------------
def sparse_diff(ref_ids: np.ndarray, ref_vals: np.ndarray, ids: np.ndarray, vals: np.ndarray) -> float:
    """The largest difference between two batches of sparse vectors (the top terms of each row: ids,
    -1 for none, and their weights), compared as maps term -> weight: a term both keep, by its
    weights; a term one side kept and the other cut, by how far its weight is above the other side's
    smallest kept weight (two near-equal terms may trade places at the cut, which is no error), or by
    its whole weight where the other side kept fewer terms than it could (it found the term zero)."""
    width, worst = ref_ids.shape[1], 0.0
    for ra, va, rb, vb in zip(ref_ids, ref_vals, ids, vals):
        a = {int(i): float(v) for i, v in zip(ra, va) if i >= 0}
        b = {int(i): float(v) for i, v in zip(rb, vb) if i >= 0}
        for k in a.keys() | b.keys():
            if k in a and k in b:
                d = abs(a[k] - b[k])
            else:
                v, other = (a[k], b) if k in a else (b[k], a)
                d = max(0.0, v - min(other.values())) if len(other) == width else v
            worst = max(worst, d)
    return worst


class Compared(TypedDict):
    """Two graphs' outputs compared (compare)."""

    max_abs_diff: dict[str, float]
    """Per float output (a sparse vector's top terms: under "values"), over the real tokens."""
    top1_agreement: float | None
    """Over the outputs that make choices; None when none does."""


class Fp16Check(TypedDict):
    """The fp16 graph against the fp32 one (check_fp16): None where the check could not run, and why."""

    fp16_top1_agreement_vs_fp32: float | None
    fp16_max_abs_diff: dict[str, float] | None
    fp16_check: str


def compare(
    ref: dict[str, np.ndarray], got: dict[str, np.ndarray], axes: dict[str, tuple[str, ...]], mask: np.ndarray
) -> Compared:
    """Max abs difference per float output (real tokens only) and the top-1 agreement over the outputs
    that make choices (None when none does). Top terms (outputs "indices" and "values": a sparse
    vector's, or each token's candidates) are compared as maps (sparse_diff), row by row (token by
    token), reported under "values"."""
    diffs: dict[str, float] = {}
    agree = total = 0
    sparse = {"indices", "values"} <= set(ref)
    if sparse:
        for name in ("indices", "values"):
            if ref[name].shape != got[name].shape:
                raise ParityError(f"output '{name}' has shape {got[name].shape} in onnxruntime but "
                                  f"{ref[name].shape} in PyTorch")
        rows = lambda name, x: real_rows(x, axes[name], mask).reshape(-1, x.shape[-1])  # noqa: E731
        diffs["values"] = sparse_diff(rows("indices", ref["indices"]).astype(np.int64),
                                      rows("values", ref["values"]),
                                      rows("indices", got["indices"]).astype(np.int64),
                                      rows("values", got["values"]).astype(np.float32))
        chosen = decisions("indices", ref["indices"], got["indices"], axes["indices"], mask)
        agree, total = int((chosen[0] == chosen[1]).sum()), chosen[0].size  # type: ignore[index]
    for name, a in ref.items():
        if sparse and name in ("indices", "values"):
            continue
        b = got[name]
        if a.shape != b.shape:
            raise ParityError(f"output '{name}' has shape {b.shape} in onnxruntime but {a.shape} in PyTorch")
        if a.dtype.kind == "f":
            diffs[name] = float(np.abs(real_rows(a, axes[name], mask)
                                       - real_rows(b.astype(np.float32), axes[name], mask)).max(initial=0.0))
        chosen = decisions(name, a, b, axes[name], mask)
        if chosen is not None:
            agree += int((chosen[0] == chosen[1]).sum())
            total += chosen[0].size
    return {"max_abs_diff": diffs, "top1_agreement": agree / total if total else None}


CALIBRATION_INPUTS = 512  # the first inputs of --calibrate: enough for stable ranges, read in seconds
CALIBRATION_BATCH = 32


def calibration_batches(path: Path, meta: RunMeta, tok: Any, pad_id: int, max_length: int,
                        inputs: tuple[str, ...]) -> list[dict[str, np.ndarray]]:
    """The first CALIBRATION_INPUTS inputs of ``path`` (any file `mlmkit predict --input` reads) as the
    graph's feeds, featurized by the bundle's task as inference will featurize them (a pretraining
    run's: the masked-LM task's, for which a text without a [MASK] is one token), in batches of
    similar length."""
    from itertools import islice

    from mlmkit.errors import ConfigError
    from mlmkit.registry import task_of
    from mlmkit.text.batching import bucket_batches, pad_features
    from mlmkit.text.records import iter_inputs

    items = [r.data for r in islice(iter_inputs(path), CALIBRATION_INPUTS)]
    if not items:
        raise ConfigError(f"--calibrate {path} has no inputs",
                          "give texts or records as `mlmkit predict --input` reads them")
    task = task_of(meta.task)
    ctx = replace(meta.context(task.resolve_options(saved=meta.options), max_length=max_length),
                  tokenizer=tok)
    features = task.featurize([task.from_input(x, ctx.options) for x in items], tok, ctx, training=False)
    lengths = [len(f["input_ids"]) for f in features]
    return [{k: v for k, v in pad_features([features[i] for i in b], pad_id).items() if k in inputs}
            for b in bucket_batches(lengths, CALIBRATION_BATCH)]


# ---- onnx steps --------------------------------------------------------------------------------
@contextlib.contextmanager
def quiet_onnxruntime() -> Iterator[None]:
    """onnxruntime's python tools log through the root logger (and configure it on first use):
    silence them during a call and leave the process's logging as it was."""
    handlers, disabled = list(logging.root.handlers), logging.root.manager.disable
    logging.disable(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(disabled)
        logging.root.handlers[:] = handlers


def onnx_session(path: Path, providers: list[str] | None = None) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=providers or ["CPUExecutionProvider"])


def run_onnx(session: Any, batch: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    feed = {i.name: batch[i.name] for i in session.get_inputs()}
    return dict(zip(names, session.run(names, feed)))


def torch_outputs(graph: nn.Module, batch: dict[str, np.ndarray], names: list[str],
                  inputs: tuple[str, ...]) -> dict[str, np.ndarray]:
    set_attention_impl(graph, "sdpa")  # the reference is the model as PyTorch runs it
    with torch.no_grad():
        out = graph(*(torch.from_numpy(batch[k]) for k in inputs))
    return {n: o.numpy() for n, o in zip(names, out)}


def check_fp16(
    path: Path, fp32_out: dict[str, np.ndarray], batch: dict[str, np.ndarray],
    axes: dict[str, tuple[str, ...]],
    names: list[str],
) -> Fp16Check:
    """The fp16 graph against the fp32 one, measured where it can run: onnxruntime's fp16 kernels of
    the fused operators exist for CUDA only, so without a usable CUDA execution provider the check is
    skipped and says why. Errors on CUDA are raised, never swallowed."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return {"fp16_top1_agreement_vs_fp32": None, "fp16_max_abs_diff": None,
                "fp16_check": "skipped: this onnxruntime has no CUDA execution provider"}
    session = onnx_session(path, ["CUDAExecutionProvider", "CPUExecutionProvider"])
    if "CUDAExecutionProvider" not in session.get_providers():
        return {"fp16_top1_agreement_vs_fp32": None, "fp16_max_abs_diff": None,
                "fp16_check": "skipped: no usable CUDA GPU"}
    h = compare(fp32_out, run_onnx(session, batch, names), axes, batch["attention_mask"])
    return {"fp16_top1_agreement_vs_fp32": h["top1_agreement"], "fp16_max_abs_diff": h["max_abs_diff"],
            "fp16_check": "measured with the CUDA execution provider"}
