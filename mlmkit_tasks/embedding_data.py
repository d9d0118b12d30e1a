"""The embedding task's data: what its ``read`` makes of a file, a BEIR directory or a
sentence-transformers directory, and what its ``featurize`` takes from an example.

- a sentence-transformers directory's pooling, normalisation, prompts and max length
  (``sentence_transformers_options``), and whether a directory is a SPLADE SparseEncoder instead
  (``is_splade_directory``, the sparse-embedding task's);
- a data file's records as rows of an anchor, its positive and hard negatives (``anchor_row``, with
  the teacher's scores for margin-mse), scored pairs (``scored_pair``), and the kind of data a list
  of examples is (``data_kind``); rows as a retrieval evaluation (``as_retrieval``);
- the teacher's embedding of every training text (``with_teacher``, mse-distill);
- an example's texts (``example_texts``), the prompt before each (``prompt_for``) and the id that
  tells equal texts of a batch (``text_id``).

No torch at module level: a teacher run is loaded through mlmkit.model when mse-distill asks for one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mlmkit.taskkit import (
    DISTINCT,
    CheckpointInfo,
    DataFormatError,
    Example,
    Feature,
    Options,
    Record,
    TaskError,
    get_loss,
    load_pipeline,
    numbered,
    parse_json,
)

log = logging.getLogger("mlmkit")

ST_POOLING = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
              "pooling_mode_max_tokens": "max",
              "pooling_mode_lasttoken": "lasttoken", "pooling_mode_weightedmean_tokens": "weightedmean",
              "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens"}
"""sentence-transformers' Pooling config keys and the pooling each names (models/pooled.py's modes)."""
ST_ACTIVATIONS = ("identity", "tanh", "relu", "gelu", "sigmoid", "silu")
"""The activations a Dense module may name (its torch class, lower-cased:
torch.nn.modules.linear.Identity)."""
FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl"}
ST_PROMPTS = {"query_prompt": ("query",), "document_prompt": ("document", "passage", "corpus")}
"""The prompt options and the names a sentence-transformers directory's "prompts" gives them (the first
found)."""
ST_ALIASES = frozenset(n for names in ST_PROMPTS.values() for n in names)
"""The prompt names that are the query and document prompts' (their options, not ``prompts``)."""


# a training feature's "target" without a teacher (mse-distill's only)
NO_TARGET = np.zeros(0, dtype=np.float32)
DATA_NAMES = {"rows": "rows of an anchor and its positive", "scored": "scored pairs", "texts": "plain texts"}


# ---- sentence-transformers directories -----------------------------------------------------------
# a sentence-transformers SparseEncoder: the sparse-embedding task's
SPLADE_MODULES = ("SpladePooling", "MLMTransformer")


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


# ---- records -------------------------------------------------------------------------------------
def loss_option(options: Mapping[str, Any]) -> str:
    """The loss as far as the options say: ``auto`` with a teacher is mse-distill (else still auto)."""
    loss = options.get("loss", "auto")
    return "mse-distill" if loss == "auto" and options.get("teacher") else loss


def data_kind(examples: list[Example]) -> str:
    """What the examples are: "rows" (anchor, positive ...), "scored" pairs or plain "texts"."""
    if not examples or "anchor" in examples[0]:
        return "rows"
    return "scored" if "score" in examples[0] else "texts"


def _negative_columns(fields: Mapping[str, Any], prefix: str) -> list[str]:
    """``negative``, then ``negative_1``, ``negative_2`` ... (by number) among a record's fields."""
    return ([prefix] if prefix in fields else []) + numbered(fields, prefix)


