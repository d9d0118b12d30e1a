"""SQuAD metrics (mlmkit_tasks/qa_metrics.py): answer normalisation, exact match and F1 against
hand-computed values."""

from __future__ import annotations

import pytest
from qa_helpers import ctx

from mlmkit_tasks.qa import task
from mlmkit_tasks.qa_metrics import f1_score, normalize_answer


def test_normalisation():
    assert normalize_answer("The  Cat, an apple!") == "cat apple"
    assert normalize_answer("Theatre of A-ha's") == "theatre of ahas"  # articles only as whole words
    assert normalize_answer("  \tA the AN ") == ""


def test_metrics_equal_hand_computed_values():
    def ex(golds, impossible=False):
        return {"answers": [{"text": g, "answer_start": 0} for g in golds], "is_impossible": impossible}

    examples = [ex(["The Eiffel Tower", "Eiffel"]), ex(["red dog"]), ex([], True), ex([], True),
                ex(["a cat sat on the mat"]), ex(["Paris", "in Paris, France"])]
    preds = [{"answer": a} for a in ["eiffel tower.", "the big red dog", "", "x", "cat sat here", "France"]]
    # F1: 1, 2*(2/3*1)/(2/3+1) = 0.8, 1, 0, 2*(2/3*1/2)/(2/3+1/2) = 4/7, max(0, 2*(1/1*1/3)/(1+1/3)) = 0.5
    m = task.compute_metrics(preds, examples, ctx())
    assert m["exact_match"] == pytest.approx(100 * 2 / 6)
    assert m["f1"] == pytest.approx(100 * (1 + 0.8 + 1 + 0 + 4 / 7 + 0.5) / 6)
    assert f1_score("the", "") == 1.0 and f1_score("", "x") == 0.0
