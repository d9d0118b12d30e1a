"""Pretraining instances (mlmkit/train/corpus/instances.py): NSP pairs (the label not given away by
their lengths), --no-nsp packing, and the instance units cached beside the shard."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from corpus_helpers import FIRST_ID, shards, tok_fixture, write_txt  # noqa: F401  (the fixture `tok`)

from mlmkit.errors import MlmkitError
from mlmkit.train.corpus import instances as corpus_instances
from mlmkit.train.corpus.instances import nsp_instances, packed_instances
from mlmkit.train.corpus.shards import TokenizedCorpus, tokenize_corpus
from mlmkit.train.data import PretrainData


def sentence_corpus(
    n_docs: int = 1000, seed: int = 0, sent_len: tuple[int, int] = (3, 14), sents: tuple[int, int] = (2, 12)
) -> TokenizedCorpus:
    """A corpus whose every token of sentence s (global index) has the id FIRST_ID + s, so each token
    tells which sentence, and therefore which document, it comes from."""
    rng = random.Random(seed)
    tokens, sent_lens, doc_sizes = [], [], []
    s = 0
    for _ in range(n_docs):
        n = rng.randint(*sents)
        doc_sizes.append(n)
        for _ in range(n):
            k = rng.randint(*sent_len)
            tokens += [FIRST_ID + s] * k
            sent_lens.append(k)
            s += 1
    return TokenizedCorpus(
        np.asarray(tokens, np.int32),
        np.concatenate([[0], np.cumsum(sent_lens)]).astype(np.int64),
        np.concatenate([[0], np.cumsum(doc_sizes)]).astype(np.int64),
    )


def doc_of_sentence(c: TokenizedCorpus) -> np.ndarray:
    return np.repeat(np.arange(c.num_docs), np.diff(c.doc_offsets))


# ---- NSP instances -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def nsp_setup():
    c = sentence_corpus()
    return c, nsp_instances(c, 64, random.Random(0))


def test_isnext_rate_is_about_half(nsp_setup):
    c, inst = nsp_setup
    units = corpus_instances.instance_units(c, 64, nsp=True)
    assert len(inst) == len(units) - 1 > 1000  # one instance per unit and epoch
    is_next = np.mean([x.is_next == 0 for x in inst])  # label 0 = IsNext, as transformers
    assert 0.45 <= is_next <= 0.55, is_next


def test_random_b_never_comes_from_a_document_of_a(nsp_setup):
    c, inst = nsp_setup
    doc = doc_of_sentence(c)
    for x in inst:
        sa, sb = x.a - FIRST_ID, x.b - FIRST_ID
        docs_a, docs_b = set(doc[sa]), set(doc[sb])
        assert len(docs_a) == 1  # segment A is from one document
        assert len(np.unique(sa)) == sa.max() - sa.min() + 1  # consecutive sentences
        if x.is_next == 1:  # NotNext: B from another document
            assert len(docs_b) == 1 and docs_b != docs_a
        else:  # IsNext: B is what follows A in the same document
            assert docs_b == docs_a
            assert sb.min() > sa.max()


def test_isnext_b_is_the_true_continuation(nsp_setup):
    _, inst = nsp_setup
    # B starts right after A's last sentence, except where truncation dropped A's tail sentence
    follow = [int((x.b - FIRST_ID).min() == (x.a - FIRST_ID).max() + 1) for x in inst if x.is_next == 0]
    assert np.mean(follow) > 0.9


def test_lengths_within_the_maximum(nsp_setup):
    _, inst = nsp_setup
    lengths = np.array([len(x.a) + len(x.b) + 3 for x in inst])  # [CLS] A [SEP] B [SEP]
    assert lengths.max() <= 64
    assert all(len(x.a) > 0 and len(x.b) > 0 for x in inst)


def test_length_does_not_give_the_label_away(nsp_setup):
    # a random B is as long as the true continuation would be: with B filled up to the target
    # length instead, short documents let a model reach ~61% NSP accuracy from lengths alone
    _, inst = nsp_setup
    is_next = np.array([x.is_next == 0 for x in inst])
    len_b = np.array([len(x.b) for x in inst])
    total = len_b + [len(x.a) for x in inst]
    assert abs(len_b[is_next].mean() - len_b[~is_next].mean()) < 1.5
    assert abs(total[is_next].mean() - total[~is_next].mean()) < 1.5


def test_long_documents_fill_the_window_with_some_short_targets():
    c = sentence_corpus(n_docs=60, sents=(200, 300))
    inst = nsp_instances(c, 128, random.Random(0))
    lengths = np.array([len(x.a) + len(x.b) + 3 for x in inst])
    assert lengths.max() <= 128
    assert np.mean(lengths >= 110) > 0.6  # the target length is the window...
    assert 0.03 < np.mean(lengths < 64) < 0.4  # ...but shorter for 10% of the documents
    assert 0.45 <= np.mean([x.is_next == 0 for x in inst]) <= 0.55


def test_nsp_needs_two_documents():
    c = sentence_corpus(n_docs=1)
    with pytest.raises(MlmkitError, match="at least 2 documents"):
        nsp_instances(c, 64, random.Random(0))


def test_nsp_instances_are_seeded():
    c = sentence_corpus(n_docs=50)
    a = nsp_instances(c, 64, random.Random(3))
    b = nsp_instances(c, 64, random.Random(3))
    d = nsp_instances(c, 64, random.Random(4))
    key = lambda xs: [(x.a.tolist(), x.b.tolist(), x.is_next) for x in xs]  # noqa: E731
    assert key(a) == key(b) and key(a) != key(d)


# ---- --no-nsp packing --------------------------------------------------------------------------
def test_packing_respects_max_length_and_document_boundaries():
    c = sentence_corpus(n_docs=100, sent_len=(3, 70))  # some sentences longer than the window
    max_len = 48
    inst = packed_instances(c, max_len)
    doc = doc_of_sentence(c)
    by_doc: dict[int, list[int]] = {}
    for x in inst:
        assert x.b is None
        assert 0 < len(x.a) <= max_len - 2  # [CLS] A [SEP]
        docs = set(doc[x.a - FIRST_ID])
        assert len(docs) == 1, docs  # never across a document boundary
        by_doc.setdefault(docs.pop(), []).extend(x.a.tolist())
    # every token is used once, in order
    for d in range(c.num_docs):
        s0, s1 = c.doc_offsets[d], c.doc_offsets[d + 1]
        assert by_doc[d] == c.tokens[c.sent_offsets[s0] : c.sent_offsets[s1]].tolist()
    # windows are packed: a sentence that fits is not split, and windows are mostly full
    for x in inst:
        s = x.a - FIRST_ID
        first, last = s[0], s[-1]
        whole = [t for t in np.unique(s) if t not in (first, last)]
        for t in whole:
            assert (s == t).sum() == c.sent_offsets[t + 1] - c.sent_offsets[t]
    assert np.mean([len(x.a) for x in inst]) > 0.6 * (max_len - 2)


def test_instance_units_are_computed_once_and_cached_beside_the_shard(tmp_path, tok, monkeypatch):
    docs = [[f"w{i} w{(i * 7) % 60} w{(i * 13) % 60} w{i % 5}." for i in range(k, k + 2 + k % 4)]
            for k in range(40)]
    p = write_txt(tmp_path / "c.txt", docs=docs)
    first = PretrainData(tokenize_corpus([p], tok, tmp_path / "cache"), tok, max_len=32, batch_size=4, seed=1)
    (shard,) = shards(tmp_path / "cache")
    assert (shard / "units-nsp-32-all.npy").is_file()

    def computed_again(*args):
        raise AssertionError("the units were computed again")

    monkeypatch.setattr(corpus_instances, "_blocks", computed_again)
    again = PretrainData(tokenize_corpus([p], tok, tmp_path / "cache"), tok, max_len=32, batch_size=4, seed=1)
    assert np.array_equal(first.units, again.units) and first.num_units > 10
    a, b = first.batch(1, 2, seed=5), again.batch(1, 2, seed=5)  # another process, the same batch
    assert all(torch.equal(a[k], b[k]) for k in a)
    # each epoch visits every unit once, in its own order
    epoch0 = first.order(0).tolist()
    assert sorted(epoch0) == list(range(first.num_units)) and epoch0 != first.order(1).tolist()
