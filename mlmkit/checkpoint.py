"""Read and write run directories (Hugging Face checkpoints) atomically.

Every file goes through files.atomic_write (a temporary name, then a rename), so a process killed
mid-write leaves the previous file intact. Weights are read with safetensors or
``torch.load(weights_only=True)``: loading a checkpoint never runs code.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from .config import ModelConfig
from .errors import ConfigError
from .files import atomic_write, read_json, write_json
from .tokenizer import save_tokenizer

WEIGHTS = "model.safetensors"
MAX_HEADER = 100 << 20  # bytes of a safetensors JSON header; a large model's is a few hundred KB
LAYER_KEY = re.compile(r"^bert\.encoder\.layer\.(\d+)\.")
META = "mlmkit.json"
# keys (mlmkit's names) whose tensors are tied to another parameter; not stored, as transformers does
TIED_KEYS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")


def save_weights(model: torch.nn.Module, path: str | Path, config: Any = None) -> None:
    """Write the state dict as safetensors under the family's transformers names (``config``'s
    family; BERT's when None), without the tied decoder copy."""
    m = unwrap(model)
    fam = (config if config is not None else getattr(m, "config", None) or ModelConfig()).family
    sd = {k: v.detach().to("cpu").contiguous() for k, v in m.state_dict().items() if k not in TIED_KEYS}
    sd = fam.to_family(sd)
    atomic_write(path, lambda tmp: save_file(sd, tmp, metadata={"format": "pt"}))


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain module under DistributedDataParallel / torch.compile wrappers."""
    while hasattr(model, "module") or hasattr(model, "_orig_mod"):
        model = getattr(model, "module", None) or model._orig_mod
    return model


def _normalise_key(k: str) -> str:
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
            raise ConfigError(f"{p}: not a weight index (no weight_map of file names)", "re-create the checkpoint")
        files = [d / f for f in sorted(set(shards.values()))]
        lacking = [f.name for f in files if not f.is_file()]
        if lacking:
            raise ConfigError(f"{p} lists shards that are not there: {', '.join(lacking[:3])}", "copy the whole checkpoint directory")
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


def _read_weights(p: Path) -> dict[str, torch.Tensor]:
    if p.suffix == ".safetensors":
        try:
            return load_file(str(p))
        except Exception as e:  # safetensors raises its own error types for truncated files
            raise ConfigError(f"{p}: unreadable weights ({e})", "the file is corrupted; re-create it") from None
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
    bad = ConfigError(f"{p}: unreadable weights (no valid safetensors header)", "the file is corrupted; re-create it")
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


def _ints(x: Any) -> bool:
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
        except Exception:  # a legacy (non-zip) or damaged pickle: _read_weights says which when it is loaded
            return None
        if not isinstance(part, dict):
            return None
        shapes.update({k: tuple(v.shape) for k, v in part.items() if isinstance(v, torch.Tensor)})
    return shapes


def check_weights(d: str | Path, config: Any) -> None:
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
    sd = fam.from_family({_normalise_key(k): torch.empty(s, device="meta") for k, s in shapes.items()})
    have = {k: tuple(v.shape) for k, v in sd.items()}
    name = fam.config_aliases.get
    E = fam.embedding_size(config)
    emb_field = "embedding_size" if E != config.hidden_size else name("hidden_size", "hidden_size")

    def wrong(field: str, value: Any, what: str) -> ConfigError:
        return ConfigError(f"{d / 'config.json'}: {field} {value} does not match the weights ({where}): {what}",
                           "the config.json is not this checkpoint's; restore its own, or fix the field")

    word = have.get("bert.embeddings.word_embeddings.weight")
    if word is not None and len(word) == 2:
        if word[0] != config.vocab_size:
            raise wrong("vocab_size", config.vocab_size, f"the word embeddings have {word[0]} rows")
        if word[1] != E:
            raise wrong(emb_field, E, f"the word embeddings have {word[1]} columns")
    for key, field in (("position_embeddings", "max_position_embeddings"), ("token_type_embeddings", "type_vocab_size")):
        table = have.get(f"bert.embeddings.{key}.weight")
        if table and getattr(config, field) and table[0] != getattr(config, field):
            raise wrong(field, getattr(config, field), f"the {key.replace('_', ' ')} have {table[0]} rows")
    layers = {int(m.group(1)) for k in have if (m := LAYER_KEY.match(k))}
    if layers and max(layers) + 1 != config.num_hidden_layers:
        raise wrong(name("num_hidden_layers", "num_hidden_layers"), config.num_hidden_layers,
                    f"there are weights for {max(layers) + 1} layers")
    rel = have.get("bert.encoder.rel_embeddings.weight")
    if rel and fam.name == "deberta-v2":
        from .models.deberta import position_buckets, span

        if rel[0] != 2 * span(config):
            field = "position_buckets" if position_buckets(config) > 0 else "max_relative_positions"
            raise wrong(field, config.extra.get(field), f"the relative position embeddings have {rel[0]} rows, "
                        f"the config makes {2 * span(config)}")
    for key, want in _meta_shapes(config).items():
        if key in have and have[key] != want:
            raise wrong(*_field_of(config, want, have[key]), f"{key} is {list(have[key])}, the config makes {list(want)}")


def _meta_shapes(config: Any) -> dict[str, tuple[int, ...]]:
    """The shapes of the embeddings, the first layer and the encoder's shared modules this config
    makes, built on the meta device (no memory): every family's blocks, whatever sizes they read."""
    fam = config.family
    with torch.device("meta"):
        parts = {"bert.embeddings.": fam.embeddings(config), "bert.encoder.layer.0.": fam.layer(config, 0)}
        try:
            parts.update({f"bert.encoder.{n}.": m for n, m in fam.encoder_modules(config).items()})
        except RuntimeError:  # one computes a table from its values (DeBERTa's buckets): check_weights checks its rows
            pass
    return {prefix + k: tuple(v.shape) for prefix, m in parts.items() for k, v in m.state_dict().items()}