def anchor_row(rec: Record, options: Mapping[str, Any], *, scores: bool) -> Example:
    """{"anchor", "positive", "negatives"} of a record, with the teacher's "scores" (the positive's,
    then each negative's) when it has them; ``scores``: they are required (margin-mse)."""
    negs = _negative_columns(rec.fields(), "negative")
    texts = [(k, rec.text(k, required=False)) for k in negs]
    row: Example = {"anchor": rec.text(options["anchor_column"]),
                    "positive": rec.text(options["positive_column"])}
    col = options["scores_column"]
    value = rec.fields().get(col)
    if value is None:
        if scores:
            raise rec.error(f"{loss_option(options)} needs the teacher's scores", col,
                            hint="mlmkit mine --with-scores writes them "
                            "(the positive's, then each negative's)")
        row["negatives"] = [t for _, t in texts if t]
        return row
    ok = isinstance(value,
                    list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                                  for x in value)
    if not ok or len(value) != 1 + len(texts):
        raise rec.error(f"expected {1 + len(texts)} finite numbers (the positive's score, then one per "
                        "negative), "
                        f"got {value!r}"[:300], col, hint="the list mlmkit mine --with-scores writes")
    kept = [(t, float(x)) for (_, t), x in zip(texts, value[1:]) if t]
    row["negatives"] = [t for t, _ in kept]
    row["scores"] = [float(value[0]), *(x for _, x in kept)]
    return row


def scored_pair(rec: Record, options: Mapping[str, Any], hint: str | None = None) -> Example:
    """{"text", "text_pair", "score", "line", "source"} of one record (the STS layout)."""
    value = rec.fields().get(options["score_column"])
    try:
        score = float(value) if value is not None and not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        score = math.nan
    if not math.isfinite(score):
        raise rec.error(f"the score must be a finite number, not {value!r}", options["score_column"],
                        hint=hint)
    return {"text": rec.text(options["text_column"]), "text_pair": rec.text(options["pair_column"]),
            "score": score, "line": rec.line, "source": rec.source}


def as_retrieval(rows: list[Example]) -> list[Example]:
    """Training-style rows as a retrieval evaluation: each anchor a query, searching the distinct texts
    of every positive and negative of the file, its own positive the one relevant document."""
    doc_ids: dict[str, str] = {}
    for r in rows:
        for text in (r["positive"], *r["negatives"]):
            doc_ids.setdefault(text, f"d{len(doc_ids)}")
    queries = [{"kind": "query", "id": f"q{i}", "text": r["anchor"], "judged": {doc_ids[r["positive"]]: 1}}
               for i, r in enumerate(rows)]
    return queries + [{"kind": "doc", "id": did, "text": text} for text, did in doc_ids.items()]


# ---- the teacher (mse-distill) -------------------------------------------------------------------
def with_teacher(examples: list[Example], options: Mapping[str, Any]) -> None:
    """Each example's "targets": the teacher's embedding of each of its texts (queries as queries,
    documents as documents, with the teacher's own prompts)."""
    if not options.get("teacher"):
        raise TaskError("mse-distill needs a teacher",
                        "--option teacher=BUNDLE_OR_RUN (an embedding bundle or run)")
    embed = _teacher(Path(options["teacher"]))
    by_kind: dict[str, list[tuple[int, int, str]]] = {}
    for i, ex in enumerate(examples):
        for part, t in enumerate(example_texts(ex)):
            if t is not None:
                kind = ("query" if part == 0 else "document") if "anchor" in ex else "none"
                by_kind.setdefault(kind, []).append((i, part, t))
    for ex in examples:
        ex["targets"] = {}
    log.info("embedding the %d training texts with the teacher %s", sum(map(len, by_kind.values())),
             options["teacher"])
    for kind, items in by_kind.items():
        vectors = embed([t for _, _, t in items], kind)
        for (i, part, _), v in zip(items, vectors):
            examples[i]["targets"][part] = v
    for ex in examples:
        ex["targets"] = [ex["targets"][p] for p in sorted(ex["targets"])]


