"""Which precision and engine a bundle runs in on the machine at hand, behind a quality gate. No torch.

    auto   the fastest precision this machine computes in hardware whose gate passes, else the
           bundle's own: an fp32 bundle runs in bf16 (OpenVINO) on a CPU with bf16 units (AMX,
           AVX512-BF16), in fp32 (onnxruntime) elsewhere; an int8 bundle in int8, an fp16 one in fp16
    fp32 / bf16 / fp16 / int8   that precision, or one line saying why it cannot be had here

The gate: the candidate precision against the bundle's fp32 graph (onnxruntime) on the gate's sample,
which travels in the bundle's mlmkit.json ("gate": the --calibrate inputs export read, else a sample
of random token ids of mixed lengths), measured again on each machine: the top-1 agreement of the
outputs that choose (classes, tags, spans, masked tokens), else the mean cosine of vectors, else the
Pearson correlation of scores (runtime.prediction.agreement), held to GATE_THRESHOLDS or the user's
--min-agreement. Speeds that decided the order: docs/performance.md, "Precision and engines".
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, TypeVar

import numpy as np

from mlmkit.args import PRECISIONS
from mlmkit.errors import BundleError, ConfigError, MlmkitError
from mlmkit.runtime.bundle import BundleMeta
from mlmkit.runtime.engines import BF16_FEATURES, ENGINES, cpu_feature
from mlmkit.runtime.prediction import agreement
from mlmkit.text.batching import pad_features

T = TypeVar("T")

PRECISION_ENV = "MLMKIT_PRECISION"
"""The environment variable that sets --precision where none is given (auto unless set)."""
GATE_THRESHOLDS = {"top-1 agreement": 0.99, "mean cosine": 0.999, "score correlation": 0.999}
"""Each gate measure's default threshold: bf16 kept an embedding's cosine at 0.99998 and every top-1
choice on MiniLM (docs/performance.md); below these a precision is not used."""
SAMPLE_ROWS = 24
GATE_ROWS = 32  # the --calibrate inputs kept as the gate's sample
MAX_GATE_ROWS = 256  # the most a bundle's gate sample may hold: it runs at every load of an fp32 bundle


class GateRecord(TypedDict):
    """A precision's gate (judge): what was measured, its value against the threshold, on what sample."""

    precision: str
    measure: str
    value: float | None
    threshold: float
    passed: bool
    on: str


class SessionArgs(TypedDict):
    """How every session of one bundle opens (an engine's ``open`` keywords)."""

    device: str
    threads: int | None
    spin: bool


class GateSample(TypedDict):
    """The gate's sample as mlmkit.json's "gate" keeps it (gate_sample): each row's real tokens."""

    on: str
    input_ids: list[list[int]]
    token_type_ids: list[list[int]]


Measured = dict[str, float | str | None]
"""A session's agreement with the fp32 one (measure): prediction.agreement's figures and their "measure"."""


@dataclass
class Choice:
    """What a bundle runs in: the precision, the engine, the one line that says why, the gate that let
    it (or turned it down), and the faster precisions passed over with why."""

    precision: str
    engine: str
    why: str
    gate: GateRecord | None = None
    skipped: dict[str, str] = field(default_factory=dict)


# ---- the gate's sample --------------------------------------------------------------------------
def sample_batch(
    vocab_size: int, specials: Any, max_length: int, *, rows: int = SAMPLE_ROWS, seed: int = 0
) -> dict[str, np.ndarray]:
    """Random token ids of mixed lengths (3 .. min(max_length, 128)) padded to the longest, half of
    them sentence pairs, with 1-3 [MASK] in each row but the first (what a masked LM's graph reads;
    to any other model they are tokens like the rest). Framed by the tokenizer's cls and sep where it
    has them (a Qwen3 tokenizer has no cls; one without a mask token gets no masks)."""
    rng = np.random.default_rng(seed)
    longest = max(3, min(max_length, 128))
    lengths = np.linspace(3, longest, rows).round().astype(int)
    rng.shuffle(lengths)
    words = np.setdiff1d(np.arange(vocab_size), np.asarray(specials.all))
    T = int(lengths.max())
    ids = np.full((rows, T), specials.pad, dtype=np.int64)
    mask = np.zeros((rows, T), dtype=np.int64)
    types = np.zeros((rows, T), dtype=np.int64)
    for r, n in enumerate(lengths):
        seq = rng.choice(words, size=n)
        if specials.cls is not None:
            seq[0] = specials.cls
        if specials.sep is not None:
            seq[-1] = specials.sep
        if r % 2 and n >= 5 and specials.sep is not None:  # a pair: [CLS] A [SEP] B [SEP]
            cut = n // 2
            seq[cut] = specials.sep
            types[r, cut + 1 : n] = 1
        if r > 0 and specials.mask is not None:
            inner = [i for i in range(1, n - 1) if seq[i] != specials.sep]
            for i in rng.choice(inner, size=min(len(inner), int(rng.integers(1, 4))), replace=False):
                seq[i] = specials.mask
        ids[r, :n], mask[r, :n] = seq, 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def gate_sample(batches: list[dict[str, np.ndarray]], on: str, rows: int = GATE_ROWS) -> GateSample:
    """``rows`` rows of padded ``batches``, evenly spread over them (batches are cut by length), as
    mlmkit.json's "gate" keeps them: each row's real tokens."""
    every = [(b, r) for b in batches for r in range(len(b["input_ids"]))]
    picked = sorted(set(np.linspace(0, len(every) - 1, min(rows, len(every))).round().astype(int).tolist()))
    ids, types = [], []
    for b, r in (every[i] for i in picked):
        n = int(b["attention_mask"][r].sum())
        ids.append([int(x) for x in b["input_ids"][r, :n]])
        types.append([int(x) for x in (b["token_type_ids"][r, :n] if "token_type_ids" in b
                                       else np.zeros(n, dtype=int))])
    return {"on": on, "input_ids": ids, "token_type_ids": types}


