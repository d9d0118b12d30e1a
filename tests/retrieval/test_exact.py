"""The one tie rule of every ranking (exact.top_k, BM25): the higher score first, then the earlier
document; the same ranks whatever the CPU's numpy selection kernels."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mlmkit.retrieval.exact import BM25, top_k


def _by_rule(s: np.ndarray, k: int) -> list[int]:
    return sorted(range(len(s)), key=lambda r: (-s[r], r))[:k]


@pytest.mark.parametrize("seed", range(6))
def test_top_k_keeps_equal_scores_by_the_earlier_row_across_chunks(seed):
    rng = np.random.default_rng(seed)
    n, k, chunk = int(rng.integers(50, 3000)), int(rng.integers(1, 60)), int(rng.integers(7, 500))
    s = rng.integers(0, 4, (5, n)).astype(np.float32)  # a few distinct scores: ties everywhere
    s[rng.random((5, n)) < 0.2] = -np.inf  # rows kept out by a filter
    rows, scores = top_k(((a, s[:, a:a + chunk]) for a in range(0, n, chunk)), 5, k)
    for q in range(5):
        want = _by_rule(s[q], k)
        assert rows[q].tolist()[:len(want)] == want and scores[q].tolist() == s[q, want].tolist()


SCRIPT = """
import hashlib, json, sys
import numpy as np
from mlmkit.retrieval.exact import BM25, top_k
rng = np.random.default_rng(0)
s = rng.integers(0, 5, (8, 40000)).astype(np.float32)
rows, _ = top_k(((a, s[:, a:a + 4096]) for a in range(0, s.shape[1], 4096)), 8, 50)
words = ["cat", "dog", "bird", "fish"]
docs = [" ".join(words[(i * 7 + j) % 4] for j in range(1 + i % 3)) for i in range(3000)]
bm_rows, bm_scores = BM25(docs).search(["cat dog", "bird", "fish cat"], 40)
print(json.dumps([rows.tolist(), bm_rows.tolist(), bm_scores.tolist()]))
"""


def test_the_same_ranks_with_numpys_cpu_specific_kernels_switched_off():
    """np.argpartition's order of equal keys differs between its AVX-512 and AVX2 kernels: the ranks
    do not (NPY_DISABLE_CPU_FEATURES switches off every kernel this CPU dispatches to beyond numpy's
    baseline)."""
    pytest.importorskip("bm25s")
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    dispatched = [f for f in __cpu_dispatch__ if __cpu_features__.get(f)]
    if not dispatched:
        pytest.skip("numpy dispatches to no kernel beyond its baseline on this CPU")
    runs = []
    for off in ("", " ".join(dispatched)):
        env = {**os.environ, "NPY_DISABLE_CPU_FEATURES": off}
        r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env,
                           timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        runs.append(r.stdout)
    assert runs[0] == runs[1]
    rows, bm_rows, bm_scores = json.loads(runs[0])
    assert all(np.all(np.diff(row) != 0) for row in rows)  # no row twice
    for row, sc in zip(bm_rows, bm_scores):  # BM25's equal scores by the earlier document
        assert all((a > b) or (a == b and r1 < r2) for a, b, r1, r2 in zip(sc, sc[1:], row, row[1:]))


def test_bm25_ranks_by_the_rule_and_a_mask_keeps_its_documents():
    docs = ["cat dog", "dog cat", "cat", "bird", "cat dog", "fish"]
    rows, scores = BM25(docs).search(["cat dog"], 6)
    assert rows[0].tolist()[:2] == [0, 1] and scores[0, 0] == scores[0, 1]  # equal: the earlier first
    mask = np.array([0, 1, 1, 1, 1, 1], dtype=np.float32)
    rows, _ = BM25(docs).search(["cat dog"], 2, mask=mask)
    assert rows[0].tolist() == [1, 4]


def test_bm25_over_stop_words_only_is_one_line():
    from mlmkit.errors import ConfigError

    with pytest.raises(ConfigError, match="hold no word but English stop words"):
        BM25(["the a an", "of the", "..."])


@pytest.mark.parametrize(("text", "want"), [('{"documents": 12}', 12), ('{"documents": "12"}', None),
                                            ('{"documents": 12', None), ("[]", None)])
def test_a_first_stages_finished_vectors_marker_is_read_typed_and_a_damaged_one_embeds_again(
        tmp_path, text, want):
    """corpus-embeddings.json (an embedding first stage's vectors, whole): read by the typed reader; a
    damaged or hand-edited one means the corpus is embedded again, not a traceback."""
    from mlmkit.retrieval.exact import _embedded

    done = tmp_path / "corpus-embeddings.json"
    assert _embedded(done) is None
    done.write_text(text)
    assert _embedded(done) == want
