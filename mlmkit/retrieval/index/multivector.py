"""A multi-vector index (a colbert bundle's: one vector per token), in the PLAID design. No torch.

Every token vector is stored as the nearest of K centroids (k-means over a sample of the corpus's
token vectors, with faiss) and its residual from that centroid, ``bits`` (1 or 2) a dimension: each
dimension's residual falls in one of 2^bits buckets (cut at the sample's residual quantiles), and is
read back as its bucket's weight (the median of the sample's residuals in it). A token vector of 128
dimensions takes 2 bytes of code and 32 bytes of residual at 2 bits (16 at 1 bit).

The index's ``codec.npz`` holds the centroids, the cutoffs and the weights; it is made by the build
that creates the index and kept by every append (its token vectors are coded with the same
centroids). Each shard holds, beside its ids.arrow:

    lengths.bin     int32: each document's token vectors (a document's are consecutive)
    codes.bin       uint16: each token vector's centroid
    residuals.bin   uint8: each token vector's residual, dims x bits / 8 bytes, numpy.packbits order
    offsets.bin, rows.bin, weights.bin
                    the centroids' postings (retrieval/postings.py, inverted files only): the documents
                    holding a token vector of each centroid, a block of documents at a time

A search takes three stages for each query (its token vectors, [MASK] expansion included):

1. candidates: each query token's ``nprobe`` best centroids; a document scores the sum, over the
   query tokens, of their scores with the probed centroids it holds (through the postings); its
   ``candidates`` best go on;
2. the centroids' MaxSim: each candidate scored by MaxSim over its tokens' centroids (no residual
   read); the ``rescore`` best (4 k, at least 128) go on;
3. MaxSim over their token vectors, decoded (centroid + residual, unit length): the k best.

Memory while building: the first SAMPLE_TOKENS token vectors (64 MiB at 128 dimensions), held
until the centroids are trained on them, and one block's postings. While searching: the pages of
the files read, a query's (tokens, K) centroid scores and its candidates' token vectors.
"""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mlmkit.errors import ConfigError
from mlmkit.files import atomic_write
from mlmkit.retrieval import postings
from mlmkit.retrieval.exact import masked, normalized, top_k
from mlmkit.retrieval.index.codecs import faiss_module
from mlmkit.retrieval.maxsim import maxsim, padded

CODEC = "codec.npz"
BITS = (1, 2)
SAMPLE_TOKENS = 1 << 17
"""The first token vectors of a new index, held in memory until the centroids are trained on them."""
POINTS_PER_CENTROID = 40
"""Sample token vectors a centroid: K is the power of two at or below SAMPLE / 40 (faiss asks 39)."""
MAX_CENTROIDS = 1 << 16  # codes are uint16
WINDOW = 256
"""Documents a window at most (``--window``): their results (a list of floats a token, ~32 bytes a
value) are held until the window is coded, ~70 MB for 256 documents of 64 tokens of 128 dimensions."""
KMEANS_ITERATIONS = 4
"""PLAID's own (ColBERT's kmeans_niters): more moved nDCG@10 on the built-in set by less than its noise."""
NPROBE = 4
CANDIDATES = 4096
FILES = ("lengths.bin", "codes.bin", "residuals.bin")


