"""Pretraining instances from token shards: NSP pairs and packed windows, made per batch.

NSP instances follow the original BERT data pipeline (Devlin et al.'s release): a target length
(shorter with probability 0.1), segment A from consecutive sentences, B the true continuation half
of the time and a span of another document otherwise, the longer side truncated. Three deviations:
a chunk of a single sentence borrows the next sentence when there is one (the previous one at the end
of a document), so IsNext stays near 50% (the original forces a random B for such chunks); a random
B is as long as the true continuation would have been, not filled up to the target length, so
sequence length alone does not predict the label (with the original, short documents let a model
reach ~61% NSP accuracy from lengths alone); and the chunks are fixed (instance_units), each making
one instance per epoch, made when its batch is drawn: a short target takes a chunk's first
sentences, and the sentences a NotNext instance leaves unused wait for another epoch (the original
reads them again at once) — so nothing per epoch grows with the corpus.
"""

from __future__ import annotations

import logging
import os
import random
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from mlmkit.errors import MlmkitError
from mlmkit.train.corpus.shards import TokenizedCorpus

log = logging.getLogger("mlmkit")


@dataclass
class Instance:
    a: np.ndarray
    b: np.ndarray | None
    is_next: int  # 0 = IsNext (B follows A), 1 = NotNext, as transformers' next_sentence_label


def _truncate_pair(a: list[int], b: list[int], max_tokens: int, rng: random.Random) -> None:
    """Trim the longer side one token at a time, from the front or the back at random (BERT
    truncate_seq_pair). The draws are made first and the cuts once, so a pair of n tokens costs O(n),
    not O(n^2) of deleting from the front of a list."""
    la, lb = len(a), len(b)
    cut = {"a": [0, 0], "b": [0, 0]}  # tokens to drop from the front, from the back
    while la + lb > max_tokens:
        side = "a" if la > lb else "b"
        cut[side][0 if rng.random() < 0.5 else 1] += 1
        if side == "a":
            la -= 1
        else:
            lb -= 1
    for seq, (front, back) in ((a, cut["a"]), (b, cut["b"])):
        del seq[len(seq) - back :]
        del seq[:front]


def _random_b(corpus: TokenizedCorpus, d: int, want: int, rng: random.Random, tries: int = 4) -> list[int]:
    """Consecutive sentences of document ``d`` about ``want`` tokens long: the span nearest that
    length among a few random starts, so the length of a random B tells nothing about IsNext. Read
    from the offsets: a long document costs what its span does, not what the whole does."""
    so = corpus.sent_offsets
    s0, s1 = int(corpus.doc_offsets[d]), int(corpus.doc_offsets[d + 1])
    best: tuple[int, int, int] | None = None  # first sentence, end, tokens
    for _ in range(tries):
        start = s0 + rng.randrange(s1 - s0)
        end, n = start, 0
        while end < s1:
            k = int(so[end + 1] - so[end])
            if n and abs(n + k - want) >= abs(n - want):
                break
            n, end = n + k, end + 1
        if best is None or best[2] == 0 or abs(n - want) < abs(best[2] - want):
            best = (start, end, n)
    assert best is not None
    return corpus.tokens[so[best[0]] : so[best[1]]].tolist()


SHORT_SEQ_PROB = 0.1


def instance_units(corpus: TokenizedCorpus, max_len: int, nsp: bool) -> np.ndarray:
    """The units an epoch's instances are drawn from, as U+1 boundaries (cached in the corpus's shard
    directory, so a large corpus computes them once).

    NSP: runs of consecutive sentences of one document, each growing until it holds max_len - 3
    tokens or the document ends (BERT's chunks at the full target length); boundaries are sentence
    indices. --no-nsp: the packed windows of max_len - 2 tokens (whole sentences while they fit,
    a longer sentence in pieces, never across documents); boundaries are token indices."""
    kind = "nsp" if nsp else "packed"
    cached = corpus.cache / f"units-{kind}-{max_len}-{corpus.part}.npy" if corpus.cache is not None else None
    if cached is not None and cached.is_file():
        try:
            units = np.load(cached, mmap_mode="r")
            last = len(corpus.sent_offsets) - 1 if nsp else len(corpus.tokens)
            if units.ndim == 1 and len(units) >= 1 and int(units[0]) == 0 and int(units[-1]) == last:
                return units
        except (OSError, ValueError):
            pass
    cap = max_len - 3 if nsp else max_len - 2
    ends = array("q")
    sent = 0  # index of the next sentence
    pos = 0  # token offset of the next sentence
    for d0, d1 in _blocks(corpus.doc_offsets):
        lengths = np.diff(np.asarray(corpus.sent_offsets[d0[0] : d1[-1] + 1])).tolist()
        k = 0
        for n_sents in (np.asarray(d1) - np.asarray(d0)).tolist():
            length = cur = 0
            for j in range(n_sents):
                n = lengths[k]
                k += 1
                if nsp:
                    length += n
                    if length >= cap or j == n_sents - 1:
                        ends.append(sent + j + 1)
                        length = 0
                    continue
                if cur and cur + n > cap:  # packing: this sentence starts the next window
                    ends.append(pos)
                    cur = 0
                if n > cap:  # a sentence longer than the window is split
                    whole = n - n % cap
                    ends.extend(range(pos + cap, pos + whole + 1, cap))
                    cur = n - whole
                else:
                    cur += n
                pos += n
            if not nsp and cur:
                ends.append(pos)
            sent += n_sents
    units = np.concatenate([[0], np.frombuffer(ends, dtype=np.int64)]).astype(np.int64)
    if cached is not None:
        try:
            tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
            with open(tmp, "wb") as f:
                np.save(f, units)
            tmp.replace(cached)
        except OSError as e:  # a read-only cache still trains, computing the units each time
            log.warning("could not cache %s (%s)", cached, e)
    return units


