"""Weight files of a model directory: which they are, their digest, reading them safely, and checking
a config's sizes against their shapes before any module is built (safetensors headers, no tensor read).

Kept apart from checkpoint.py so that config.py (ModelConfig.load checks every directory it reads)
can use it without importing checkpoint.py, which imports config.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, TypeGuard

import torch
from safetensors.torch import load_file

from mlmkit.errors import ConfigError
from mlmkit.files import read_json
from mlmkit.models.config import ModelConfig
from mlmkit.models.core import make_embeddings, make_layer

WEIGHTS = "model.safetensors"
MAX_HEADER = 100 << 20  # bytes of a safetensors JSON header; a large model's is a few hundred KB


LAYER_KEY = re.compile(r"^bert\.encoder\.layer\.(\d+)\.")


def normalise_key(k: str) -> str:
    # TF-era checkpoints spell LayerNorm parameters gamma/beta
    if k.endswith(".gamma"):
        k = k[: -len("gamma")] + "weight"
    elif k.endswith(".beta"):
        k = k[: -len("beta")] + "bias"
    return k


WEIGHT_FILES = (WEIGHTS, "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def weight_files(d: str | Path) -> list[Path]:
    """The weight files of a model directory: model.safetensors, pytorch_model.bin, or the shards an
    index (*.index.json, as transformers writes large checkpoints) lists; [] when there are none."""
    d = Path(d)
    for name in WEIGHT_FILES:
        p = d / name
        if not p.is_file():
            continue
        if not name.endswith(".index.json"):
            return [p]
        index = read_json(p)
        shards = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(shards, dict) or not all(isinstance(v, str) for v in shards.values()):
            raise ConfigError(f"{p}: not a weight index (no weight_map of file names)",
                              "re-create the checkpoint")
        files = [d / f for f in sorted(set(shards.values()))]
        lacking = [f.name for f in files if not f.is_file()]
        if lacking:
            raise ConfigError(f"{p} lists shards that are not there: {', '.join(lacking[:3])}",
                              "copy the whole checkpoint directory")
        return files
    return []


def weights_digest(d: str | Path) -> str:
    """sha256 of a model directory's weight files, in order: what a bundle records of its source."""
    h = hashlib.sha256()
    for f in weight_files(d):
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def read_weights(p: Path) -> dict[str, torch.Tensor]:
    if p.suffix == ".safetensors":
        try:
            return load_file(str(p))
        except Exception as e:  # safetensors raises its own error types for truncated files
            raise ConfigError(f"{p}: unreadable weights ({e})",
                              "the file is corrupted; re-create it") from None
    try:
        return torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # weights_only refuses pickled code and objects; a truncated file fails too
        # torch's own message goes on to suggest weights_only=False, which is exactly what must not be done
        why = "it holds pickled code or objects" if "weights_only" in str(e) else "the file is damaged"
        raise ConfigError(
            f"{p}: not a plain tensor checkpoint ({why})",
            "mlmkit loads only tensors, never pickled code; convert it to model.safetensors",
        ) from None