def padded(sample: Mapping[str, Any], pad_id: int) -> dict[str, np.ndarray]:
    """A gate sample (gate_sample) as one padded batch of the graph's inputs."""
    return pad_features([{"input_ids": r, "token_type_ids": t}
                         for r, t in zip(sample["input_ids"], sample["token_type_ids"])],
                        pad_id)


def _sample(meta: BundleMeta, path: Path, specials: Any) -> tuple[dict[str, np.ndarray], str]:
    """The gate's sample of a bundle, padded as one batch, and what it is; for a bundle exported before
    the gate, the random sample export would have made (``specials``: the tokenizer's special ids)."""
    g = meta.gate
    if not g:
        batch = sample_batch(meta.tokenizer.vocab_size, specials, meta.max_length)
        return (batch, f"{SAMPLE_ROWS}-input sample (random token ids, made here: the bundle carries no gate "
                       "sample)")
    ids, types = g.get("input_ids") or [], g.get("token_type_ids") or []
    V = meta.tokenizer.vocab_size
    ok = (isinstance(ids, list) and ids and isinstance(types, list) and len(types) == len(ids)
          and all(isinstance(r, list) and r and all(isinstance(x, int) and 0 <= x < V for x in r)
                  for r in ids)
          and all(isinstance(t, list) and len(t) == len(r) and all(x in (0, 1) for x in t)
                  for r, t in zip(ids, types)))
    if not ok:
        raise BundleError(f"{path / 'mlmkit.json'}: 'gate' has no sample of token ids below the vocabulary's "
                          "size", "re-create the bundle with `mlmkit export`")
    if len(ids) > MAX_GATE_ROWS or max(map(len, ids)) > meta.max_length:  # it runs at every load
        raise BundleError(f"{path / 'mlmkit.json'}: 'gate' holds {len(ids):,} rows of up to "
                          f"{max(map(len, ids)):,} tokens; a gate sample has at most {MAX_GATE_ROWS} rows of "
                          f"at most the bundle's {meta.max_length}",
                          "re-create the bundle with `mlmkit export`")
    return padded(g, meta.tokenizer.pad_id), f"{len(ids)}-input sample ({g.get('on', 'the sample batch')})"


# ---- the gate -------------------------------------------------------------------------------------
def measure(ref: Any, got: Any, batch: dict[str, np.ndarray], axes: dict[str, tuple[str, ...]],
            ref_on: tuple[str, str] = ("onnxruntime", "fp32"),
            got_on: tuple[str, str] = ("OpenVINO", "bf16")) -> Measured:
    """The agreement of session ``got`` with the fp32 session ``ref`` on ``batch``. ``ref_on``, ``got_on``:
    each session's engine and precision, which a GateRunError names when that session fails to run."""
    names = list(axes)

    def run(s: Any, on: tuple[str, str]) -> dict[str, np.ndarray]:
        feed = {i.name: batch[i.name] for i in s.get_inputs()}
        try:
            return dict(zip(names, s.run(names, feed)))
        except Exception as e:  # noqa: BLE001 - each engine raises its own types (onnxruntime's Fail ...)
            raise GateRunError(*on, e) from e

    got_ = agreement([run(ref, ref_on)], [run(got, got_on)], axes, [batch["attention_mask"]])
    kind = ("top-1 agreement" if got_["top1"] is not None else "mean cosine" if got_["cosine"] is not None
            else "score correlation")
    return {**got_, "measure": kind}


