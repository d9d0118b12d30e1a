"""onnxruntime inference on exported bundles: sessions, length-bucketed batches, the pipelines.

A loaded bundle is a callable over a list of inputs, results in input order:

    from mlmkit.runtime import Pipeline
    fill = Pipeline.load("exports/mlm")
    fill(["The capital of France is [MASK].", "A [MASK] and a [MASK]."])

No torch here, directly or indirectly (cold start under a second, PERF_NOTES): this module needs
onnxruntime, tokenizers and numpy, and the task plugins' torch-free parts (from_input, featurize,
postprocess, compute_metrics), the same code `mlmkit evaluate` runs on a PyTorch model.

Fill-mask results, one per input: {"text", "masks": [{"position", "start", "end", "candidates":
[{"token", "id", "score"}, ...]}, ...], "sequence"}. ``position`` is the token index, ``start`` /
``end`` the characters of the [MASK] in the text, ``sequence`` the text with every [MASK]
replaced by its best candidate. A text without [MASK] (or whose only [MASK] lies past the max
length) gets "masks": [] and an "error" saying so; it is never sent to the model. Inputs longer
than the max length are truncated (classification, fill-mask: "truncated": true and one warning)
or cut into windows by the task (tagging, qa).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import AddedToken

from .batching import bucket_batches, pad_features, scatter_outputs
from .errors import BundleError, ConfigError, DataFormatError
from .tokenizer import MASK, is_lowercase, load_tokenizer, special_ids

log = logging.getLogger("mlmkit")

BUNDLE_FILES = ("model.onnx", "tokenizer.json", "mlmkit.json")
COMMANDS = {"fill-mask": "fill-mask", "classification": "classify", "tagging": "tag", "qa": "qa"}
"""Bundle task -> the inference command that serves it (any task is served by `mlmkit predict`)."""
INPUT_SUFFIXES = (".txt", ".jsonl", ".csv", ".tsv")
Progress = Callable[[float], None]
"""Called with the number of inputs (possibly fractional, for windowed tasks) each batch completed."""


# ---- the bundle --------------------------------------------------------------------------------
def tokenizer_fingerprint(tok: Any) -> dict[str, Any]:
    """What a bundle's mlmkit.json records of its tokenizer and the runtime checks: a hash of the
    vocabulary (token -> id), its size, casing and the special ids the graph depends on."""
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    digest = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode("utf-8")).hexdigest()
    ids = special_ids(tok)
    return {
        "vocab_sha256": digest,
        "vocab_size": tok.get_vocab_size(),
        "lowercase": is_lowercase(tok),
        "pad_id": ids.pad,
        "mask_id": ids.mask,
    }


def read_bundle_meta(path: str | Path) -> dict[str, Any]:
    """mlmkit.json of a bundle, after checking that the bundle's three files are there."""
    d = Path(path)
    if not d.is_dir():
        raise BundleError(f"bundle not found: {d}", "pass a directory written by `mlmkit export`")
    missing = [f for f in BUNDLE_FILES if not (d / f).is_file()]
    if missing:
        raise BundleError(f"{d} lacks {', '.join(missing)}", "re-create the bundle with `mlmkit export RUN --out DIR`")
    try:
        meta = json.loads((d / "mlmkit.json").read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BundleError(f"{d / 'mlmkit.json'} is corrupted ({e})", "re-create the bundle with `mlmkit export`") from None
    keys = ("task", "max_length", "inputs", "outputs", "tokenizer")
    if not isinstance(meta, dict) or any(k not in meta for k in keys):
        lacking = [k for k in keys if not isinstance(meta, dict) or k not in meta]
        raise BundleError(f"{d / 'mlmkit.json'} is not a bundle description (no {', '.join(lacking)})",
                          "is it a run directory? export it first: mlmkit export RUN --out DIR")
    tok = meta["tokenizer"]
    if not isinstance(tok, dict) or any(not isinstance(tok.get(k), int) for k in ("pad_id", "mask_id", "vocab_size")):
        raise BundleError(f"{d / 'mlmkit.json'}: its 'tokenizer' entry is incomplete", "re-create the bundle with `mlmkit export`")
    return meta


def load_bundle_tokenizer(path: str | Path, meta: dict[str, Any]) -> Any:
    """The bundle's tokenizer, refused when it is not the one the model was exported with."""
    p = Path(path) / "tokenizer.json"
    try:
        tok = load_tokenizer(p)
    except ConfigError as e:
        raise BundleError(f"{p} is corrupted or not a tokenizer ({e.message})", "re-create the bundle with `mlmkit export`") from None
    want, have = meta["tokenizer"], tokenizer_fingerprint(tok)
    diff = [k for k in ("vocab_size", "vocab_sha256", "lowercase", "pad_id", "mask_id") if want.get(k) != have[k]]
    if diff:
        raise BundleError(
            f"{p} does not match the model: its {', '.join(diff)} differ from the exported tokenizer's "
            f"(vocabulary {have['vocab_size']} vs {want.get('vocab_size')} tokens)",
            "restore the tokenizer.json written by `mlmkit export`, or export again",
        )
    tok.no_padding()  # a tokenizer.json may carry fixed padding (PERF_NOTES); batches pad themselves
    tok.no_truncation()
    return tok


def make_session(model: str | Path, *, device: str = "cpu", threads: int | None = None) -> ort.InferenceSession:
    """An onnxruntime session on ``device`` ("cpu" or "cuda"). Without onnxruntime-gpu or without a
    GPU, "cuda" logs a warning and runs on the CPU."""
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"--device {device} is not supported", "use cpu or cuda")
    if threads is not None and threads < 1:
        raise ConfigError(f"--threads must be at least 1, got {threads}")
    providers = ["CPUExecutionProvider"]
    if device == "cuda":
        if "CUDAExecutionProvider" in ort.get_available_providers():
            providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
        else:
            log.warning("--device cuda: this onnxruntime has no CUDA execution provider (pip install onnxruntime-gpu); "
                        "running on the CPU")
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads or 0  # 0: onnxruntime's default, one per physical core
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    try:
        with warnings.catch_warnings():  # onnxruntime's own "provider not available": said below, once
            warnings.simplefilter("ignore")
            session = ort.InferenceSession(str(model), so, providers=providers)
    except Exception as e:  # onnxruntime raises its own exception types for unreadable graphs
        reason = str(e).rsplit("failed:", 1)[-1].strip()[:200]  # drop the "[ONNXRuntimeError] ... path" preamble
        raise BundleError(f"{model} is corrupted or not an ONNX model ({reason})", "re-create the bundle with `mlmkit export`") from None
    if device == "cuda" and "CUDAExecutionProvider" in providers and "CUDAExecutionProvider" not in session.get_providers():
        log.warning("--device cuda: no usable GPU for onnxruntime; running on the CPU")
    return session