def _teacher(path: Path) -> Any:
    """(texts, input type) -> float32 (n, D): an embedding bundle (onnxruntime) or run (PyTorch)."""
    if not path.exists():
        raise TaskError(f"teacher not found: {path}",
                        "give an embedding bundle (mlmkit export) or a fine-tuned embedding run")
    if (path / "model.onnx").is_file():
        pipe = load_pipeline(path, command="embed")
        return lambda texts, kind: np.asarray([r["embedding"] for r in pipe(texts, input_type=kind)],
                                              dtype=np.float32)
    from mlmkit.model import load_finetuned, predict, torch_forward

    task, net, tok, meta = load_finetuned(path)
    if task.name != "embedding":
        raise TaskError(f"the teacher {path} is a {task.name} run", "give an embedding bundle or run")

    def embed(texts: list[str], kind: str) -> np.ndarray:
        ctx = meta.context(task.resolve_options({"input_type": kind}, saved=meta.options))
        got = predict(task, [{"text": t} for t in texts], tok, ctx, torch_forward(net, task.outputs))
        return np.asarray([p["embedding"] for p in got.predictions], dtype=np.float32)

    return embed


# ---- what featurize takes from an example --------------------------------------------------------
def example_texts(ex: Example) -> list[str | None]:
    """An example's texts by ``part``: an anchor, its positive and its negatives; or a text and its pair
    (None without one)."""
    if "anchor" in ex:
        return [ex["anchor"], ex["positive"], *ex["negatives"]]
    return [ex["text"], ex.get("text_pair")]


def prompt_for(ex: Example, part: int, options: Mapping[str, Any]) -> str:
    """The prompt before text ``part`` of ``ex``: a query's (an anchor, a retrieval query, an input
    declared a query) or a document's (a positive or negative, a corpus text, an input declared one).
    ``prompt_name`` (sentence-transformers' word: `--prompt-name`) names the prompt of the inputs, or
    of the queries where there are documents too; an input declared nothing takes the model's
    ``default_prompt_name`` where it has one, else none."""
    name = options.get("prompt_name") or ""
    if "anchor" in ex or "kind" in ex:
        query = part == 0 if "anchor" in ex else ex["kind"] == "query"
        kind = (name or "query") if query else "document"
    else:
        declared = options.get("input_type", "none")
        kind = name or (declared if declared != "none" else options.get("default_prompt_name") or "none")
    if kind == "none":
        return ""
    prompts = named_prompts(options)
    if kind not in prompts and kind not in ("query", "document"):
        raise TaskError(f"the model has no prompt named {kind!r}",
                        f"its prompts: {', '.join(prompts) or 'none'}")
    return str(prompts.get(kind, ""))


def check_loss_data(examples: list[Example], loss: str, hint: str) -> None:
    """The ``loss`` of the embedding registry trains on what ``examples`` are, or a TaskError saying so."""
    kind, want = data_kind(examples), get_loss("embedding", loss).data
    if kind not in want:
        raise TaskError(f"the {loss} loss trains on {' or '.join(DATA_NAMES[w] for w in want)}, "
                        f"and the data are {DATA_NAMES[kind]}", hint)


def training_fields(ex: Example, part: int, ids: list[int], in_batch: bool) -> Feature:
    """A training feature's ``text_id`` (equal texts, equal ids; also DISTINCT under an in-batch loss:
    no text twice in a batch, where it would be its own false negative) and ``score`` (a scored pair's
    gold, the teacher's score of a row's candidate, else 0)."""
    f: Feature = {"text_id": text_id(ids)}
    if in_batch:
        f[DISTINCT] = f["text_id"]
    f["score"] = float(ex["scores"][part - 1] if part and "scores" in ex else ex.get("score", 0.0))
    return f


def text_id(ids: list[int]) -> int:
    """The same int64 for the same token ids: which texts of a batch are equal (never each other's
    negatives)."""
    return int.from_bytes(hashlib.blake2b(np.asarray(ids, dtype=np.int64).tobytes(), digest_size=8).digest(),
                          "little",
                          signed=True)
