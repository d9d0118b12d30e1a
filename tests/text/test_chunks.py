"""Chunker: chunks at word ends within the size, and on through words longer than a chunk."""

from __future__ import annotations

import random

import pytest

from mlmkit.text.chunks import Chunker, Chunking
from mlmkit.text.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def tok():
    rnd = random.Random(0)
    words = ["the", "cat", "sat", "on", "mat", "dog", "ran", "park", "bird"]
    return train_tokenizer([" ".join(rnd.choice(words) for _ in range(12)) for _ in range(300)],
                           vocab_size=200, min_frequency=1, kind="bpe")


def _tokens(tok, text: str, span: tuple[int, int]) -> int:
    return len(tok.encode(text[span[0]:span[1]], add_special_tokens=False).ids)


@pytest.mark.parametrize("text", [
    " ".join("".join(random.Random(1).choice("thecasonmdgrpkbi") for _ in range(100)) for _ in range(30)),
    "ねこがすわるいぬがはしる" * 40,  # no spaces: one word for the tokenizer
])
def test_words_longer_than_a_chunk_are_cut_inside_and_chunking_goes_on(tok, text):
    """A word longer than a chunk no longer walks the chunks back a token at a time: each chunk
    starts at least size - overlap tokens after the one before (a few more chunks than tokens /
    (size - overlap), for the word ends chunks prefer)."""
    n, m = 32, 4
    spans = Chunker(tok, 64, Chunking.of(n, m)).spans(text)
    total = len(tok.encode(text, add_special_tokens=False).ids)
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    # a chunk cut inside a character's bytes spans the whole character: up to 2 more tokens each side
    assert all(_tokens(tok, text, s) <= n + 4 for s in spans)
    assert len(spans) <= 1.6 * total / (n - m), (len(spans), total)
    assert all(a[0] < b[0] and a[1] < b[1] for a, b in zip(spans, spans[1:]))


def test_ordinary_text_is_chunked_at_word_ends(tok):
    text = " ".join(["the cat sat on the mat"] * 30)
    spans = Chunker(tok, 64, Chunking.of(16, 4)).spans(text)
    assert len(spans) > 1
    for a, b in spans:
        assert (a == 0 or text[a - 1] == " ") and (b == len(text) or text[b] == " ")
