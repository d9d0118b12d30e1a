"""Sequence classification: a linear head on the pooled [CLS] vector, single texts or text pairs.

Three problem types, with transformers' names (option problem_type, saved in config.json):

- single_label_classification (the default): one label per example, softmax; accuracy (the main
  metric), macro-F1, Matthews correlation and the confusion matrix;
- multi_label_classification: any number of labels per example (a JSON list, or a string split on
  label_separator), a sigmoid per label, the labels at or over ``threshold``; micro-F1 (main),
  macro-F1 and subset accuracy;
- regression: one number per example (num_labels 1), the raw score; Pearson (main), Spearman, MSE.

Data: CSV or TSV with a header, or JSONL; a text column, an optional second text (segment B of a
pair) and a label column, all renamable (options text_column, pair_column, label_column).

The model is transformers' BertForSequenceClassification under the same parameter names
(bert.*, classifier.*), so a run directory loads there unchanged, and a directory transformers
wrote exports as this task. No torch at module level: the ONNX runtime imports this file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mlmkit.taskkit import (
    BATCH,
    EXAMPLE,
    LABEL,
    MAX_RECORD_BYTES,
    TRUNCATED,
    CheckpointInfo,
    ConfigError,
    DataFormatError,
    Example,
    Feature,
    HFConfig,
    Input,
    Metrics,
    Prediction,
    Record,
    TaskContext,
    TaskOption,
    clip_text,
    data_format,
    iter_jsonl,
    iter_records,
    tokenizer_settings,
)
from mlmkit_tasks.classification_metrics import multi_label_metrics, regression_metrics, single_label_metrics

if TYPE_CHECKING:  # the config type is torch's side (models/); a task imports torch in build_model only
    from mlmkit.model import ModelConfig

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl"}
SINGLE, MULTI, REGRESSION = "single_label_classification", "multi_label_classification", "regression"
HF_ARCHITECTURE = "BertForSequenceClassification"


# ---- reading -----------------------------------------------------------------------------------
def _label(rec: Record, opts: Mapping[str, Any]) -> str | list[str] | float:
    """The gold label of a record for the problem type: a string, a list of strings, or a number."""
    field, kind = opts["label_column"], opts["problem_type"]
    value = rec.fields().get(field)
    if value is None:
        rec.text(field, flag="--label-column")  # raises the missing-field error
    if kind == REGRESSION:
        try:
            x = float(value) if value is not None and not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            x = math.nan
        if not math.isfinite(x):
            raise rec.error(f"a regression label must be a finite number, not {value!r}", field)
        return x
    if kind == MULTI:
        items = (value if isinstance(value, list) else str(value).split(opts["label_separator"])
                 if isinstance(value, str) else [value])
        labels = [_label_str(rec, field, v) for v in items if not (isinstance(v, str) and not v.strip())]
        return sorted(set(labels))
    label = _label_str(rec, field, value)
    if not label:
        raise rec.error("empty label", field, "every example needs a label")
    return label


def _label_str(rec: Record, field: str, value: Any) -> str:
    """JSON labels may be strings, numbers or booleans; all become strings ("1", "true")."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, (bool, int, float)):
        return json.dumps(value)
    raise rec.error(f"a label must be a string or a number, not {type(value).__name__}", field)


def _example(rec: Record, opts: Mapping[str, Any], *, labelled: bool) -> Example:
    """{"text", ["text_pair"], ["label"]} of a record. The pair column is used when a record has it;
    naming one with --pair-column makes it required."""
    pair_named = opts["pair_column"] != "text_pair"
    ex: Example = {"text": rec.text(opts["text_column"], flag="--text-column")}
    pair = rec.text(opts["pair_column"], required=pair_named, flag="--pair-column")
    if pair is not None:
        ex["text_pair"] = pair
    if labelled:
        ex["label"] = _label(rec, opts)
    return ex


# ---- labels ------------------------------------------------------------------------------------
def _label_ids(examples: list[Example], ctx: TaskContext) -> dict[str, int]:
    """label -> id of the run; a gold label the model never saw is a data error (file, line)."""
    if not ctx.labels:
        raise ConfigError("the run has no label list (mlmkit.json 'labels')",
                          "fine-tune it with the classification task")
    ids = {lab: i for i, lab in enumerate(ctx.labels)}
    if ctx.options["problem_type"] == REGRESSION:
        return ids
    for ex in examples:
        gold = ex.get("label")
        for lab in ([] if gold is None else gold if isinstance(gold, list) else [gold]):
            if lab not in ids:
                shown = ", ".join(ctx.labels[:20]) + (f", ... ({len(ctx.labels)} in all)" if len(ctx.labels)
                                                      > 20 else "")
                raise DataFormatError(
                    ex.get("source", "<input>"),
                    f"label '{lab}' was not in the training data; the model knows: {shown}",
                    line=ex.get("line"), field=ctx.options.get("label_column", "label"),
                    hint="evaluate on data with the training labels, or fine-tune with this label",
                )
    return ids


