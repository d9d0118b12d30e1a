"""ann.py: --ann hnsw and ivf find the exact hits."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from index_helpers import (
    built,
    exact,
)

from mlmkit.errors import ConfigError
from mlmkit.retrieval.index import BuildArgs, Index, build, search_vectors

pytest_plugins = ["index_fixtures"]


def test_ann_indexes_find_the_exact_hits(setup, tmp_path):
    pytest.importorskip("faiss")
    want, _ = exact(setup, 10)
    for q, ann in (("float32", "hnsw"), ("int8", "hnsw"), ("float32", "ivf")):
        ix = built(setup, f"{q}-{ann}", quantization=q, ann=ann)
        rows, _ = search_vectors(ix, setup["q"], 10, rescore=200)
        recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, want)])
        assert recall >= 0.85, (q, ann, recall)
    # an ann.faiss over other vectors than the manifest's (an append stopped between the two) is refused
    lines = setup["corpus"].read_text().splitlines(keepends=True)
    (tmp_path / "few.jsonl").write_text("".join(lines[:40]))
    build(BuildArgs(setup["bundle"], tmp_path / "few.jsonl", tmp_path / "few", ann="hnsw"))
    shutil.copytree(built(setup, "float32-hnsw").path, tmp_path / "ix")
    shutil.copy(tmp_path / "few" / "ann.faiss", tmp_path / "ix" / "ann.faiss")
    with pytest.raises(ConfigError, match="holds 40 vectors; the manifest says 1,200"):
        search_vectors(Index.open(tmp_path / "ix"), setup["q"], 10)
    # an IVF graph in place of the HNSW one (of the same vectors) is one line, not faiss's RuntimeError
    shutil.copy(built(setup, "float32-ivf").path / "ann.faiss", tmp_path / "ix" / "ann.faiss")
    with pytest.raises(ConfigError, match="is a faiss IndexIVFFlat, not the hnsw index its manifest names"):
        search_vectors(Index.open(tmp_path / "ix"), setup["q"], 10)
