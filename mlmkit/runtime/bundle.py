"""The bundle format, read side: its files, the description (mlmkit.json) and its checks, the graph's
inputs, outputs and axes, the tokenizer. Export writes what this module reads; the constants live
here, once. No torch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from tokenizers import AddedToken

from mlmkit.errors import BundleError, ConfigError
from mlmkit.files import JSONObject, parse_json
from mlmkit.registry import BATCH, SEQUENCE, Options, TaskContext, TaskState
from mlmkit.text.tokenizer import MASK, is_lowercase, load_tokenizer, special_ids, special_tokens

BUNDLE_FILES = ("model.onnx", "tokenizer.json", "mlmkit.json")
BUNDLE_FORMAT = 2
"""mlmkit.json's format_version: 2 declares output axes by name and keeps a task's saved state in
"task_state"."""
MAX_LENGTH = 1 << 16  # tokens: no BERT has more positions; a larger max_length in a bundle is damage
TASK_OUTPUT_TYPE = "tensor(float)"
"""onnxruntime's element type of a graph's outputs: all float32 (mlmkit.exporter.graphs.TaskGraph casts
them; an fp16 or int8 graph keeps float32 inputs and outputs)."""
MASKS = "masks"
MASK_ROWS = {"mask_positions": (MASKS, "coordinate"), "top_ids": (MASKS, "k"), "top_probs": (MASKS, "k")}
"""The outputs of the masked-LM graphs of an earlier layout (the core's own graph, before fill-mask was
a task): one row per [MASK] of the batch. Such a bundle is refused in one line saying to export its
run again; the runtime reads per-token outputs only."""
# axes whose size varies from run to run: never a fixed size in the graph
DYNAMIC_AXES = (BATCH, SEQUENCE, MASKS)
LABELS_KEY = "mlmkit.labels"
"""The graph's metadata_props entry with the labels, in the order the head was trained with (JSON):
written by mlmkit.exporter.bundle.record_labels; a bundle's mlmkit.json must list the same. Bundles exported
before it have none and are checked by the label count alone."""
# the graph's, less token_type_ids where the family has none
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
PRECISIONS = ("fp32", "int8", "fp16")


# ---- the bundle --------------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenizerPrint:
    """What a bundle records of its tokenizer (tokenizer_fingerprint), checked when it loads."""

    vocab_sha256: str
    vocab_size: int
    lowercase: bool
    pad_id: int
    mask_id: int | None  # None: a tokenizer without a mask token (Qwen3's)


def tokenizer_fingerprint(tok: Any) -> TokenizerPrint:
    """What a bundle's mlmkit.json records of its tokenizer and the runtime checks: a hash of the
    vocabulary (token -> id), its size, casing and the special ids the graph depends on."""
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    digest = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode("utf-8")).hexdigest()
    ids = special_ids(tok)
    return TokenizerPrint(vocab_sha256=digest, vocab_size=tok.get_vocab_size(), lowercase=is_lowercase(tok),
                          pad_id=ids.pad, mask_id=ids.mask)


@dataclass(frozen=True)
class ModelShape:
    """The model's sizes, as mlmkit.json's "model" records them (a static table has no layers)."""

    model_type: str = ""
    vocab_size: int | None = None
    hidden_size: int | None = None
    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
    max_position_embeddings: int | None = None


@dataclass(frozen=True)
class BundleMeta:
    """A bundle's description (mlmkit.json), typed: every field the runtime reads, checked when it is
    read (``from_json``: one line naming the file and the field) and written the one way (``to_json``).

    ``run`` holds what the bundle carries of its run and the runtime does not read (the data it was
    trained on, its metrics, a distillation's or a static table's record ...): model cards show it,
    and a later version's fields travel in it unread."""

    task: str
    max_length: int
    inputs: tuple[str, ...]
    outputs: dict[str, tuple[str, ...]]
    tokenizer: TokenizerPrint
    model: ModelShape = field(default_factory=ModelShape)
    labels: tuple[str, ...] | None = None
    options: Options = field(default_factory=dict)
    task_state: TaskState = field(default_factory=dict)
    trained_as: str = ""
    opset: int = 17
    precision: str = "fp32"
    run_precision: str = "auto"  # fp32: export --precision fp32 pinned it (auto never picks bf16 for it)
    optimizations: tuple[str, ...] = ()
    fused_operators: dict[str, int] = field(default_factory=dict)
    parity: JSONObject = field(default_factory=dict)  # export's figures against PyTorch (exporter/parity.py)
    # the precision gate's sample and records (runtime/precision.py)
    gate: JSONObject = field(default_factory=dict)
    model_bytes: int = 0
    source: JSONObject = field(default_factory=dict)
    run: JSONObject = field(default_factory=dict)
    format_version: int = BUNDLE_FORMAT

    @classmethod
    def from_json(cls, data: Any, path: Path) -> BundleMeta:
        """The description ``data`` (parsed mlmkit.json at ``path``), checked field by field."""
        keys = ("task", "max_length", "inputs", "outputs", "tokenizer")
        if not isinstance(data, dict) or any(k not in data for k in keys):
            lacking = [k for k in keys if not isinstance(data, dict) or k not in data]
            raise BundleError(f"{path} is not a bundle description (no {', '.join(lacking)})",
                              "is it a run directory? export it first: mlmkit export RUN --out DIR")
        if data.get("format_version") != BUNDLE_FORMAT:
            raise BundleError(f"{path.parent} is a bundle of format {data.get('format_version')}; this "
                              "mlmkit reads format "
                              f"{BUNDLE_FORMAT}",
                              "export the run again with this version: mlmkit export RUN --out DIR")
        if _axes(data["outputs"]) == MASK_ROWS:
            raise BundleError(f"{path.parent} is a fill-mask bundle of an earlier layout (one output row per "
                              "[MASK]); "
                              "this mlmkit reads per-token outputs",
                              "export its run again: mlmkit export RUN --out DIR")
        _check_description(path, data)
        known = {f.name for f in fields(cls)} - {"run", "tokenizer", "model"}
        tok, model, labels = data["tokenizer"], data.get("model") or {}, data.get("labels")
        # the fields' values, by name
        typed: dict[str, Any] = {k: data[k] for k in known if data.get(k) is not None}
        typed.update(
            inputs=tuple(data["inputs"]), outputs={k: tuple(v) for k, v in data["outputs"].items()},
            labels=tuple(labels) if labels is not None else None,
            optimizations=tuple(data.get("optimizations") or ()),
            tokenizer=TokenizerPrint(**{f.name: tok[f.name] for f in fields(TokenizerPrint)}),
            model=ModelShape(**{f.name: model[f.name] for f in fields(ModelShape) if f.name in model}),
        )
        return cls(**typed,
                   run={k: v for k, v in data.items() if k not in known | {"tokenizer", "model", "format"}})

    def to_json(self) -> JSONObject:
        """mlmkit.json's object: what the run carried, then every typed field."""
        out: JSONObject = {**self.run, "format": "mlmkit-onnx-bundle"}
        for f in fields(self):
            if f.name != "run":
                v = getattr(self, f.name)
                out[f.name] = list(v) if isinstance(v, tuple) else v
        out["outputs"] = {k: list(v) for k, v in self.outputs.items()}
        out["tokenizer"], out["model"] = asdict(self.tokenizer), {k: v for k, v in asdict(self.model).items()
                                                                  if v is not None}
        return out

    def context(self, options: Mapping[str, Any]) -> TaskContext:
        """The task's context for this bundle, with ``options`` already resolved."""
        return TaskContext(max_length=self.max_length, options=dict(options), labels=self.labels,
                           state=dict(self.task_state))