def judge(result: Mapping[str, Any], precision: str, min_agreement: float | None, on: str) -> GateRecord:
    """``result`` (measure()) held to its threshold: the gate's record (mlmkit.json's gate.PRECISION)."""
    threshold = min_agreement if min_agreement is not None else GATE_THRESHOLDS[result["measure"]]
    value = result["value"]
    passed = value is not None and not math.isnan(value) and value >= threshold
    return {"precision": precision, "measure": result["measure"], "value": value, "threshold": threshold,
            "passed": bool(passed), "on": on}


def said(g: Mapping[str, Any]) -> str:
    """A gate's record in words: "mean cosine 0.99998 >= 0.999 on the 24-input sample (...)"; a record
    edited out of shape says what it lacks rather than failing."""
    value, threshold = g.get("value"), g.get("threshold")
    if not isinstance(threshold, (int, float)) or not (value is None or isinstance(value, (int, float))):
        return "its record in mlmkit.json has no value and threshold"
    v = "nothing to compare" if value is None else f"{math.floor(value * 1e6) / 1e6:.6g}"  # rounded down
    return (f"{g.get('measure', 'agreement')} {v} {'>=' if g.get('passed') else '<'} {threshold:g} on the "
            f"{g.get('on', 'sample')}")


class GateRunError(BundleError):
    """An engine that failed to run the gate's sample (measure): which (``engine``), in what precision,
    and its own error's report, in one line."""

    def __init__(self, engine: str, precision: str, error: Exception) -> None:
        super().__init__(cannot_run(error, engine, precision),
                         "run it with --precision fp32, or re-create the bundle with `mlmkit export`")
        self.engine, self.precision = engine, precision


def cannot_run(e: Exception, engine: str = "OpenVINO", precision: str = "bf16") -> str:
    """Why ``engine`` could not read or run a graph in ``precision``, in one line (its report folded and
    cut: onnxruntime's "[ONNXRuntimeError] : 1 : FAIL :" preamble as the error's type). A GateRunError
    says the engine that failed itself."""
    if isinstance(e, GateRunError):
        return e.message
    if isinstance(e, MlmkitError):
        reason = e.message
    else:
        text = re.sub(r"^\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*\w+\s*:\s*", "", " ".join(str(e).split()))
        reason = f"{type(e).__name__}: {text}"[:200] if type(e).__module__.startswith("onnxruntime") \
            else text[:200]
    return f"{engine} cannot run it in {precision} ({reason})"


# ---- the choice ------------------------------------------------------------------------------------
def requested(precision: str | None) -> str:
    """--precision as given, else $MLMKIT_PRECISION, else auto; checked."""
    p = precision if precision is not None else os.environ.get(PRECISION_ENV) or "auto"
    if p not in PRECISIONS:
        where = f"${PRECISION_ENV}" if precision is None else "--precision"
        raise ConfigError(f"{where} {p} is not a precision", f"use one of {', '.join(PRECISIONS)}")
    return p


def bf16_unavailable(device: str) -> str | None:
    """Why this machine cannot compute bf16 through an engine, or None."""
    if device != "cpu":
        return "bf16 runs on the CPU's bf16 units; on --device cuda export with --precision fp16"
    if cpu_feature("bf16") is None:
        flags = " nor ".join(BF16_FEATURES)
        return f"this CPU has no bf16 units (neither {flags} in its flags)"
    return ENGINES["openvino"].missing()