# ---- pipelines ---------------------------------------------------------------------------------
class Pipeline:
    """A loaded bundle. ``Pipeline.load(path)`` returns the pipeline of the bundle's task; calling it
    on a list of inputs (texts, or records for tasks that take several fields) returns one result
    dict per input, in input order."""

    def __init__(self, path: Path, meta: dict[str, Any], tokenizer: Any, session: ort.InferenceSession, batch_size: int) -> None:
        if batch_size < 1:
            raise ConfigError(f"--batch-size must be at least 1, got {batch_size}")
        self.path, self.meta, self.tokenizer, self.session, self.batch_size = path, meta, tokenizer, session, batch_size
        self.max_length = int(meta["max_length"])
        self.pad_id = int(meta["tokenizer"]["pad_id"])
        self.input_names = [i.name for i in session.get_inputs()]
        self.output_names = [o.name for o in session.get_outputs()]
        self.axes = {k: {int(i): a for i, a in v.items()} for k, v in meta["outputs"].items()}
        lacking = [n for n in self.axes if n not in self.output_names]
        if lacking or self.input_names != list(meta["inputs"]) or "input_ids" not in self.input_names:
            raise BundleError(
                f"{path / 'model.onnx'} does not match its mlmkit.json (graph inputs {self.input_names}, outputs {self.output_names})",
                "re-create the bundle with `mlmkit export`",
            )

    @property
    def task(self) -> str:
        return str(self.meta["task"])

    @property
    def providers(self) -> list[str]:
        return list(self.session.get_providers())

    @classmethod
    def load(
        cls, path: str | Path, *, device: str = "cpu", threads: int | None = None, batch_size: int = 32, command: str | None = None
    ) -> Pipeline:
        """Load and check a bundle. ``command`` (e.g. "classify") refuses a bundle of another task."""
        d = Path(path)
        meta = read_bundle_meta(d)
        task = str(meta["task"])
        if command is not None and COMMANDS.get(task) != command:
            right = COMMANDS.get(task)
            use = f"use `mlmkit {right} {d}`" if right else f"use `mlmkit predict {d}`"
            raise BundleError(f"{d} is a {task} bundle; `mlmkit {command}` serves {_task_of(command)} bundles", use)
        tok = load_bundle_tokenizer(d, meta)
        if meta.get("precision") == "fp16" and device != "cuda":
            log.warning("%s is an fp16 bundle, made for --device cuda; on the CPU it is slow", d)
        session = make_session(d / "model.onnx", device=device, threads=threads)
        kind = FillMaskPipeline if task == "fill-mask" else TaskPipeline
        return kind(d, meta, tok, session, batch_size)

    def __call__(self, inputs: Sequence[str | dict[str, Any]], **kwargs: Any) -> list[dict[str, Any]]:
        raise NotImplementedError

    def run_batch(self, features: Sequence[dict[str, Any]]) -> dict[str, np.ndarray]:
        """One session run on features padded to their longest; token_type_ids default to zeros."""
        arrays = pad_features(features, self.pad_id)
        feed = {n: arrays[n] for n in self.input_names}
        return dict(zip(self.output_names, self.session.run(self.output_names, feed)))

    def run_features(
        self, features: Sequence[dict[str, Any]], progress: Progress | None = None, per_feature: float = 1.0
    ) -> dict[str, list[np.ndarray]]:
        """The model's outputs per feature, in feature order: length-bucketed batches padded to their
        longest member, outputs trimmed back to each feature's length where they are per token."""
        lengths = [len(f["input_ids"]) for f in features]
        into: dict[str, list[Any]] = {n: [None] * len(features) for n in self.axes}
        for batch in bucket_batches(lengths, self.batch_size):
            out = self.run_batch([features[i] for i in batch])
            scatter_outputs({n: out[n] for n in self.axes}, batch, lengths, self.axes, into)
            if progress is not None:
                progress(len(batch) * per_feature)
        return into


