"""The embedding task's sentence-transformers directories, read and written: the modules
(modules.json: Transformer, Pooling, Dense ..., Normalize), the pooling config, the Dense layers' configs,
the prompts, truncate_dim and max length.

- reading: ``sentence_transformers_options`` (a checkpoint's options, from_hf's), and whether a
  directory is a SPLADE SparseEncoder (``is_splade_directory``, the sparse-embedding task's) or a
  multi-vector one (``is_multi_vector_directory``, the colbert task's);
- the prompts by name (``named_prompts``), as the options hold them;
- writing: ``st_run_files``, the files that make a fine-tuned run a sentence-transformers directory.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mlmkit.taskkit import CheckpointInfo, DataFormatError, Options, TaskError, parse_json

ST_POOLING = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
              "pooling_mode_max_tokens": "max",
              "pooling_mode_lasttoken": "lasttoken", "pooling_mode_weightedmean_tokens": "weightedmean",
              "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens"}
"""sentence-transformers' Pooling config keys and the pooling each names (models/pooled.py's modes)."""
ST_ACTIVATIONS = ("identity", "tanh", "relu", "gelu", "sigmoid", "silu")
"""The activations a Dense module may name (its torch class, lower-cased:
torch.nn.modules.linear.Identity)."""
ST_PROMPTS = {"query_prompt": ("query",), "document_prompt": ("document", "passage", "corpus")}
"""The prompt options and the names a sentence-transformers directory's "prompts" gives them (the first
found)."""
ST_ALIASES = frozenset(n for names in ST_PROMPTS.values() for n in names)
"""The prompt names that are the query and document prompts' (their options, not ``prompts``)."""
# a sentence-transformers SparseEncoder: the sparse-embedding task's
SPLADE_MODULES = ("SpladePooling", "MLMTransformer")


# ---- reading a sentence-transformers directory --------------------------------------------------
def st_json(path: Path, *, optional: bool = False) -> Any:
    """A JSON file of a sentence-transformers directory; unreadable or invalid is a DataFormatError
    naming it. ``optional``: a missing file reads as {}."""
    try:
        return parse_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        if optional and isinstance(e, FileNotFoundError):
            return {}
        raise DataFormatError(path, f"unreadable ({e})",
                              hint="a sentence-transformers directory needs valid JSON here") from None