def _field_of(config: Any, want: tuple[int, ...], have: tuple[int, ...]) -> tuple[str, int]:
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


def load_state_dict(run_dir: str | Path, config: Any = None) -> dict[str, torch.Tensor]:
    """Weights of a run directory or Hugging Face directory (one file or shards), keys renamed from
    the family's names (``config``'s, else its config.json's) to mlmkit's (BERT's)."""
    d = Path(run_dir)
    files = weight_files(d)
    if not files:
        raise ConfigError(
            f"no weights in {d}",
            "a model directory needs model.safetensors or pytorch_model.bin (or their sharded index) beside config.json",
        )
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        part = _read_weights(f)
        if not isinstance(part, dict) or not all(isinstance(v, torch.Tensor) for v in part.values()):
            raise ConfigError(f"{f}: not a dictionary of tensors", "is it a model checkpoint?")
        sd.update(part)
    if config is None:
        config = ModelConfig.load(d) if (d / "config.json").is_file() else ModelConfig()
    sd = config.family.from_family({_normalise_key(k): v for k, v in sd.items()})
    # transformers ties the decoder bias to cls.predictions.bias; keep the one we use
    if "cls.predictions.decoder.bias" in sd:
        sd.setdefault("cls.predictions.bias", sd["cls.predictions.decoder.bias"])
        del sd["cls.predictions.decoder.bias"]
    return sd


def load_weights(
    model: torch.nn.Module, sd: dict[str, torch.Tensor], *, allow_missing: tuple[str, ...] = ()
) -> tuple[list[str], list[str]]:
    """Load ``sd`` into ``model``. Returns (missing, unexpected) after dropping tied keys.

    Missing keys are an error unless they start with one of ``allow_missing`` (a fresh head);
    unexpected keys are returned for the caller to report (a pretraining head being dropped)."""
    own = unwrap(model).state_dict()
    bad = [k for k, v in sd.items() if k in own and own[k].shape != v.shape]
    if bad:
        k = bad[0]
        raise ConfigError(
            f"weight {k} has shape {tuple(sd[k].shape)} in the checkpoint but {tuple(own[k].shape)} in the model",
            "the config.json does not match the weights",
        )
    missing = [k for k in own if k not in sd and k not in TIED_KEYS]
    unexpected = [k for k in sd if k not in own]
    hard = [k for k in missing if not k.startswith(allow_missing)]
    if hard:
        raise ConfigError(f"checkpoint lacks {len(hard)} weights, e.g. {hard[0]}",
                          "is it a checkpoint of the model_type its config.json names?")
    unwrap(model).load_state_dict({k: v for k, v in sd.items() if k in own}, strict=False)
    return missing, unexpected


def save_run(
    model: torch.nn.Module, out_dir: str | Path, *, config: Any, tokenizer: Any, meta: dict[str, Any]
) -> None:
    """Write a run directory: config.json, model.safetensors, tokenizer files, mlmkit.json.

    Weights are written before mlmkit.json so a reader that sees the new metadata sees new weights."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    config.save(d / "config.json")
    save_tokenizer(tokenizer, d, max_length=int(meta.get("max_length", 512)))
    save_weights(model, d / WEIGHTS, config)
    write_json(d / META, meta)


def read_run_meta(d: str | Path, config: Any) -> dict[str, Any]:
    """mlmkit.json of a run directory, checked against itself and its config.json: a label list that
    is not the head's (config.json's id2label, in order) would label every input wrongly, silently."""
    p = Path(d) / META
    meta = read_json(p)
    labels = meta.get("labels")
    head = [config.id2label[i] for i in sorted(config.id2label)] if config.id2label else None
    problems = [
        (not isinstance(meta.get("task"), str), "it names no task"),
        (not isinstance(meta.get("max_length"), int) or isinstance(meta.get("max_length"), bool)
         or not 1 <= meta["max_length"] <= config.max_tokens,
         f"its max_length {meta.get('max_length')!r} is not from 1 to the model's {config.max_tokens} positions"),
        (labels is not None and labels != head,
         f"its labels {labels} are not config.json's id2label {head}"),
        (not isinstance(meta.get("options", {}), dict) or not isinstance(meta.get("task_state", {}), dict),
         "its options or task_state are not objects"),
    ]
    bad = [why for wrong, why in problems if wrong]
    if bad:
        raise ConfigError(f"{p}: {bad[0]}", "the run directory was edited or damaged; fine-tune it again")
    return meta


def is_model_dir(d: str | Path) -> bool:
    d = Path(d)
    return (d / "config.json").exists() and any((d / name).is_file() for name in WEIGHT_FILES)
