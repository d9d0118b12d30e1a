"""codecs.py: quantized indexes (float16, int8, binary) and their rescoring copies keep the exact hits."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from index_helpers import (
    DOCS,
    built,
    exact,
    one_red_line,
    runner,
)

from mlmkit.cli import app
from mlmkit.errors import ConfigError
from mlmkit.retrieval.exact import normalized
from mlmkit.retrieval.index import BuildArgs, Index, search_vectors

pytest_plugins = ["index_fixtures"]


def test_quantized_indexes_keep_the_exact_hits_and_binary_rescored_over_everything_is_int8(setup):
    want, _ = exact(setup, 10)
    recall = {}
    for q in ("float16", "int8", "binary"):
        ix = built(setup, q, quantization=q)
        rows, scores = search_vectors(ix, setup["q"], 10)
        recall[q] = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, want)])
        assert np.allclose(scores, (setup["q"][:, None, :] * setup["vectors"][rows]).sum(-1), atol=0.02)
    assert recall["float16"] >= 0.98 and recall["int8"] >= 0.9 and recall["binary"] >= 0.6, recall
    # (near-tied tiny-model vectors: int8 swaps a few, and 64 sign bits say little; all-MiniLM-L6-v2 on the
    # built-in set: int8 0.994, binary rescored from 100 0.994, docs/retrieval.md "Large corpora")
    # binary's rescoring reads the int8 copy: rescoring every document is int8's own search
    b, i8 = built(setup, "binary", quantization="binary"), built(setup, "int8", quantization="int8")
    rows_b, scores_b = search_vectors(b, setup["q"], 10, rescore=DOCS)
    assert (b.manifest.ranges == i8.manifest.ranges) and (b.shards[0][2] == i8.shards[0][0]).all()
    exact_i8 = normalized(setup["q"]) @ np.concatenate([c for _, c in i8.chunks()]).T
    top = np.lexsort((np.broadcast_to(np.arange(DOCS), exact_i8.shape), -exact_i8), axis=1)[:, :10]
    assert (rows_b == top).all() and np.allclose(scores_b, np.take_along_axis(exact_i8, top, 1), atol=1e-5)
    assert (b.path / "shard-000000" / "vectors.bin").stat().st_size == DOCS * 64 // 8


def test_a_float16_rescoring_copy_gives_int8_and_binary_the_exact_hits(setup, tmp_path):
    want, want_scores = exact(setup, 10)
    for q in ("int8", "binary"):
        ix = built(setup, f"{q}-copy", quantization=q, rescore_copy="float16")
        assert (ix.copy == "float16" and (ix.path / "shard-000000" / "rescore.bin").stat().st_size == DOCS
                * 64 * 2)
        # every document rescored: float16's own top 10
        rows, scores = search_vectors(ix, setup["q"], 10, rescore=DOCS)
        recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, want)])
        # float16 swaps near ties only
        assert recall >= 0.98 and np.allclose(scores, want_scores, atol=2e-3), (q, recall)
    assert (built(setup, "int8", quantization="int8").copy is None
            and built(setup, "binary", quantization="binary").copy == "int8")
    for quant, copy in (("int8", "int8"), ("float32", "float16"), ("int8", "float32")):
        with pytest.raises(ConfigError, match="--rescore-copy"):
            BuildArgs(setup["bundle"], setup["corpus"], tmp_path / "x", quantization=quant, rescore_copy=copy)
    # an append keeps the index's copy: asking for none is refused, the index untouched
    idx = tmp_path / "ix"
    shutil.copytree(built(setup, "int8-copy").path, idx)
    (tmp_path / "new.jsonl").write_text(json.dumps({"_id": "new", "text": "a dog"}) + "\n")
    r = runner.invoke(app, ["index", str(setup["bundle"]), "--corpus", str(tmp_path / "new.jsonl"), "--out",
                            str(idx), "--append",
                            "--quantization", "int8"])
    assert "--rescore-copy float16" in one_red_line(r) and Index.open(idx).count == DOCS
