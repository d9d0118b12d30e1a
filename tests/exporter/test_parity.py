"""Parity of a bundle with PyTorch (mlmkit/exporter/parity.py): sparse vectors compare as maps, and near
ties may trade places at the cut."""

from __future__ import annotations

import numpy as np


def test_sparse_vectors_compare_as_maps_and_near_ties_may_trade_places_at_the_cut():
    from mlmkit.exporter.parity import sparse_diff

    ids = np.array([[5, 9, 2], [7, 1, -1]])
    vals = np.array([[3.0, 1.00001, 1.0], [2.0, 0.5, 0.0]], dtype=np.float32)
    swapped = np.array([[5, 9, 4], [1, 7, -1]])  # term 2 and term 4 (both ~1.0) trade places at the cut
    got = np.array([[3.0, 1.00001, 1.00000], [0.5, 2.0, 0.0]], dtype=np.float32)
    assert sparse_diff(ids, vals, swapped, got) < 1e-4
    # a real miss: term 3 kept with 0.4 where the other side found zero
    wrong = np.array([[5, 9, 4], [7, 1, 3]])
    assert sparse_diff(ids, vals, wrong,
                       np.array([[3.0, 1.00001, 2.5], [2.0, 0.5, 0.4]], dtype=np.float32)) > 1.0
