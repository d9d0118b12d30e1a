"""Pretraining batches (mlmkit/train/data.py): [CLS] A [SEP] B [SEP] within the max length, the same
batch for the same (epoch, index, seed)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from corpus_helpers import FIRST_ID, tok_fixture  # noqa: F401  (the fixture `tok`)

from mlmkit.text.tokenizer import special_ids
from mlmkit.train.corpus.shards import TokenizedCorpus
from mlmkit.train.data import PretrainData


def word_corpus(n_docs: int, seed: int = 0) -> TokenizedCorpus:
    rng = random.Random(seed)
    tokens, sent_lens, doc_sizes = [], [], []
    for _ in range(n_docs):
        n = rng.randint(2, 6)
        doc_sizes.append(n)
        for _ in range(n):
            k = rng.randint(4, 20)
            tokens += [rng.randrange(FIRST_ID, 100) for _ in range(k)]
            sent_lens.append(k)
    return TokenizedCorpus(
        np.asarray(tokens, np.int32),
        np.concatenate([[0], np.cumsum(sent_lens)]).astype(np.int64),
        np.concatenate([[0], np.cumsum(doc_sizes)]).astype(np.int64),
    )


@pytest.mark.parametrize("nsp", [True, False])
def test_batches_are_cls_a_sep_b_sep_within_max_len(tok, nsp):
    ids = special_ids(tok)
    data = PretrainData(word_corpus(80), tok, max_len=32, batch_size=16, nsp=nsp, seed=0)
    b = data.batch(0, 1, seed=7)
    assert b["input_ids"].shape[0] == 16 and b["input_ids"].shape[1] <= 32
    assert ("next_sentence_label" in b) == nsp
    labels, types, att = b["labels"], b["token_type_ids"], b["attention_mask"]
    original = torch.where(labels != -100, labels, b["input_ids"])
    for r in range(16):
        n = int(att[r].sum())
        row = original[r, :n].tolist()
        assert row[0] == ids.cls and row[-1] == ids.sep
        assert (original[r, n:] == ids.pad).all() and (types[r, n:] == 0).all()
        seps = [i for i, t in enumerate(row) if t == ids.sep]
        if nsp:
            assert len(seps) == 2
            assert (types[r, : seps[0] + 1] == 0).all() and (types[r, seps[0] + 1 : n] == 1).all()
        else:
            assert seps == [n - 1] and (types[r] == 0).all()
        assert (labels[r] != -100).any()
    # the same (epoch, index, seed) gives the same batch: resuming needs no replay
    again = data.batch(0, 1, seed=7)
    assert all(torch.equal(b[k], again[k]) for k in b)
    assert not torch.equal(data.batch(0, 2, seed=8)["input_ids"], b["input_ids"])