def read_bundle_meta(path: str | Path) -> BundleMeta:
    """mlmkit.json of a bundle, after checking that the bundle's three files are there."""
    d = Path(path)
    if not d.is_dir():
        raise BundleError(f"bundle not found: {d}", "pass a directory written by `mlmkit export`")
    missing = [f for f in BUNDLE_FILES if not (d / f).is_file()]
    if missing:
        raise BundleError(f"{d} lacks {', '.join(missing)}",
                          "re-create the bundle with `mlmkit export RUN --out DIR`")
    try:
        data = parse_json((d / "mlmkit.json").read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BundleError(f"{d / 'mlmkit.json'} is corrupted ({e})",
                          "re-create the bundle with `mlmkit export`") from None
    return BundleMeta.from_json(data, d / "mlmkit.json")


def _check_description(path: Path, meta: JSONObject) -> None:
    """Each field of a bundle's mlmkit.json has the type and range the runtime relies on: one line
    naming the file and the first field that does not."""
    tok, model = meta["tokenizer"], meta.get("model", {})
    tok_ok = isinstance(tok, dict) and _int_in(tok.get("vocab_size"), 1, 1 << 24)
    V = tok["vocab_size"] if tok_ok else 0
    model_ok = isinstance(model, dict) and all(
        _int_in(model.get(k, 1), 1, 1 << 24)
        for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "max_position_embeddings")) and isinstance(model.get(
                                                           "model_type", ""), str)
    positions = model.get("max_position_embeddings", MAX_LENGTH) if model_ok else MAX_LENGTH
    labels, outputs, inputs = meta.get("labels"), meta["outputs"], meta["inputs"]
    problems = [
        (not tok_ok, "'tokenizer.vocab_size' is not a positive number of tokens"),
        # mask_id null: a tokenizer without a mask token
        (tok_ok and not (_int_in(tok.get("pad_id"), 0, V - 1)
                         and (tok.get("mask_id") is None or _int_in(tok.get("mask_id"), 0, V - 1))),
         "'tokenizer.pad_id' or 'tokenizer.mask_id' is not a token id of the vocabulary"),
        (tok_ok and not (isinstance(tok.get("vocab_sha256"), str) and isinstance(tok.get("lowercase"), bool)),
         "'tokenizer.vocab_sha256' is not a hash or 'tokenizer.lowercase' not true / false"),
        (not isinstance(meta["task"], str) or not meta["task"], "'task' is not a name"),
        (not model_ok, "'model' is not an object of the model's sizes (positive whole numbers)"),
        (not _int_in(meta["max_length"], 1, min(positions, MAX_LENGTH)),
         f"'max_length' {meta['max_length']!r} is not a whole number of tokens from 1 to "
         f"{min(positions, MAX_LENGTH)}"),
        (labels is not None and (not isinstance(labels, list) or not labels
                                 or not all(isinstance(x, str) and x for x in labels)),
         "'labels' is not a list of names"),
        (isinstance(labels, list) and len(set(map(str, labels))) != len(labels),
         "'labels' names a label twice"),
        (not isinstance(meta.get("options", {}), dict), "'options' is not an object"),
        (not isinstance(meta.get("task_state", {}), dict), "'task_state' is not an object"),
        (not isinstance(outputs, dict) or not outputs
         or not all(isinstance(v, list) and v and all(isinstance(a, str) for a in v)
                    for v in outputs.values()),
         "'outputs' does not map names to axis lists"),
        (not isinstance(inputs, list) or "input_ids" not in inputs or len(set(map(str, inputs)))
         != len(inputs)
         or not all(isinstance(i, str) and i in INPUT_NAMES for i in inputs),
         f"'inputs' is not a list of the graph inputs ({', '.join(INPUT_NAMES)})"),
        (meta.get("precision", "fp32") not in PRECISIONS,
         f"'precision' is not one of {', '.join(PRECISIONS)}"),
        (not _int_in(meta.get("opset", 17), 1, 1000), "'opset' is not an ONNX opset number"),
        (not isinstance(meta.get("trained_as", ""), str), "'trained_as' is not a task name"),
        (meta.get("format", "mlmkit-onnx-bundle") != "mlmkit-onnx-bundle",
         "'format' is not mlmkit-onnx-bundle"),
        (not _int_in(meta.get("model_bytes", 0), 0, 1 << 50), "'model_bytes' is not a size in bytes"),
        (not isinstance(meta.get("optimizations", []), list)
         or not all(isinstance(x, str) for x in meta.get("optimizations", [])),
         "'optimizations' is not a list of names"),
        (not isinstance(meta.get("fused_operators", {}), dict), "'fused_operators' is not an object"),
        (not isinstance(meta.get("parity", {}), dict), "'parity' is not an object"),
        (not isinstance(meta.get("gate", {}), dict), "'gate' is not an object"),
        (isinstance(meta.get("gate"), dict) and not isinstance(meta["gate"].get("bf16", {}), dict),
         "'gate.bf16' is not an object"),
        (meta.get("run_precision", "auto") not in ("auto", "fp32"), "'run_precision' is not auto or fp32"),
        (not isinstance(meta.get("source", {}), dict), "'source' is not an object"),
    ]
    bad = [why for wrong, why in problems if wrong]
    if bad:
        raise BundleError(f"{path}: {bad[0]}", "re-create the bundle with `mlmkit export`")