def _task_of(command: str) -> str:
    return next((t for t, c in COMMANDS.items() if c == command), command)


class FillMaskPipeline(Pipeline):
    """Top-k tokens for every [MASK] of each text, computed inside the graph (see export.py)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.top_k = int(self.meta.get("top_k") or 5)
        self.mask_id = int(self.meta["tokenizer"]["mask_id"])
        self.tokenizer.enable_truncation(self.max_length, strategy="longest_first")
        # a literal "[MASK]" in the text must become the mask id even for a tokenizer built from a
        # bare vocab.txt, where it is an ordinary vocabulary entry that the normaliser would split
        self.tokenizer.add_special_tokens([AddedToken(MASK, special=True, normalized=False)])
        if self.tokenizer.token_to_id(MASK) != self.mask_id:
            raise BundleError(f"{self.path / 'tokenizer.json'}: {MASK} is not token {self.mask_id}", "export the bundle again")
        self._token_text: dict[int, str] = {}

    def _token(self, i: int) -> str:
        if i not in self._token_text:
            self._token_text[i] = self.tokenizer.decode([i], skip_special_tokens=False).strip()
        return self._token_text[i]

    def __call__(
        self, inputs: Sequence[str | dict[str, Any]], *, top_k: int | None = None, progress: Progress | None = None
    ) -> list[dict[str, Any]]:
        k = self.top_k if top_k is None else top_k
        if not 1 <= k <= self.top_k:
            raise ConfigError(f"--top-k {k}: this bundle was exported with --top-k {self.top_k}",
                              f"ask for 1 to {self.top_k}, or export again with a larger --top-k")
        pairs = [_text_pair(x) for x in inputs]
        encs = self.tokenizer.encode_batch([(a, b) if b is not None else a for a, b in pairs]) if pairs else []
        results: list[dict[str, Any]] = []
        todo: list[int] = []
        for i, ((a, b), enc) in enumerate(zip(pairs, encs)):
            r: dict[str, Any] = {"text": a} if b is None else {"text": a, "text_pair": b}
            if enc.overflowing:
                r["truncated"] = True
            r["masks"] = []
            if self.mask_id in enc.ids:
                todo.append(i)
            else:
                had = (a.count(MASK) + (b or "").count(MASK)) > 0
                r["error"] = (f"no [MASK] within the first {self.max_length} tokens" if had
                              else "no [MASK] token in the text")
            results.append(r)
        _warn_truncated(sum(1 for r in results if r.get("truncated")), len(results), self.max_length)
        if progress is not None and len(todo) < len(results):
            progress(len(results) - len(todo))  # texts without [MASK] are done already
        lengths = [len(encs[i].ids) for i in todo]
        for batch in bucket_batches(lengths, self.batch_size):
            items = [todo[j] for j in batch]
            feats = [{"input_ids": encs[i].ids, "token_type_ids": encs[i].type_ids} for i in items]
            out = self.run_batch(feats)
            for (row, pos), ids, probs in zip(out["mask_positions"], out["top_ids"], out["top_probs"]):
                i = items[int(row)]
                enc = encs[i]
                start, end = enc.offsets[int(pos)]
                results[i]["masks"].append({
                    "position": int(pos), "segment": int(enc.sequence_ids[int(pos)] or 0), "start": int(start), "end": int(end),
                    "candidates": [{"token": self._token(int(t)), "id": int(t), "score": float(p)} for t, p in zip(ids[:k], probs[:k])],
                })
            if progress is not None:
                progress(len(items))
        for r in results:
            if r["masks"]:
                r["sequence"] = _fill(r["text"], [m for m in r["masks"] if m["segment"] == 0])
                if "text_pair" in r:
                    r["sequence_pair"] = _fill(r["text_pair"], [m for m in r["masks"] if m["segment"] == 1])
                for m in r["masks"]:
                    if "text_pair" not in r:
                        del m["segment"]
        return results


def _text_pair(item: str | dict[str, Any]) -> tuple[str, str | None]:
    if isinstance(item, str):
        return item, None
    if isinstance(item, dict) and isinstance(item.get("text"), str):
        pair = item.get("text_pair")
        return item["text"], pair if isinstance(pair, str) else None
    have = ", ".join(item) if isinstance(item, dict) else type(item).__name__
    raise DataFormatError("<input>", f"expected a text or a record with a 'text' field, got: {have}", field="text")


def _fill(text: str, masks: list[dict[str, Any]]) -> str:
    """``text`` with each [MASK] span replaced by its best candidate (word pieces glued on)."""
    out, last = [], 0
    for m in sorted(masks, key=lambda m: m["start"]):
        best = m["candidates"][0]["token"] if m["candidates"] else ""
        out.append(text[last : m["start"]])
        if best.startswith("##"):
            out[-1] = out[-1].rstrip()
            best = best[2:]
        out.append(best)
        last = m["end"]
    return "".join(out) + text[last:]


def _warn_truncated(n: int, total: int, max_length: int) -> None:
    if n:
        log.warning("%d of %d inputs were longer than %d tokens and were truncated (their results say \"truncated\": true)",
                    n, total, max_length)


class TaskPipeline(Pipeline):
    """Any registered task: the task's from_input / featurize / postprocess around the ONNX model."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        from .registry import get_task

        self.task_impl = get_task(self.task)

    def options(self, given: dict[str, Any] | None = None) -> dict[str, Any]:
        """The task's defaults < the options saved in the bundle < ``given``; unknown ones are an error."""
        from .registry import task_options

        return task_options(self.task_impl, given or {}, saved=self.meta.get("options"))

    def __call__(
        self, inputs: Sequence[str | dict[str, Any]], *, progress: Progress | None = None, **options: Any
    ) -> list[dict[str, Any]]:
        opts = self.options(options)
        examples = [self.task_impl.from_input(x, **opts) for x in inputs]
        return self.predict_examples(examples, opts, progress=progress)

    def predict_examples(
        self, examples: list[dict[str, Any]], opts: dict[str, Any], *, progress: Progress | None = None, calibrate: bool = False
    ) -> list[dict[str, Any]]:
        if not examples:
            return []
        meta = {**self.meta, "options": opts}
        task = self.task_impl
        features = task.featurize(examples, self.tokenizer, meta=meta, max_length=self.max_length, training=False)
        outputs = self.run_features(features, progress, per_feature=len(examples) / max(1, len(features)))
        if calibrate and getattr(task, "calibrate", None) is not None:  # as finetuning.TaskEvaluator does
            meta.update(task.calibrate(outputs, features, examples, meta=meta))
        preds = task.postprocess(outputs, features, examples, meta=meta)
        truncated = self._truncated(examples, features)
        for i in truncated:
            preds[i] = {**preds[i], "truncated": True}
        _warn_truncated(len(truncated), len(examples), self.max_length)
        return preds

    def _truncated(self, examples: list[dict[str, Any]], features: list[dict[str, Any]]) -> list[int]:
        """Examples the task cut to the max length (one feature of full length whose text encodes
        longer); windowed tasks split long inputs into several features instead and lose nothing."""
        counts: dict[int, int] = {}
        full: list[int] = []
        for f in features:
            i = f.get("example", f.get("example_index"))
            if isinstance(i, int):
                counts[i] = counts.get(i, 0) + 1
                if len(f["input_ids"]) >= self.max_length:
                    full.append(i)
        out = []
        for i in sorted(set(full)):
            ex = examples[i]
            if counts[i] != 1 or not isinstance(ex.get("text"), str):
                continue
            pair = ex.get("text_pair")
            enc = self.tokenizer.encode(ex["text"], pair) if isinstance(pair, str) else self.tokenizer.encode(ex["text"])
            if len(enc.ids) > self.max_length:
                out.append(i)
        return out

    def evaluate(
        self, data: str | Path, *, options: dict[str, Any] | None = None, predictions: str | Path | None = None
    ) -> dict[str, Any]:
        """The task's metrics on labelled ``data``: the steps of finetuning.TaskEvaluator on ONNX outputs."""
        opts = self.options(options)
        examples = self.task_impl.read(Path(data), **opts)
        # the decision settings saved at fine-tuning (QA's null threshold) are used as they are:
        # tuning them on the data being scored would flatter it (finetuning.TaskEvaluator agrees)
        preds = self.predict_examples(examples, opts)
        metrics = self.task_impl.compute_metrics(preds, examples, meta={**self.meta, "options": opts})
        if predictions is not None:
            write_jsonl(predictions, preds)
        return metrics


