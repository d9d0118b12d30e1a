"""`mlmkit search INDEX --export FILE`: an index's ids and vectors as a Parquet table. No torch."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import mlmkit.retrieval.index.multivector as multivector
from mlmkit.files import atomic_write
from mlmkit.retrieval.index.store import CHUNK, StoredIndex


def export_parquet(ix: StoredIndex, path: Path) -> int:
    """ids and float32 vectors (dequantized) as a Parquet table: ``id`` string, ``vector``
    fixed_size_list<float32>[dims], what LanceDB, DuckDB and Qdrant's importers read; a sparse index's
    as ``indices`` list<int32> and ``values`` list<float32> (Qdrant's sparse vectors); a multi-vector
    index's as ``vectors`` list<fixed_size_list<float32>[dims]>, each document's token vectors decoded
    (Qdrant's multivectors). Written a chunk at a time, whole or not at all. Returns the number of rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = {"sparse": pa.schema([("id", pa.string()), ("indices", pa.list_(pa.int32())),
                                   ("values", pa.list_(pa.float32()))]),
              "multivector": pa.schema([("id", pa.string()),
                                        ("vectors", pa.list_(pa.list_(pa.float32(), ix.dims)))]),
              }.get(ix.kind, pa.schema([("id", pa.string()), ("vector", pa.list_(pa.float32(), ix.dims))]))

    def write(tmp: str) -> None:
        with pq.ParquetWriter(tmp, schema) as w:
            start = 0
            for p in ix.sparse:
                for a in range(0, p.count, CHUNK):
                    e = min(p.count, a + CHUNK)
                    terms, values = p.vectors(a, e)
                    w.write_table(pa.table({"id": ix.ids(np.arange(start + a, start + e)), "indices": terms,
                                            "values": values},
                                           schema=schema))
                start += p.count
            for a in range(0, ix.count, CHUNK) if ix.kind == "multivector" else ():
                rows = np.arange(a, min(ix.count, a + CHUNK))
                docs = multivector.documents(ix, rows)
                flat = pa.FixedSizeListArray.from_arrays(pa.array(np.concatenate(docs).reshape(-1)), ix.dims)
                offsets = pa.array(np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int32))
                w.write_table(pa.table({"id": pa.array(ix.ids(rows), pa.string()),
                                        "vectors": pa.ListArray.from_arrays(offsets, flat)}, schema=schema))
            for start, x in ix.chunks("rescore") if ix.kind == "dense" else ():
                ids = ix.ids(np.arange(start, start + len(x)))
                w.write_table(pa.table({"id": pa.array(ids, pa.string()),
                                        "vector": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)),
                                                                                    ix.dims)}, schema=schema))

    atomic_write(path, write)
    return ix.count
