"""``--ann hnsw | ivf``: a faiss index over every shard's vectors (ann.faiss), built and searched. No torch.

HNSW (M 32, efSearch at least the candidates asked) or IVF (4 sqrt(N) lists, nprobe 16) over the
stored vectors: Flat for float32, SQfp16 for float16, SQ8 for int8, and faiss's binary indexes for
binary. An append rebuilds it (its IVF lists are trained again on the whole corpus).
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from mlmkit.errors import ConfigError
from mlmkit.files import atomic_write
from mlmkit.retrieval.index.codecs import faiss_module
from mlmkit.retrieval.index.manifest import AnnSettings, Manifest
from mlmkit.retrieval.index.store import CHUNK, StoredIndex

FILTERED_CEILING = 16384
"""The widest efSearch a filtered HNSW search takes (efSearch / the fraction of rows allowed, up to this)."""


def ann_settings(ann: str, count: int, *, hnsw_m: int, ivf_lists: int | None) -> AnnSettings:
    """The manifest's ``ann_settings`` of a new index of ``count`` documents."""
    if ann == "hnsw":
        return AnnSettings(m=hnsw_m, ef_construction=80, ef_search=128)
    if ann == "ivf":
        return AnnSettings(lists=ivf_lists or max(1, min(65536, int(4 * np.sqrt(count)))), nprobe=16)
    return AnnSettings()


def build_ann(out: Path, manifest: Manifest) -> None:
    """ann.faiss (the manifest's ann_file) over every shard ``manifest`` names in ``out``, written
    atomically. Memory: the faiss structure, held whole while it is built (and, for IVF, its training
    sample)."""
    faiss = faiss_module()
    ix = StoredIndex(out, manifest)
    ix.shards = [ix.shard(out / s.name, s.count, "rebuild the index") for s in manifest.shards]
    q, d, s = ix.quantization, ix.dims, manifest.ann_settings
    if q == "binary":
        spec = f"BHNSW{s.m}" if manifest.ann == "hnsw" else f"BIVF{s.lists}"
        index = faiss.index_binary_factory(d, spec)
    else:
        code = {"float32": "Flat", "float16": "SQfp16", "int8": "SQ8"}[q]
        hnsw = f"HNSW{s.m}" + ("" if code == "Flat" else f"_{code}")
        spec = hnsw if manifest.ann == "hnsw" else f"IVF{s.lists},{code}"
        index = faiss.index_factory(d, spec, faiss.METRIC_INNER_PRODUCT)
    if manifest.ann == "hnsw":
        faiss.ParameterSpace().set_index_parameter(index, "efConstruction", int(s.ef_construction or 80))

    def raw() -> Iterator[np.ndarray]:
        for vectors, _, _ in ix.shards:
            for a in range(0, len(vectors), CHUNK):
                chunk = np.asarray(vectors[a:a + CHUNK])
                yield chunk if q == "binary" else np.ascontiguousarray(ix.floats(chunk))

    if not index.is_trained:
        rng = np.random.default_rng(0)
        sample = np.concatenate(list(raw()))  # training sample: at most 256 a list (faiss's own advice)
        sample = sample[rng.permutation(len(sample))[: 256 * int(s.lists or 1)]]
        index.train(sample)
    for chunk in raw():
        index.add(chunk)
    write_faiss(index, out / str(manifest.ann_path), binary=q == "binary")


def write_faiss(index: Any, path: Path, *, binary: bool = False) -> None:
    """``index`` written to ``path`` atomically, through a Python file: faiss's own file writer prints a
    full disk met as it closes the file ("close error") and returns, leaving a cut file; Python's raises
    (ENOSPC). faiss's failed write of another kind (a RuntimeError whose message is its C++ source's) is
    an OSError naming ``path``. Either way the temporary file is removed and ``path`` is as it was."""
    faiss = faiss_module()
    writer = faiss.write_index_binary if binary else faiss.write_index

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            try:
                writer(index, faiss.PyCallbackIOWriter(f.write))
            except RuntimeError as e:
                said = " ".join(str(e).split())
                said = said.rsplit("failed:", 1)[-1].strip()[:120] if "failed:" in said else said[:120]
                raise OSError(errno.EIO, f"faiss could not write it ({said or type(e).__name__})",
                              str(path)) from e

    atomic_write(path, write)


