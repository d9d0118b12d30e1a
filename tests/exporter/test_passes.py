"""The passes over an exported graph (mlmkit/exporter/passes.py): onnxruntime's fusion, refused where it
does not happen, and static int8 calibrated on the inputs it is given (the runs: conftest.py's session
fixture ``runs``)."""

from __future__ import annotations

import random
from pathlib import Path

import onnx
import pytest
import torch
from conftest import run_export
from task_runs import sentence

from mlmkit.errors import MlmkitError
from mlmkit.models.core import BertSelfAttention
from mlmkit.runtime.pipeline import Pipeline


def _texts(path: Path, n: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    path.write_text("".join(sentence(rng, rng.randint(3, 20)) + "\n" for _ in range(n)))
    return path


@pytest.mark.parametrize("task", ["classification", "tagging", "embedding", "colbert"])
def test_static_int8_is_calibrated_on_the_inputs_it_is_given(runs, tmp_path, task):
    """--calibrate: activation ranges measured on real inputs, featurized by the task (QDQ nodes with
    constant scales, no DynamicQuantizeLinear), the agreement with fp32 measured on those inputs (a
    vector's cosine for embeddings, a token vector's for colbert)."""
    calib = _texts(tmp_path / "calib.txt", 64)
    q = run_export(runs[task], tmp_path / "int8", quantize="int8", calibrate=calib, min_agreement=0.5)
    assert q["precision"] == "int8" and "int8-static-qdq-per-channel" in q["optimizations"]
    ops = [n.op_type for n in onnx.load(str(tmp_path / "int8" / "model.onnx")).graph.node]
    assert ops.count("QuantizeLinear") >= 2 and "DynamicQuantizeLinear" not in ops
    got = q["parity"]["int8_agreement"]
    assert got["on"] == "64 --calibrate inputs" and 0.5 <= got["value"] <= 1.0
    vectors = task in ("embedding", "colbert")
    assert (got["top1"] is None) == vectors and (got["cosine"] is None) != vectors
    out = Pipeline.load(tmp_path / "int8")(["john went to paris", "the cat sat on the mat"])
    assert len(out) == 2 and (task != "colbert" or all(len(r["vectors"]) >= 4 for r in out))


def test_attention_the_fusion_does_not_recognise_is_refused(runs, tmp_path, monkeypatch):
    """An attention spelt as einsum exports and runs, but onnxruntime cannot fuse it: refused loudly
    rather than shipped several times slower."""

    def einsum_attention(self, x, mask, queries=None):
        B, T, H = x.shape
        q, k, v = self._heads(self.query(x)), self._heads(self.key(x)), self._heads(self.value(x))
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / self.head_dim**0.5 + mask
        ctx = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(scores, -1), v)
        return ctx.permute(0, 2, 1, 3).reshape(B, T, H)

    monkeypatch.setattr(BertSelfAttention, "forward", einsum_attention)
    with pytest.raises(MlmkitError, match="fusion did not happen: Attention 0 of 2"):
        run_export(runs["fill-mask"], tmp_path / "b")
    assert not (tmp_path / "b" / "model.onnx").exists()