def evaluate_bundle(
    bundle: str | Path,
    data: str | Path,
    *,
    options: dict[str, Any] | None = None,
    predictions: str | Path | None = None,
    device: str = "cpu",
    threads: int | None = None,
) -> dict[str, Any]:
    """Score an exported bundle on labelled ``data`` with its task's metrics (onnxruntime)."""
    pipe = Pipeline.load(bundle, device=device, threads=threads)
    if not isinstance(pipe, TaskPipeline):
        raise BundleError(f"{bundle} is a {pipe.task} bundle, which has no labelled evaluation",
                          "evaluate a fine-tuned task bundle (classification, tagging, qa)")
    return pipe.evaluate(data, options=options, predictions=predictions)


# ---- inputs and outputs ------------------------------------------------------------------------
def read_inputs(path: str | Path) -> list[str | dict[str, Any]]:
    """Inputs of a file: .txt (one text per non-blank line), .jsonl (an object or a string per
    line), .csv / .tsv (a header, then one record per row)."""
    p = Path(path)
    if not p.is_file():
        raise DataFormatError(p, "file not found" if not p.exists() else "not a file", hint="check the --input path")
    suffix = p.suffix.lower()
    if suffix not in INPUT_SUFFIXES:
        raise DataFormatError(p, f"unknown input format '{p.suffix or p.name}'", hint=f"use one of: {', '.join(INPUT_SUFFIXES)}")
    try:
        text = p.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataFormatError(p, f"not valid UTF-8 (byte {e.start})", hint="re-save the file as UTF-8") from None
    return parse_inputs(text, suffix.lstrip("."), source=str(p))


