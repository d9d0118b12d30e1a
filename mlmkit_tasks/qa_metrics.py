"""The qa task's metrics, as the official SQuAD script (v1.1 / v2.0) computes them."""

from __future__ import annotations

import collections
import re
import string

from mlmkit.taskkit import Example


def normalize_answer(s: str) -> str:
    """Lower case, drop punctuation, the articles a/an/the and extra whitespace (SQuAD v1.1/v2.0)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


_PUNCT = set(string.punctuation)


def exact_match(gold: str, pred: str) -> float:
    return float(normalize_answer(gold) == normalize_answer(pred))


def f1_score(gold: str, pred: str) -> float:
    g, p = normalize_answer(gold).split(), normalize_answer(pred).split()
    if not g or not p:  # no-answer: 1 only when both are empty
        return float(g == p)
    same = sum((collections.Counter(g) & collections.Counter(p)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def gold_answers(example: Example) -> list[str]:
    """Gold texts as the official script takes them: impossible questions (and empty golds) are [""]."""
    if example.get("is_impossible"):
        return [""]
    return [a["text"] for a in example.get("answers", []) if normalize_answer(a["text"])] or [""]
