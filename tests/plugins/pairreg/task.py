"""Sentence-pair regression: JSONL {"text", "text_pair", "score"} -> one float per pair.

Head: a linear layer named ``regressor`` on the pooled [CLS] vector, MSE loss; metrics Pearson and
Spearman correlation (numpy only). Like the built-in tasks, nothing here imports torch at module
level: torch is imported inside ``build_model`` only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from mlmkit.errors import DataFormatError


class PairRegression:
    name = "pairreg"
    description = "sentence-pair regression (MSE; Pearson / Spearman)"
    formats = ("jsonl",)
    metrics = ("pearson", "spearman")
    options: dict[str, Any] = {"score_field": "score"}
    label_names = ("labels",)
    hf_architecture = "BertModel"  # the head (`regressor`) has no transformers counterpart; the encoder loads
    default_max_length = 128
    greater_is_better = True

    # ---- data ----------------------------------------------------------------------------------
    def read(self, path: Path, **options: Any) -> list[dict[str, Any]]:
        field = options.get("score_field", "score")
        examples = []
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataFormatError(path, f"not a JSON object ({e.msg})", line=n, hint="one JSON object per line") from None
                for key in ("text", "text_pair", field):
                    if key not in rec:
                        raise DataFormatError(path, "missing", line=n, field=key, hint="each line needs text, text_pair and a score")
                try:
                    score = float(rec[field])
                except (TypeError, ValueError):
                    raise DataFormatError(path, f"not a number: {rec[field]!r}", line=n, field=field) from None
                examples.append({"text": str(rec["text"]), "text_pair": str(rec["text_pair"]), "score": score})
        return examples

    def from_input(self, item: str | dict[str, Any], **options: Any) -> dict[str, Any]:
        if isinstance(item, str):
            text, _, pair = item.partition("\t")
            return {"text": text, "text_pair": pair}
        return {"text": str(item["text"]), "text_pair": str(item.get("text_pair", ""))}

    def label_list(self, examples: list[dict[str, Any]]) -> list[str] | None:
        return None

    def featurize(
        self, examples: list[dict[str, Any]], tokenizer: Any, *, meta: dict[str, Any], max_length: int, training: bool
    ) -> list[dict[str, Any]]:
        tokenizer.enable_truncation(max_length, strategy="longest_first")
        try:
            encs = tokenizer.encode_batch([(e["text"], e["text_pair"]) for e in examples])
        finally:
            tokenizer.no_truncation()
        feats = []
        for i, (ex, enc) in enumerate(zip(examples, encs)):
            f: dict[str, Any] = {"input_ids": list(enc.ids), "token_type_ids": list(enc.type_ids), "example": i}
            if training:
                f["labels"] = float(ex["score"])
            feats.append(f)
        return feats

    # ---- model ---------------------------------------------------------------------------------
    def build_model(self, config: Any) -> Any:
        import torch
        from torch import nn

        from mlmkit.model import BertModel, init_weights

        class PairRegressor(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.config = config
                self.bert = BertModel(config, add_pooling_layer=True)
                self.dropout = nn.Dropout(config.hidden_dropout_prob)
                self.regressor = nn.Linear(config.hidden_size, 1)
                init_weights(self, config.initializer_range)

            def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
                _, pooled = self.bert(input_ids, attention_mask, token_type_ids)
                score = self.regressor(self.dropout(pooled)).squeeze(-1)  # (B,)
                out = {"score": score}
                if labels is not None:
                    out["loss"] = torch.nn.functional.mse_loss(score.float(), labels.float())
                return out

        return PairRegressor()

    def onnx_outputs(self) -> dict[str, dict[int, str]]:
        return {"score": {0: "batch"}}

    # ---- predictions and metrics ---------------------------------------------------------------
    def postprocess(
        self, outputs: dict[str, Any], features: list[dict[str, Any]], examples: list[dict[str, Any]], *, meta: dict[str, Any]
    ) -> list[dict[str, Any]]:
        preds: list[dict[str, Any] | None] = [None] * len(examples)
        for f, s in zip(features, outputs["score"]):
            preds[f["example"]] = {"score": float(np.asarray(s).reshape(()))}
        return preds  # type: ignore[return-value]

    def compute_metrics(
        self, predictions: list[dict[str, Any]], examples: list[dict[str, Any]], *, meta: dict[str, Any]
    ) -> dict[str, float]:
        p = np.array([x["score"] for x in predictions], dtype=np.float64)
        g = np.array([e["score"] for e in examples], dtype=np.float64)
        return {"pearson": pearson(p, g), "spearman": pearson(ranks(p), ranks(g))}


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation; 0.0 when either side is constant (undefined), so model selection still works."""
    a, b = a - a.mean(), b - b.mean()
    den = math.sqrt(float((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / den) if den > 0 else 0.0


def ranks(x: np.ndarray) -> np.ndarray:
    """Ranks with ties given their average rank (as scipy.stats.rankdata)."""
    order = np.argsort(x, kind="mergesort")
    r = np.empty(len(x), dtype=np.float64)
    r[order] = np.arange(len(x), dtype=np.float64)
    for v in np.unique(x):
        tie = x == v
        if tie.sum() > 1:
            r[tie] = r[tie].mean()
    return r


task = PairRegression()
