"""Sequence classification: a linear head on the pooled [CLS] vector, single texts or text pairs.

Data: CSV or TSV with a header, or JSONL; a text column, an optional second text (segment B of a
pair) and a label column, all renamable (options text_column, pair_column, label_column). Labels
are strings, read from the training data; the core stores them as config.json's id2label.
Metrics: accuracy (the main one), macro-F1 and Matthews correlation (scikit-learn), plus the
confusion matrix for the CLI's table.

The model is transformers' BertForSequenceClassification under the same parameter names
(bert.*, classifier.*), so a run directory loads there unchanged. No torch at module level: the
ONNX runtime imports this file for from_input / featurize / postprocess.
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlmkit.taskkit import (
    BATCH,
    EXAMPLE,
    LABEL,
    TRUNCATED,
    ConfigError,
    DataFormatError,
    Record,
    TaskContext,
    TaskOption,
    clip_text,
    data_format,
    iter_jsonl,
    iter_records,
    tokenizer_settings,
)

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl"}


# ---- reading -----------------------------------------------------------------------------------
def _label_str(rec: Record, field: str) -> str:
    """JSON labels may be strings, numbers or booleans; all become strings ("1", "true")."""
    value = rec.fields().get(field)
    if value is None:
        rec.text(field, flag="--label-column")  # raises the missing-field error
    if isinstance(value, str):
        label = value.strip()
    elif isinstance(value, (bool, int, float)):
        label = json.dumps(value)
    else:
        raise rec.error(f"a label must be a string or a number, not {type(value).__name__}", field)
    if not label:
        raise rec.error("empty label", field, "every example needs a label")
    return label


def _example(rec: Record, opts: Mapping[str, Any], *, labelled: bool) -> dict[str, Any]:
    """{"text", ["text_pair"], ["label"]} of a record. The pair column is used when a record has it;
    naming one with --pair-column makes it required."""
    pair_named = opts["pair_column"] != "text_pair"
    ex = {"text": rec.text(opts["text_column"], flag="--text-column")}
    pair = rec.text(opts["pair_column"], required=pair_named, flag="--pair-column")
    if pair is not None:
        ex["text_pair"] = pair
    if labelled:
        ex["label"] = _label_str(rec, opts["label_column"])
    return ex


# ---- labels ------------------------------------------------------------------------------------
def _label_ids(examples: list[dict[str, Any]], ctx: TaskContext) -> dict[str, int]:
    """label -> id of the run; a gold label the model never saw is a data error (file, line)."""
    if not ctx.labels:
        raise ConfigError("the run has no label list (mlmkit.json 'labels')", "fine-tune it with the classification task")
    ids = {lab: i for i, lab in enumerate(ctx.labels)}
    for ex in examples:
        if ex.get("label") is not None and ex["label"] not in ids:
            shown = ", ".join(ctx.labels[:20]) + (f", ... ({len(ctx.labels)} in all)" if len(ctx.labels) > 20 else "")
            raise DataFormatError(
                ex.get("source", "<input>"), f"label '{ex['label']}' was not in the training data; the model knows: {shown}",
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


# ---- the head ----------------------------------------------------------------------------------
@functools.cache
def _cls_only_graph() -> type:
    """The classifier's inference form: the last layer runs for [CLS] only (torch on demand)."""
    import torch
    from torch import nn

    from mlmkit.model import encode_cls

    class ClsOnlyGraph(nn.Module):
        def __init__(self, model: nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
        ) -> dict[str, torch.Tensor]:
            logits = self.model.classifier(encode_cls(self.model.bert, input_ids, attention_mask, token_type_ids))
            return {"logits": logits, "probabilities": torch.softmax(logits.float(), dim=-1)}

    return ClsOnlyGraph


