"""Late interaction (ColBERT): MaxSim, the score of a query's token vectors against a document's.

score(query, document) = the sum over the query's tokens of its best dot product with any of the
document's tokens. ``maxsim`` is the one implementation: training (torch tensors, with gradients),
evaluation, search and serving (numpy arrays) all call it, so a model is trained on exactly the score
it is ranked by. It uses only operators numpy and torch share; this module never imports torch.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

CHUNK_ELEMENTS = 1 << 25
"""Most similarity entries (query tokens x document tokens) held at once: 128 MiB of float32."""


def _namespace(x: Any) -> Any:
    return np if isinstance(x, np.ndarray) else sys.modules["torch"]


def maxsim(Q: Any, D: Any, q_mask: Any = None, d_mask: Any = None, *,
           chunk_elements: int = CHUNK_ELEMENTS) -> Any:
    """(q, n) MaxSim scores of ``Q`` (q, Tq, dim) against ``D`` (n, Td, dim), numpy or torch alike.

    ``q_mask`` (q, Tq) and ``d_mask`` (n, Td), booleans, say which token vectors count (None: all).
    A query token left out adds nothing; a document token left out is never a best match; a document
    with no token that counts scores 0. The documents are scored ``chunk_elements`` similarity
    entries at a time, so memory stays bounded whatever the corpus."""
    xp = _namespace(Q)
    q, tq, dim = Q.shape
    n, td, _ = D.shape
    flat = Q.reshape(q * tq, dim)
    step = max(1, chunk_elements // max(1, q * tq * td))
    parts = []
    for start in range(0, n, step):
        Dc = D[start:start + step]
        S = (flat @ Dc.reshape(-1, dim).T).reshape(q, tq, len(Dc), td)  # (q, Tq, n', Td)
        if d_mask is not None:
            S = xp.where(d_mask[start:start + step][None, None], S, -xp.inf)
        best = xp.amax(S, -1)  # (q, Tq, n'): each query token's best document token
        if d_mask is not None:
            best = xp.where(xp.isinf(best), 0.0, best)
        if q_mask is not None:
            best = best * q_mask[:, :, None]
        parts.append(best.sum(1))
    return xp.concatenate(parts, 1) if parts else xp.zeros((q, 0), dtype=Q.dtype)


def padded(vectors: Sequence[np.ndarray], dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Texts' token vectors ((tokens_i, dim) each) as one (n, T, dim) float32 array, zero-padded, and
    its (n, T) mask of real tokens: what ``maxsim`` takes."""
    width = max([len(v) for v in vectors] or [1]) or 1
    out = np.zeros((len(vectors), width, dim), dtype=np.float32)
    mask = np.zeros((len(vectors), width), dtype=bool)
    for i, v in enumerate(vectors):
        out[i, : len(v)] = v
        mask[i, : len(v)] = True
    return out, mask


def rank(queries: Sequence[np.ndarray], documents: Sequence[np.ndarray], k: int, *,
         batch: int = 32) -> list[list[tuple[int, float]]]:
    """Each query's ``k`` best documents by MaxSim, exactly (every document scored): (document
    position, score) pairs, best first; ``batch`` queries at a time."""
    if not documents:
        return [[] for _ in queries]
    dim = int(np.asarray(documents[0]).shape[-1])
    D, dm = padded(documents, dim)
    out: list[list[tuple[int, float]]] = []
    for start in range(0, len(queries), batch):
        Q, qm = padded(queries[start:start + batch], dim)
        S = maxsim(Q, D, qm, dm)
        top = np.argsort(-S, axis=1, kind="stable")[:, :k]
        out.extend([(int(j), float(row[j])) for j in idx] for idx, row in zip(top, S))
    return out
