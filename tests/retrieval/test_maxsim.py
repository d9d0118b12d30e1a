"""MaxSim (mlmkit/retrieval/maxsim.py) against its formula, in numpy and torch, and the ranking by it."""

from __future__ import annotations

import numpy as np
import torch

from mlmkit.retrieval.maxsim import maxsim, rank


def _maxsim_loop(q: np.ndarray, d: np.ndarray) -> float:
    return float(sum(max(float(a @ b) for b in d) for a in q)) if len(d) else 0.0


def test_maxsim_is_the_sum_of_each_query_tokens_best_match_in_numpy_and_torch():
    rng = np.random.default_rng(0)
    queries = [rng.normal(size=(n, 8)).astype(np.float32) for n in (3, 5)]
    docs = [rng.normal(size=(n, 8)).astype(np.float32) for n in (4, 1, 7, 0)]
    want = np.array([[_maxsim_loop(q, d) for d in docs] for q in queries])
    from mlmkit.retrieval.maxsim import padded

    Q, qm = padded(queries, 8)
    D, dm = padded(docs, 8)
    for chunk in (1 << 25, 1):  # all documents at once, and one at a time
        got = maxsim(Q, D, qm, dm, chunk_elements=chunk)
        assert np.allclose(got, want, atol=1e-5)
    got_torch = maxsim(torch.from_numpy(Q), torch.from_numpy(D), torch.from_numpy(qm), torch.from_numpy(dm))
    assert torch.allclose(got_torch, torch.from_numpy(want).float(), atol=1e-5)
    top = rank(queries, docs, k=2)
    assert [[j for j, _ in row] for row in top] == [list(np.argsort(-w, kind="stable")[:2]) for w in want]
