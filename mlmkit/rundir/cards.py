"""Model cards: README.md in the Hugging Face model-card format for run directories and bundles.

The card is written from what the directory holds (mlmkit.json through its typed reader, a run's
``RunMeta`` or a bundle's ``BundleMeta``, and config.json), so it can be rewritten at any time
(``write_card(DIR)``; training and export call it): YAML front matter (library_name, pipeline_tag,
base_model when it is a Hub id, tags, model-index with the evaluation metrics), then the training
data, the arguments, the results and how to use the model. A bundle's card adds the export facts. A
README.md that mlmkit did not write (a foreign checkpoint's, or one a user edited and took the marker
line out of) is kept.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from mlmkit.files import JSONObject, atomic_write_text, read_json
from mlmkit.registry import PRETRAINING

MARKER = "<!-- mlmkit model card: mlmkit rewrites this file; delete this line to keep your edits -->"
BUNDLE_FORMAT = "mlmkit-onnx-bundle"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def write_card(d: str | Path) -> Path | None:
    """Write DIR/README.md for a run directory or bundle; returns its path, or None when a README.md
    mlmkit did not write is there (it is kept)."""
    d = Path(d)
    path = d / "README.md"
    if path.exists() and MARKER not in path.read_text(encoding="utf-8", errors="replace"):
        return None
    atomic_write_text(path, card(d))
    return path


def card(d: Path) -> str:
    """The model card of run directory or bundle ``d``, as text."""
    meta, bundle = _description(d)
    config = read_json(d / "config.json") if (d / "config.json").exists() else {}
    task = meta.get("task", "")
    pretraining = meta.get("trained_as", task) == PRETRAINING
    tag = _pipeline_tag(task)
    metrics = results(meta)
    model_type = (meta.get("model") or {}).get("model_type") or config.get("model_type")
    front: JSONObject = {"library_name": "mlmkit", "pipeline_tag": tag}
    base = _hub_id(meta.get("base_model"))
    if base:
        front["base_model"] = base
    front["tags"] = [t for t in ("mlmkit", model_type, task, "onnx" if bundle else None) if t]
    if metrics:
        data = meta.get("data") or {}
        dataset = Path(str(data.get("eval") or "held-out")).name
        front["model-index"] = [{"name": d.name, "results": [{
            "task": {"type": tag},
            "dataset": {"name": dataset, "type": dataset},
            "metrics": [{"type": k, "value": v, "name": k} for k, v in metrics.items()],
        }]}]
    out = ["---", *yaml_lines(front), "---", MARKER, "", f"# {d.name}", "",
           _summary(meta, task, pretraining, bundle, model_type), ""]
    out += _data(meta, pretraining)
    args = meta.get("train_args")
    if args:
        out += ["## Training arguments", "", "| argument | value |", "|---|---|",
                *(f"| {k} | {_cell(v)} |" for k, v in args.items() if k not in ("progress",)
                  and v is not None), ""]
    if metrics:
        where = "the best evaluation" if meta.get("best_metrics") else "the last evaluation"
        out += ["## Results", "", f"On {front['model-index'][0]['results'][0]['dataset']['name']}, at {where}"
                + (f" (step {meta['best_step']})" if meta.get("best_step") else "") + ":", "",
                "| metric | value |", "|---|---|", *(f"| {k} | {_cell(v)} |" for k, v in metrics.items()), ""]
    if (d / "curves.png").exists():
        out += ["## Training curves", "", "![training curves](curves.png)", ""]
    if bundle:
        out += _export(meta)
    out += _usage(d, meta, task, pretraining, bundle, config)
    return "\n".join(out).rstrip() + "\n"


def _description(d: Path) -> tuple[JSONObject, bool]:
    """(mlmkit.json of ``d`` checked by its typed reader, as the flat object the card reads; whether ``d``
    is a bundle). A wrong field is one line naming the file and the field, as everywhere it is read."""
    path = d / "mlmkit.json"
    data = read_json(path)
    if data.get("format") == BUNDLE_FORMAT:
        from mlmkit.runtime.bundle import BundleMeta

        return BundleMeta.from_json(data, path).to_json(), True
    from mlmkit.rundir.meta import RunMeta

    return RunMeta.from_json(data, path).to_json(), False


def results(meta: JSONObject) -> dict[str, float]:
    """The evaluation metrics a run reports (the best model's when one was kept), without the eval_ prefix."""
    src = meta.get("best_metrics") or meta.get("final_metrics") or {}
    skip = ("step", "epoch", "loss", "lr", "tokens_per_s")
    out = {}
    for k, v in src.items():
        name = k[5:] if k.startswith("eval_") else k
        if (isinstance(v, (int, float)) and not isinstance(v, bool) and name not in skip
            and not name.endswith("_loss")):
            if meta.get("best_metrics") or k.startswith("eval_"):
                out[name] = round(float(v), 6)
    return out


def _plugin(task: str) -> Any:
    """The registered task of that name, or None (a task not installed here still gets a card)."""
    from mlmkit.registry import task_of

    try:
        return task_of(task)
    except Exception:  # noqa: BLE001
        return None


def _pipeline_tag(task: str) -> str:
    plugin = _plugin(task)
    return plugin.pipeline_tag if plugin is not None else "feature-extraction"


def _hub_id(base: Any) -> str | None:
    """``base_model`` as a Hub repository id: the base's config.json ``_name_or_path`` when that is one."""
    if not isinstance(base, str):
        return None
    if HUB_ID.match(base) and not Path(base).exists():
        return base
    cfg = Path(base) / "config.json"
    try:
        name = json.loads(cfg.read_text(encoding="utf-8")).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) and HUB_ID.match(name) and not Path(name).exists() else None


