"""A token shard's manifest.json (`mlmkit tokenize`): its shape is ``ShardManifest``, read through the one
typed reader (mlmkit.typed), its format and version checked in one place."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mlmkit.errors import MlmkitError
from mlmkit.files import parse_json
from mlmkit.typed import from_json, to_json

SHARD_FORMAT = "mlmkit-token-shard"
SHARD_VERSION = 1
REWRITE = "write it again with `mlmkit tokenize`"


@dataclass(frozen=True)
class SourceFile:
    """A file the shard was made from, as it was then."""

    path: str
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class ShardManifest:
    format: str
    version: int
    dtype: str  # of tokens.bin: uint16 where the vocabulary fits, else uint32
    tokens: int
    sentences: int
    documents: int
    files: tuple[SourceFile, ...]
    tokenizer_sha256: str
    text_column: str | None = None


def read_manifest(shard: Path) -> ShardManifest:
    """The manifest of the shard in ``shard``; one line naming the file and the field where it is not
    one (an MlmkitError)."""
    path = shard / "manifest.json"
    data = parse_json(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or (data.get("format"), data.get("version")) != (SHARD_FORMAT,
                                                                                   SHARD_VERSION):
        found = (data.get("format"), data.get("version")) if isinstance(data, dict) else None
        raise MlmkitError(f"{path}: not a token shard of format {SHARD_FORMAT} version {SHARD_VERSION} "
                          f"(found {found})", REWRITE)
    return from_json(ShardManifest, data, path, error=MlmkitError, fix=REWRITE)


def write_manifest(shard: Path, manifest: ShardManifest) -> None:
    import json

    (shard / "manifest.json").write_text(json.dumps(to_json(manifest), indent=2) + "\n", encoding="utf-8")
