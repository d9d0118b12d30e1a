"""An index's manifest (manifest.json): what the index is, one frozen dataclass, ``Manifest``, read
by mlmkit's one typed reader (mlmkit/typed.py) and checked here, once, field by field. No torch.

Its format version (``FORMAT``) is checked in one place, ``read_manifest``: another version is refused
in one line saying how to re-create the index. A wrong type, a missing field or fields that disagree
with each other are one line naming the file and the field (ConfigError, exit 2). What a field means:
store.py (the directory), codecs.py (quantization, ranges, the rescoring copy), identity.py (the
bundle), ann.py (the ANN settings), multivector.py (bits, centroids, tokens, search), live.py
(deleted), text/chunks.py (chunks).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from mlmkit.errors import ConfigError
from mlmkit.files import JSONObject, read_json
from mlmkit.retrieval.index.codecs import QUANTIZATIONS, RESCORE_COPIES
from mlmkit.text.chunks import Chunking
from mlmkit.typed import check_version, from_json, rule, to_json

MANIFEST = "manifest.json"
FORMAT = 1
"""The manifest's format. Fields added since (the bundle's ``model_bytes``, ``model_mtime_ns`` and
``mlmkit_json_sha256``, ``rescore_copy``) are optional: a manifest without them is read as before."""
KINDS = ("dense", "sparse", "multivector")
ANNS = ("flat", "hnsw", "ivf")
ANN_FILE = re.compile(r"ann(-\d{6})?\.faiss")
"""The names an ANN index's file takes (a compaction's: ann-NNNNNN.faiss, live.py)."""
AGAIN = "re-create the index: `mlmkit index BUNDLE --corpus DOCS --out DIR` again"
"""What a manifest of another format says to do."""
OPTIONAL = ("block", "bits", "centroids", "tokens", "search", "chunks", "prompt_name", "dimensions",
            "normalized", "deleted", "ann_file")
"""Fields a manifest holds only where they apply: not written when None."""

Kind = Literal["dense", "sparse", "multivector"]
Ann = Literal["flat", "hnsw", "ivf"]


def _positive(n: int | None) -> bool:
    return n is None or n >= 1


def _counted(n: int | None) -> bool:
    return n is None or n >= 0


POSITIVE = rule(_positive, "a positive whole number")
COUNT = rule(_counted, "a count (0 or more)")


@dataclass(frozen=True)
class ShardEntry:
    """A shard directory the manifest names, and its documents (rows)."""

    name: str = field(metadata=rule(lambda s: "/" not in s and s not in ("", ".", ".."),
                                    "a shard directory's name"))
    count: int = field(metadata=COUNT)


@dataclass(frozen=True)
class Deleted:
    """live.py's bitmap: the first ``rows`` rows, a bit each, ``count`` of them set; the rows after
    them live."""

    file: str = field(metadata=rule(lambda s: "/" not in s and s != "", "a file name in the index"))
    rows: int = field(metadata=COUNT)
    count: int = field(metadata=COUNT)


@dataclass(frozen=True)
class BundleRecord:
    """The bundle an index was built with (identity.py): its path and whole-bundle sha256, and what the
    file system said of its graph then (absent in indexes built before they were recorded)."""

    path: str
    sha256: str
    model_bytes: int | None = None
    model_mtime_ns: int | None = None
    mlmkit_json_sha256: str | None = None


@dataclass(frozen=True)
class AnnSettings:
    """--ann hnsw's ``m``, ``ef_construction``, ``ef_search``, or --ann ivf's ``lists``, ``nprobe``
    (ann.py)."""

    m: int | None = field(default=None, metadata=POSITIVE)
    ef_construction: int | None = field(default=None, metadata=POSITIVE)
    ef_search: int | None = field(default=None, metadata=POSITIVE)
    lists: int | None = field(default=None, metadata=POSITIVE)
    nprobe: int | None = field(default=None, metadata=POSITIVE)


@dataclass(frozen=True)
class SearchSettings:
    """A multi-vector index's search (multivector.py): centroids probed a query token, candidates scored."""

    nprobe: int = field(metadata=POSITIVE)
    candidates: int = field(metadata=POSITIVE)


