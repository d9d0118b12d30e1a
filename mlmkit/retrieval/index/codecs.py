"""How an index stores its unit-length vectors (``--quantization``, ``--rescore-copy``): each
quantization's row format, the int8 calibration, and the conversions both ways. No torch.

Scores are dot products of unit vectors, so cosines:

- ``float32``: D values a row;
- ``float16``: half the disk, scores within ~1e-3 of float32;
- ``int8``: each dimension's range (the CALIBRATION percentiles of the first CALIBRATION_ROWS
  documents' values) cut into 255 steps; the float query is scored against the dequantized vectors
  (asymmetric: quantizing the query too, to the documents' ranges, lost a tenth of recall@10:
  docs/retrieval.md);
- ``binary``: one bit a dimension (positive or not), D / 8 bytes a row in numpy.packbits order; a
  query (float) is scored against +-1 vectors, then its ``rescore`` best are scored again with the
  int8 copy, and the best ``top_k`` of those kept. (Bits cut at each dimension's median instead of
  0 were measured no better on all-MiniLM-L6-v2 and worse on a tiny random model.)

``--rescore-copy float16`` keeps the vectors as float16 beside an int8 or binary index: the first
stage still reads only the quantized vectors (what must stay in memory for speed), and the
candidates are rescored from the float16 copy, read from disk for them alone: recall@10 1.000 for
int8 from 100 candidates on that set.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mlmkit.errors import ConfigError

QUANTIZATIONS = ("float32", "float16", "int8", "binary")
RESCORE_COPIES = ("int8", "float16")
"""What a quantized index may keep beside its vectors for rescoring: int8 (binary's default), float16."""
CALIBRATION = (0.1, 99.9)
"""The percentiles of each dimension's values that bound int8's range."""
CALIBRATION_ROWS = 8192
"""The first documents of a new index whose vectors calibrate int8 (and binary's int8 copy)."""


def faiss_module() -> Any:
    """faiss (--ann's indexes, a multi-vector index's k-means), or one line saying how to install it."""
    try:
        import faiss
    except ImportError:
        raise ConfigError("--ann hnsw and ivf, and the index of a colbert bundle, need faiss",
                          "pip install 'mlmkit[retrieval]' (faiss-cpu), or --ann flat") from None
    return faiss


def row_bytes(quantization: str, dims: int) -> int:
    """Bytes a row of ``dims`` dimensions takes on disk as ``quantization`` stores it (a rescoring
    copy's kind is a quantization too: int8 or float16)."""
    return {"float32": 4 * dims, "float16": 2 * dims, "int8": dims, "binary": (dims + 7) // 8}[quantization]


def dtype(quantization: str) -> Any:
    """The numpy type of a stored row's values (binary: bytes of packed bits)."""
    return {"float32": np.float32, "float16": np.float16, "int8": np.int8, "binary": np.uint8}[quantization]


def calibrate(x: np.ndarray) -> np.ndarray:
    """(2, D) int8 ranges: each dimension's CALIBRATION percentiles of the sample ``x`` (a range of 0
    widened, so that every step is positive)."""
    lo, hi = np.percentile(x, CALIBRATION, axis=0).astype(np.float32)
    hi = np.maximum(hi, lo + 1e-6)
    return np.stack([lo, hi])


def quantize(x: np.ndarray, ranges: np.ndarray) -> np.ndarray:
    lo, hi = ranges
    return (np.clip(np.rint((x - lo) / (hi - lo) * 255), 0, 255) - 128).astype(np.int8)


def dequantize(q: np.ndarray, ranges: np.ndarray | None) -> np.ndarray:
    assert ranges is not None
    lo, hi = ranges
    return lo + (q.astype(np.float32) + 128) * ((hi - lo) / 255)


def stored(x: np.ndarray, quantization: str, ranges: np.ndarray | None,
           copy: str | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """(vectors as stored, the rescoring copy of kind ``copy`` or None) of unit-length float32 rows."""
    if quantization == "float32":
        return x.astype(np.float32), None
    if quantization == "float16":
        return x.astype(np.float16), None
    assert ranges is not None
    q8 = quantize(x, ranges)
    kept = x.astype(np.float16) if copy == "float16" else q8 if copy == "int8" else None
    return (q8 if quantization == "int8" else np.packbits(x > 0, axis=1)), kept


def floats(raw: np.ndarray, quantization: str, dims: int, ranges: np.ndarray | None) -> np.ndarray:
    """Stored rows of ``quantization`` as float32: as stored (floats), dequantized (int8), +-1 (binary)."""
    if quantization == "binary":
        return np.unpackbits(raw, axis=1, count=dims).astype(np.float32) * 2 - 1
    if quantization == "int8":
        return dequantize(raw, ranges)
    return raw.astype(np.float32, copy=False)  # float32 rows as they are read: no copy of a chunk