def centroid_count(tokens: int) -> int:
    """K for a sample of ``tokens`` token vectors: the power of two at or below tokens / 40 (1 at least)."""
    return 1 << max(0, int(np.log2(max(1, tokens // POINTS_PER_CENTROID))))


@dataclass
class Codec:
    """How token vectors are coded: K unit centroids (K, dims) and the residual buckets."""

    centroids: np.ndarray
    cutoffs: np.ndarray
    """(2^bits - 1,): the residual values that part the buckets."""
    weights: np.ndarray
    """(2^bits,): the value a bucket decodes to."""

    @property
    def bits(self) -> int:
        return int(np.log2(len(self.weights)))

    @property
    def dims(self) -> int:
        return int(self.centroids.shape[1])

    def residual_bytes(self) -> int:
        return (self.dims * self.bits + 7) // 8

    @classmethod
    def train(cls, sample: np.ndarray, bits: int, centroids: int | None = None) -> Codec:
        """K-means (faiss, spherical, KMEANS_ITERATIONS, seed 0) over ``sample`` (unit token vectors), then
        the buckets from the quantiles of the sample's residuals."""
        faiss = faiss_module()
        x = np.ascontiguousarray(sample, dtype=np.float32)
        k = min(centroids or centroid_count(len(x)), len(x), MAX_CENTROIDS)
        km = faiss.Kmeans(x.shape[1], k, niter=KMEANS_ITERATIONS, seed=0, spherical=True, verbose=False,
                          min_points_per_centroid=1, max_points_per_centroid=1 << 20)
        km.train(x)
        c = normalized(np.asarray(km.centroids, dtype=np.float32))
        r = x - c[nearest(c, x)]
        n = 1 << bits
        cutoffs = np.quantile(r, np.arange(1, n) / n).astype(np.float32)
        weights = np.quantile(r, (np.arange(n) + 0.5) / n).astype(np.float32)
        return cls(c, cutoffs, weights)

    def encode(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(codes (n,) uint16, residuals (n, residual_bytes) uint8) of unit token vectors."""
        codes = nearest(self.centroids, x)
        r = x - self.centroids[codes]
        buckets = np.zeros(r.shape, dtype=np.uint8)
        # the cutoffs below each value (np.searchsorted's answer, several times faster)
        for c in self.cutoffs:
            buckets += r > c
        planes = (buckets[:, :, None] >> np.arange(self.bits - 1, -1, -1, dtype=np.uint8)) & 1
        return codes.astype(np.uint16), np.packbits(planes.reshape(len(x), -1), axis=1)

    def decode(self, codes: np.ndarray, residuals: np.ndarray) -> np.ndarray:
        """Unit float32 token vectors of codes and residuals: centroid + each dimension's bucket weight
        (a byte's 8 / bits dimensions read at once from a table of the 256 bytes)."""
        per = 8 // self.bits
        byte = np.arange(256, dtype=np.uint8)
        shifts = np.arange(per - 1, -1, -1, dtype=np.uint8) * self.bits
        table = self.weights[(byte[:, None] >> shifts) & ((1 << self.bits) - 1)]  # (256, per)
        values = table[residuals].reshape(len(codes), -1)[:, :self.dims]
        return normalized(self.centroids[np.asarray(codes, dtype=np.int64)] + values)

    def save(self, path: Path) -> None:
        def write(tmp: str) -> None:
            with open(tmp, "wb") as f:
                np.savez(f, centroids=self.centroids, cutoffs=self.cutoffs, weights=self.weights)

        atomic_write(path, write)

    @classmethod
    def load(cls, path: Path, dims: int, hint: str) -> Codec:
        """The codec at ``path``, checked: float32 unit centroids of ``dims`` dimensions (at most
        MAX_CENTROIDS), 2^bits weights for BITS, ascending cutoffs, every value finite."""
        try:
            with np.load(path, allow_pickle=False) as z:
                c, cut, w = (np.asarray(z[k]) for k in ("centroids", "cutoffs", "weights"))
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            what = "is missing" if not path.is_file() else f"is not a readable codec ({why})"
            raise ConfigError(f"{path} {what}", hint) from None
        shaped = (c.ndim == 2 and c.shape[1] == dims and 1 <= len(c) <= MAX_CENTROIDS and cut.ndim == 1
                  and w.ndim == 1
                  and len(w) in (1 << b for b in BITS) and len(cut) == len(w) - 1)
        if not shaped or not all(a.dtype == np.float32 and np.isfinite(a).all()
                                 for a in (c, cut, w)) or (np.diff(cut) < 0).any():
            raise ConfigError(f"{path}: not the codec of a {dims}-dimension index (centroids {c.shape}, "
                              f"cutoffs {cut.shape}, "
                              f"weights {w.shape}, or values that are not finite float32)", hint)
        return cls(c, cut, w)


def nearest(centroids: np.ndarray, x: np.ndarray, chunk: int = 8192) -> np.ndarray:
    """Each row of ``x``'s best centroid by dot product, ``chunk`` rows at a time."""
    out = np.zeros(len(x), dtype=np.int64)
    for a in range(0, len(x), chunk):
        out[a:a + chunk] = np.argmax(x[a:a + chunk] @ centroids.T, axis=1)
    return out


def document_postings(lengths: np.ndarray, codes: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray,
                                                                               np.ndarray]:
    """Documents (their token counts, their tokens' codes) as postings.Writer's CSR rows: each
    document's distinct centroids (weight 1)."""
    doc = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    keys = np.unique(doc * k + codes.astype(np.int64))
    starts = np.concatenate([[0], np.cumsum(np.bincount(keys // k, minlength=len(lengths)))])
    return starts, (keys % k).astype(np.int32), np.ones(len(keys), dtype=np.float32)


@dataclass
class Shard:
    """One shard of a multi-vector index, memory-mapped."""

    count: int
    starts: np.ndarray
    """(count + 1,) int64: document i's token vectors are rows starts[i]:starts[i + 1]."""
    codes: np.ndarray
    residuals: np.ndarray
    postings: postings.Postings

    @classmethod
    def open(cls, s: Path, n: int, codec: Codec, block: int, hint: str, *, memory: bool = False) -> Shard:
        lengths = np.asarray(postings.mapped_file(s / "lengths.bin", np.int32, (n,), n, hint), dtype=np.int64)
        if (lengths < 0).any():
            raise ConfigError(f"{s / 'lengths.bin'} holds a negative length: a corrupted file", hint)
        starts = np.concatenate([[0], np.cumsum(lengths)])
        tokens = int(starts[-1])
        codes = postings.mapped_file(s / "codes.bin", np.uint16, (tokens,), n, hint, memory=memory)
        for a in range(0, tokens, 1 << 22):
            if int(np.asarray(codes[a:a + (1 << 22)]).max(initial=0)) >= len(codec.centroids):
                raise ConfigError(f"{s / 'codes.bin'} names a centroid past the codec's "
                                  f"{len(codec.centroids):,}: "
                                  "a corrupted file or another index's codec", hint)
        residuals = postings.mapped_file(s / "residuals.bin", np.uint8, (tokens, codec.residual_bytes()), n,
                                         hint, memory=memory)
        return cls(n, starts, codes, residuals,
                   postings.Postings.open(s, n, len(codec.centroids), block, hint, forward=False,
                                           memory=memory))


def spans(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenation of arange(a, a + n) for each (a, n)."""
    before = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return np.repeat(np.asarray(starts, dtype=np.int64) - before, lengths) + np.arange(int(lengths.sum()))


def tokens_of(ix: Any, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For global document rows: (their tokens' codes, residuals, each document's token count), the
    documents in ``rows``' order."""
    rows = np.asarray(rows, dtype=np.int64)
    firsts = np.cumsum([0] + [s.count for s in ix.multi])
    which = np.searchsorted(firsts, rows, side="right") - 1
    lengths = np.zeros(len(rows), dtype=np.int64)
    for i, s in enumerate(ix.multi):
        local = rows[which == i] - firsts[i]
        lengths[which == i] = s.starts[local + 1] - s.starts[local]
    dest = np.concatenate([[0], np.cumsum(lengths)])
    codes = np.zeros(int(dest[-1]), dtype=np.uint16)
    res = np.zeros((int(dest[-1]), ix.codec.residual_bytes()), dtype=np.uint8)
    for i, s in enumerate(ix.multi):
        sel = np.nonzero(which == i)[0]
        if len(sel):
            src, dst = spans(s.starts[rows[sel] - firsts[i]], lengths[sel]), spans(dest[sel], lengths[sel])
            codes[dst], res[dst] = s.codes[src], s.residuals[src]
    return codes, res, lengths


def documents(ix: Any, rows: np.ndarray) -> list[np.ndarray]:
    """The decoded token vectors of global document rows, one (tokens, dims) array each."""
    codes, res, lengths = tokens_of(ix, rows)
    x = ix.codec.decode(codes, res)
    return np.split(x, np.cumsum(lengths)[:-1])


def search(ix: Any, queries: Sequence[np.ndarray], k: int, *, rescore: int | None = None,
           allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The top ``k`` documents of each query (its (tokens, dims) vectors) by MaxSim over the decoded
    token vectors, found in three stages (the module's docstring); ``rescore``: the documents of the
    second stage that the third scores exactly (default 4 k, at least 128); ``allowed``: (count,) bool,
    the documents the first stage may take (None: all)."""
    from scipy.sparse import csr_matrix

    settings = ix.manifest.search
    nprobe = settings.nprobe if settings is not None else NPROBE
    wide = settings.candidates if settings is not None else CANDIDATES
    n2 = min(ix.count, max(rescore or max(4 * k, 128), k))
    out_i = np.full((len(queries), k), -1, dtype=np.int64)
    out_s = np.full((len(queries), k), -np.inf, dtype=np.float32)
    C = ix.codec.centroids
    for j, q in enumerate(queries):
        q = np.asarray(q, dtype=np.float32).reshape(-1, ix.dims)
        if not len(q):
            continue
        S = q @ C.T  # (tokens, K)
        probe = np.argsort(-S, axis=1, kind="stable")[:, :nprobe]  # equal scores: the lower centroid
        w = np.zeros((1, S.shape[1]), dtype=np.float32)
        np.add.at(w[0], probe.reshape(-1), np.take_along_axis(S, probe, 1).reshape(-1))
        rows1, s1 = top_k(masked(postings.scores([s.postings for s in ix.multi], csr_matrix(w)), allowed), 1,
                          min(ix.count, max(wide, n2)))
        cand = rows1[0][(rows1[0] >= 0) & ~np.isneginf(s1[0])]
        if not len(cand):  # every document deleted or kept out by the filter: no hits
            continue
        codes, _, lengths = tokens_of(ix, cand)
        approx = _centroid_maxsim(S, codes, lengths)
        keep = cand[np.lexsort((cand, -approx))[:n2]]
        docs = documents(ix, keep)
        D, mask = padded(docs, ix.dims)
        exact = maxsim(q[None], D, None, mask)[0]
        order = np.lexsort((keep, -exact))[:k]
        out_i[j, :len(order)], out_s[j, :len(order)] = keep[order], exact[order]
    return out_i, out_s


def _centroid_maxsim(S: np.ndarray, codes: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Each document's MaxSim over its tokens' centroids: S (query tokens, K) read at its codes."""
    if not len(lengths):
        return np.zeros(0, dtype=np.float32)
    scores = np.ascontiguousarray(S.T)[np.asarray(codes, dtype=np.int64)]  # (candidate tokens, query tokens)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    full = lengths > 0
    best = np.zeros((len(lengths), len(S)), dtype=np.float32)
    if full.any():
        best[full] = np.maximum.reduceat(scores, starts[full], axis=0)
    return best.sum(1)


def pair_scores(ix: Any, queries: Sequence[np.ndarray], rows: np.ndarray) -> np.ndarray:
    """MaxSim of each query with one document of the index (a global row), from its decoded vectors."""
    docs = documents(ix, np.asarray(rows, dtype=np.int64))
    out = np.zeros(len(rows), dtype=np.float32)
    for j, (q, d) in enumerate(zip(queries, docs)):
        D, mask = padded([d], ix.dims)
        out[j] = maxsim(np.asarray(q, dtype=np.float32).reshape(1, -1, ix.dims), D, None, mask)[0, 0]
    return out
