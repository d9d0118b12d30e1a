"""``Index``: the object users call to build, open, change and search an index (faiss's and LanceDB's
index objects are the model). Each method is a thin call into building.py, live.py or search.py, over
the reader store.py opens. No torch.

    ix = Index.build(bundle, corpus, out)    # or Index.open(out)
    ix.add(documents); ix.delete(ids); ix.upsert(documents); ix.compact()
    ix.search(["a query"], k=10, where="lang=en"); ix.stats()

A change (add, delete, upsert, compact) is written to disk whole (the manifest last) and the object
opened again on the index as it became.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mlmkit.files import JSONObject
from mlmkit.retrieval.index.building import add as add_documents
from mlmkit.retrieval.index.building import build_from
from mlmkit.retrieval.index.building import upsert as upsert_documents
from mlmkit.retrieval.index.live import compact as compact_index
from mlmkit.retrieval.index.live import delete as delete_ids
from mlmkit.retrieval.index.live import ids_of, read_ids_file
from mlmkit.retrieval.index.search import search_index
from mlmkit.retrieval.index.store import Documents, Progress, StoredIndex


class Index(StoredIndex):
    """An index directory, opened (StoredIndex: its manifest checked against its files, which are
    memory-mapped), with the changes and search users call."""

    @classmethod
    def build(cls, bundle: str | Path, corpus: Documents, out: str | Path, *, progress: Progress = None,
              **settings: Any) -> Index:
        """A new index at ``out`` of ``corpus`` embedded with ``bundle`` (an embedding, sparse-embedding
        or colbert bundle), opened. ``settings``: `mlmkit index`'s (BuildArgs's fields: quantization,
        ann, rescore_copy, chunk_tokens, workers, append, resume ...)."""
        build_from(Path(bundle), corpus, Path(out), progress, settings)
        return cls.open(out)

    def add(self, documents: Documents, *, bundle: str | Path | None = None, progress: Progress = None,
            **settings: Any) -> None:
        """Embed ``documents`` (new ids) into a new shard (`mlmkit index --append`), with the index's own
        bundle (or ``bundle``, the same graph elsewhere) and settings."""
        add_documents(self, documents, None if bundle is None else Path(bundle), progress, settings)
        self.reopen()

    def upsert(self, documents: Documents, *, progress: Progress = None, **settings: Any) -> None:
        """Add ``documents``, replacing the index's of the same ids, in one change (`--upsert`)."""
        upsert_documents(self, documents, progress, settings)
        self.reopen()

    def delete(self, ids: Iterable[str] | Path) -> None:
        """Delete the documents ``ids`` (or those a file lists, as `--delete` reads it: a pathlib.Path)."""
        if isinstance(ids, Path):
            delete_ids(self.path, read_ids_file(ids), ids)
        else:
            delete_ids(self.path, ids_of(ids), "the ids given")
        self.reopen()

    def compact(self) -> None:
        """Rewrite the shards that hold deleted documents without them (`--compact`)."""
        compact_index(self.path)
        self.reopen()

    def search(self, queries: Sequence[str] | Any, k: int = 10, *,
               where: str | Sequence[str] | np.ndarray | None = None,
               rescore: int | None = None, chunk_agg: str = "max", bundle: str | Path | None = None,
               prompt_name: str | None = None, device: str = "cpu",
               precision: str | None = None) -> list[list[JSONObject]]:
        """Each query's top ``k`` hits, {"id", "score"} best first (a chunked index's with its best chunk).
        ``queries``: texts (embedded with the index's bundle, or ``bundle``), or vectors as search_vectors
        takes them; ``where``: a filter's conditions (`--where`'s, e.g. "lang=en"), or a (count,) bool array
        of the rows allowed."""
        return search_index(self, queries, k, where=where, rescore=rescore, chunk_agg=chunk_agg,
                            bundle=bundle, prompt_name=prompt_name, device=device, precision=precision)
