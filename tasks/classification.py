"""Sequence classification: a linear head on the pooled [CLS] vector, single texts or text pairs.

Data: CSV or TSV with a header, or JSONL; a text column, an optional second text (segment B of a
pair) and a label column, all renamable (--text-column, --pair-column, --label-column). Labels
are strings, read from the training data; the core stores them as config.json's id2label.
Metrics: accuracy (the main one), macro-F1 and Matthews correlation (scikit-learn), plus the
confusion matrix for the CLI's table.

The model is transformers' BertForSequenceClassification under the same parameter names
(bert.*, classifier.*), so a run directory loads there unchanged. No torch at module level: the
ONNX runtime imports this file for from_input / featurize / postprocess.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mlmkit.errors import ConfigError, DataFormatError

TEXT, PAIR, LABEL = "text", "text_pair", "label"
SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl"}


# ---- reading -----------------------------------------------------------------------------------
def _decode(path: Path) -> str:
    """The file as text; a missing file or non-UTF-8 bytes name the file and line."""
    if not path.is_file():
        what = "is a directory, not a data file" if path.is_dir() else "file not found"
        raise DataFormatError(path, what, hint="check the path")
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")  # a spreadsheet's byte-order mark is not part of the first column name
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise DataFormatError(
            path, f"not valid UTF-8 (byte 0x{data[e.start]:02x})", line=line, hint="re-save the file as UTF-8"
        ) from None


def _label_str(value: Any, path: Path, line: int, field: str) -> str:
    """JSON labels may be strings, numbers or booleans; all become strings ("1", "true")."""
    if isinstance(value, str):
        label = value.strip()
    elif isinstance(value, (bool, int, float)):
        label = json.dumps(value)
    else:
        raise DataFormatError(path, f"a label must be a string or a number, not {type(value).__name__}", line=line, field=field)
    if not label:
        raise DataFormatError(path, "empty label", line=line, field=field, hint="every example needs a label")
    return label


def _text(value: Any, path: Path, line: int, field: str) -> str:
    if not isinstance(value, str):
        raise DataFormatError(path, f"the text must be a string, not {type(value).__name__}", line=line, field=field)
    if not value.strip():
        raise DataFormatError(path, "empty text", line=line, field=field, hint="remove the row or fill in its text")
    return value


def _missing_column(path: Path, line: int, column: str, have: list[str], flag: str) -> DataFormatError:
    return DataFormatError(
        path,
        f"no column '{column}'; the header has: {', '.join(have) or 'nothing'}",
        line=line,
        field=column,
        hint=f"name the column with {flag}",
    )


def _records(path: Path, text: str, delimiter: str) -> Iterator[tuple[int, list[str]]]:
    """(first line, fields) of each non-blank record. TSV has no quoting (the GLUE convention: a
    quote inside a text is just a character); CSV follows RFC 4180, so a quoted text may span lines."""
    kind = "TSV" if delimiter == "\t" else "CSV"
    quoting = csv.QUOTE_NONE if kind == "TSV" else csv.QUOTE_MINIMAL
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, quoting=quoting, strict=True)
    start = 1
    try:
        for row in reader:
            line, start = start, reader.line_num + 1  # the next record starts after this one's last line
            if any(c.strip() for c in row):
                yield line, row
    except csv.Error as e:
        raise DataFormatError(path, f"malformed {kind}: {e}", line=reader.line_num) from None


def _read_delimited(path: Path, text: str, delimiter: str, cols: dict[str, str]) -> list[dict[str, Any]]:
    records = _records(path, text, delimiter)
    first = next(records, None)
    if first is None:
        return []
    line, header = first[0], [c.strip() for c in first[1]]
    for key, flag in (("text_column", "--text-column"), ("label_column", "--label-column")):
        if cols[key] not in header:
            raise _missing_column(path, line, cols[key], header, flag)
    use_pair = cols["pair_column"] in header
    if not use_pair and cols["pair_column"] != PAIR:  # asked for by name, so it must be there
        raise _missing_column(path, line, cols["pair_column"], header, "--pair-column")
    wanted = ("text_column", "label_column") + (("pair_column",) if use_pair else ())
    examples: list[dict[str, Any]] = []
    for line, fields in records:
        if len(fields) > len(header):
            raise DataFormatError(
                path, f"{len(fields)} fields but the header has {len(header)}", line=line,
                hint="quote texts that contain a comma" if delimiter == "," else "a text contains a tab",
            )
        row = dict(zip(header, fields))
        for key in wanted:
            if cols[key] not in row:
                raise DataFormatError(path, f"the row has {len(fields)} fields and ends before this column", line=line,
                                      field=cols[key], hint="every row needs as many fields as the header")
        ex = {"text": _text(row[cols["text_column"]], path, line, cols["text_column"])}
        if use_pair:
            ex["text_pair"] = _text(row[cols["pair_column"]], path, line, cols["pair_column"])
        ex["label"] = _label_str(row[cols["label_column"]], path, line, cols["label_column"])
        examples.append({**ex, "line": line, "source": str(path)})
    return examples


def _read_jsonl(path: Path, text: str, cols: dict[str, str]) -> list[dict[str, Any]]:
    examples: list[dict[str, Any]] = []
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError as e:
            raise DataFormatError(path, f"malformed JSON ({e.msg} at column {e.colno})", line=line,
                                  hint="each line must be one JSON object") from None
        if not isinstance(rec, dict):
            raise DataFormatError(path, f"expected a JSON object, got {type(rec).__name__}", line=line)
        for key, flag in (("text_column", "--text-column"), ("label_column", "--label-column")):
            if rec.get(cols[key]) is None:
                raise DataFormatError(
                    path, f"no field '{cols[key]}'; the record has: {', '.join(rec) or 'nothing'}",
                    line=line, field=cols[key], hint=f"name the field with {flag}",
                )
        ex = {"text": _text(rec[cols["text_column"]], path, line, cols["text_column"])}
        if rec.get(cols["pair_column"]) is not None:
            ex["text_pair"] = _text(rec[cols["pair_column"]], path, line, cols["pair_column"])
        ex["label"] = _label_str(rec[cols["label_column"]], path, line, cols["label_column"])
        examples.append({**ex, "line": line, "source": str(path)})
    return examples


# ---- labels ------------------------------------------------------------------------------------
def _unknown_label(ex: dict[str, Any], labels: list[str], label_column: str = LABEL) -> DataFormatError:
    shown = ", ".join(labels[:20]) + (f", ... ({len(labels)} in all)" if len(labels) > 20 else "")
    return DataFormatError(
        ex.get("source", "<input>"),
        f"label '{ex['label']}' was not in the training data; the model knows: {shown}",
        line=ex.get("line"),
        field=label_column,
        hint="evaluate on data with the training labels, or fine-tune with this label",
    )


def _check_labels(examples: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, int]:
    """label -> id of the run; a gold label the model never saw is a data error (file, line)."""
    labels = list(meta.get("labels") or [])
    if not labels:
        raise ConfigError("the run has no label list (mlmkit.json 'labels')", "fine-tune it with the classification task")
    ids = {lab: i for i, lab in enumerate(labels)}
    col = (meta.get("options") or {}).get("label_column", LABEL)
    for ex in examples:
        if ex.get("label") is not None and ex["label"] not in ids:
            raise _unknown_label(ex, labels, col)
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
def _model_class() -> type:
    """transformers' BertForSequenceClassification, re-spelt on mlmkit's encoder (torch on demand)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from mlmkit.model import BertModel, init_weights

    class BertForSequenceClassification(nn.Module):
        def __init__(self, config: Any) -> None:
            super().__init__()
            if config.num_labels < 2:
                raise ConfigError(
                    f"classification needs at least two labels, the config has {config.num_labels}",
                    "the training data must contain two or more distinct labels",
                )
            self.config = config
            self.bert = BertModel(config, add_pooling_layer=True)
            p = config.extra.get("classifier_dropout")  # HF: classifier_dropout, else hidden_dropout_prob
            self.dropout = nn.Dropout(config.hidden_dropout_prob if p is None else p)
            self.classifier = nn.Linear(config.hidden_size, config.num_labels)
            init_weights(self, config.initializer_range)  # the encoder is overwritten by the checkpoint

        def forward(
            self,
            input_ids: torch.Tensor,
            attention_mask: torch.Tensor | None = None,
            token_type_ids: torch.Tensor | None = None,
            labels: torch.Tensor | None = None,
        ) -> dict[str, torch.Tensor]:
            _, pooled = self.bert(input_ids, attention_mask, token_type_ids)  # pooled: tanh(W h_[CLS]), (B, H)
            logits = self.classifier(self.dropout(pooled))  # (B, num_labels)
            out = {"logits": logits, "probabilities": torch.softmax(logits.float(), dim=-1)}
            if labels is not None:
                out["loss"] = F.cross_entropy(logits.float(), labels)
            return out

    class ClsOnlyGraph(nn.Module):
        """Inference form of the classifier: the last layer runs for [CLS] only (mlmkit.model.encode_cls)."""

        partial_layers = 1  # export.fuse: the last layer's single-query attention stays unfused

        def __init__(self, model: BertForSequenceClassification) -> None:
            super().__init__()
            self.model = model

        def forward(
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
        ) -> dict[str, torch.Tensor]:
            from mlmkit.model import encode_cls

            logits = self.model.classifier(encode_cls(self.model.bert, input_ids, attention_mask, token_type_ids))
            return {"logits": logits, "probabilities": torch.softmax(logits.float(), dim=-1)}

    BertForSequenceClassification.ClsOnlyGraph = ClsOnlyGraph
    return BertForSequenceClassification