@dataclass(frozen=True)
class Manifest:
    """manifest.json, typed. Build one with ``dataclasses.replace`` of another, or whole (building.py)."""

    format: int
    bundle: BundleRecord
    dims: int = field(metadata=COUNT)
    count: int = field(metadata=COUNT)
    quantization: str
    shards: tuple[ShardEntry, ...]
    kind: Kind = "dense"
    prompts: dict[str, str] = field(default_factory=dict)
    ranges: list[list[float]] | None = None
    rescore_copy: str | None = None
    ann: Ann = "flat"
    ann_settings: AnnSettings = AnnSettings()
    ann_file: str | None = field(default=None, metadata=rule(
        lambda s: s is None or ANN_FILE.fullmatch(s) is not None, "ann.faiss or ann-NNNNNN.faiss"))
    block: int | None = field(default=None, metadata=POSITIVE)
    bits: int | None = None
    centroids: int | None = field(default=None, metadata=POSITIVE)
    tokens: int | None = field(default=None, metadata=COUNT)
    search: SearchSettings | None = None
    chunks: Chunking | None = None
    prompt_name: str | None = None
    dimensions: int | None = field(default=None, metadata=POSITIVE)
    normalized: bool | None = None
    deleted: Deleted | None = None
    extra: JSONObject = field(default_factory=dict)
    """Fields this mlmkit does not know (a later one's), written back as read."""

    @property
    def copy(self) -> str | None:
        """The rescoring copy's kind (codecs.RESCORE_COPIES), or None: rescoring reads the vectors
        themselves."""
        return self.rescore_copy

    @property
    def ann_path(self) -> str | None:
        """The ANN index's file: ann.faiss, or a compaction's ann-NNNNNN.faiss (live.py); None for a
        flat index."""
        return None if self.ann == "flat" else self.ann_file or "ann.faiss"

    def to_json(self) -> JSONObject:
        """The manifest as its file holds it: the fields that do not apply left out, as a build writes
        them."""
        out = to_json(self, rest="extra")
        for name in OPTIONAL:
            if out.get(name) is None:
                out.pop(name, None)
        if self.chunks is not None:
            out["chunks"] = self.chunks.manifest()
        out["bundle"] = {k: v for k, v in out["bundle"].items() if v is not None}
        out["ann_settings"] = {k: v for k, v in out["ann_settings"].items() if v is not None}
        return out

    def __getitem__(self, key: str) -> Any:
        """A field as the file holds it (``m["count"]``): for scripts; mlmkit reads the fields."""
        return self.to_json()[key]


def read_manifest(d: Path) -> Manifest:
    """The manifest of the index directory ``d``, its format checked (another is refused, saying how to
    re-create the index), its fields typed and checked against each other."""
    path = d / MANIFEST
    data = read_json(path)
    check_version(data, path, key="format", reads=FORMAT, what="an index", fix=AGAIN)
    if "rescore_copy" not in data and data.get("quantization") == "binary":
        data = {**data, "rescore_copy": "int8"}  # written before the copy was a setting: binary kept int8
    hint = f"rebuild the index, or restore {d} from a copy"
    m = from_json(Manifest, data, path, fix=hint, rest="extra")  # its shards built as ShardEntry
    check(m, path, hint)
    return m


def check(m: Manifest, path: Path, hint: str) -> None:
    """The fields that must agree with each other: one line naming the file and the field."""
    def refuse(name: str, what: str, value: Any) -> None:
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        raise ConfigError(f"{path}: '{name}' is not {what} ({shown})", hint)

    allowed = ("residual",) if m.kind == "multivector" else QUANTIZATIONS
    if m.quantization not in allowed:
        refuse("quantization", f"one of {', '.join(allowed)} (a {m.kind} index)", m.quantization)
    if m.rescore_copy is not None and m.rescore_copy not in RESCORE_COPIES:
        refuse("rescore_copy", f"one of {', '.join(RESCORE_COPIES)}", m.rescore_copy)
    if m.ranges is not None or "int8" in (m.quantization, m.copy):
        r = m.ranges
        ok = r is not None and len(r) == 2 and all(len(row) == m.dims for row in r)
        if ok:
            with np.errstate(invalid="ignore"):
                lo, hi = np.asarray(r, dtype=np.float64)
                ok = bool(np.isfinite(lo).all() and np.isfinite(hi).all() and (hi > lo).all())
        if not ok:
            refuse("ranges", f"two lists of {m.dims} finite numbers (each dimension's low, then its high, "
                   "above it)", r)
    keys = {"flat": (), "hnsw": ("m", "ef_construction", "ef_search"), "ivf": ("lists", "nprobe")}[m.ann]
    if any(getattr(m.ann_settings, k) is None for k in keys):
        refuse("ann_settings", f"an object of {', '.join(keys)} (a {m.ann} index)", to_json(m.ann_settings))
    if m.kind != "dense" and m.block is None:
        refuse("block", f"a positive whole number (a {m.kind} index)", None)
    if m.kind == "multivector":
        for name in ("search", "tokens", "bits", "centroids"):
            if getattr(m, name) is None:
                refuse(name, "given (a multivector index)", None)
    names = [s.name for s in m.shards]
    if len(set(names)) != len(names):
        refuse("shards", "a list of shards each named once", sorted({n for n in names if names.count(n) > 1}))
    if sum(s.count for s in m.shards) != m.count:
        held = sum(s.count for s in m.shards)
        raise ConfigError(f"{path}: 'count' {m.count} but its shards hold {held} vectors", hint)
    if m.deleted is not None and m.deleted.rows > m.count:
        refuse("deleted", f"a bitmap of at most the {m.count:,} rows the index holds", to_json(m.deleted))


def shard_name(shards: tuple[ShardEntry, ...] | list[ShardEntry] = (), after: int = 0) -> str:
    """The name of the next new shard: one past the highest number ``shards`` have (and past ``after``),
    so a shard of a compaction or an append never takes a name in use."""
    numbers = [int(s.name.removeprefix("shard-")) for s in shards if s.name.removeprefix("shard-").isdigit()]
    return f"shard-{max([after - 1, *numbers], default=-1) + 1:06d}"

