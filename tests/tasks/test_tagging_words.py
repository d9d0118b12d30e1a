"""Words and windows (mlmkit_tasks/tagging_words.py): a text split into words with exact spans, and
windows that cut on word boundaries."""

from __future__ import annotations

from mlmkit_tasks.tagging import split_words, windows


def test_windows_cover_on_word_boundaries():
    word_of = [0, 0, 0, 1, 2, 2, 3, 4, 5, 6, 6, 6, 6, 6, 6, 6, 7]  # word 6 is longer than a window
    spans = windows(word_of, 5, 1)
    assert spans[0][0] == 0 and spans[-1][1] == len(word_of)
    for (s0, e0), (s1, _) in zip(spans, spans[1:]):
        assert s0 < s1 <= e0  # progress, no gap
    assert all(0 < e - s <= 5 for s, e in spans)
    cuts = {p for s, e in spans for p in (s, e)} - {0, len(word_of)}
    assert all(word_of[p] != word_of[p - 1] for p in cuts if not 9 < p < 16)
    assert windows([0, 1, 2], 5, 1) == [(0, 3)]


def test_split_words_keeps_exact_spans():
    text = "Zoë\u00a0Saldaña,\tcafe\u0301 (São\u2009Paulo)\u3000ok\u200b!"
    spans = split_words(text)
    assert [text[a:b] for a, b in spans] == ["Zoë", "Saldaña", ",", "cafe\u0301", "(", "São", "Paulo", ")",
                                             "ok", "\u200b", "!"]
