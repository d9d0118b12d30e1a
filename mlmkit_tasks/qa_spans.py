"""The qa task's span search: the best answer span of an example over its windows (numpy only: the
ONNX runtime's postprocessing too), and the null score."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mlmkit.taskkit import EXAMPLE, Feature, Prediction

Offsets = list[tuple[int, int] | None]


def best_span(
    start: np.ndarray, end: np.ndarray, offsets: Offsets, n_best: int, max_answer: int
) -> tuple[float, int, int] | None:
    """(score, start token, end token) of the best valid span of one window, or None."""
    n = min(len(start), len(end), len(offsets))
    ctx = np.array([i for i in range(n) if offsets[i] is not None], dtype=np.int64)
    if ctx.size == 0:
        return None
    s_idx = ctx[np.argsort(-start[ctx], kind="stable")[:n_best]]  # n-best starts among context tokens
    e_idx = ctx[np.argsort(-end[ctx], kind="stable")[:n_best]]
    score = start[s_idx][:, None] + end[e_idx][None, :]  # (n_best, n_best)
    length = e_idx[None, :] - s_idx[:, None] + 1
    score = np.where((length >= 1) & (length <= max_answer), score, -np.inf)
    k = int(np.argmax(score))
    best = float(score.flat[k])
    if best == -np.inf:
        return None
    return best, int(s_idx[k // score.shape[1]]), int(e_idx[k % score.shape[1]])


def search_spans(outputs: dict[str, list[np.ndarray]], features: list[Feature], n_examples: int,
            opts: Mapping[str, Any]) -> list[Prediction]:
    """Per example: the best span over all its windows (score, character span) and the null score."""
    res: list[Prediction] = [{"score": None, "start": -1, "end": -1, "null": None}
                                 for _ in range(n_examples)]
    n_best, max_answer = int(opts["n_best"]), int(opts["max_answer_length"])
    for f, st, en in zip(features, outputs["start_logits"], outputs["end_logits"]):
        st = np.asarray(st, dtype=np.float64).reshape(-1)  # (T,)
        en = np.asarray(en, dtype=np.float64).reshape(-1)
        r = res[f[EXAMPLE]]
        null = float(st[0] + en[0])  # [CLS]
        r["null"] = null if r["null"] is None else min(r["null"], null)
        span = best_span(st, en, f["offsets"], n_best, max_answer)
        if span is not None and (r["score"] is None or span[0] > r["score"]):
            r["score"], r["start"], r["end"] = span[0], f["offsets"][span[1]][0], f["offsets"][span[2]][1]
    return res


def trimmed(text: str, start: int, end: int) -> tuple[int, int]:
    """A span without the whitespace at its ends: SentencePiece's lone "▁" pieces (and byte-level
    "Ġ" pieces) carry the space before a word in their offsets."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end