def _blocks(doc_offsets: np.ndarray, size: int = 1 << 16) -> Iterator[tuple[list[int], list[int]]]:
    """(first sentences, ends) of the documents, ``size`` documents at a time (bounded memory)."""
    for i in range(0, len(doc_offsets) - 1, size):
        chunk = np.asarray(doc_offsets[i : i + size + 1]).tolist()
        yield chunk[:-1], chunk[1:]


def nsp_instance(
    corpus: TokenizedCorpus, units: np.ndarray, u: int, max_tokens: int, rng: random.Random,
    short_seq_prob: float = SHORT_SEQ_PROB,
) -> Instance | None:
    """The NSP instance of unit ``u`` (see instance_units), as BERT's create_instances_from_document
    makes one from a chunk: with probability ``short_seq_prob`` a shorter target length (the unit's
    first sentences that reach it); A its first 1..n-1 sentences; B the rest (IsNext) or, half the
    time, a span of another document as long as the rest would have been (NotNext); the longer side
    truncated. None when A or B came out empty."""
    so = corpus.sent_offsets
    s0, s1 = int(units[u]), int(units[u + 1])
    d = int(np.searchsorted(corpus.doc_offsets, s0, side="right")) - 1
    ds0, ds1 = int(corpus.doc_offsets[d]), int(corpus.doc_offsets[d + 1])
    target = rng.randint(2, max_tokens) if rng.random() < short_seq_prob else max_tokens
    first, end, length = s0, s0, 0
    while end < s1 and (end == s0 or length < target):
        length += int(so[end + 1] - so[end])
        end += 1
    if end - first == 1:  # a single sentence borrows the next one, or the previous one (see module doc)
        if end < ds1:
            end += 1
        elif first > ds0:
            first -= 1
    n = end - first
    a_end = first + (rng.randint(1, n - 1) if n >= 2 else 1)
    a = corpus.tokens[so[first] : so[a_end]].tolist()
    if n == 1 or rng.random() < 0.5:
        is_next, want = 1, int(so[end] - so[a_end]) or target - len(a)
        b = _random_b(corpus, _other_document(corpus, d, want, rng), want, rng)
    else:
        is_next, b = 0, corpus.tokens[so[a_end] : so[end]].tolist()
    _truncate_pair(a, b, max_tokens, rng)
    return Instance(np.asarray(a, np.int32), np.asarray(b, np.int32), is_next) if a and b else None


def _other_document(corpus: TokenizedCorpus, d: int, want: int, rng: random.Random, tries: int = 10) -> int:
    """A random document other than ``d``: the first of a few draws long enough to give ``want``
    tokens, else the longest drawn (so a random B is rarely shorter than the continuation it stands
    for, on corpora of short documents too)."""
    best, best_len = (d + 1) % corpus.num_docs, -1
    for _ in range(tries):
        other = rng.randrange(corpus.num_docs)
        if other == d:
            continue
        so, do = corpus.sent_offsets, corpus.doc_offsets
        n = int(so[do[other + 1]] - so[do[other]])
        if n >= want:
            return other
        if n > best_len:
            best, best_len = other, n
    return best


def packed_instance(corpus: TokenizedCorpus, units: np.ndarray, u: int) -> Instance:
    """--no-nsp: the packed window ``u`` (see instance_units)."""
    return Instance(np.asarray(corpus.tokens[int(units[u]) : int(units[u + 1])], np.int32), None, 0)


def nsp_instances(
    corpus: TokenizedCorpus, max_len: int, rng: random.Random, short_seq_prob: float = SHORT_SEQ_PROB
) -> list[Instance]:
    """One instance per unit, in corpus order, each from its own generator seeded from ``rng``: what
    an epoch of PretrainData draws (in another order), all at once. For tests and inspection."""
    check_nsp(corpus)
    units, seed = instance_units(corpus, max_len, nsp=True), rng.getrandbits(64)
    made = (nsp_instance(corpus, units, u, max_len - 3, random.Random(f"{seed}/{u}"), short_seq_prob)
            for u in range(len(units) - 1))
    return [x for x in made if x is not None]


def packed_instances(corpus: TokenizedCorpus, max_len: int) -> list[Instance]:
    """--no-nsp: every packed window, in corpus order."""
    units = instance_units(corpus, max_len, nsp=False)
    return [packed_instance(corpus, units, u) for u in range(len(units) - 1)]


def check_nsp(corpus: TokenizedCorpus) -> None:
    if corpus.num_docs < 2:
        raise MlmkitError(
            "next-sentence prediction needs at least 2 documents (blank lines separate them)",
            "add blank lines between documents, or pass --no-nsp",
        )
