"""Sentence-pair regression: JSONL {"text", "text_pair", "score"} -> one float per pair.

The example plugin of docs/plugins.md: only the required members of mlmkit.registry.Task plus the
two optional ones it needs (its option ``score_field``, and ``from_input`` for tab-separated pairs).
Head: a linear layer named ``regressor`` on the pooled [CLS] vector, MSE loss; metrics Pearson and
Spearman correlation (numpy only). The head is head.py's module-level class, which imports torch;
``build_model`` imports it, so this module never does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mlmkit.taskkit import (
    BATCH,
    EXAMPLE,
    MAX_RECORD_BYTES,
    TRUNCATED,
    Record,
    TaskContext,
    TaskOption,
    iter_jsonl,
    tokenizer_settings,
)


class PairRegression:
    name = "pairreg"
    description = "sentence-pair regression (MSE; Pearson / Spearman)"
    metrics = ("pearson", "spearman")
    outputs = {"score": (BATCH,)}
    options = (TaskOption("score_field", "score", "The JSON field holding the gold score."),)

    def read(self, path, options, *, max_bytes=MAX_RECORD_BYTES):
        return [{"text": r.text("text"), "text_pair": r.text("text_pair"),
                 "score": _number(r, options["score_field"])}
                for r in iter_jsonl(path, max_bytes=max_bytes)]

    def from_input(self, item, options):  # a text "A<TAB>B", or a record {"text", "text_pair"}
        if isinstance(item, str):
            text, _, pair = item.partition("\t")
            return {"text": text, "text_pair": pair}
        record = Record("<input>", None, item)
        return {"text": record.text("text"), "text_pair": record.text("text_pair")}

    def featurize(self, examples, tokenizer, ctx: TaskContext, *, training):
        with tokenizer_settings(tokenizer, max_length=ctx.max_length) as tok:
            encs = tok.encode_batch([(e["text"], e["text_pair"]) for e in examples])
        return [{"input_ids": enc.ids, "token_type_ids": enc.type_ids, EXAMPLE: i,
                 TRUNCATED: bool(enc.overflowing),
                 **({"labels": ex["score"]} if training else {})}
                for i, (ex, enc) in enumerate(zip(examples, encs))]

    def build_model(self, config, ctx):
        from .head import PairRegressor  # torch: imported here, never at the task module's level

        return PairRegressor(config)

    def postprocess(self, outputs, features, examples, ctx):
        return [{"score": float(s)} for s in outputs["score"]]  # one feature per example, in order

    def compute_metrics(self, predictions, examples, ctx):
        p, g = np.array([x["score"] for x in predictions]), np.array([e["score"] for e in examples])
        return {"pearson": pearson(p, g), "spearman": pearson(ranks(p), ranks(g))}


def _number(record: Any, field: str) -> float:
    try:
        return float(record.fields()[field])
    except KeyError:
        raise record.error("missing", field, "each line needs text, text_pair and a score") from None
    except (TypeError, ValueError):
        raise record.error(f"not a number: {record.data[field]!r}", field) from None


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation; 0.0 when either side is constant (undefined), so model selection still works."""
    a, b = a - a.mean(), b - b.mean()
    den = float(np.sqrt((a * a).sum() * (b * b).sum()))
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