def parse_inputs(text: str, kind: str, source: str = "<stdin>") -> list[str | dict[str, Any]]:
    """Inputs of ``text`` in format ``kind`` ("txt", "jsonl", "csv", "tsv")."""
    if kind == "txt":
        return [line.rstrip("\r") for line in text.split("\n") if line.strip()]
    if kind == "jsonl":
        items: list[str | dict[str, Any]] = []
        for n, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataFormatError(source, f"malformed JSON ({e.msg})", line=n, hint="one JSON object per line") from None
            if not isinstance(rec, (str, dict)):
                raise DataFormatError(source, f"expected an object or a string, got {type(rec).__name__}", line=n)
            items.append(rec)
        return items
    delimiter = "\t" if kind == "tsv" else ","
    rows = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter,
                          quoting=csv.QUOTE_NONE if kind == "tsv" else csv.QUOTE_MINIMAL)
    try:
        return [dict(r) for r in rows if any((v or "").strip() for v in r.values() if isinstance(v, str))]
    except csv.Error as e:
        raise DataFormatError(source, f"malformed {kind.upper()}: {e}", line=rows.line_num) from None


def read_stdin() -> list[str | dict[str, Any]]:
    """Inputs piped on stdin: JSON lines when every non-blank line is a JSON object or string,
    else text lines (one input per line)."""
    text = sys.stdin.read()
    return parse_inputs(text, "jsonl" if _all_json_lines(text) else "txt")


def _all_json_lines(text: str) -> bool:
    lines = [line for line in text.split("\n") if line.strip()]
    if not lines or lines[0].lstrip()[:1] not in ('{', '"'):
        return False
    try:
        return all(isinstance(json.loads(line), (str, dict)) for line in lines)
    except json.JSONDecodeError:
        return False


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")

