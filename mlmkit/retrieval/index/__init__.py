"""`mlmkit index` and `mlmkit search`: a corpus embedded once into an on-disk index, searched in
bounded memory. No torch.

``Index`` (store.py) is the object the CLI, the server and Python users call: ``Index.build``,
``Index.open``, ``.add``, ``.search``, ``.delete``, ``.upsert``, ``.compact``, ``.stats``. One module a job:

- ``store.py``: ``Index``: the directory (shards of memory-mapped vectors and ids) opened, read, and its API;
- ``manifest.py``: manifest.json as a typed, checked ``Manifest`` (its format version checked there);
- ``disk.py``: the files beside the manifest (ids, the deleted rows' bitmap, chunk spans, the footprint);
- ``codecs.py``: how vectors are stored (float32, float16, int8, binary; the rescoring copy);
- ``identity.py``: the bundle an index was built with, recorded at build, checked cheaply at search;
- ``build_args.py``: `mlmkit index`'s arguments (``BuildArgs``), checked;
- ``building.py``: `mlmkit index` (build, ``--append``, ``--resume``, ``--upsert``'s append);
- ``embedding.py``: the corpus read and embedded window by window, here or on Ray (``--engine ray``);
- ``pending.py``: the shard being written (``.pending/``), window by window, resumable;
- ``live.py``: ``--delete``, ``--upsert``'s deletes, ``--compact``;
- ``ann.py``: ``--ann hnsw | ivf`` with faiss;
- ``multivector.py``: a colbert bundle's index (a vector a token: centroids, residuals, MaxSim);
- ``search.py``: the top k of query vectors or texts;
- ``filters.py``: ``--where``: the documents' other fields, kept beside their shard;
- ``hybrid.py``: several retrievers of one corpus (indexes, BM25) fused (``--hybrid``, ``--fusion``);
- ``evaluation.py``: `mlmkit evaluate INDEX`, and mining's retriever over an index;
- ``export.py``: `mlmkit search --export` (Parquet).

The names callers import are re-exported here.
"""

from mlmkit.retrieval.index.ann import ann_search, build_ann
from mlmkit.retrieval.index.api import Index
from mlmkit.retrieval.index.build_args import BuildArgs
from mlmkit.retrieval.index.building import build
from mlmkit.retrieval.index.codecs import (
    CALIBRATION,
    CALIBRATION_ROWS,
    QUANTIZATIONS,
    RESCORE_COPIES,
    calibrate,
    dequantize,
    quantize,
    row_bytes,
    stored,
)
from mlmkit.retrieval.index.disk import footprint
from mlmkit.retrieval.index.embedding import corpus_records
from mlmkit.retrieval.index.evaluation import (
    IndexRetriever,
    evaluate_bundle_by_index,
    evaluate_index,
    through_index,
)
from mlmkit.retrieval.index.export import export_parquet
from mlmkit.retrieval.index.identity import (
    bundle_checksum,
    check_bundle,
    query_bundle,
    same_bundle,
    served_indexes,
)
from mlmkit.retrieval.index.manifest import ANNS, FORMAT, KINDS, MANIFEST, Manifest, read_manifest
from mlmkit.retrieval.index.search import as_input, as_queries, hits, is_sparse, query_vectors, search_vectors
from mlmkit.retrieval.index.store import CHUNK, QUERY_BLOCK, Stats, StoredIndex

__all__ = [
    "ANNS", "CALIBRATION", "CALIBRATION_ROWS", "CHUNK", "FORMAT", "KINDS", "MANIFEST", "QUANTIZATIONS",
    "QUERY_BLOCK", "RESCORE_COPIES", "BuildArgs", "Index", "IndexRetriever", "Manifest", "Stats",
    "StoredIndex",
    "ann_search", "as_input", "as_queries", "build", "build_ann", "bundle_checksum", "calibrate",
    "check_bundle", "corpus_records", "dequantize", "evaluate_bundle_by_index", "evaluate_index",
    "export_parquet", "footprint", "hits", "is_sparse", "quantize", "query_bundle", "query_vectors",
    "read_manifest", "row_bytes", "same_bundle", "search_vectors", "served_indexes", "stored",
    "through_index",
]