def _summary(meta: JSONObject, task: str, pretraining: bool, bundle: bool, model_type: Any) -> str:
    family = model_type or "encoder"
    if pretraining:
        what = f"A {family} encoder pretrained with mlmkit (masked language modelling" + (
            " and next-sentence prediction)." if meta.get("nsp") else ").")
    else:
        source = (meta.get("source") or {}).get("path")
        what = f"A {family} model for the {task} task" + (
            f", fine-tuned with mlmkit from `{meta['base_model']}`." if meta.get("base_model")
            else f", exported by mlmkit from `{source}`." if source else ".")
    if bundle:
        what += f" This is its ONNX bundle ({meta.get('precision', 'fp32')}), served by onnxruntime."
    labels = meta.get("labels")
    if labels:
        shown = ", ".join(f"`{x}`" for x in labels[:20]) + (f" and {len(labels) - 20} more" if len(labels)
                                                            > 20 else "")
        what += f" Labels: {shown}."
    return what


def _data(meta: JSONObject, pretraining: bool) -> list[str]:
    files = meta.get("corpus") if pretraining else None
    data = meta.get("data") or {}
    lines = []
    if files:
        lines += [f"- corpus: `{f}`" for f in files[:20]]
    for k in ("train", "eval"):
        if data.get(k):
            lines.append(f"- {k}: `{data[k]}`")
    if meta.get("max_length"):
        lines.append(f"- max length: {meta['max_length']} tokens")
    return ["## Training data", "", *lines, ""] if lines else []


def _export(meta: JSONObject) -> list[str]:
    parity = meta.get("parity")
    fused = meta.get("fused_operators") or {}
    rows = [("opset", meta.get("opset")), ("precision", meta.get("precision")),
            ("quantization", "dynamic int8" if meta.get("precision") == "int8" else "none"),
            ("optimizations", ", ".join(meta.get("optimizations") or []) or "none"),
            ("fused operators", ", ".join(f"{k} {v}" for k, v in fused.items()) or "none"),
            ("parity with PyTorch", json.dumps(parity) if isinstance(parity, dict) else parity),
            ("inputs", ", ".join(meta.get("inputs") or [])), ("max length", meta.get("max_length")),
            ("model bytes", meta.get("model_bytes"))]
    return ["## Export", "", "| | |", "|---|---|",
            *(f"| {k} | {_cell(v)} |" for k, v in rows if v not in (None, "")), ""]