def _header_shapes(p: Path) -> dict[str, tuple[int, ...]]:
    """The shapes a safetensors file declares (its 8-byte header length, then the JSON header),
    without reading a tensor; a header whose tensors end past the end of the file is a truncated file."""
    bad = ConfigError(f"{p}: unreadable weights (no valid safetensors header)",
                      "the file is corrupted; re-create it")
    try:
        with open(p, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            n = int.from_bytes(fh.read(8), "little")
            if not 2 <= n <= min(size - 8, MAX_HEADER):
                raise bad
            header = json.loads(fh.read(n))
    except (OSError, ValueError):  # (json's errors and UnicodeDecodeError are ValueErrors)
        raise bad from None
    if not isinstance(header, dict):
        raise bad
    shapes, end = {}, 0
    for k, v in header.items():
        if k == "__metadata__":
            continue
        shape, offsets = (v.get("shape"), v.get("data_offsets")) if isinstance(v, dict) else (None, None)
        if not (_ints(shape) and _ints(offsets) and len(offsets) == 2):
            raise bad
        shapes[k], end = tuple(shape), max(end, offsets[1])
    if 8 + n + end > size:
        raise ConfigError(f"{p}: truncated weights ({size:,} bytes, its header describes {8 + n + end:,})",
                          "the file is corrupted; re-create it or copy it again")
    return shapes


def _ints(x: object) -> TypeGuard[list[int]]:
    """Whether ``x`` is a list of non-negative integers (a header's shape or offsets)."""
    return isinstance(x, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in x)


def weight_shapes(files: list[Path]) -> dict[str, tuple[int, ...]] | None:
    """Every weight's shape (the files' own names) from the headers of a model directory's weight
    files, no tensor read; None where there is no header to read (a pytorch_model.bin that is not a
    zip archive torch can map)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        if f.suffix == ".safetensors":
            shapes.update(_header_shapes(f))
            continue
        try:  # mapped, not read: the tensors' pages stay on disk
            part = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # a legacy (non-zip) or damaged pickle: read_weights says which when it is loaded
            return None
        if not isinstance(part, dict):
            return None
        shapes.update({k: tuple(v.shape) for k, v in part.items() if isinstance(v, torch.Tensor)})
    return shapes


def check_weights(d: str | Path, config: ModelConfig) -> None:
    """Raise ConfigError where ``config`` (the directory's config.json) does not describe its weights:
    the sizes are read from the weights' headers and compared before any module is built. Called by
    ModelConfig.load for every model directory, whatever the family."""
    d = Path(d)
    files = weight_files(d)
    shapes = weight_shapes(files)
    if not shapes:
        return
    where = files[0].name if len(files) == 1 else f"the {len(files)} shards of {d}"
    fam = config.family
    sd = fam.from_family({normalise_key(k): torch.empty(s, device="meta") for k, s in shapes.items()})
    have = {k: tuple(v.shape) for k, v in sd.items()}
    name = fam.config_aliases.get
    E = fam.embedding_size(config)
    emb_field = "embedding_size" if E != config.hidden_size else name("hidden_size", "hidden_size")

    def wrong(field: str, value: Any, what: str) -> ConfigError:
        return ConfigError(f"{d / 'config.json'}: {field} {value} does not match the weights ({where}): "
                           f"{what}",
                           "the config.json is not this checkpoint's; restore its own, or fix the field")

    word = have.get("bert.embeddings.word_embeddings.weight")
    if word is not None and len(word) == 2:
        if word[0] != config.vocab_size:
            raise wrong("vocab_size", config.vocab_size, f"the word embeddings have {word[0]} rows")
        if word[1] != E:
            raise wrong(emb_field, E, f"the word embeddings have {word[1]} columns")
    for key, field in (("position_embeddings", "max_position_embeddings"),
                       ("token_type_embeddings", "type_vocab_size")):
        table = have.get(f"bert.embeddings.{key}.weight")
        if table and getattr(config, field) and table[0] != getattr(config, field):
            raise wrong(field, getattr(config, field), f"the {key.replace('_', ' ')} have {table[0]} rows")
    layers = {int(m.group(1)) for k in have if (m := LAYER_KEY.match(k))}
    if layers and max(layers) + 1 != config.num_hidden_layers:
        raise wrong(name("num_hidden_layers", "num_hidden_layers"), config.num_hidden_layers,
                    f"there are weights for {max(layers) + 1} layers")
    # what only the family knows to compare (DeBERTa's relative table)
    mismatch = fam.shape_mismatch(config, have)
    if mismatch is not None:
        raise wrong(*mismatch)
    for key, want in _meta_shapes(config).items():
        if key in have and have[key] != want:
            raise wrong(*_field_of(config, want, have[key]),
                        f"{key} is {list(have[key])}, the config makes {list(want)}")


def _meta_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shapes of the embeddings, the first layer and the encoder's shared modules this config
    makes, built on the meta device (no memory): every family's blocks, whatever sizes they read."""
    fam = config.family
    with torch.device("meta"):
        parts = {"bert.embeddings.": make_embeddings(config), "bert.encoder.layer.0.": make_layer(config, 0)}
        try:
            parts.update({f"bert.encoder.{n}.": m for n, m in fam.encoder_modules(config).items()})
        # one computes a table from its values (DeBERTa's buckets): check_weights checks its rows
        except RuntimeError:
            pass
    return {prefix + k: tuple(v.shape) for prefix, m in parts.items() for k, v in m.state_dict().items()}


def _field_of(config: ModelConfig, want: tuple[int, ...], have: tuple[int, ...]) -> tuple[str, int]:
    """(config field, its value) that most likely made ``want`` differ from the weights' ``have``."""
    name = config.family.config_aliases.get
    for w, h in zip(want, have):
        if w == h:
            continue
        if w in (config.intermediate_size, 2 * config.intermediate_size):
            return name("intermediate_size", "intermediate_size"), config.intermediate_size
        if w == config.family.embedding_size(config) != config.hidden_size:
            return "embedding_size", w
        break
    return name("hidden_size", "hidden_size"), config.hidden_size
