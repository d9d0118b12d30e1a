"""A long corpus line tokenized in pieces (mlmkit/train/corpus/pieces.py): cut where the tokens stay
the whole's, for WordPiece and SentencePiece (Metaspace) tokenizers."""

from __future__ import annotations

import random

import pytest

from mlmkit.text.tokenizer import train_tokenizer
from mlmkit.train.corpus import shards as corpus_shards


@pytest.fixture(scope="module")
def tok():
    lines = ["the cat sat on the mat", "我们在北京学习中文", "日本語の文章です", "who is john ?"] * 5
    return train_tokenizer(lines, vocab_size=120, min_frequency=1)


def test_a_long_line_is_cut_where_its_tokens_stay_the_wholes(tok) -> None:
    """A corpus line past LONG_LINE is encoded in pieces. Words joined by commas without a space: the
    old fixed-size cut split a word at each piece's end (its tokens changed); a SentencePiece (Metaspace)
    tokenizer's text with spaces: the old cut after a space left a lone marker token at each piece's
    end. Both now cut where the tokens are checked to stay the whole's."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    rng = random.Random(3)
    words = [rng.choice(["cat", "mat", "sat", "the", "who", "john"]) for _ in range(75_000)]
    sp = Tokenizer(models.Unigram())
    sp.normalizer = normalizers.NFKC()
    sp.pre_tokenizer = pre_tokenizers.Metaspace()
    sp.train_from_iterator(["the cat sat on the mat, who is john ?"] * 50,
                           trainers.UnigramTrainer(vocab_size=40, special_tokens=["<unk>"],
                                                   unk_token="<unk>"))

    def pieced(t, text, with_tok=True):
        pieces = list(corpus_shards._pieces(text, 100_000, t if with_tok else None))
        assert len(pieces) >= 3 and "".join(pieces) == text
        return [i for p in pieces for i in t.encode(p, add_special_tokens=False).ids]

    for t, text in ((tok, ",".join(words)), (sp, " ".join(words))):
        whole = t.encode(text, add_special_tokens=False).ids
        assert pieced(t, text) == whole
        assert pieced(t, text, with_tok=False) != whole  # the old cut
    # Metaspace without any whitespace has no such place: a piece's first word gets its marker (a token or two
    # a cut)
    text = ",".join(words)
    assert abs(len(pieced(sp, text)) - len(sp.encode(text, add_special_tokens=False).ids)) <= 2 * 3