def _usage(d: Path, meta: JSONObject, task: str, pretraining: bool, bundle: bool,
           config: JSONObject) -> list[str]:
    name = d.name
    out = ["## How to use", "", "With mlmkit:", "", "```bash"]
    if bundle:
        command = _command(task)
        out += [f"mlmkit {command} {name} --input texts.txt" if command
                else f"mlmkit predict {name} --input texts.jsonl",
                f"mlmkit serve {name}        # HTTP: POST /v1/models/{name}/predict"]
    else:
        out.append(f"mlmkit export {name} --out exports/{name}")
        if not pretraining:
            out.append(f"mlmkit evaluate {name} --data eval.jsonl")
        else:
            out.append(f"mlmkit finetune TASK --model {name} --train train.jsonl --out runs/TASK")
    out += ["```", ""]
    if bundle:
        out += ["In Python:", "", "```python", "import mlmkit", "",
                f'pipe = mlmkit.Pipeline.load("{name}")', 'print(pipe(["a text"]))', "```", ""]
    else:
        arch = (config.get("architectures") or [""])[0]
        if arch:
            out += ["With transformers (the directory is a Hugging Face checkpoint):", "", "```python",
                    f"from transformers import AutoTokenizer, {arch}", "",
                    f'model = {arch}.from_pretrained("{name}")',
                    f'tokenizer = AutoTokenizer.from_pretrained("{name}")', "```", ""]
    return out


def _command(task: str) -> str | None:
    plugin = _plugin(task)
    return plugin.command if plugin is not None else None


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(str(x) for x in v)
    return str(v).replace("|", "\\|").replace("\n", " ")


def yaml_lines(value: Any, indent: int = 0) -> list[str]:
    """``value`` (dicts, lists, scalars) as block-style YAML that any YAML reader reads back as ``value``:
    scalars as JSON (a quoted string keeps ``: # - ---`` and newlines as text), what YAML will not take
    raw escaped, keys quoted unless they are plain names."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            plain = isinstance(k, str) and _PLAIN_KEY.fullmatch(k) and k.lower() not in _YAML_WORDS
            key = k if plain else _scalar(str(k))
            if isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}{key}:")
                lines += yaml_lines(v, indent + 2)
            else:
                lines.append(f"{pad}{key}: {_scalar(v)}")
    elif isinstance(value, list):
        for item in value:
            sub = yaml_lines(item, indent + 2)
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}- {sub[0].lstrip()}")
                lines += sub[1:]
            else:
                lines.append(f"{pad}- {_scalar(item)}")
    else:
        lines.append(pad + _scalar(value))
    return lines


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
# plain, they read as None or booleans
_YAML_WORDS = {"null", "true", "false", "yes", "no", "on", "off", "y", "n"}
# characters a YAML stream may not hold raw (C1 controls, BOM, non-characters), or reads as line breaks
_RAW_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff]")


def _scalar(v: Any) -> str:
    if isinstance(v, float):
        if not math.isfinite(v):
            return ".nan" if math.isnan(v) else (".inf" if v > 0 else "-.inf")
        mantissa, e, exponent = repr(v).partition("e")  # YAML 1.1 reads 5e-05 as text: 5.0e-05
        return mantissa + ("" if "." in mantissa or not e else ".0") + e + exponent
    if isinstance(v, (dict, list)):  # empty ones (the others are blocks)
        return "{}" if isinstance(v, dict) else "[]"
    return _RAW_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(v, ensure_ascii=False))
