"""The embedding task's data: what its ``read`` makes of a data file or a BEIR directory, and what
its ``featurize`` takes from an example (a sentence-transformers directory is embedding_st.py's).

- a file's or a BEIR split's examples (``read_examples``, the task's ``read``);
- a data file's records as rows of an anchor, its positive and hard negatives (``anchor_row``, with
  the teacher's scores for margin-mse), scored pairs (``scored_pair``), and the kind of data a list
  of examples is (``data_kind``, checked against the loss by ``check_loss_data``); rows as a
  retrieval evaluation (``as_retrieval``);
- the teacher's embedding of every training text (``with_teacher``, mse-distill);
- an example's texts (``example_texts``), the prompt before each (``prompt_for``) and the id that
  tells equal texts of a batch (``text_id``).

No torch at module level: a teacher run is loaded through mlmkit.model when mse-distill asks for one.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mlmkit.taskkit import (
    DISTINCT,
    DataFormatError,
    Example,
    Feature,
    Record,
    TaskError,
    data_format,
    get_loss,
    is_beir,
    iter_jsonl,
    iter_records,
    load_pipeline,
    numbered,
    read_split,
)
from mlmkit_tasks.embedding_options import loss_option, trains_on_teacher_scores
from mlmkit_tasks.embedding_st import named_prompts

log = logging.getLogger("mlmkit")

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl"}


# a training feature's "target" without a teacher (mse-distill's only)
NO_TARGET = np.zeros(0, dtype=np.float32)
DATA_NAMES = {"rows": "rows of an anchor and its positive", "scored": "scored pairs", "texts": "plain texts"}


# ---- reading a file or a BEIR directory ----------------------------------------------------------
def read_examples(path: Path, options: Mapping[str, Any], *, training: bool,
                  max_bytes: int | None) -> list[Example]:
    """The task's ``read``: a BEIR directory's split, or a data file's rows, scored pairs or (for
    mse-distill) plain texts; one kind of data per file."""
    if is_beir(path):
        return _beir_examples(path, options, training=training, max_bytes=max_bytes)
    fmt = data_format(path, FORMATS)
    loss = loss_option(options)
    texts_ok = training and loss == "mse-distill"  # plain texts: only a teacher's embeddings to learn
    examples: list[Example] = []
    records = (iter_jsonl(path, max_bytes=max_bytes) if fmt == "jsonl"
               else iter_records(path, fmt, max_bytes=max_bytes))
    for rec in records:
        fields = rec.fields()
        if options["anchor_column"] in fields:
            ex = anchor_row(rec, options, scores=trains_on_teacher_scores(options))
        elif texts_ok and options["score_column"] not in fields:
            ex = {"text": rec.text(options["text_column"]),
                  "text_pair": rec.text(options["pair_column"], required=False)}
        else:
            ex = scored_pair(rec, options, hint=f"scored pairs need {options['score_column']}; rows need "
                                                 f"{options['anchor_column']} and "
                                                 f"{options['positive_column']}")
        if examples and data_kind([ex]) != data_kind(examples[:1]):
            raise rec.error(f"{DATA_NAMES[data_kind([ex])]} and {DATA_NAMES[data_kind(examples[:1])]} "
                            "mixed in one file",
                            hint="one kind of data per file")
        examples.append(ex)
    if not examples:
        raise DataFormatError(path, "no examples",
                              hint="anchor and positive (and negatives) per record, or text, "
                                   "text_pair and score")
    if not training:
        return as_retrieval(examples) if "anchor" in examples[0] else examples
    if loss == "mse-distill":
        with_teacher(examples, options)
    return examples


def _beir_examples(path: Path, options: Mapping[str, Any], *, training: bool,
                   max_bytes: int | None) -> list[Example]:
    """A BEIR split: for training its (query, relevant document) rows, for evaluation a retrieval set
    ({"kind": "query", "id", "text", "judged"} then {"kind": "doc", "id", "text"})."""
    split = read_split(path, training=training, max_bytes=max_bytes)
    for why, n in split.skipped.items():
        log.warning("%s: %d queries of the %s split left out: %s", split.directory, n, split.split, why)
    if not training:
        return ([{"kind": "query", "id": q, "text": text, "judged": split.qrels[q]}
                 for q, text in split.queries.items()]
                + [{"kind": "doc", "id": d, "text": text} for d, text in split.corpus.items()])
    rows: list[Example] = [{"anchor": split.queries[q], "positive": split.corpus[d], "negatives": []}
                           for q in split.qrels for d in split.positives(q)]
    if trains_on_teacher_scores(options):
        raise TaskError(f"{loss_option(options)} trains on rows with the teacher's scores; a "
                        "BEIR split has none",
                        f"mine them: mlmkit mine {path} --out rows.jsonl --with-scores")
    if loss_option(options) == "mse-distill":
        with_teacher(rows, options)
    return rows


# ---- records -------------------------------------------------------------------------------------
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
