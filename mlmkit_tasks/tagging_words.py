"""Words and sub-tokens for the tagging task: a text's words with their character offsets
(``split_words``, ``joined_offsets``), the overlapping windows a long sentence is cut into on word
boundaries (``windows``), a pre-tokenized encoding's sub-tokens with the word of each
(``word_pieces``), and a word's label distribution from those of its sub-tokens
(``word_distributions``: first, average or max).
"""

from __future__ import annotations

import bisect
import unicodedata
from collections.abc import Sequence

import numpy as np


def _is_word_char(ch: str) -> bool:
    # letters, digits, underscore, and combining marks (a decomposed "é" stays one word)
    return ch.isalnum() or ch == "_" or unicodedata.category(ch).startswith("M")


def split_words(text: str) -> list[tuple[int, int]]:
    """Character spans of the words of ``text``: runs of word characters, and every other
    non-space character on its own (punctuation), so text[start:end] is the word exactly."""
    spans: list[tuple[int, int]] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
        elif _is_word_char(ch):
            j = i + 1
            while j < n and _is_word_char(text[j]):
                j += 1
            spans.append((i, j))
            i = j
        else:
            spans.append((i, i + 1))
            i += 1
    return spans


def joined_offsets(tokens: Sequence[str]) -> tuple[str, list[tuple[int, int]]]:
    """The text " ".join(tokens) and each token's [start, end) in it (pre-tokenized inputs)."""
    offsets, pos = [], 0
    for t in tokens:
        offsets.append((pos, pos + len(t)))
        pos += len(t) + 1
    return " ".join(tokens), offsets


def windows(word_of: Sequence[int], budget: int, overlap: int) -> list[tuple[int, int]]:
    """[start, end) sub-token ranges of at most ``budget`` tokens covering 0..len(word_of), each
    overlapping the previous by about ``overlap`` tokens. Cuts fall on word starts; only a single
    word longer than a window is cut inside."""
    n = len(word_of)
    if n <= budget:
        return [(0, n)]
    starts = [p for p in range(n) if p == 0 or word_of[p] != word_of[p - 1]]
    is_start = set(starts)
    spans: list[tuple[int, int]] = []
    s = 0
    while True:
        e = min(s + budget, n)
        if e < n:
            b = e
            while b > s and b not in is_start:
                b -= 1
            e = b if b > s else e  # a word longer than the window is cut inside
        spans.append((s, e))
        if e >= n:
            return spans
        target = max(e - overlap, s + 1)
        j = bisect.bisect_right(starts, target) - 1  # the last word start at or before the target
        if starts[j] > s:
            s = starts[j]
        else:  # inside one long word: the next word start, else a cut inside the word
            j = bisect.bisect_right(starts, s)
            s = starts[j] if j < len(starts) and starts[j] <= e else target


SPACE_PIECES = ("Ġ", "▁")  # a byte-level BPE's / SentencePiece's word-start marker, as a piece of its own


def word_pieces(ids: Sequence[int], word_ids: Sequence[int], n_words: int, unk: int,
                 tokens: Sequence[str] = ()) -> tuple[list[int], list[int]]:
    """The sub-token ids of a pre-tokenized encoding and the word of each, every word with at least
    one: a word the normaliser erases (a zero-width space) gets [UNK]. A word-start marker that a
    small BPE / Unigram vocabulary splits off on its own ("Ġ", "▁" followed by the word's letters) is
    left out: it would be the word's first piece, the same for every word, and carry its label."""
    keep = [not (t in SPACE_PIECES and k + 1 < len(word_ids) and word_ids[k + 1] == word_ids[k])
            for k, t in enumerate(tokens)] if tokens else [True] * len(ids)
    sub_ids: list[int] = []
    word_of: list[int] = []
    expect = 0  # the next word that has no sub-token yet
    for tid, w, kept in zip(ids, word_ids, keep):
        if not kept:
            continue
        while expect < w:
            sub_ids.append(unk)
            word_of.append(expect)
            expect += 1
        sub_ids.append(tid)
        word_of.append(w)
        expect = max(expect, w + 1)
    for w in range(expect, n_words):
        sub_ids.append(unk)
        word_of.append(w)
    return sub_ids, word_of


def word_distributions(probs: np.ndarray, tokens: list[list[int]], agg: str) -> np.ndarray:
    """(words, L): each word's label distribution from the rows of its sub-tokens in ``probs`` (T, L)."""
    counts = np.fromiter((len(t) for t in tokens), dtype=np.int64, count=len(tokens))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    # (sub-tokens, L)
    rows = np.asarray(probs, dtype=np.float64)[np.fromiter((x for t in tokens for x in t), dtype=np.int64)]
    if agg == "first":
        return rows[starts]
    if agg == "average":
        return np.add.reduceat(rows, starts, axis=0) / counts[:, None]
    # max: the sub-token the model is surest about speaks for the word (the first of equals)
    word = np.repeat(np.arange(len(tokens)), counts)
    order = np.lexsort((-rows.max(axis=1), word))  # by word, then most confident first (stable)
    return rows[order[starts]]
