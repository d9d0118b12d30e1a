"""The bundle an index was built with: its identity recorded once at build, checked cheaply at search.
No torch.

A build records, in the manifest's ``bundle``: its resolved ``path``; ``sha256``, a hash of the whole
graph and description (model.onnx, then mlmkit.json: the same bundle wherever it is copied); and what
the file system says of the graph at that moment, ``model_bytes`` and ``model_mtime_ns``, with
``mlmkit_json_sha256`` (Pipeline.identity's fields, as a resumable job records them).

A search (``mlmkit search``, /v1/search, evaluation, mining) checks the bundle it embeds queries with
against that record (``same_bundle``):

1. the same path, model.onnx of the same size and modification time (to the nanosecond), and an
   mlmkit.json of the same sha256 (a few kB, hashed each time): the same bundle, and model.onnx (up to
   hundreds of MB) is not read;
2. anything else (a copy, another path, a graph touched or replaced, an index built before these
   fields were recorded): the whole bundle hashed and compared with ``sha256``, once per process for a
   file of that path, size and time (``bundle_checksum``'s cache).

What step 1 trusts: a file at the same path with the same size and time is the same file, as make,
rsync (by default) and a resumed batch job (jobs/batch.py) trust it. A graph rewritten in place that
keeps both (``touch -r``, a copy with ``cp -p`` of another graph of exactly the same size) passes
unseen; any other change is caught by the hash.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from pathlib import Path

from mlmkit.errors import ConfigError, MlmkitError
from mlmkit.retrieval.index.ann import load_ann
from mlmkit.retrieval.index.disk import manifest_stamp
from mlmkit.retrieval.index.manifest import BundleRecord
from mlmkit.retrieval.index.store import StoredIndex

log = logging.getLogger("mlmkit")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _stat(bundle: Path) -> tuple[str, int, int, str]:
    """(resolved path, model.onnx's size and mtime_ns, mlmkit.json's sha256): what step 1 compares."""
    g = (bundle / "model.onnx").stat()
    return str(bundle.resolve()), g.st_size, g.st_mtime_ns, _sha256(bundle / "mlmkit.json")


def bundle_checksum(bundle: Path) -> str:
    """sha256 over the bundle's graph and description: the same bundle wherever it is copied. Read
    whole once per process for a graph of the same path, size and time (cached)."""
    return _checksum(*_stat(Path(bundle)))


@functools.lru_cache(maxsize=64)
def _checksum(path: str, size: int, mtime_ns: int, description: str) -> str:
    """The key is what ``_stat`` saw: a graph changed since (size or time) is another key, read again."""
    h = hashlib.sha256()
    for name in ("model.onnx", "mlmkit.json"):
        with open(Path(path) / name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def record(bundle: Path) -> BundleRecord:
    """The manifest's ``bundle`` at build: the path, the whole-bundle sha256 (read once), the graph's
    size and time and the description's sha256."""
    path, size, mtime_ns, description = _stat(Path(bundle))
    return BundleRecord(path, _checksum(path, size, mtime_ns, description), size, mtime_ns, description)


def same_bundle(recorded: BundleRecord, bundle: Path, *, read: bool = True) -> bool:
    """Whether ``bundle`` is the one a manifest's ``recorded`` bundle names: step 1 of the module's
    docstring, then (``read``) step 2. ``read=False``: step 1 alone (no graph read)."""
    here = _stat(Path(bundle))
    was = (recorded.path, recorded.model_bytes, recorded.model_mtime_ns, recorded.mlmkit_json_sha256)
    if here == was:
        return True
    return read and _checksum(*here) == recorded.sha256


