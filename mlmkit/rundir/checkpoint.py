"""Read and write run directories (Hugging Face checkpoints) atomically.

Every file goes through files.atomic_write (a temporary name, then a rename), so a process killed
mid-write leaves the previous file intact. Weights are read with safetensors or
``torch.load(weights_only=True)``: loading a checkpoint never runs code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from mlmkit.errors import ConfigError
from mlmkit.files import atomic_write
from mlmkit.models.config import ModelConfig
from mlmkit.rundir.config import load_config, save_config
from mlmkit.rundir.meta import META, RunMeta, read_meta, write_meta
from mlmkit.rundir.weights import WEIGHT_FILES, WEIGHTS, normalise_key, read_weights, weight_files
from mlmkit.text.tokenizer import save_tokenizer

# keys (mlmkit's names) whose tensors are tied to another parameter; not stored, as transformers does
TIED_KEYS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")


def tied_keys(model: torch.nn.Module) -> set[str]:
    """The TIED_KEYS of ``model`` that are tied: whose parameter is also another's (the MLM decoder
    sharing the word embeddings), or that it does not have. A decoder of its own (a family's
    tie_word_embeddings false: EuroBERT's lm_head) is stored and loaded like any weight."""
    own = {name for name, _ in model.named_parameters()}  # a shared parameter under its first name only
    return {k for k in TIED_KEYS if k not in own}


def save_weights(model: torch.nn.Module, path: str | Path, config: ModelConfig | None = None) -> None:
    """Write the state dict as safetensors under the family's transformers names (``config``'s
    family; BERT's when None), without the tied decoder copy."""
    m = unwrap(model)
    fam = (config if config is not None else getattr(m, "config", None) or ModelConfig()).family
    tied = tied_keys(m)
    sd = {k: v.detach().to("cpu").contiguous() for k, v in m.state_dict().items() if k not in tied}
    sd = fam.to_family(sd)
    atomic_write(path, lambda tmp: save_file(sd, tmp, metadata={"format": "pt"}))


def save_module_weights(model: torch.nn.Module, d: Path) -> None:
    """The weights a model also keeps where another library's loader looks for them (its
    ``module_weights``: the colbert projection as a sentence-transformers Dense module), each file
    written whole."""
    weights = getattr(unwrap(model), "module_weights", None)
    for name, tensors in (weights() if callable(weights) else {}).items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        _save_tensors({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, d / name)


def _save_tensors(sd: dict[str, torch.Tensor], path: Path) -> None:
    atomic_write(path, lambda tmp: save_file(sd, tmp, metadata={"format": "pt"}))


def module_state_dict(d: Path) -> dict[str, torch.Tensor]:
    """A sentence-transformers directory's Dense modules' weights (each in its folder, in modules.json's
    order): the k-th's ``linear.*`` as ``dense.{k}.linear.*`` (the embedding task's layers after
    pooling), and a lone Dense's also as ``linear.*`` (a MultiVectorEncoder's or PyLate's projection,
    the colbert task's); {} without one."""
    try:
        modules = json.loads((d / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    dense = [m for m in modules if isinstance(m, dict) and str(m.get("type", "")).rsplit(".", 1)[-1]
             == "Dense"] \
        if isinstance(modules, list) else []
    sd: dict[str, torch.Tensor] = {}
    for k, module in enumerate(dense):
        if not str(module.get("path") or ""):
            continue
        folder = d / str(module["path"])
        files = weight_files(folder)
        if not files:
            raise ConfigError(f"{folder}: the Dense module has no weights",
                              "re-save the sentence-transformers model")
        for f in files:
            part = read_weights(f)
            if not isinstance(part, dict):
                raise ConfigError(f"{f}: not a dictionary of tensors", "is it a model checkpoint?")
            linear = {k2: v for k2, v in part.items() if k2.startswith("linear.")
                      and isinstance(v, torch.Tensor)}
            sd.update({f"dense.{k}.{name}": v for name, v in linear.items()})
            if len(dense) == 1:
                sd.update(linear)
    return sd


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain module under DistributedDataParallel / torch.compile wrappers."""
    while hasattr(model, "module") or hasattr(model, "_orig_mod"):
        model = getattr(model, "module", None) or model._orig_mod
    return model


def load_state_dict(run_dir: str | Path, config: ModelConfig | None = None) -> dict[str, torch.Tensor]:
    """Weights of a run directory or Hugging Face directory (one file or shards), keys renamed from
    the family's names (``config``'s, else its config.json's) to mlmkit's (BERT's)."""
    d = Path(run_dir)
    files = weight_files(d)
    if not files:
        raise ConfigError(
            f"no weights in {d}",
            "a model directory needs model.safetensors or pytorch_model.bin (or their sharded index) beside "
            "config.json",
        )
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        part = read_weights(f)
        if not isinstance(part, dict) or not all(isinstance(v, torch.Tensor) for v in part.values()):
            raise ConfigError(f"{f}: not a dictionary of tensors", "is it a model checkpoint?")
        sd.update(part)
    if config is None:
        config = load_config(d) if (d / "config.json").is_file() else ModelConfig()
    sd = {normalise_key(k): v for k, v in sd.items()}
    _check_family(d, config, sd)
    sd = config.family.fold_weights(config, config.family.from_family(sd))
    # transformers ties the decoder bias to cls.predictions.bias; keep the one we use
    if "cls.predictions.decoder.bias" in sd:
        sd.setdefault("cls.predictions.bias", sd["cls.predictions.decoder.bias"])
        del sd["cls.predictions.decoder.bias"]
    for k, v in module_state_dict(d).items():  # a run keeps them in model.safetensors too: its own come first
        sd.setdefault(k, v)
    return sd


def _check_family(d: Path, config: ModelConfig, sd: dict[str, torch.Tensor]) -> None:
    """The weights are of the family config.json names: keys under another family's backbone (a BERT
    checkpoint whose config says roberta) would load into the wrong blocks without a word."""
    from mlmkit.models import FAMILIES

    roots = {k.split(".", 1)[0] for k in sd}
    own = config.family.prefix
    others: dict[str, str] = {}
    for f in FAMILIES:  # a prefix several families share names the first registered (roberta, not jina's)
        if f.prefix != own:
            others.setdefault(f.prefix, f.name)
    foreign = sorted(roots & set(others))
    if foreign and own not in roots:
        raise ConfigError(f"{d}: config.json says model_type {config.model_type!r}, but the weights are a "
                          f"{others[foreign[0]]} "
                          f"model's (their keys start with '{foreign[0]}.')",
                          "fix model_type in config.json, or give the checkpoint these weights belong to")


def load_weights(
    model: torch.nn.Module, sd: dict[str, torch.Tensor], *, allow_missing: tuple[str, ...] = ()
) -> tuple[list[str], list[str]]:
    """Load ``sd`` into ``model``. Returns (missing, unexpected) after dropping tied keys.

    Missing keys are an error unless they start with one of ``allow_missing`` (a fresh head);
    unexpected keys are returned for the caller to report (a pretraining head being dropped). A model
    that derives weights it lacks from what a checkpoint has instead (its ``derived_weights(sd)``: the
    rerank task's classifier from a causal LM's answer-token rows) gets ``sd`` first, whoever loads it."""
    derive = getattr(unwrap(model), "derived_weights", None)
    if callable(derive):
        sd = derive(sd)
    own = unwrap(model).state_dict()
    bad = [k for k, v in sd.items() if k in own and own[k].shape != v.shape]
    if bad:
        k = bad[0]
        raise ConfigError(
            f"weight {k} has shape {tuple(sd[k].shape)} in the checkpoint but {tuple(own[k].shape)} in the "
            "model",
            "the config.json does not match the weights",
        )
    tied = tied_keys(unwrap(model))
    missing = [k for k in own if k not in sd and k not in tied]
    unexpected = [k for k in sd if k not in own]
    hard = [k for k in missing if not k.startswith(allow_missing)]
    if hard:
        raise ConfigError(f"checkpoint lacks {len(hard)} weights, e.g. {hard[0]}",
                          "is it a checkpoint of the model_type its config.json names?")
    unwrap(model).load_state_dict({k: v for k, v in sd.items() if k in own}, strict=False)
    return missing, unexpected


def save_run(model: torch.nn.Module, out_dir: str | Path, *, config: ModelConfig, tokenizer: Any,
             meta: RunMeta) -> None:
    """Write a run directory: config.json, model.safetensors (and the model's ``module_weights``),
    tokenizer files, mlmkit.json.

    Weights are written before mlmkit.json so a reader that sees the new metadata sees new weights."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    save_config(config, d / "config.json")
    save_tokenizer(tokenizer, d, max_length=meta.max_length)
    save_weights(model, d / WEIGHTS, config)
    save_module_weights(model, d)
    write_meta(d, meta)


def read_run_meta(d: str | Path, config: ModelConfig) -> RunMeta:
    """mlmkit.json of a run directory, checked field by field and against its config.json: a label
    list that is not the head's (config.json's id2label, in order) would label every input wrongly,
    silently."""
    meta = read_meta(d)
    labels = list(meta.labels) if meta.labels is not None else None
    head = [config.id2label[i] for i in sorted(config.id2label)] if config.id2label else None
    problems = [
        (meta.max_length > config.max_tokens,
         f"its max_length {meta.max_length} is not from 1 to the model's {config.max_tokens} positions"),
        (labels is not None and labels != head, f"its labels {labels} are not config.json's id2label {head}"),
    ]
    bad = [why for wrong, why in problems if wrong]
    if bad:
        raise ConfigError(f"{Path(d) / META}: {bad[0]}",
                          "the run directory was edited or damaged; fine-tune it again")
    return meta


def is_model_dir(d: str | Path) -> bool:
    d = Path(d)
    return (d / "config.json").exists() and any((d / name).is_file() for name in WEIGHT_FILES)