def _sort_key(labels: set[str]) -> Any:
    """Integer-looking labels in numeric order (2 before 10), anything else as strings."""
    try:
        for lab in labels:
            int(lab)
    except ValueError:
        return None
    return int


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


# ---- the inference form ------------------------------------------------------------------------
def cls_only(model: Any) -> Any:
    """The same outputs, the last layer computed for [CLS] only where the head reads [CLS] alone (not
    ModernBERT's mean pooling): heads/classification.py's ClsOnlyGraph. The reranker's too."""
    from mlmkit.model import reads_cls_only
    from mlmkit_tasks.heads.classification import ClsOnlyGraph

    return ClsOnlyGraph(model) if reads_cls_only(model.bert) else model


class ClassificationTask:
    name = "classification"
    description = ("Sequence classification of single texts or text pairs ([CLS] head): single-label, "
                   "multi-label, regression.")
    formats = ("csv", "tsv", "jsonl")
    metrics = ("accuracy", "macro_f1", "mcc")
    outputs = {"logits": (BATCH, LABEL)}
    options = (
        TaskOption("text_column", "text", "The text column / field.", flags=("--text-column",)),
        TaskOption("pair_column", "text_pair", "The second text of a pair (used when present).",
                   flags=("--pair-column",)),
        TaskOption("label_column", "label", "The label column / field.", flags=("--label-column",)),
        TaskOption("problem_type", SINGLE,
                   "single_label_classification, multi_label_classification or regression.",
                   choices=(SINGLE, MULTI, REGRESSION), fixed=True, flags=("--problem-type",)),
        TaskOption("threshold", 0.5, "multi-label: the probability from which a label is predicted.",
                   minimum=0.0, flags=("--threshold",)),
        TaskOption("label_separator", ",",
                   "multi-label: what separates the labels of a text field (JSON lists need none)."),
    )
    hf_architecture = HF_ARCHITECTURE
    pipeline_tag = "text-classification"
    command = "classify"
    partial_layers = 1  # export_module computes the last layer for [CLS] only

    def read(self, path: Path, options: Mapping[str, Any], *,
             max_bytes: int | None = MAX_RECORD_BYTES) -> list[Example]:
        """Labelled examples {"text", ["text_pair"], "label", "line", "source"} of a CSV/TSV/JSONL file."""
        fmt = data_format(path, FORMATS)
        records = (iter_jsonl(path, max_bytes=max_bytes) if fmt == "jsonl"  # JSON lines: objects only
                   else iter_records(path, fmt, max_bytes=max_bytes))
        examples = [{**_example(rec, options, labelled=True), "line": rec.line, "source": rec.source}
                    for rec in records]
        if not examples:
            raise DataFormatError(path, "no examples",
                                  hint="the file needs a header and at least one labelled row")
        return examples

    def from_input(self, item: Input, options: Mapping[str, Any]) -> Example:
        """A text, or a record with the text (and pair) fields."""
        if isinstance(item, str):
            if not item.strip():
                raise DataFormatError("<input>", "empty text",
                                      hint="give a text to classify, or leave the input out")
            return {"text": item}
        return _example(Record("<input>", None, item), options, labelled=False)

    def label_list(self, examples: list[Example]) -> list[str]:
        if isinstance(examples[0]["label"], float):
            return ["score"]  # regression: one output
        found = {lab for ex in examples
                 for lab in (ex["label"] if isinstance(ex["label"], list) else [ex["label"]])}
        return sorted(found, key=_sort_key(found))

    def hf_config(self, ctx: TaskContext) -> HFConfig:
        return {"problem_type": ctx.options["problem_type"]}

    def main_metric(self, ctx: TaskContext) -> str:
        return {SINGLE: "accuracy", MULTI: "micro_f1", REGRESSION: "pearson"}[ctx.options["problem_type"]]

    def from_hf(self, config: ModelConfig, directory: Path) -> CheckpointInfo | None:
        """transformers' BertForSequenceClassification: labels from id2label, the problem type from
        config.json (as transformers infers it when absent: regression for one label)."""
        if HF_ARCHITECTURE not in (config.architectures or []):
            return None
        kind = config.extra.get("problem_type") or (REGRESSION if config.num_labels == 1 else SINGLE)
        id2label = config.id2label or {}
        labels = [id2label[i] for i in sorted(id2label)] or None
        return {"labels": labels, "options": {"problem_type": kind}}

    def featurize(self, examples: list[Example], tokenizer: Any, ctx: TaskContext, *,
                  training: bool) -> list[Feature]:
        """One feature per example: [CLS] A [SEP] (B [SEP]) truncated to the max length."""
        unlabelled = [ex for ex in examples if ex.get("label") is None]
        if training and unlabelled:
            ex = unlabelled[0]
            raise DataFormatError(ex.get("source", "<input>"), "no label", line=ex.get("line"), field="label")
        # gold labels, where there are any (evaluation data), must be ones the model was trained on
        ids = _label_ids(examples, ctx) if len(unlabelled) < len(examples) else {}
        L, kind = ctx.max_length, ctx.options["problem_type"]
        inputs = [(clip_text(ex["text"], tokenizer, L), clip_text(ex["text_pair"], tokenizer, L))
                  if ex.get("text_pair") is not None else clip_text(ex["text"], tokenizer, L)
                  for ex in examples]
        with tokenizer_settings(tokenizer, max_length=L) as tok:
            encodings = tok.encode_batch(inputs) if inputs else []
        features = []
        for i, (ex, enc) in enumerate(zip(examples, encodings)):
            f: Feature = {"input_ids": enc.ids, "token_type_ids": enc.type_ids, EXAMPLE: i}
            if enc.overflowing:
                f[TRUNCATED] = True
            if training:
                if kind == MULTI:  # a fixed-size vector (numpy): one 0/1 per label
                    f["labels"] = np.zeros(len(ids), dtype=np.float32)
                    f["labels"][[ids[lab] for lab in ex["label"]]] = 1.0
                else:
                    f["labels"] = float(ex["label"]) if kind == REGRESSION else ids[ex["label"]]
            features.append(f)
        return features

    def build_model(self, config: ModelConfig, ctx: TaskContext) -> Any:
        """transformers' *ForSequenceClassification of the config's family, on mlmkit's encoder."""
        from mlmkit.model import BertForLabels

        kind = ctx.options["problem_type"]
        least = 1 if kind != SINGLE else 2
        if config.num_labels < least or (kind == REGRESSION and config.num_labels != 1):
            raise ConfigError(f"{kind} needs {'exactly one' if kind == REGRESSION else f'at least {least}'} "
                              "label(s), "
                              f"the config has {config.num_labels}",
                              "check the training data's labels and --problem-type")
        return BertForLabels(config, per_token=False, problem_type=kind)

    def export_module(self, model: Any) -> Any:
        """The same outputs, the last layer computed for [CLS] only (cls_only)."""
        return cls_only(model)

    def postprocess(
        self, outputs: dict[str, list[np.ndarray]], features: list[Feature], examples: list[Example],
        ctx: TaskContext
    ) -> list[Prediction]:
        """single-label: {"label", "score", "probabilities": {label: p}}; multi-label: {"labels": [...],
        "probabilities": {label: p}}; regression: {"score"}. One feature per example."""
        labels, kind = list(ctx.labels or ()), ctx.options["problem_type"]
        preds: list[Prediction] = [{} for _ in examples]
        for f, logits in zip(features, outputs["logits"]):
            x = np.asarray(logits, dtype=np.float64)
            if kind == REGRESSION:
                preds[f[EXAMPLE]] = {"score": float(x[0])}
            elif kind == MULTI:
                p = 1.0 / (1.0 + np.exp(-x))
                chosen = [lab for lab, q in zip(labels, p) if q >= ctx.options["threshold"]]
                preds[f[EXAMPLE]] = {"labels": chosen, "probabilities": dict(zip(labels, map(float, p)))}
            else:
                p = _softmax(x)
                best = int(p.argmax())
                preds[f[EXAMPLE]] = {"label": labels[best], "score": float(p[best]),
                                     "probabilities": dict(zip(labels, map(float, p)))}
        return preds

    def compute_metrics(self, predictions: list[Prediction], examples: list[Example],
                        ctx: TaskContext) -> Metrics:
        """single-label: accuracy, macro_f1 (over the labels present in gold or predictions), mcc (0.0
        when undefined), and the confusion matrix (rows gold, columns predicted, in the run's label
        order); multi-label: micro_f1, macro_f1, subset_accuracy; regression: pearson, spearman, mse."""
        if not examples:
            raise ConfigError("no examples to score", "check the evaluation data")
        _label_ids(examples, ctx)
        kind = ctx.options["problem_type"]
        if kind == REGRESSION:
            return regression_metrics([p["score"] for p in predictions], [ex["label"] for ex in examples])
        if kind == MULTI:
            return multi_label_metrics([p["labels"] for p in predictions], [ex["label"] for ex in examples],
                                       list(ctx.labels or ()))
        return single_label_metrics([p["label"] for p in predictions], [ex["label"] for ex in examples],
                                    list(ctx.labels or ()))

    def summary(self, prediction: Prediction) -> dict[str, str]:
        if "labels" in prediction:
            return {"labels": ", ".join(prediction["labels"]) or "(none)"}
        if "label" in prediction:
            return {"label": prediction["label"], "score": f"{prediction['score']:.3f}"}
        return {"score": f"{prediction['score']:.4f}"}


task = ClassificationTask()
