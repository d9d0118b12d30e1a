"""Where a long line can be cut into pieces, each tokenized on its own, without changing its tokens."""

from __future__ import annotations

from typing import Any

CUT_TRIES = 48  # places looked at for a token-keeping cut
CUT_MARGIN = 64  # characters each side of a cut that must tokenize as the uncut text does


def token_cut(text: str, lo: int, hi: int, tok: Any) -> int:
    """A place in text[lo:hi] where cutting leaves the tokens of the CUT_MARGIN characters each side
    as the uncut text's (each side encoded on its own, as the pieces are), tried in this order: beside
    the last spaces (after one for WordPiece and byte-level BPE, before one for SentencePiece's
    Metaspace, whose piece would end in a lone marker), the pre-tokenizer's word starts (a long run of
    punctuated words without a space), then every place back from ``hi``. ``hi`` when none of CUT_TRIES
    does: in a long run without whitespace, Metaspace marks a piece's first word (one token in
    ``size`` characters differs; WordPiece and byte-level BPE find a place)."""
    def keeps(at: int) -> bool:
        a, b = text[max(lo, at - CUT_MARGIN):at], text[at:at + CUT_MARGIN]
        ids = tok.encode(a + b, add_special_tokens=False).ids
        apart = tok.encode(a, add_special_tokens=False).ids + tok.encode(b, add_special_tokens=False).ids
        return bool(ids == apart)

    spaces: list[int] = []
    at = hi
    while len(spaces) < 8 and (at := text.rfind(" ", lo, at)) > lo:
        spaces += [at + 1, at]
    window = text[max(lo, hi - 4 * CUT_MARGIN):hi]
    pre = tok.pre_tokenizer
    starts = [hi - len(window) + o[0] for _, o in pre.pre_tokenize_str(window)][1:] if pre is not None else []
    for at in [*spaces, *reversed(starts), *range(hi - 1, lo, -1)][:CUT_TRIES]:
        if lo < at < hi and keeps(at):
            return at
    return spaces[0] if spaces else hi
