"""Static-embedding bundles: a table of one vector per token, averaged over a text's tokens.

No transformer runs: the graph gathers each token's row of ``table`` (vocabulary x dims, the rows
already weighted) and averages them over the text's counted tokens, then L2-normalises:

    embedding[b] = normalise( sum_t m[b,t] * table[ids[b,t]] / max(sum_t m[b,t] * counted[ids[b,t]], eps) )

``m`` is the attention mask; ``counted`` is 1 for a vocabulary token and 0 for the special tokens
(their rows are zero), so [CLS] and [SEP] neither add to the sum nor to the count. The bundle is an
ordinary ``embedding`` bundle (model.onnx, tokenizer.json, mlmkit.json), so `mlmkit embed`,
`predict`, `evaluate`, `mine --retriever` and `serve` run it as they run any embedding bundle; its
mlmkit.json's model type is ``static-embedding`` and its "static" entry says how the table was made
(mlmkit.train.static). No torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mlmkit.files import JSONObject, atomic_write, atomic_write_text, write_json
from mlmkit.runtime.bundle import BundleMeta, ModelShape, tokenizer_fingerprint
from mlmkit.text.specials import write_special_tokens_map

STATIC = "static-embedding"
"""The model type of a static-embedding bundle (mlmkit.json's model.model_type)."""
STATIC_OPSET = 17
EPS = 1e-9


def static_graph(table: np.ndarray, counted: np.ndarray) -> Any:
    """The ONNX graph of the module docstring: inputs input_ids and attention_mask (batch, sequence),
    int64; output embedding (batch, hidden), float32."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    if table.ndim != 2 or counted.shape != (table.shape[0],):
        raise ValueError(f"a table of (vocabulary, dims) rows and a count per row, got {table.shape} and "
                         f"{counted.shape}")
    inits = [numpy_helper.from_array(np.ascontiguousarray(table, dtype=np.float32), "table"),
             numpy_helper.from_array(np.ascontiguousarray(counted, dtype=np.float32), "counted"),
             numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
             numpy_helper.from_array(np.array([-1], dtype=np.int64), "axis_last"),
             numpy_helper.from_array(np.array(EPS, dtype=np.float32), "eps")]
    node = helper.make_node
    nodes = [
        node("Gather", ["table", "input_ids"], ["rows"]),  # (B, T, D)
        node("Gather", ["counted", "input_ids"], ["count"]),  # (B, T)
        node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
        node("Mul", ["count", "mask"], ["weight"]),  # (B, T): 1 for a real, counted token
        node("Unsqueeze", ["weight", "axis1"], ["weight_row"]),  # (B, 1, T)
        node("MatMul", ["weight_row", "rows"], ["summed_row"]),  # (B, 1, D)
        node("Squeeze", ["summed_row", "axis1"], ["summed"]),  # (B, D)
        node("ReduceSum", ["weight", "axis_last"], ["tokens"], keepdims=1),  # (B, 1)
        node("Max", ["tokens", "eps"], ["tokens_safe"]),
        node("Div", ["summed", "tokens_safe"], ["mean"]),
        node("Mul", ["mean", "mean"], ["squares"]),
        node("ReduceSum", ["squares", "axis_last"], ["norm2"], keepdims=1),
        node("Sqrt", ["norm2"], ["norm"]),
        node("Max", ["norm", "eps"], ["norm_safe"]),
        node("Div", ["mean", "norm_safe"], ["embedding"]),
    ]
    graph = helper.make_graph(
        nodes, "static_embedding",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", "hidden"])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", STATIC_OPSET)],
                              producer_name="mlmkit")
    model.ir_version = 8  # onnxruntime reads IR 8 at opset 17
    onnx.checker.check_model(model)
    return model


def static_embeddings(table: np.ndarray, counted: np.ndarray, ids: list[list[int]]) -> np.ndarray:
    """What the graph computes, in numpy, for texts given as token id lists (the tests' reference)."""
    out = np.zeros((len(ids), table.shape[1]), dtype=np.float64)
    for i, row in enumerate(ids):
        w = counted[row].astype(np.float64)
        v = (w[:, None] * table[row].astype(np.float64)).sum(0) / max(w.sum(), EPS)
        out[i] = v / max(float(np.linalg.norm(v)), EPS)
    return out.astype(np.float32)


def write_static_bundle(out: str | Path, table: np.ndarray, counted: np.ndarray, tok: Any, *, max_length: int,
                        options: Mapping[str, Any], info: JSONObject, source: str) -> BundleMeta:
    """Write the bundle's files into ``out`` (model.onnx, tokenizer.json and its special_tokens_map.json
    before mlmkit.json, each replaced atomically) and return its description."""
    import onnx

    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    model = static_graph(table, counted)
    atomic_write(d / "model.onnx", lambda tmp: onnx.save(model, tmp))
    atomic_write_text(d / "tokenizer.json", tok.to_str(pretty=False))
    write_special_tokens_map(tok, d)  # the special tokens' roles, read back with tokenizer.json
    meta = BundleMeta(
        task="embedding", trained_as="embedding", max_length=max_length,
        options={**options, "pooling": "mean", "normalize": True},
        inputs=("input_ids", "attention_mask"), outputs={"embedding": ("batch", "hidden")},
        opset=STATIC_OPSET,
        tokenizer=tokenizer_fingerprint(tok),
        model=ModelShape(model_type=STATIC, vocab_size=int(table.shape[0]), hidden_size=int(table.shape[1])),
        model_bytes=os.path.getsize(d / "model.onnx"), source={"path": source}, run={"static": info},
    )
    write_json(d / "mlmkit.json", meta.to_json())
    return meta


def read_static_table(bundle: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(table, counted) of a static-embedding bundle's graph."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(Path(bundle) / "model.onnx"))
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return init["table"], init["counted"]


__all__ = ["STATIC", "read_static_table", "static_embeddings", "static_graph", "write_static_bundle"]