@contextlib.contextmanager
def _truncating(tokenizer: Any, max_length: int) -> Iterator[Any]:
    """The tokenizer truncating to ``max_length`` (longest_first for pairs), unpadded; its previous
    settings come back afterwards, since the caller's tokenizer is shared."""
    trunc, pad = tokenizer.truncation, tokenizer.padding
    tokenizer.enable_truncation(max_length, strategy="longest_first")
    tokenizer.no_padding()
    try:
        yield tokenizer
    finally:
        tokenizer.no_truncation()
        if trunc is not None:
            tokenizer.enable_truncation(**trunc)
        if pad is not None:
            tokenizer.enable_padding(**pad)


class ClassificationTask:
    name = "classification"
    description = "Sequence classification of single texts or text pairs ([CLS] head)."
    formats = ("csv", "tsv", "jsonl")
    metrics = ("accuracy", "macro_f1", "mcc")
    options = {"text_column": TEXT, "pair_column": PAIR, "label_column": LABEL}
    label_names = ("labels",)
    hf_architecture = "BertForSequenceClassification"
    default_max_length = 128

    def read(self, path: Path, **options: Any) -> list[dict[str, Any]]:
        """Examples {"text", ["text_pair"], "label", "line", "source"} of a CSV/TSV/JSONL file.

        The pair column is used when the file has it; naming one with --pair-column makes it required."""
        path = Path(path)
        cols = {**self.options, **{k: v for k, v in options.items() if k in self.options and v is not None}}
        fmt = SUFFIXES.get(path.suffix.lower())
        if fmt is None:
            raise DataFormatError(
                path, f"unknown format '{path.suffix or path.name}'", hint=f"use one of: {', '.join(SUFFIXES)}"
            )
        text = _decode(path)
        if fmt == "jsonl":
            examples = _read_jsonl(path, text, cols)
        else:
            examples = _read_delimited(path, text, "\t" if fmt == "tsv" else ",", cols)
        if not examples:
            raise DataFormatError(path, "no examples", hint="the file needs a header and at least one labelled row")
        return examples

    def from_input(self, item: str | dict[str, Any], **options: Any) -> dict[str, Any]:
        """An example from a runtime input: a text, or a record with the text (and pair) columns."""
        if isinstance(item, str):
            return {"text": item}
        cols = {**self.options, **{k: v for k, v in options.items() if k in self.options and v is not None}}
        if not isinstance(item, dict) or not isinstance(item.get(cols["text_column"]), str):
            have = ", ".join(item) if isinstance(item, dict) else type(item).__name__
            raise DataFormatError(
                "<input>", f"no text field '{cols['text_column']}' (the record has: {have})",
                field=cols["text_column"], hint="name the field with --text-column",
            )
        ex = {"text": item[cols["text_column"]]}
        if isinstance(item.get(cols["pair_column"]), str):
            ex["text_pair"] = item[cols["pair_column"]]
        return ex

    def label_list(self, examples: list[dict[str, Any]]) -> list[str]:
        found = {ex["label"] for ex in examples}
        return sorted(found, key=_sort_key(found))

    def featurize(
        self, examples: list[dict[str, Any]], tokenizer: Any, *, meta: dict[str, Any], max_length: int, training: bool
    ) -> list[dict[str, Any]]:
        """One feature per example: [CLS] A [SEP] (B [SEP]) truncated to ``max_length``."""
        unlabelled = [ex for ex in examples if ex.get("label") is None]
        if training and unlabelled:
            ex = unlabelled[0]
            raise DataFormatError(ex.get("source", "<input>"), "no label", line=ex.get("line"), field=LABEL)
        # gold labels, where there are any (evaluation data), must be ones the model was trained on
        ids = _check_labels(examples, meta) if len(unlabelled) < len(examples) else {}
        inputs = [(ex["text"], ex["text_pair"]) if ex.get("text_pair") is not None else ex["text"] for ex in examples]
        with _truncating(tokenizer, max_length) as tok:
            encodings = tok.encode_batch(inputs) if inputs else []
        features = []
        for i, (ex, enc) in enumerate(zip(examples, encodings)):
            f: dict[str, Any] = {"input_ids": enc.ids, "token_type_ids": enc.type_ids, "example": i}
            if training:
                f["labels"] = ids[ex["label"]]
            features.append(f)
        return features

    def build_model(self, config: Any) -> Any:
        return _model_class()(config)

    def export_module(self, model: Any) -> Any:
        """What export.py exports: the same outputs, the last layer computed for [CLS] only."""
        return _model_class().ClsOnlyGraph(model)

    def onnx_outputs(self) -> dict[str, dict[int, str]]:
        return {"probabilities": {0: "batch"}}

    def postprocess(
        self, outputs: dict[str, Any], features: list[dict[str, Any]], examples: list[dict[str, Any]], *, meta: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """{"label", "score", "probabilities": {label: p}} per example (one feature each)."""
        labels = list(meta["labels"])
        preds: list[dict[str, Any] | None] = [None] * len(examples)
        for f, probs in zip(features, outputs.get("probabilities", [])):
            p = [float(x) for x in probs]
            best = max(range(len(p)), key=p.__getitem__)
            preds[f["example"]] = {"label": labels[best], "score": p[best], "probabilities": dict(zip(labels, p))}
        missing = [i for i, p in enumerate(preds) if p is None]
        if missing:
            raise ConfigError(f"no model output for {len(missing)} of {len(examples)} examples", "a bug: please report it")
        return preds  # type: ignore[return-value]

    def compute_metrics(
        self, predictions: list[dict[str, Any]], examples: list[dict[str, Any]], *, meta: dict[str, Any]
    ) -> dict[str, Any]:
        """accuracy, macro_f1 (over the labels present in gold or predictions), mcc (0.0 when
        undefined), and the confusion matrix (rows gold, columns predicted, in meta["labels"] order)."""
        import numpy as np
        from sklearn.metrics import accuracy_score, confusion_matrix, f1_score, matthews_corrcoef

        _check_labels(examples, meta)
        labels = list(meta["labels"])
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