def check_bundle(ix: StoredIndex, bundle: Path) -> None:
    """A bundle given to search an index must be the one it was built with."""
    was = ix.manifest.bundle
    if same_bundle(was, bundle):
        return
    if str(Path(bundle).resolve()) == was.path:
        raise ConfigError(f"{ix.path} was built with the bundle {bundle} as it was then; its model.onnx "
                          "or mlmkit.json has changed since (another graph or description): its queries "
                          "would be embedded into another space", "rebuild the index with the bundle as it "
                          "is, or restore the bundle the index was built with")
    raise ConfigError(f"{ix.path} was built with the bundle {was.path}, not {bundle} "
                      "(another graph or description): its queries would be embedded into another space",
                      "search with the index's own bundle (the default), or build the index with this one")


def query_bundle(ix: StoredIndex, bundle: Path | None) -> Path:
    """The bundle that embeds an index's queries: ``bundle``, or the one the manifest names, checked."""
    b = Path(bundle) if bundle is not None else Path(ix.manifest.bundle.path)
    if not (b / "model.onnx").is_file():
        raise ConfigError(f"the index's bundle {b} is not there",
                          "pass --bundle with the bundle it was built with")
    check_bundle(ix, b)
    return b


def served_indexes(indexes: dict[str, Path], bundles: dict[str, Path], *,
                   memory: bool = True) -> dict[str, tuple[str, StoredIndex]]:
    """`mlmkit serve --search-index`: each index opened (``memory``: read into memory; else memory-mapped) and
    paired with the served bundle that built it, {index name: (model name, StoredIndex)}; one that no served
    bundle built is refused. The bundle at the index's recorded path, unchanged, is found without reading
    a graph; the others are hashed."""
    served = {name: path for name, path in bundles.items() if (path / "model.onnx").is_file()}
    out: dict[str, tuple[str, StoredIndex]] = {}
    for name, path in indexes.items():
        ix = _opened(path, memory)
        was = ix.manifest.bundle
        model = next((m for m, b in served.items() if same_bundle(was, b, read=False)), None)
        model = model or next((m for m, b in served.items() if same_bundle(was, b)), None)
        if model is None:
            raise ConfigError(f"--search-index {path} was built with the bundle {was.path}, which is not "
                              "served (no served bundle has its graph and description)",
                              "serve that bundle beside the index")
        out[name] = (model, ix)
    return out


def _opened(path: Path, memory: bool) -> StoredIndex:
    """The index at ``path`` opened as a server serves it, its ANN index read now: a damaged one is
    refused when it is opened, not at every search."""
    ix = StoredIndex.open(path, memory=memory)
    if ix.ann != "flat":
        load_ann(ix)
    return ix


_refused: dict[Path, tuple[int, int, int] | None] = {}
"""The manifests a reload could not take (reloaded), each logged once."""


def reloaded(ix: StoredIndex, bundle: Path) -> StoredIndex:
    """``ix``, or the index at its path opened again as the server opened it (its ANN index read), when
    its manifest changed on disk since (an `mlmkit index --delete`, `--upsert`, `--append` or `--compact`
    under a running server: each writes new files, then switches the manifest) and still names
    ``bundle``. A manifest that cannot be opened, or names another bundle, keeps ``ix`` served, logged
    once."""
    if not ix.changed():
        return ix
    try:
        stamp: tuple[int, int, int] | None = manifest_stamp(ix.path)
    except OSError:
        stamp = None
    try:
        if stamp is None:
            raise ConfigError(f"{ix.path}'s manifest is gone")
        new = _opened(ix.path, ix.memory)
        if not same_bundle(new.manifest.bundle, bundle):
            was = new.manifest.bundle.path
            raise ConfigError(f"it was built again with the bundle {was}, not the served {bundle}")
    except (MlmkitError, OSError) as e:
        if ix.path not in _refused or _refused[ix.path] != stamp:
            why = e.message if isinstance(e, MlmkitError) else str(e)
            log.warning("index %s changed on disk, and is still served as it was (%s documents): %s", ix.path,
                        f"{ix.live:,}", why)
            _refused[ix.path] = stamp
        return ix
    log.info("index %s changed on disk: now serving its %s documents (was %s)", ix.path, f"{new.live:,}",
             f"{ix.live:,}")
    return new