def choose(path: Path, meta: BundleMeta, precision: str | None, make: Callable[[Any], T], *,
           device: str = "cpu",
           threads: int | None = None, spin: bool = True, min_agreement: float | None = None,
           gate: GateRecord | None = None, specials: Any = None) -> tuple[T, Choice]:
    """The precision and engine ``path``'s bundle runs in here (see the module's docstring), and what
    ``make`` (the pipeline, which checks a session against the bundle's description) makes of its
    session. Every session is checked before a gate runs on it; the fp32 session measured against is
    the one kept when bf16 is not used, and none is made when a passed ``gate`` is given. ``gate``: a passed
    gate measured already for this precision (a job's workers take the parent's); ``specials``: the
    tokenizer's special ids, for a bundle without a gate sample."""
    want = requested(precision)
    have = meta.precision
    model = path / "model.onnx"
    ort = ENGINES["onnxruntime"]
    if precision is None and want != "auto" and have != "fp32":
        want = "auto"  # $MLMKIT_PRECISION is a default: an int8 or fp16 bundle runs in its own
    if have != "fp32" or device != "cpu" or want == "fp32":
        if want not in ("auto", have):
            if have == "fp32" and want == "bf16":
                raise ConfigError(f"--precision bf16: {bf16_unavailable(device)}",
                                  "run it with --precision fp32 or auto")
            raise ConfigError(f"--precision {want}: {path} is an {have} bundle, which runs in {have} only",
                              (f"for {want}, export the run with --precision {want}" if want != "bf16"
                               else "export the run in fp32: bf16 is computed from the fp32 graph")
                              + (" (fp16 runs on --device cuda)" if want == "fp16" else ""))
        said_why = "asked for" if want == have else f"the bundle is {have}"
        return (make(ort.open(model, precision=have, device=device, threads=threads, spin=spin)),
                Choice(have, ort.name, f"{have} on {ort.name}: {said_why}"))
    if want in ("fp16", "int8"):
        hint = ("--device cuda with a bundle exported with --precision fp16" if want == "fp16"
                else "export it with --precision int8")
        raise ConfigError(f"--precision {want}: {path} is an fp32 bundle", f"for {want}, {hint}")
    pinned = meta.run_precision == "fp32" and want == "auto"
    why_not = "the bundle was exported with --precision fp32" if pinned else bf16_unavailable(device)
    recorded = meta.gate.get("bf16")
    if why_not is None and isinstance(recorded,
                                      dict) and recorded.get("passed") is False and min_agreement is None:
        why_not = f"its gate failed at export: {said(recorded)} (--min-agreement sets another threshold)"
    if why_not is not None and want == "bf16":
        raise ConfigError(f"--precision bf16: {why_not}", "run it with --precision fp32 or auto")
    ref = None  # the fp32 pipeline: made for the gate, or for running in fp32
    kw = SessionArgs(device=device, threads=threads, spin=spin)
    if why_not is None:
        # a damaged one: BundleError
        sample = None if gate is not None and gate.get("passed") else _sample(meta, path, specials)
        # outside _gated_bf16: a bundle onnxruntime refuses is an error, not a reason
        if sample is not None:
            ref = make(ort.open(model, precision="fp32", **kw))
        fast, gate, why_not = _gated_bf16(path, meta, make, ref, sample, gate, min_agreement, kw)
        if fast is not None and gate is not None:
            return fast, Choice("bf16", "openvino", f"bf16 on openvino: this CPU has {cpu_feature('bf16')}; "
                                f"its gate passed: {said(gate)}", gate)
        assert why_not is not None
        if want == "bf16":
            raise ConfigError(f"--precision bf16: {why_not}", "run it with --precision fp32 or auto"
                              + (", or set another threshold with --min-agreement" if "gate failed" in why_not
                                 else ""))
    if ref is None:
        ref = make(ort.open(model, precision="fp32", **kw))
    return ref, Choice("fp32", ort.name, f"fp32 on {ort.name}: bf16 not used: {why_not}", gate,
                       {"bf16": why_not})


def _gated_bf16(path: Path, meta: BundleMeta, make: Callable[[Any], T], ref: T | None,
                sample: tuple[dict[str, np.ndarray], str] | None, gate: GateRecord | None,
                min_agreement: float | None,
                kw: SessionArgs) -> tuple[T | None, GateRecord | None, str | None]:
    """The bf16 pipeline on OpenVINO, measured against the fp32 ``ref`` on ``sample`` (none: ``gate``
    passed already): (it, its gate, None) where the gate passes, else (None, the gate, why not). OpenVINO
    that cannot read or run the graph is a reason (fp32 then, saying so); onnxruntime that cannot run the
    fp32 reference refuses the bundle in one line naming it (fp32 would run on that same session)."""
    try:
        fast = make(ENGINES["openvino"].open(path / "model.onnx", precision="bf16", **kw))
        if sample is not None and ref is not None:
            measured = measure(ref.session, fast.session, sample[0], meta.outputs)  # type: ignore[attr-defined]
            gate = judge(measured, "bf16", min_agreement, sample[1])
    except GateRunError as e:
        if e.engine != ENGINES["onnxruntime"].name:
            return None, gate, e.message
        on = sample[1] if sample is not None else "gate's sample"
        raise BundleError(f"{path}: {e.message}, on the precision gate's {on}",
                          "re-create the bundle with `mlmkit export`, or check the onnxruntime install: it "
                          "runs the fp32 graph every precision is measured against") from None
    except Exception as e:  # noqa: BLE001 - a graph OpenVINO cannot read or run: fp32 then, saying why
        return None, gate, cannot_run(e)
    assert gate is not None  # measured, or given as passed
    if gate["passed"]:
        return fast, gate, None
    return None, gate, f"its gate failed here: {said(gate)}"