def load_ann(ix: StoredIndex) -> Any:
    """``ix``'s faiss index (its manifest's ann_file), read once and kept on ``ix`` (a search of many
    query blocks, a server's every request, use that one). A file faiss cannot read (truncated, another
    file's bytes), or one of other dimensions or another number of vectors than the manifest's (an append
    stopped between writing it and its manifest) is one line naming it, never searched."""
    if ix.ann_index is not None:
        return ix.ann_index
    faiss = faiss_module()
    path = ix.path / str(ix.manifest.ann_path)
    hint = f"build it again from the stored vectors: mlmkit index {ix.path} --compact"
    if not path.is_file():
        raise ConfigError(f"{path} is missing; the manifest of {ix.path} names it as its {ix.ann} index",
                          hint)
    try:
        read = faiss.read_index_binary if ix.quantization == "binary" else faiss.read_index
        index = read(str(path))
    except (RuntimeError, MemoryError):  # faiss's message is its C++ source's; the file is actionable
        raise ConfigError(f"{path} is not a readable faiss {ix.ann} index: a truncated or replaced file",
                          hint) from None
    if not hasattr(index, "hnsw" if ix.ann == "hnsw" else "nprobe"):  # what its search parameters set
        raise ConfigError(f"{path} is a faiss {type(index).__name__}, not the {ix.ann} index its manifest "
                          "names: a replaced file", hint)
    if index.d != ix.dims:
        raise ConfigError(f"{path} holds vectors of {index.d} dimensions; the manifest says {ix.dims}: a "
                          "replaced file", hint)
    if index.ntotal != ix.count:
        raise ConfigError(f"{path} holds {index.ntotal:,} vectors; the manifest says {ix.count:,}: an append "
                          "that was stopped before its manifest was written",
                          "finish that append: the same `mlmkit index` command with --resume")
    ix.ann_index = index
    return index


def ann_search(ix: StoredIndex, q: np.ndarray, n: int,
               allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The ``n`` candidates of each (unit) query from the ANN index (load_ann): (rows, scores), -1 past
    the graph's reach; ``allowed`` ((count,) bool): only those rows, through faiss's IDSelectorBitmap
    (not binary IVF, which takes none)."""
    faiss = faiss_module()
    index = load_ann(ix)
    settings = ix.manifest.ann_settings
    ef, nprobe = max(settings.ef_search or 128, n), settings.nprobe or 16
    x = np.packbits(q > 0, axis=1) if ix.quantization == "binary" else np.ascontiguousarray(q)
    if allowed is None:
        name, value = ("efSearch", ef) if ix.ann == "hnsw" else ("nprobe", nprobe)
        faiss.ParameterSpace().set_index_parameter(index, name, value)
        scores, rows = index.search(x, n)
    else:  # the fewer rows allowed, the wider the search: efSearch and nprobe over the fraction allowed
        share = max(float(allowed.mean()), 1e-6) if len(allowed) else 1.0
        ef = int(min(max(ef, ef / share), FILTERED_CEILING))
        nprobe = int(min(np.ceil(nprobe / share), settings.lists or 1 << 30))
        bits = np.packbits(allowed, bitorder="little")  # faiss's bitmap: bit i of byte j is row 8j + i
        sel = faiss.IDSelectorBitmap(len(allowed), faiss.swig_ptr(bits))
        params = (faiss.SearchParametersHNSW(sel=sel, efSearch=ef) if ix.ann == "hnsw"
                  else faiss.SearchParametersIVF(sel=sel, nprobe=nprobe))
        scores, rows = index.search(x, n, params=params)
    return rows.astype(np.int64), scores.astype(np.float32)
