"""Tokenizer settings for one block, and clipping a huge text to what a max length can use. No torch."""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CHARS_PER_TOKEN = 100
"""The least chars_per_token gives: more than real text has per token (about 4 in English, 1-2 in
Chinese and Japanese, 20 in a run of spaces before a word), and WordPiece's longest word before [UNK]."""
_chars_per_token: weakref.WeakKeyDictionary[Any, tuple[int, int]] = weakref.WeakKeyDictionary()


def chars_per_token(tokenizer: Any) -> int:
    """A ceiling on the characters one token of ``tokenizer`` covers: its longest vocabulary entry,
    WordPiece's max_input_chars_per_word, or CHARS_PER_TOKEN, whichever is most (computed once per
    tokenizer and vocabulary size)."""
    size = tokenizer.get_vocab_size()
    try:
        known = _chars_per_token.get(tokenizer)
    except TypeError:  # not weakly referable: computed each time
        known = None
    if known is not None and known[0] == size:
        return known[1]
    most = max([CHARS_PER_TOKEN, *map(len, tokenizer.get_vocab())])
    most = max(most, int(getattr(tokenizer.model, "max_input_chars_per_word", 0) or 0))
    try:
        _chars_per_token[tokenizer] = (size, most)
    except TypeError:
        pass
    return most


def clip_text(text: str, tokenizer: Any, max_tokens: int) -> str:
    """A prefix of ``text`` that tokenizes to more than ``max_tokens`` tokens, the same ones the whole
    text starts with, or the whole text when it has no more: a 20 MB line costs what the max length
    uses, not its size, with or without whitespace (Chinese, Japanese). Prefixes of doubling length
    are tokenized until the tokens of their complete words (words as the tokenizer splits them: at
    whitespace and punctuation, each CJK character apart for BERT) number more than ``max_tokens``;
    a cut inside a word changes that word's tokens only, and more than ``max_tokens`` tokens keep
    truncation visible to the tokenizer. The work is bounded: the prefix is at most
    ``(max_tokens + 2) * chars_per_token(tokenizer)`` characters that can become tokens (past that,
    characters the normaliser drops and whitespace are read on, in linear time)."""
    if len(text) <= 8 * max_tokens:  # most texts: nothing to gain
        return text
    cap = (max_tokens + 2) * chars_per_token(tokenizer)
    n = 8 * max_tokens
    with tokenizer_settings(tokenizer) as tok:
        while True:
            if n >= len(text):
                return text
            prefix = text[:n]
            if n >= cap and _kept(tok, prefix) >= cap:  # enough characters for max_tokens + 2 tokens
                return prefix
            words = tok.encode(prefix, add_special_tokens=False).word_ids
            last = words[-1] if words else None  # the word the cut may be inside of
            if sum(w != last for w in words) > max_tokens:
                return prefix
            # words that make no tokens (control characters): look further
            n = 2 * n if n >= cap else min(2 * n, cap)


_SPACE = re.compile(r"\s+")


def _kept(tokenizer: Any, text: str) -> int:
    """The characters of ``text`` that can become tokens: what the normaliser leaves (BERT's drops
    control characters and, uncased, accents), less whitespace. A prefix with ``cap`` of them holds
    more than max_tokens tokens however many characters the normaliser or the pre-tokenizer drop."""
    norm = getattr(tokenizer, "normalizer", None)
    kept = norm.normalize_str(text) if norm is not None else text
    return len(kept) - sum(len(m) for m in _SPACE.findall(kept))


@contextmanager
def tokenizer_settings(
    tokenizer: Any, *, max_length: int | None = None, strategy: str = "longest_first", stride: int = 0,
    words: bool = False,
) -> Iterator[Any]:
    """The tokenizer unpadded and truncating to ``max_length`` (None: not truncating) inside the block;
    its own settings come back afterwards, since a caller's tokenizer is shared. ``words``: the input
    is pre-split words (``is_pretokenized``), so a byte-level BPE gives each its leading space ("Ġ"),
    as the word has in running text (RoBERTa's add_prefix_space for tagging)."""
    trunc, pad = tokenizer.truncation, tokenizer.padding
    pre = tokenizer.pre_tokenizer
    spaced = words and type(pre).__name__ == "ByteLevel" and not pre.add_prefix_space
    tokenizer.no_padding()
    if max_length is None:
        tokenizer.no_truncation()
    else:
        tokenizer.enable_truncation(max_length, stride=stride, strategy=strategy)
    if spaced:
        pre.add_prefix_space = True
    try:
        yield tokenizer
    finally:
        if spaced:
            pre.add_prefix_space = False
        tokenizer.no_truncation()
        if trunc is not None:
            tokenizer.enable_truncation(**trunc)
        if pad is not None:
            tokenizer.enable_padding(**pad)
