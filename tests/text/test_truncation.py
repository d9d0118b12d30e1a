"""Clipping a huge text to what a max length uses (mlmkit/text/truncation.py), with or without
whitespace."""

from __future__ import annotations

from typing import Any

import pytest

from mlmkit.taskkit import clip_text
from mlmkit.text.tokenizer import train_tokenizer
from mlmkit.text.truncation import chars_per_token


@pytest.fixture(scope="module")
def tok():
    lines = ["the cat sat on the mat", "我们在北京学习中文", "日本語の文章です", "who is john ?"] * 5
    return train_tokenizer(lines, vocab_size=120, min_frequency=1)


class Spy:
    """A tokenizer that records the length of every text it is asked to encode."""

    def __init__(self, tok: Any) -> None:
        self.__dict__["_tok"], self.__dict__["seen"] = tok, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)

    def encode(self, text: str, **kw: Any) -> Any:
        self.seen.append(len(text))
        return self._tok.encode(text, **kw)


@pytest.mark.parametrize("text", ["我们在北京学习中文" * 2_300_000,  # 20 MB of Chinese: no whitespace at all
                                  "ですます" * 5_000_000,  # kana only: one "word" to BERT's pre-tokenizer
                                  "the cat sat " * 1_700_000])  # 20 MB of words
def test_clip_text_costs_what_the_max_length_uses_with_or_without_whitespace(tok, text: str) -> None:
    spy, max_tokens = Spy(tok), 64
    clipped = clip_text(text, spy, max_tokens)
    cap = (max_tokens + 2) * chars_per_token(tok)
    assert text.startswith(clipped) and len(clipped) <= cap
    assert sum(spy.seen) <= 2 * cap  # never the 20 MB
    whole = tok.encode(text[: 4 * cap], add_special_tokens=False).ids  # what the whole text starts with
    part = tok.encode(clipped, add_special_tokens=False).ids
    assert part[:max_tokens] == whole[:max_tokens]
    assert (len(part) > max_tokens) == (len(whole) > max_tokens)  # kana: one [UNK] either way
