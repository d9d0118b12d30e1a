"""onnxruntime inference on exported bundles: sessions, length-bucketed batches, the pipelines.

A loaded bundle is a callable over a list of inputs, results in input order:

    from mlmkit.runtime.pipeline import Pipeline
    fill = Pipeline.load("exports/mlm")  # a fill-mask bundle, exported from a pretraining run
    fill(["The capital of France is [MASK].", "A [MASK] and a [MASK]."], top_k=3)

No torch here, directly or indirectly (cold start under a second: docs/performance.md, "Cold start"): this
module needs onnxruntime, tokenizers and numpy, and the task plugins' torch-free parts (from_input, featurize,
postprocess, compute_metrics), the same code `mlmkit evaluate` runs on a PyTorch model.

Inputs longer than the max length are truncated (their results say "truncated": true, with one
warning) or cut into windows by the task (tagging, qa).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, overload

import numpy as np

from mlmkit.errors import BundleError, ConfigError, DataFormatError, MlmkitError
from mlmkit.files import JSONObject, write_jsonl
from mlmkit.registry import (
    EXAMPLE,
    LABEL,
    Input,
    Metrics,
    Plugin,
    Prediction,
    TaskContext,
    get_task,
    tasks_for_command,
)
from mlmkit.runtime import prediction
from mlmkit.runtime.bundle import (
    DYNAMIC_AXES,
    LABELS_KEY,
    TASK_OUTPUT_TYPE,
    BundleMeta,
    load_bundle_tokenizer,
    read_bundle_meta,
)
from mlmkit.runtime.engines import make_session  # noqa: F401 - its home was here: benchmarks import it from here
from mlmkit.runtime.precision import Choice, GateRecord, choose
from mlmkit.runtime.prediction import Progress
from mlmkit.text.tokenizer import special_ids

log = logging.getLogger("mlmkit")

CPU_BATCH_ACTIVATIONS = 196_608
"""On the CPU a batch ends before rows x longest x hidden size passes this (512 tokens at hidden
384, 256 at hidden 768): batches whose activations stay in the cores' caches run faster than
batches of 32 at any length (docs/performance.md, "Tuning", has the figures). On CUDA, batches are
cut by count only."""

CPU_RUN_TOKENS = 16
"""On the CPU one onnxruntime run costs a fixed time, the weights read from memory once, plus a time
per padded token: a run is worth 10 to 28 tokens of padding whatever the model's size (both terms
grow with its weights; benchmarks/batch_cuts.py fits them). The batches of a call are cut where that
costs least (batching.bucket_batches; docs/performance.md, "Tuning")."""

BF16_BATCH_ACTIVATIONS = 786_432
BF16_RUN_TOKENS = 128
"""The same two cuts for an fp32 bundle computed in bf16 by OpenVINO on AMX: the matrix products are
about 3x cheaper, so a run's fixed cost is worth more tokens and larger batches pay (2,048 tokens at
hidden 384; docs/performance.md, "Precision and engines")."""
CPU_CUTS = {"onnxruntime": (CPU_BATCH_ACTIVATIONS, CPU_RUN_TOKENS),
            "openvino": (BF16_BATCH_ACTIVATIONS, BF16_RUN_TOKENS)}
"""Each engine's (activations of a batch, tokens a run is worth) on the CPU."""


# ---- pipelines ---------------------------------------------------------------------------------
T = TypeVar("T")