class ClassificationTask:
    name = "classification"
    description = "Sequence classification of single texts or text pairs ([CLS] head)."
    formats = ("csv", "tsv", "jsonl")
    metrics = ("accuracy", "macro_f1", "mcc")
    outputs = {"probabilities": (BATCH, LABEL)}
    options = (
        TaskOption("text_column", "text", "The text column / field."),
        TaskOption("pair_column", "text_pair", "The second text of a pair (used when present)."),
        TaskOption("label_column", "label", "The label column / field."),
    )
    hf_architecture = "BertForSequenceClassification"
    command = "classify"
    partial_layers = 1  # export_module computes the last layer for [CLS] only

    def read(self, path: Path, options: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Labelled examples {"text", ["text_pair"], "label", "line", "source"} of a CSV/TSV/JSONL file."""
        fmt = data_format(path, FORMATS)
        records = iter_jsonl(path) if fmt == "jsonl" else iter_records(path, fmt)  # JSON lines: objects only
        examples = [{**_example(rec, options, labelled=True), "line": rec.line, "source": rec.source} for rec in records]
        if not examples:
            raise DataFormatError(path, "no examples", hint="the file needs a header and at least one labelled row")
        return examples

    def from_input(self, item: str | dict[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
        """A text, or a record with the text (and pair) fields."""
        if isinstance(item, str):
            if not item.strip():
                raise DataFormatError("<input>", "empty text", hint="give a text to classify, or leave the input out")
            return {"text": item}
        return _example(Record("<input>", None, item), options, labelled=False)

    def label_list(self, examples: list[dict[str, Any]]) -> list[str]:
        found = {ex["label"] for ex in examples}
        return sorted(found, key=_sort_key(found))

    def featurize(self, examples: list[dict[str, Any]], tokenizer: Any, ctx: TaskContext, *, training: bool) -> list[dict[str, Any]]:
        """One feature per example: [CLS] A [SEP] (B [SEP]) truncated to the max length."""
        unlabelled = [ex for ex in examples if ex.get("label") is None]
        if training and unlabelled:
            ex = unlabelled[0]
            raise DataFormatError(ex.get("source", "<input>"), "no label", line=ex.get("line"), field="label")
        # gold labels, where there are any (evaluation data), must be ones the model was trained on
        ids = _label_ids(examples, ctx) if len(unlabelled) < len(examples) else {}
        L = ctx.max_length
        inputs = [(clip_text(ex["text"], tokenizer, L), clip_text(ex["text_pair"], tokenizer, L))
                  if ex.get("text_pair") is not None else clip_text(ex["text"], tokenizer, L) for ex in examples]
        with tokenizer_settings(tokenizer, max_length=ctx.max_length) as tok:
            encodings = tok.encode_batch(inputs) if inputs else []
        features = []
        for i, (ex, enc) in enumerate(zip(examples, encodings)):
            f: dict[str, Any] = {"input_ids": enc.ids, "token_type_ids": enc.type_ids, EXAMPLE: i}
            if enc.overflowing:
                f[TRUNCATED] = True
            if training:
                f["labels"] = ids[ex["label"]]
            features.append(f)
        return features

    def build_model(self, config: Any) -> Any:
        """transformers' BertForSequenceClassification, on mlmkit's encoder."""
        from mlmkit.model import BertForLabels

        if config.num_labels < 2:
            raise ConfigError(f"classification needs at least two labels, the config has {config.num_labels}",
                              "the training data must contain two or more distinct labels")
        return BertForLabels(config, per_token=False)

    def export_module(self, model: Any) -> Any:
        """The same outputs, the last layer computed for [CLS] only."""
        return _cls_only_graph()(model)

    def postprocess(
        self, outputs: dict[str, Any], features: list[dict[str, Any]], examples: list[dict[str, Any]], ctx: TaskContext
    ) -> list[dict[str, Any]]:
        """{"label", "score", "probabilities": {label: p}} per example (one feature each)."""
        labels = list(ctx.labels or ())
        preds: list[dict[str, Any]] = [{} for _ in examples]
        for f, probs in zip(features, outputs["probabilities"]):
            p = [float(x) for x in probs]
            best = max(range(len(p)), key=p.__getitem__)
            preds[f[EXAMPLE]] = {"label": labels[best], "score": p[best], "probabilities": dict(zip(labels, p))}
        return preds

    def compute_metrics(self, predictions: list[dict[str, Any]], examples: list[dict[str, Any]], ctx: TaskContext) -> dict[str, Any]:
        """accuracy, macro_f1 (over the labels present in gold or predictions), mcc (0.0 when
        undefined), and the confusion matrix (rows gold, columns predicted, in the run's label order)."""
        import numpy as np
        from sklearn.metrics import accuracy_score, confusion_matrix, f1_score, matthews_corrcoef

        _label_ids(examples, ctx)
        labels = list(ctx.labels or ())
        gold = [ex["label"] for ex in examples]
        pred = [p["label"] for p in predictions]
        if not gold:
            raise ConfigError("no examples to score", "check the evaluation data")
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")  # MCC of a constant prediction: 0/0, reported as 0.0
            mcc = float(matthews_corrcoef(gold, pred))
        return {
            "accuracy": float(accuracy_score(gold, pred)),
            "macro_f1": float(f1_score(gold, pred, average="macro", zero_division=0)),
            "mcc": 0.0 if mcc != mcc else mcc,
            "confusion_matrix": confusion_matrix(gold, pred, labels=labels).tolist(),
            "labels": labels,
        }


task = ClassificationTask()
