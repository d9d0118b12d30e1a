"""The classification metrics, written in numpy for the base install, equal scikit-learn's."""

from __future__ import annotations

import random
import warnings

import pytest

from mlmkit_tasks.classification_metrics import multi_label_metrics, regression_metrics, single_label_metrics

sklearn = pytest.importorskip("sklearn.metrics")
LABELS = ["a", "b", "c", "d"]


@pytest.mark.parametrize("seed", range(12))
def test_single_label_metrics_equal_scikit_learns(seed):
    rnd = random.Random(seed)
    n, used = rnd.randint(1, 40), LABELS[:rnd.randint(1, 4)]
    gold = [rnd.choice(used) for _ in range(n)]
    pred = [rnd.choice(used) for _ in range(n)] if seed % 3 else [used[0]] * n  # a constant guess too
    got = single_label_metrics(pred, gold, LABELS)
    assert got["accuracy"] == pytest.approx(sklearn.accuracy_score(gold, pred))
    assert got["macro_f1"] == pytest.approx(sklearn.f1_score(gold, pred, average="macro", zero_division=0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MCC of a constant guess: 0/0, which scikit-learn warns of
        want_mcc = sklearn.matthews_corrcoef(gold, pred)
    assert got["mcc"] == pytest.approx(0.0 if want_mcc != want_mcc else want_mcc)
    assert got["confusion_matrix"] == sklearn.confusion_matrix(gold, pred, labels=LABELS).tolist()


@pytest.mark.parametrize("seed", range(8))
def test_multi_label_metrics_equal_scikit_learns(seed):
    from sklearn.preprocessing import MultiLabelBinarizer

    rnd = random.Random(seed)
    rows = rnd.randint(1, 30)
    gold = [rnd.sample(LABELS, rnd.randint(0, 3)) for _ in range(rows)]
    pred = [rnd.sample(LABELS, rnd.randint(0, 3)) for _ in range(rows)]
    mlb = MultiLabelBinarizer(classes=LABELS)
    g, p = mlb.fit_transform(gold), mlb.transform(pred)
    got = multi_label_metrics(pred, gold, LABELS)
    assert got["micro_f1"] == pytest.approx(sklearn.f1_score(g, p, average="micro", zero_division=0))
    assert got["macro_f1"] == pytest.approx(sklearn.f1_score(g, p, average="macro", zero_division=0))
    assert got["subset_accuracy"] == pytest.approx(sklearn.accuracy_score(g, p))


def test_regression_metrics():
    gold, pred = [0.0, 1.0, 2.0, 3.0], [0.5, 1.0, 1.5, 4.0]
    got = regression_metrics(pred, gold)
    assert got["mse"] == pytest.approx(sklearn.mean_squared_error(gold, pred))
    assert got["spearman"] == pytest.approx(1.0) and 0.9 < got["pearson"] < 1.0
    assert regression_metrics([1.0, 1.0], [0.0, 1.0])["pearson"] == 0.0  # a constant side