class Pipeline:
    """A loaded bundle of any registered task: prediction's loop with the onnxruntime session as the
    forward. ``Pipeline.load(path)`` loads and checks one; calling it on a list of inputs (texts, or
    records for tasks that take several fields) returns one result dict per input, in input order.
    Runtime options (the task's declared options) are keyword arguments; the bundle's saved options
    are their defaults."""

    def __init__(self, path: Path, meta: BundleMeta, tokenizer: Any, session: Any, batch_size: int,
                 plugin: Plugin) -> None:
        if batch_size < 1:
            raise ConfigError(f"--batch-size must be at least 1, got {batch_size}")
        self.path, self.meta, self.tokenizer, self.session, self.batch_size = (path, meta, tokenizer, session,
                                                                               batch_size)
        self.plugin = plugin
        self.batch_tokens: int | None = None  # batching.bucket_batches' max_tokens; set by load
        self.run_tokens: int | None = None  # and its run_tokens (the CPU's cost of one more run); set by load
        self.device = "cpu"
        self.choice: Choice | None = None  # the precision and engine it runs in, and why; set by load
        self.max_length = meta.max_length
        self.pad_id = meta.tokenizer.pad_id
        self.input_names = [i.name for i in session.get_inputs()]
        self.output_names = [o.name for o in session.get_outputs()]
        self.outputs = dict(meta.outputs)
        lacking = [n for n in meta.outputs if n not in self.output_names]
        if lacking or self.input_names != list(meta.inputs) or "input_ids" not in self.input_names:
            raise BundleError(
                f"{path / 'model.onnx'} does not match its mlmkit.json (graph inputs {self.input_names}, "
                f"outputs {self.output_names})",
                "re-create the bundle with `mlmkit export`",
            )
        self._check_outputs(session)
        self._check_labels(session)
        plugin.resolve_options({}, saved=meta.options, model=True)  # its saved options, checked once
        if self.outputs != plugin.outputs:  # e.g. a description edited to name another task
            raise BundleError(
                f"{path} is described as a {plugin.name} bundle, but its outputs {dict(self.outputs)} are "
                "not the task's "
                f"{dict(plugin.outputs)}", "re-create the bundle with `mlmkit export`")

    def _check_outputs(self, session: Any) -> None:
        """The graph's outputs against the description: as many axes as declared, the element type the
        pipeline reads, a varying size on every varying axis and the declared size on the fixed ones (a
        label axis has one entry per label: a label list that does not fit the head would label every
        input wrongly, silently)."""
        labels, desc = self.meta.labels, self.path / "mlmkit.json"
        graph = {o.name: o for o in session.get_outputs()}
        for name, axes in self.meta.outputs.items():
            out = graph[name]
            dims = list(out.shape or [])
            if dims and len(dims) != len(axes):
                raise BundleError(f"{desc}: its 'outputs' give '{name}' the axes {list(axes)}, but the "
                                  f"model's '{name}' "
                                  f"has {len(dims)} ({dims})", "re-create the bundle with `mlmkit export`")
            if out.type != TASK_OUTPUT_TYPE:
                raise BundleError(f"{self.path / 'model.onnx'}: its output '{name}' is {out.type}, the "
                                  "runtime reads "
                                  f"{TASK_OUTPUT_TYPE}",
                                  "re-create the bundle with `mlmkit export`")
            for axis, dim in zip(axes, dims):
                if axis == LABEL and isinstance(dim, int) and (labels is None or dim != len(labels)):
                    raise BundleError(
                        f"{desc} lists {len(labels or [])} labels but the model's '{name}' has {dim}",
                        "re-create the bundle with `mlmkit export`",
                    )
                if isinstance(dim, int) and axis in DYNAMIC_AXES:
                    raise BundleError(f"{desc}: the model's '{name}' has a size of {dim} along its '{axis}' "
                                      "axis, "
                                      "whose size varies from run to run",
                                      "re-create the bundle with `mlmkit export`")

    def _check_labels(self, session: Any) -> None:
        """The labels against the order the head was trained with, which export records in the graph
        (LABELS_KEY); a bundle from before that is checked by its label count alone (_check_outputs)."""
        recorded = session.get_modelmeta().custom_metadata_map.get(LABELS_KEY)
        if recorded is None:
            return
        try:
            trained = json.loads(recorded)
        except ValueError:
            raise BundleError(f"{self.path / 'model.onnx'}: its recorded labels are damaged",
                              "re-create the bundle with `mlmkit export`") from None
        labels = list(self.meta.labels) if self.meta.labels is not None else None
        if trained != labels:
            raise BundleError(
                f"{self.path / 'mlmkit.json'}: its 'labels' {labels} are not the labels the model was "
                "trained with, "
                f"in that order ({trained}, recorded in model.onnx)",
                "restore the bundle's own mlmkit.json, or re-create the bundle with `mlmkit export`",
            )

    @property
    def task(self) -> str:
        return self.meta.task

    @property
    def providers(self) -> list[str]:
        return list(self.session.get_providers())

    @property
    def precision(self) -> str:
        """The precision it computes in (bf16 for an fp32 bundle run by OpenVINO on bf16 units)."""
        return self.choice.precision if self.choice is not None else self.meta.precision

    @classmethod
    def load(
        cls, path: str | Path, *, device: str = "cpu", threads: int | None = None, batch_size: int = 32,
        batch_tokens: int | None = None, spin: bool = True, command: str | None = None,
        precision: str | None = None,
        min_agreement: float | None = None, gate: GateRecord | None = None,
    ) -> Pipeline:
        """Load and check a bundle. ``command`` (e.g. "classify") refuses a bundle that command does not
        serve. ``batch_tokens``: the most padded tokens in one onnxruntime batch (0: no limit; default:
        CPU_CUTS' activations of its engine over the hidden size on the CPU, no limit on CUDA). ``spin``: see
        make_session. ``precision``: auto (default: $MLMKIT_PRECISION, else auto), fp32, bf16, fp16 or int8,
        held to the gate (``min_agreement``: its threshold) as mlmkit.runtime.precision.choose says; ``gate``:
        a passed gate of that precision measured already (a job's workers take their parent's)."""
        if batch_tokens is not None and batch_tokens < 0:
            raise ConfigError(f"--batch-tokens must be 0 (no limit) or more, got {batch_tokens}")
        d = Path(path)
        meta = read_bundle_meta(d)
        task = meta.task
        plugin = get_task(task)
        if command is not None:
            serves = plugin.command
            if serves != command:
                which = " or ".join(tasks_for_command(command)) or "no registered task's"
                use = f"use `mlmkit {serves} {d}`" if serves else f"use `mlmkit predict {d}`"
                raise BundleError(f"{d} is a {task} bundle; `mlmkit {command}` serves {which} bundles", use)
        tok = load_bundle_tokenizer(d, meta)
        if meta.precision == "fp16" and device != "cuda":
            log.warning("%s is an fp16 bundle, made for --device cuda; on the CPU it is slow", d)

        def make(session: Any) -> Pipeline:  # the checks of a session against the description run here
            return Pipeline(d, meta, tok, session, batch_size, plugin)

        pipe, choice = choose(d, meta, precision, make, device=device, threads=threads, spin=spin,
                              min_agreement=min_agreement, gate=gate, specials=special_ids(tok))
        pipe.device, pipe.choice = device, choice
        (log.info if choice.skipped or choice.precision == "bf16" else log.debug)("%s: %s", d, choice.why)
        hidden = meta.model.hidden_size
        activations, run_tokens = CPU_CUTS[choice.engine]
        if batch_tokens is not None:
            pipe.batch_tokens = batch_tokens or None
        elif "CUDAExecutionProvider" not in pipe.providers and isinstance(hidden, int) and hidden > 0:
            pipe.batch_tokens = max(1, activations // hidden)
        if "CUDAExecutionProvider" not in pipe.providers:
            pipe.run_tokens = run_tokens
        return pipe

    def identity(self) -> JSONObject:
        """What a resumed job must find unchanged of its bundle: the path, the graph's size and time,
        and a hash of its description."""
        g = (self.path / "model.onnx").stat()
        desc = hashlib.sha256((self.path / "mlmkit.json").read_bytes()).hexdigest()
        return {"path": str(self.path.resolve()), "model_bytes": g.st_size, "model_mtime_ns": g.st_mtime_ns,
                "mlmkit_json_sha256": desc}

    @staticmethod
    def _each(inputs: Sequence[Any], first: int, convert: Callable[[Any], Any],
              errors: dict[int, MlmkitError] | None) -> tuple[list[int], list[Any]]:
        """(positions kept, converted inputs): a bad input's DataFormatError names it by number, and
        is raised, or recorded in ``errors`` with the input left out."""
        kept, out = [], []
        for i, x in enumerate(inputs):
            try:
                out.append(convert(x))
                kept.append(i)
            except DataFormatError as e:
                bad = DataFormatError(f"input {first + i}", e.detail, field=e.field,
                                      hint=e.hint) if e.path == "<input>" else e
                if errors is None:
                    raise bad from None
                errors[i] = bad
        return kept, out

    @staticmethod
    def _aligned(n: int, kept: list[int], results: list[T]) -> list[T | None]:
        """``results`` of the inputs ``kept``, at their positions among ``n`` inputs; None for the others."""
        out: list[T | None] = [None] * n
        for i, r in zip(kept, results):
            out[i] = r
        return out

    def context(self, options: Mapping[str, Any] | None = None) -> TaskContext:
        """The task's context: the bundle's labels and saved state; its defaults < the options saved
        in the bundle < ``options`` (an option the task lacks is an error)."""
        return self.meta.context(self.plugin.resolve_options(options, saved=self.meta.options, model=True))

    @overload
    def __call__(self, inputs: Sequence[Input], *, progress: Progress | None = ..., first: int = ...,
                 errors: None = ..., tokens: list[int] | None = ..., **options: Any) -> list[Prediction]: ...
    @overload
    def __call__(self, inputs: Sequence[Input], *, progress: Progress | None = ..., first: int = ...,
                 errors: dict[int, MlmkitError], tokens: list[int] | None = ...,
                 **options: Any) -> list[Prediction | None]: ...
    def __call__(self, inputs: Sequence[Input], *, progress: Progress | None = None, first: int = 1,
                 errors: dict[int, MlmkitError] | None = None, tokens: list[int] | None = None,
                 **options: Any) -> list[Prediction] | list[Prediction | None]:
        """One result per input, in order. ``first``: the number of the first input, for messages
        ("input 7: empty text"); ``errors``: collect a bad input's error here, by its position, and
        give None for it instead of stopping; ``tokens``: filled with each input's tokens, the ones
        the model ran on (special tokens and a prompt included, a window's each time; a bad input 0):
        a server's ``usage`` without tokenizing again."""
        ctx = self.context(options)
        kept, examples = self._each(inputs, first, lambda x: self.plugin.from_input(x, ctx.options), errors)
        got = prediction.predict(self.plugin, examples, self.tokenizer, ctx, self.run_batch,
                                 batch_size=self.batch_size,
                                 max_tokens=self.batch_tokens, run_tokens=self.run_tokens, progress=progress)
        if tokens is not None:
            counts = [0] * len(examples)
            for f in got.features:
                counts[f[EXAMPLE]] += len(f["input_ids"])
            tokens[:] = [c or 0 for c in self._aligned(len(inputs), kept, counts)]
        preds = got.predictions
        return preds if len(kept) == len(inputs) else self._aligned(len(inputs), kept, preds)

    @property
    def option_names(self) -> tuple[str, ...]:
        """The runtime options this bundle's task takes (keyword arguments of a call)."""
        return tuple(o.name for o in self.plugin.options)

    def check(self, inputs: Sequence[Any], options: Mapping[str, Any] | None = None) -> None:
        """Raise the error that calling the pipeline on ``inputs`` with ``options`` would raise for a
        bad option or input ("input 3: ..."), without running the model (a server answers 4xx with it)."""
        ctx = self.context(options)
        self._each(inputs, 1, lambda x: self.plugin.from_input(x, ctx.options), None)

    def summary(self, result: Prediction) -> dict[str, str]:
        """Table columns for one result (the CLI on a terminal)."""
        return self.plugin.summary(result)

    def run_batch(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One session run on a padded batch (the prediction loop's forward)."""
        feed = {n: batch[n] for n in self.input_names}
        out = dict(zip(self.output_names, self.session.run(self.output_names, feed)))
        return out

    def evaluate(
        self, data: str | Path, *, options: Mapping[str, Any] | None = None,
        predictions: str | Path | None = None,
        speed: bool = False,
    ) -> Metrics:
        """The task's metrics on labelled ``data``, the decision settings saved at fine-tuning used as
        they are (tuning them on the data being scored would flatter it). ``speed``: with the
        examples per second of the prediction (prediction.evaluate) and the model's bytes."""
        ctx = self.context(options)
        metrics, got = prediction.evaluate(self.plugin, self.plugin.read(Path(data), ctx.options),
                                           self.tokenizer, ctx,
                                           self.run_batch, batch_size=self.batch_size,
                                           max_tokens=self.batch_tokens,
                                           run_tokens=self.run_tokens, speed=speed)
        if speed:
            metrics["model_bytes"] = (self.path / "model.onnx").stat().st_size
        if predictions is not None:
            write_jsonl(predictions, got.predictions)
        return metrics


def evaluate_bundle(
    bundle: str | Path,
    data: str | Path,
    *,
    options: Mapping[str, Any] | None = None,
    predictions: str | Path | None = None,
    device: str = "cpu",
    threads: int | None = None,
    speed: bool = False,
) -> Metrics:
    """Score an exported bundle on labelled ``data`` with its task's metrics (onnxruntime); ``speed``:
    with its examples per second and bytes (Pipeline.evaluate)."""
    pipe = Pipeline.load(bundle, device=device, threads=threads)
    return pipe.evaluate(data, options=options, predictions=predictions, speed=speed)


# ---- inputs ------------------------------------------------------------------------------------
def read_inputs(path: str | Path) -> list[Input]:
    """All the inputs of a file, a directory or a glob of shards (records.iter_inputs streams them):
    .txt (one text per non-blank line), .jsonl (an object or a string per line), .csv / .tsv (a
    header, then one record per row), .parquet (a record per row)."""
    from mlmkit.text.records import iter_inputs

    return [r.data for r in iter_inputs(path)]