def _module_types(d: Path) -> list[str] | None:
    """The module types modules.json lists ("sentence_transformers.models.Pooling" ...); None when it
    is missing or unreadable (not a sentence-transformers directory)."""
    try:
        modules = parse_json((d / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return [str(m.get("type", "")) for m in modules if isinstance(m, dict)] if isinstance(modules,
                                                                                          list) else []


def is_splade_directory(d: Path) -> bool:
    """A sentence-transformers SparseEncoder directory (its modules.json names SPLADE's modules)."""
    return any(t.rsplit(".", 1)[-1] in SPLADE_MODULES for t in _module_types(d) or [])


def is_multi_vector_directory(d: Path) -> bool:
    """A sentence-transformers MultiVectorEncoder directory, or a PyLate one (its modules.json names
    a MultiVectorMask or a PyLate module, or its config declares ColBERT's query prefix): the colbert
    task's."""
    types = _module_types(d)
    if types is None:
        return False
    if any(t.rsplit(".", 1)[-1] == "MultiVectorMask" or t.startswith("pylate.") for t in types):
        return True
    try:
        config = parse_json((d / "config_sentence_transformers.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and (config.get("model_type") in ("MultiVectorEncoder", "ColBERT")
                                     or "query_prefix" in config)


def sentence_transformers_options(d: Path) -> CheckpointInfo:
    """The pooling, Dense layers, normalisation, prompts ({"options": ...}) and max length a
    sentence-transformers directory declares: its modules (Transformer, Pooling, Dense ..., Normalize)
    read whole, in order; a module mlmkit cannot run in the graph is refused by name."""
    modules = st_json(d / "modules.json")
    if not isinstance(modules, list):
        raise DataFormatError(d / "modules.json", "expected a list of modules")
    kinds = [(str(m.get("type", "")).rsplit(".", 1)[-1], m) for m in modules if isinstance(m, dict)]
    options: Options = {"normalize": any(k == "Normalize" for k, _ in kinds)}
    known = {"Transformer", "Pooling", "Dense", "Normalize"}
    other = [k for k, _ in kinds if k not in known]
    if other:
        raise DataFormatError(d / "modules.json",
                              f"module {other[0]} is not one mlmkit runs (it runs Transformer, Pooling, "
                              "Dense and Normalize)", hint="export the encoder alone with --task embedding")
    pooling = [m for k, m in kinds if k == "Pooling"]
    if pooling:
        options["pooling"] = _st_pooling(d / str(pooling[0].get("path", "1_Pooling")) / "config.json")
    dense = [_st_dense(d / str(m.get("path", ""))) for k, m in kinds if k == "Dense"]
    if dense:
        options["dense_layers"] = json.dumps(dense)
    if (d / "config_sentence_transformers.json").is_file():
        options.update(_st_prompts(d / "config_sentence_transformers.json"))
    info: CheckpointInfo = {"options": options}
    if (d / "sentence_bert_config.json").is_file():
        max_len = st_json(d / "sentence_bert_config.json").get("max_seq_length")
        if isinstance(max_len, int) and max_len > 0:
            info["max_length"] = max_len
    return info


def _st_pooling(path: Path) -> str:
    """The one pooling mode of a Pooling module's config.json (sentence-transformers 6's
    ``pooling_mode``, or the earlier flags), with its prompt tokens pooled as the others."""
    cfg = st_json(path)
    modes = [name for key, name in ST_POOLING.items() if cfg.get(key)]
    other = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v and k not in ST_POOLING]
    if isinstance(cfg.get("pooling_mode"), str):  # sentence-transformers 6 names the mode itself
        mode = cfg["pooling_mode"]
        modes, other = ([mode], []) if mode in ST_POOLING.values() else ([], [mode])
    if other or len(modes) != 1:
        raise DataFormatError(path, f"pooling {', '.join(other + modes) or 'none'} is not one of "
                              f"{', '.join(ST_POOLING.values())}",
                              hint="export with --task embedding --option pooling=...")
    if cfg.get("include_prompt") is False:
        raise DataFormatError(path, "include_prompt false (the prompt's tokens left out of the pooling) is "
                                    "not supported",
                              hint="pool the prompt's tokens too: set include_prompt to true")
    return modes[0]


def _st_dense(folder: Path) -> dict[str, Any]:
    """A Dense module's config.json as the embedding head's layer: {"in", "out", "bias", "activation"}."""
    cfg = st_json(folder / "config.json")
    act = str(cfg.get("activation_function") or "torch.nn.modules.activation.Tanh").rsplit(".", 1)[-1].lower()
    sizes = [cfg.get("in_features"), cfg.get("out_features")]
    if not all(isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 1 << 20 for n in sizes):
        raise DataFormatError(folder / "config.json",
                              f"in_features and out_features must be positive sizes, got {sizes}")
    if act not in ST_ACTIVATIONS or cfg.get("use_residual"):
        what = "use_residual" if cfg.get("use_residual") else f"activation {cfg.get('activation_function')}"
        raise DataFormatError(folder / "config.json", f"a Dense module's {what} is not supported",
                              hint=f"mlmkit runs Dense layers with {', '.join(ST_ACTIVATIONS)} and no "
                                   "residual")
    return {"in": sizes[0], "out": sizes[1], "bias": bool(cfg.get("bias", True)), "activation": act}


def _st_prompts(path: Path) -> Options:
    """config_sentence_transformers.json's named prompts (all of them, as JSON, and the query and
    document ones as their options), its default prompt name and its truncate_dim."""
    top = st_json(path)
    prompts = top.get("prompts") or {}
    if not isinstance(prompts,
                      dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise DataFormatError(path, "prompts must map names to texts",
                              hint='e.g. {"query": "query: ", "document": ""}')
    options: Options = {}
    for option, names in ST_PROMPTS.items():
        found = [prompts[n] for n in names if prompts.get(n)]
        if found:
            options[option] = found[0]
    others = {k: v for k, v in prompts.items() if k not in ST_ALIASES}
    if others:  # the query and document prompts are options of their own
        options["prompts"] = json.dumps(others, ensure_ascii=False)
    default = top.get("default_prompt_name")
    if default is not None:
        if default not in prompts:
            raise DataFormatError(path, f"default_prompt_name {default!r} names no prompt",
                                  hint="name one of its prompts")
        options["default_prompt_name"] = default
    dims = top.get("truncate_dim")
    if dims is not None:
        if not isinstance(dims, int) or isinstance(dims, bool) or dims < 1:
            raise DataFormatError(path, f"truncate_dim must be a positive whole number, got {dims!r}")
        options["dimensions"] = dims
    return options


def named_prompts(options: Mapping[str, Any]) -> dict[str, str]:
    """The model's prompts by name: its ``prompts`` (a sentence-transformers model's beyond the query
    and document ones), and the query and document prompts under each name sentence-transformers gives
    them."""
    try:
        prompts = json.loads(options.get("prompts") or "{}")
    except ValueError:
        prompts = None
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise TaskError("the prompts option must be a JSON object of names and texts, not "
                        f"{str(options.get('prompts'))[:200]!r}",
                        'e.g. --option prompts=\'{"Clustering": "task: clustering | query: "}\'')
    for option, names in ST_PROMPTS.items():
        if options.get(option):
            prompts.update({n: options[option] for n in names})
    return prompts


# ---- writing: a run as a sentence-transformers directory -----------------------------------------
TORCH_ACTIVATIONS = {"identity": "linear.Identity", "tanh": "activation.Tanh", "relu": "activation.ReLU",
                     "gelu": "activation.GELU", "sigmoid": "activation.Sigmoid", "silu": "activation.SiLU"}
"""Each of ST_ACTIVATIONS as the torch class a Dense module's config names (under torch.nn.modules)."""


def st_run_files(options: Mapping[str, Any], hidden: int, max_length: int,
                 dense: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The files of a sentence-transformers directory for a run with these options: its modules (the
    encoder at the root, the pooling, the ``dense`` layers (checked), the normalisation), its prompts,
    truncate_dim and max length."""
    o = options
    prompts = {names[0]: o[option] for option, names in ST_PROMPTS.items() if o[option]}
    prompts.update({k: v for k, v in named_prompts(o).items() if k not in ST_ALIASES})
    modes = {mode: key for key, mode in ST_POOLING.items()}
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    top = {"prompts": prompts, "default_prompt_name": o["default_prompt_name"] or None,
           "similarity_fn_name": "cosine"}
    if o["dimensions"]:
        top["truncate_dim"] = o["dimensions"]
    files = {"1_Pooling/config.json": _dump({"word_embedding_dimension": hidden,
                                             **{key: o["pooling"] == mode for mode, key in modes.items()},
                                             "include_prompt": True}),
             "sentence_bert_config.json": _dump({"max_seq_length": max_length, "do_lower_case": False}),
             "config_sentence_transformers.json": _dump(top)}
    for layer in dense:
        path = f"{len(modules)}_Dense"  # its weights: the model's module_weights, written beside
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": path,
                        "type": "sentence_transformers.models.Dense"})
        act = f"torch.nn.modules.{TORCH_ACTIVATIONS[layer['activation']]}"
        files[f"{path}/config.json"] = _dump({"in_features": layer["in"], "out_features": layer["out"],
                                              "bias": layer["bias"], "activation_function": act})
    if o["normalize"]:
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": f"{len(modules)}_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
        files[f"{modules[-1]['path']}/config.json"] = "{}\n"
    files["modules.json"] = _dump(modules)
    return files


def _dump(obj: Any) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"
