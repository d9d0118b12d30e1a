"""The classification task's metrics, in numpy: what scikit-learn's accuracy_score, f1_score
(macro and micro, zero_division=0), matthews_corrcoef, confusion_matrix and mean_squared_error
compute, written out so that the base install needs no scikit-learn (tests/tasks hold them equal to
scikit-learn's). No torch.
"""

from __future__ import annotations

import math
import warnings

import numpy as np


def confusion(gold: list[str], pred: list[str], labels: list[str]) -> np.ndarray:
    """(len(labels), len(labels)) counts: row = the gold label, column = the predicted one; a pair
    with a label outside ``labels`` is not counted."""
    at = {lab: i for i, lab in enumerate(labels)}
    m = np.zeros((len(labels), len(labels)), dtype=np.int64)
    for g, p in zip(gold, pred):
        if g in at and p in at:
            m[at[g], at[p]] += 1
    return m


def _f1(tp: np.ndarray, fp: np.ndarray, fn: np.ndarray) -> np.ndarray:
    """Per-class F1 = 2tp / (2tp + fp + fn), 0 where nothing was predicted or true."""
    den = 2 * tp + fp + fn
    return np.divide(2 * tp, den, out=np.zeros(tp.shape, dtype=np.float64), where=den > 0)


def macro_f1(gold: list[str], pred: list[str]) -> float:
    """F1 averaged over the labels that occur in either list."""
    present = sorted(set(gold) | set(pred))
    m = confusion(gold, pred, present).astype(np.float64)
    tp = np.diag(m)
    return float(_f1(tp, m.sum(axis=0) - tp, m.sum(axis=1) - tp).mean()) if present else 0.0


def mcc(gold: list[str], pred: list[str]) -> float:
    """Matthews' correlation over every label present (the multi-class form); 0.0 where it is 0/0."""
    m = confusion(gold, pred, sorted(set(gold) | set(pred))).astype(np.float64)
    t, p, n = m.sum(axis=1), m.sum(axis=0), m.sum()
    cov_tp = np.trace(m) * n - t @ p
    cov_pp, cov_tt = n * n - p @ p, n * n - t @ t
    return 0.0 if cov_pp * cov_tt == 0 else float(cov_tp / math.sqrt(cov_tt * cov_pp))


def single_label_metrics(pred: list[str], gold: list[str], labels: list[str]) -> dict[str, object]:
    return {
        "accuracy": float(np.mean([g == p for g, p in zip(gold, pred)])) if gold else 0.0,
        "macro_f1": macro_f1(gold, pred),
        "mcc": mcc(gold, pred),
        "confusion_matrix": confusion(gold, pred, labels).tolist(),
        "labels": labels,
    }


def multi_label_metrics(pred: list[list[str]], gold: list[list[str]], labels: list[str]) -> dict[str, float]:
    """Micro and macro F1 over ``labels`` (each a column; a label outside them is left out), and the
    share of inputs whose whole label set is right."""
    at = {lab: i for i, lab in enumerate(labels)}

    def binary(rows: list[list[str]]) -> np.ndarray:
        b = np.zeros((len(rows), len(labels)), dtype=bool)
        for r, row in enumerate(rows):
            b[r, [at[x] for x in row if x in at]] = True
        return b

    g, p = binary(gold), binary(pred)
    tp, fp, fn = (g & p).sum(axis=0), (~g & p).sum(axis=0), (g & ~p).sum(axis=0)
    return {
        "micro_f1": float(_f1(np.array(tp.sum()), np.array(fp.sum()), np.array(fn.sum()))),
        "macro_f1": float(_f1(tp, fp, fn).mean()) if labels else 0.0,
        "subset_accuracy": float((g == p).all(axis=1).mean()) if len(g) else 0.0,
    }


def regression_metrics(pred: list[float], gold: list[float]) -> dict[str, float]:
    """Pearson's and Spearman's correlations (0.0 where one side is constant) and the mean squared error."""
    from scipy.stats import pearsonr, spearmanr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a constant side: correlation undefined, reported as 0.0
        r = float(pearsonr(pred, gold)[0]) if len(gold) > 1 else math.nan
        rho = float(spearmanr(pred, gold)[0])
    mse = float(np.mean((np.asarray(gold, dtype=np.float64) - np.asarray(pred, dtype=np.float64)) ** 2))
    return {"pearson": 0.0 if r != r else r, "spearman": 0.0 if rho != rho else rho, "mse": mse}