def _axes(outputs: Any) -> Any:
    """'outputs' as BundleMeta holds them (axis tuples), or as they are where they are not axis lists."""
    ok = isinstance(outputs, dict) and all(isinstance(v, list) for v in outputs.values())
    return {k: tuple(v) for k, v in outputs.items()} if ok else outputs


def _int_in(x: Any, low: int, high: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and low <= x <= high


def load_bundle_tokenizer(path: str | Path, meta: BundleMeta) -> Any:
    """The bundle's tokenizer, refused when it is not the one the model was exported with."""
    p = Path(path) / "tokenizer.json"
    try:
        tok = load_tokenizer(p)
    except ConfigError as e:
        raise BundleError(f"{p} is corrupted or not a tokenizer ({e.message})",
                          "re-create the bundle with `mlmkit export`") from None
    want, have = meta.tokenizer, tokenizer_fingerprint(tok)
    diff = [f.name for f in fields(TokenizerPrint) if getattr(want, f.name) != getattr(have, f.name)]
    if diff:
        raise BundleError(
            f"{p} does not match the model: its {', '.join(diff)} differ from the exported tokenizer's "
            f"(vocabulary {have.vocab_size} vs {want.vocab_size} tokens)",
            "restore the tokenizer.json written by `mlmkit export`, or export again",
        )
    # a "[MASK]" typed in a text is the mask token, as in Hugging Face's tokenizers,
    if special_tokens(tok).mask == MASK:
        # also where tokenizer.json holds it as a vocabulary entry only (one made from a vocab.txt)
        tok.add_special_tokens([AddedToken(MASK, special=True, normalized=False)])
    # a tokenizer.json may carry fixed padding (docs/performance.md, "Tokenizer files can carry padding");
    # batches pad themselves
    tok.no_padding()
    tok.no_truncation()
    return tok
