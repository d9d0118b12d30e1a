"""Sentence embeddings: one vector per text, pooled over the encoder's real tokens inside the graph,
fine-tuned for retrieval (or similarity) with one of the registry's embedding losses (mlmkit.taskkit.losses).

Pooling ``mean`` (the default), ``cls`` or ``max`` over the tokens the attention mask keeps, then an
optional L2 normalisation (``normalize``): what sentence-transformers does with a Pooling and a
Normalize module. A sentence-transformers directory (modules.json, 1_Pooling/config.json,
sentence_bert_config.json) is read as it says, and a fine-tuned run is one too; any other BERT
checkpoint is a plain encoder. The bundle returns a (batch, hidden) tensor, never the batch x length x
hidden one.

Data, in any format fine-tuning reads (CSV / TSV / JSONL / Parquet / `datasets` directories):

- rows of an anchor, its positive and any hard negatives (``anchor``, ``positive``, ``negative`` or
  ``negative_1`` ...): trained with ``mnrl`` / ``cached-mnrl``; evaluated as retrieval, each anchor
  searching every positive and negative of the file;
- the same rows with the teacher's ``scores`` (a list: the positive's, then each negative's, as
  `mlmkit mine --with-scores` writes them): trained with ``margin-mse``;
- scored pairs (``text``, ``text_pair``, ``score``, the STS layout): trained with ``cosent``;
  evaluated by the Spearman (main) and Pearson correlation of the pairs' cosine with the scores;
- with ``teacher`` (an embedding bundle or run), any of these or plain texts (``text``): trained with
  ``mse-distill`` toward the teacher's embedding of every text (computed once, before training);
- a BEIR directory (text/beir.py): its train split's (query, relevant document) pairs for training,
  its test (or dev) split for evaluation: nDCG@10 (main), MRR@10, MAP@100, Recall@10/100,
  Precision@10 over an exact search of the whole corpus (infer/retrieval.py).

In a training batch an example's texts stay together (``group_features``); ``--batch-size`` counts
texts, so 64 holds 32 (anchor, positive) pairs.

Prompts (``query_prompt``, ``document_prompt``, as e5 and bge use them: "query: ", "passage: ") are
built into the model like its pooling: put before every query (an anchor) and every document (a
positive, a negative, a corpus text) in training and retrieval evaluation, and before an input the
caller declares one (``input_type``: `mlmkit embed --as query`, the OpenAI route's ``input_type``,
TEI's ``prompt_name``). A sentence-transformers directory's prompts are read from, and a run's written
to, config_sentence_transformers.json ({"prompts": {"query": ..., "document": ...}}).
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mlmkit.taskkit import (
    BATCH,
    DISTINCT,
    EXAMPLE,
    INDEXES,
    MAX_RECORD_BYTES,
    RETRIEVAL_METRICS,
    TRUNCATED,
    DataFormatError,
    Record,
    TaskContext,
    TaskError,
    TaskOption,
    clip_text,
    data_format,
    get_loss,
    is_beir,
    iter_jsonl,
    iter_records,
    load_pipeline,
    losses,
    mean_metrics,
    numbered,
    parse_json,
    read_split,
    retrieve,
    tokenizer_settings,
    write_trec,
)

if TYPE_CHECKING:  # the config type is torch's side (models/); a task imports torch in build_model only
    from mlmkit.model import ModelConfig

log = logging.getLogger("mlmkit")

POOLINGS = ("mean", "cls", "max")
ST_POOLING = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max"}
FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl"}
INPUT_TYPES = ("none", "query", "document")
ST_PROMPTS = {"query_prompt": ("query",), "document_prompt": ("document", "passage", "corpus")}
"""The prompt options and the names a sentence-transformers directory's "prompts" gives them (the first found)."""


NO_TARGET = np.zeros(0, dtype=np.float32)  # a training feature's "target" without a teacher (mse-distill's only)
DATA_NAMES = {"rows": "rows of an anchor and its positive", "scored": "scored pairs", "texts": "plain texts"}


def _json(path: Path) -> Any:
    try:
        return parse_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataFormatError(path, f"unreadable ({e})", hint="a sentence-transformers directory needs valid JSON here") from None


SPLADE_MODULES = ("SpladePooling", "MLMTransformer")  # a sentence-transformers SparseEncoder: the sparse-embedding task's


def is_splade_directory(d: Path) -> bool:
    """A sentence-transformers SparseEncoder directory (its modules.json names SPLADE's modules)."""
    try:
        modules = parse_json((d / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules if isinstance(m, dict)] if isinstance(modules, list) else []
    return any(k in SPLADE_MODULES for k in kinds)


def _sentence_transformers(d: Path) -> dict[str, Any]:
    """The pooling, normalisation and max length a sentence-transformers directory declares."""
    modules = _json(d / "modules.json")
    if not isinstance(modules, list):
        raise DataFormatError(d / "modules.json", "expected a list of modules")
    kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules if isinstance(m, dict)}
    options: dict[str, Any] = {"normalize": "Normalize" in kinds}
    if "Pooling" in kinds:
        cfg = _json(d / str(kinds["Pooling"].get("path", "1_Pooling")) / "config.json")
        modes = [name for key, name in ST_POOLING.items() if cfg.get(key)]
        other = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v and k not in ST_POOLING]
        if isinstance(cfg.get("pooling_mode"), str):  # sentence-transformers 6 names the mode itself
            mode = cfg["pooling_mode"]
            modes, other = ([mode], []) if mode in ST_POOLING.values() else ([], [mode])
        if other or len(modes) != 1:
            raise DataFormatError(d / "1_Pooling" / "config.json", f"pooling {', '.join(other + modes) or 'none'} is not "
                                  "one of mean, cls and max", hint="export with --task embedding --option pooling=...")
        options["pooling"] = modes[0]
    if (d / "config_sentence_transformers.json").is_file():
        prompts = _json(d / "config_sentence_transformers.json").get("prompts") or {}
        for option, names in ST_PROMPTS.items():
            found = [prompts[n] for n in names if isinstance(prompts.get(n), str) and prompts[n]]
            if found:
                options[option] = found[0]
    info: dict[str, Any] = {"options": options}
    if (d / "sentence_bert_config.json").is_file():
        max_len = _json(d / "sentence_bert_config.json").get("max_seq_length")
        if isinstance(max_len, int) and max_len > 0:
            info["max_length"] = max_len
    return info


def _dims(value: Any, hidden: int | None = None) -> list[int]:
    """``matryoshka_dims`` ("384,256,128,64") as whole numbers from 1 to the hidden size."""
    if value in ("", None):
        return []
    try:
        dims = [int(x) for x in str(value).split(",") if x.strip()]
    except ValueError:
        raise TaskError(f"matryoshka_dims must be whole numbers separated by commas, not {value!r}",
                        "e.g. --option matryoshka_dims=384,256,128,64") from None
    if any(d < 1 or (hidden is not None and d > hidden) for d in dims) or len(set(dims)) != len(dims):
        raise TaskError(f"matryoshka_dims {value!r}: each must be from 1 to the hidden size{f' ({hidden})' if hidden else ''}, once",
                        "e.g. --option matryoshka_dims=384,256,128,64")
    return dims


def _weights(value: Any, n: int) -> list[float]:
    if value in ("", None):
        return [1.0] * n
    try:
        w = [float(x) for x in str(value).split(",") if x.strip()]
    except ValueError:
        w = []
    if len(w) != n or not all(math.isfinite(x) and x >= 0 for x in w):
        raise TaskError(f"matryoshka_weights {value!r}: give one non-negative number per dimension of matryoshka_dims",
                        "e.g. --option matryoshka_weights=1,1,1,1")
    return w


def _text_id(ids: list[int]) -> int:
    """The same int64 for the same token ids: which texts of a batch are equal (never each other's negatives)."""
    return int.from_bytes(hashlib.blake2b(np.asarray(ids, dtype=np.int64).tobytes(), digest_size=8).digest(), "little",
                          signed=True)


def _negative_columns(fields: Mapping[str, Any], prefix: str) -> list[str]:
    """``negative``, then ``negative_1``, ``negative_2`` ... (by number) among a record's fields."""
    return ([prefix] if prefix in fields else []) + numbered(fields, prefix)


def _as_retrieval(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Training-style rows as a retrieval evaluation: each anchor a query, searching the distinct texts
    of every positive and negative of the file, its own positive the one relevant document."""
    doc_ids: dict[str, str] = {}
    for r in rows:
        for text in (r["positive"], *r["negatives"]):
            doc_ids.setdefault(text, f"d{len(doc_ids)}")
    queries = [{"kind": "query", "id": f"q{i}", "text": r["anchor"], "judged": {doc_ids[r["positive"]]: 1}}
               for i, r in enumerate(rows)]
    return queries + [{"kind": "doc", "id": did, "text": text} for text, did in doc_ids.items()]


class EmbeddingTask:
    name = "embedding"
    description = ("Sentence embeddings: mean / cls / max pooling (+ L2 normalisation) in the graph; fine-tuned with "
                   "mnrl, cached-mnrl (GradCache) or cosent; retrieval (nDCG@10) or STS evaluation.")
    formats: tuple[str, ...] = ("csv", "tsv", "jsonl", "parquet", "beir")
    metrics: tuple[str, ...] = (*RETRIEVAL_METRICS, "spearman", "pearson")
    outputs = {"embedding": (BATCH, "hidden")}
    options: tuple[TaskOption, ...] = (
        TaskOption("pooling", "mean", "How token vectors become one: mean, cls or max (over real tokens).", choices=POOLINGS,
                   fixed=True, flags=("--pooling",)),
        TaskOption("normalize", False, "L2-normalise the embeddings (cosine similarity becomes a dot product).", fixed=True, flags=("--normalize/--no-normalize",)),
        TaskOption("query_prompt", "", "Text put before every query (anchor) in training, evaluation and --as query "
                   "(e5: 'query: ').", fixed=True),
        TaskOption("document_prompt", "", "Text put before every document (positive, negative, corpus text) in "
                   "training, evaluation and --as document (e5: 'passage: ').", fixed=True),
        TaskOption("input_type", "none", "What the inputs are, for the prompt put before them: query, document or "
                   "none (`mlmkit embed --as query`).", choices=INPUT_TYPES, saved=False, flags=("--input-type", "--as")),
        TaskOption("index", "exact", "Retrieval evaluation: exact search, or a faiss HNSW index (approximate) for "
                   "corpora too large for it.", choices=INDEXES, saved=False, flags=("--index",), evaluation=True),
        TaskOption("save_run", "", "Retrieval evaluation: write the ranking (top 100 per query) to this file in TREC "
                   "run format.", saved=False, flags=("--save-run",), evaluation=True),
        TaskOption("loss", "auto", "Fine-tuning loss: mnrl or cached-mnrl on (anchor, positive, negatives) rows or a "
                   "BEIR directory, margin-mse on rows with teacher scores, cosent on scored pairs, mse-distill "
                   "toward a teacher; auto: mse-distill with a teacher, else mnrl or cosent by the data.",
                   choices=("auto", *losses("embedding"))),
        TaskOption("scale", 20.0, "Fine-tuning: the cosine's scale in the losses (20: temperature 0.05).", minimum=0.0),
        TaskOption("symmetric", False, "Fine-tuning (mnrl): add the positive -> anchor direction."),
        TaskOption("mini_batch_size", 32, "Fine-tuning (cached-mnrl): texts embedded at once; the batch is --batch-size.",
                   minimum=1),
        TaskOption("matryoshka_dims", "", "Fine-tuning: also train the first d dimensions for each d listed "
                   "(e.g. 384,256,128,64); evaluation reports each."),
        TaskOption("matryoshka_weights", "", "Fine-tuning: the weight of each matryoshka dimension (default 1 each)."),
        TaskOption("teacher", "", "Fine-tuning (mse-distill): an embedding bundle or run whose embeddings the model "
                   "learns (a learned projection where the sizes differ)."),
        TaskOption("scores_column", "scores", "Training rows (margin-mse): the teacher's scores, the positive's then "
                   "each negative's (mlmkit mine --with-scores)."),
        TaskOption("anchor_column", "anchor", "Training rows: the anchor (query) field."),
        TaskOption("positive_column", "positive", "Training rows: the positive field; hard negatives are negative, "
                   "negative_1, negative_2 ..."),
        TaskOption("text_column", "text", "Scored pairs: the first text of a pair.", flags=("--text-column",)),
        TaskOption("pair_column", "text_pair", "Scored pairs: the second text of a pair.", flags=("--pair-column",)),
        TaskOption("score_column", "score", "Scored pairs: the pair's gold similarity."),
    )
    label_names: tuple[str, ...] = ("part", "text_id", "score", "target")
    group_features = True
    default_max_length = 128
    command = "embed"
    pipeline_tag = "sentence-similarity"

    def main_metric(self, ctx: TaskContext) -> str:
        return "spearman" if _loss(ctx) == "cosent" or ctx.state.get("data") == "scored" else "ndcg@10"

    def fit_state(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        """The kind of training data ("rows", "scored" or "texts"), which ``loss=auto`` trains by, and
        the size of the teacher's embeddings (mse-distill)."""
        state: dict[str, Any] = {"data": _kind(examples)}
        if examples and "targets" in examples[0]:
            state["teacher_dim"] = int(len(examples[0]["targets"][0]))
        return state

    def from_hf(self, config: ModelConfig, directory: Path) -> dict[str, Any] | None:
        """A sentence-transformers directory (modules.json), or a bare encoder (architectures BertModel)."""
        if (directory / "modules.json").is_file():
            return None if is_splade_directory(directory) else _sentence_transformers(directory)
        return {} if "BertModel" in (config.architectures or []) else None

    def read(self, path: Path, options: Mapping[str, Any], *, training: bool = False,
             max_bytes: int | None = MAX_RECORD_BYTES) -> list[dict[str, Any]]:
        """Examples of a data file or a BEIR directory (``DIR:SPLIT``): for training, rows {"anchor",
        "positive", "negatives"} or scored pairs {"text", "text_pair", "score"}; for evaluation, scored
        pairs or a retrieval set ({"kind": "query", "id", "text", "judged"} then {"kind": "doc", "id", "text"})."""
        if is_beir(path):
            split = read_split(path, training=training, max_bytes=max_bytes)
            for why, n in split.skipped.items():
                log.warning("%s: %d queries of the %s split left out: %s", split.directory, n, split.split, why)
            if training:
                rows = [{"anchor": split.queries[q], "positive": split.corpus[d], "negatives": []}
                        for q in split.qrels for d in split.positives(q)]
                if _loss_option(options) == "margin-mse":
                    raise TaskError("margin-mse trains on rows with the teacher's scores; a BEIR split has none",
                                    f"mine them: mlmkit mine {path} --out rows.jsonl --with-scores")
                if _loss_option(options) == "mse-distill":
                    _with_teacher(rows, options)
                return rows
            return ([{"kind": "query", "id": q, "text": text, "judged": split.qrels[q]} for q, text in split.queries.items()]
                    + [{"kind": "doc", "id": d, "text": text} for d, text in split.corpus.items()])
        fmt = data_format(path, FORMATS)
        loss = _loss_option(options)
        texts_ok = training and loss == "mse-distill"  # plain texts: only a teacher's embeddings to learn
        examples: list[dict[str, Any]] = []
        records = iter_jsonl(path, max_bytes=max_bytes) if fmt == "jsonl" else iter_records(path, fmt, max_bytes=max_bytes)
        for rec in records:
            fields = rec.fields()
            if options["anchor_column"] in fields:
                ex = _row(rec, options, scores=loss == "margin-mse")
            elif texts_ok and options["score_column"] not in fields:
                ex = {"text": rec.text(options["text_column"]), "text_pair": rec.text(options["pair_column"], required=False)}
            else:
                ex = _scored_pair(rec, options, hint=f"scored pairs need {options['score_column']}; rows need "
                                                     f"{options['anchor_column']} and {options['positive_column']}")
            if examples and _kind([ex]) != _kind(examples[:1]):
                raise rec.error(f"{DATA_NAMES[_kind([ex])]} and {DATA_NAMES[_kind(examples[:1])]} mixed in one file",
                                hint="one kind of data per file")
            examples.append(ex)
        if not examples:
            raise DataFormatError(path, "no examples", hint="anchor and positive (and negatives) per record, or text, "
                                                            "text_pair and score")
        if not training:
            return _as_retrieval(examples) if "anchor" in examples[0] else examples
        if loss == "mse-distill":
            _with_teacher(examples, options)
        return examples

    def from_input(self, item: str | dict[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
        """A text, or a record with a text field (its text_column)."""
        if isinstance(item, str):
            return {"text": item}
        return {"text": Record("<input>", None, item).text(options["text_column"])}

    def featurize(self, examples: list[dict[str, Any]], tokenizer: Any, ctx: TaskContext, *, training: bool) -> list[dict[str, Any]]:
        """A feature per text: ``part`` 0 the anchor (a pair's first text, a query, a document, an
        input), 1 the positive (the second), 2.. the hard negatives; for training also ``text_id``
        (equal texts, equal ids) and the pair's ``score`` (0 for rows)."""
        if training:
            kind, want = _kind(examples), get_loss("embedding", _loss(ctx)).data
            if kind not in want:
                raise TaskError(f"the {_loss(ctx)} loss trains on {' or '.join(DATA_NAMES[w] for w in want)}, "
                                f"and the data are {DATA_NAMES[kind]}",
                                "use --option loss=cosent for scored pairs, loss=mnrl (or cached-mnrl) for rows, "
                                "loss=mse-distill with --option teacher=BUNDLE for any")
        texts = [(i, part, clip_text(_prompt(ex, part, ctx.options) + t, tokenizer, ctx.max_length))
                 for i, ex in enumerate(examples) for part, t in enumerate(_texts(ex)) if t is not None]
        distill = training and _loss(ctx) == "mse-distill"
        in_batch = training and get_loss("embedding", _loss(ctx)).in_batch
        with tokenizer_settings(tokenizer, max_length=ctx.max_length) as tok:
            encodings = tok.encode_batch([t for _, _, t in texts]) if texts else []
        feats = []
        for (i, part, _), enc in zip(texts, encodings):
            f = {"input_ids": enc.ids, "token_type_ids": enc.type_ids, EXAMPLE: i, "part": part,
                 **({TRUNCATED: True} if enc.overflowing else {})}
            if training:
                ex = examples[i]
                f["text_id"] = _text_id(enc.ids)
                if in_batch:  # no text twice in a batch: it would be its own false negative
                    f[DISTINCT] = f["text_id"]
                f["score"] = float(ex["scores"][part - 1] if part and "scores" in ex else ex.get("score", 0.0))
                f["target"] = ex["targets"][part] if distill else NO_TARGET
            feats.append(f)
        return feats

    def build_model(self, config: ModelConfig, ctx: TaskContext) -> Any:
        _dims(ctx.options["matryoshka_dims"], config.hidden_size)  # a bad list is an error before training
        _weights(ctx.options["matryoshka_weights"], len(_dims(ctx.options["matryoshka_dims"])))
        teacher_dim = ctx.state.get("teacher_dim") if _loss(ctx) == "mse-distill" else None
        if teacher_dim and teacher_dim != config.hidden_size and ctx.options["matryoshka_dims"]:
            raise TaskError(f"matryoshka_dims with a teacher of another size ({teacher_dim}, the model {config.hidden_size})",
                            "distil from a teacher of the model's size, or leave matryoshka_dims out")
        from mlmkit_tasks.heads.embedding import BertForEmbedding

        o, loss = ctx.options, get_loss("embedding", _loss(ctx))
        return BertForEmbedding(config, o["pooling"], bool(o["normalize"]), loss=loss, cached=loss.cached,
                                scale=float(o["scale"]), symmetric=bool(o["symmetric"]), mini_batch_size=int(o["mini_batch_size"]),
                                matryoshka=_dims(o["matryoshka_dims"], config.hidden_size),
                                matryoshka_weights=_weights(o["matryoshka_weights"], len(_dims(o["matryoshka_dims"]))),
                                teacher_dim=teacher_dim)

    def run_files(self, config: ModelConfig, ctx: TaskContext) -> dict[str, str]:
        """The run is also a sentence-transformers directory: its modules (the encoder at the root, the
        pooling, the normalisation) and its max length."""
        import json

        pooling = ctx.options["pooling"]
        prompts = {names[0]: ctx.options[option] for option, names in ST_PROMPTS.items() if ctx.options[option]}
        modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        files = {"1_Pooling/config.json": json.dumps({
            "word_embedding_dimension": config.hidden_size, "pooling_mode_cls_token": pooling == "cls",
            "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": pooling == "max",
            "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
            "pooling_mode_lasttoken": False, "include_prompt": True}, indent=2) + "\n",
            "sentence_bert_config.json": json.dumps({"max_seq_length": ctx.max_length, "do_lower_case": False}, indent=2) + "\n",
            "config_sentence_transformers.json": json.dumps({"prompts": prompts, "default_prompt_name": None,
                                                             "similarity_fn_name": "cosine"}, indent=2) + "\n"}
        if ctx.options["normalize"]:
            modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
            files["2_Normalize/config.json"] = "{}\n"
        files["modules.json"] = json.dumps(modules, indent=2) + "\n"
        return files

    def postprocess(
        self, outputs: dict[str, Any], features: list[dict[str, Any]], examples: list[dict[str, Any]], ctx: TaskContext
    ) -> list[dict[str, Any]]:
        """{"embedding": [...]} per text; a pair adds "embedding_pair" and their "cosine"."""
        preds: list[dict[str, Any]] = [{} for _ in examples]
        for f, v in zip(features, outputs["embedding"]):
            preds[f[EXAMPLE]]["embedding_pair" if f["part"] else "embedding"] = [float(x) for x in v]
        for p in preds:
            if "embedding_pair" in p:
                a, b = np.asarray(p["embedding"]), np.asarray(p["embedding_pair"])
                den = float(np.linalg.norm(a) * np.linalg.norm(b))
                p["cosine"] = float(a @ b) / den if den > 0 else 0.0
        return preds

    def compute_metrics(self, predictions: list[dict[str, Any]], examples: list[dict[str, Any]], ctx: TaskContext) -> dict[str, Any]:
        """Retrieval metrics (a retrieval set) or the pairs' Spearman and Pearson correlation (scored pairs)."""
        if examples and examples[0].get("kind") == "query":
            return _retrieval_metrics(predictions, examples, _dims(ctx.options["matryoshka_dims"]), ctx.options)
        from scipy.stats import pearsonr, spearmanr

        if any("cosine" not in p or "score" not in ex for p, ex in zip(predictions, examples)):
            raise TaskError("embedding evaluation needs pairs with a score, rows, or a BEIR directory",
                            "give text, text_pair and score per record, anchor and positive, or a BEIR directory")
        cos, gold = [p["cosine"] for p in predictions], [ex["score"] for ex in examples]
        if len(gold) < 2:
            raise TaskError("embedding evaluation needs at least two pairs")
        r, rho = float(pearsonr(cos, gold)[0]), float(spearmanr(cos, gold)[0])
        return {"spearman": 0.0 if rho != rho else rho, "pearson": 0.0 if r != r else r}

    def summary(self, prediction: dict[str, Any]) -> dict[str, str]:
        v = np.asarray(prediction["embedding"])
        return {"dims": str(v.size), "norm": f"{np.linalg.norm(v):.3f}", "start": ", ".join(f"{x:.3f}" for x in v[:4]) + " ..."}


def _scored_pair(rec: Record, options: Mapping[str, Any], hint: str | None = None) -> dict[str, Any]:
    """{"text", "text_pair", "score", "line", "source"} of one record (the STS layout)."""
    value = rec.fields().get(options["score_column"])
    try:
        score = float(value) if value is not None and not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        score = math.nan
    if not math.isfinite(score):
        raise rec.error(f"the score must be a finite number, not {value!r}", options["score_column"], hint=hint)
    return {"text": rec.text(options["text_column"]), "text_pair": rec.text(options["pair_column"]),
            "score": score, "line": rec.line, "source": rec.source}


def _loss_option(options: Mapping[str, Any]) -> str:
    """The loss as far as the options say: ``auto`` with a teacher is mse-distill (else still auto)."""
    loss = options.get("loss", "auto")
    return "mse-distill" if loss == "auto" and options.get("teacher") else loss


def _loss(ctx: TaskContext) -> str:
    """The loss option, ``auto`` resolved: mse-distill with a teacher, else by the kind of training data
    (fit_state): cosent for scored pairs, mnrl for rows."""
    loss = _loss_option(ctx.options)
    if loss == "auto":
        return "cosent" if ctx.state.get("data") == "scored" else "mnrl"
    return loss


def _kind(examples: list[dict[str, Any]]) -> str:
    """What the examples are: "rows" (anchor, positive ...), "scored" pairs or plain "texts"."""
    if not examples or "anchor" in examples[0]:
        return "rows"
    return "scored" if "score" in examples[0] else "texts"


def _row(rec: Record, options: Mapping[str, Any], *, scores: bool) -> dict[str, Any]:
    """{"anchor", "positive", "negatives"} of a record, with the teacher's "scores" (the positive's,
    then each negative's) when it has them; ``scores``: they are required (margin-mse)."""
    negs = _negative_columns(rec.fields(), "negative")
    texts = [(k, rec.text(k, required=False)) for k in negs]
    row: dict[str, Any] = {"anchor": rec.text(options["anchor_column"]), "positive": rec.text(options["positive_column"])}
    col = options["scores_column"]
    value = rec.fields().get(col)
    if value is None:
        if scores:
            raise rec.error("margin-mse needs the teacher's scores", col, hint="mlmkit mine --with-scores writes them "
                            "(the positive's, then each negative's)")
        row["negatives"] = [t for _, t in texts if t]
        return row
    ok = isinstance(value, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                                         for x in value)
    if not ok or len(value) != 1 + len(texts):
        raise rec.error(f"expected {1 + len(texts)} finite numbers (the positive's score, then one per negative), "
                        f"got {value!r}"[:300], col, hint="the list mlmkit mine --with-scores writes")
    kept = [(t, float(x)) for (_, t), x in zip(texts, value[1:]) if t]
    row["negatives"] = [t for t, _ in kept]
    row["scores"] = [float(value[0]), *(x for _, x in kept)]
    return row


def _with_teacher(examples: list[dict[str, Any]], options: Mapping[str, Any]) -> None:
    """Each example's "targets": the teacher's embedding of each of its texts (queries as queries,
    documents as documents, with the teacher's own prompts)."""
    if not options.get("teacher"):
        raise TaskError("mse-distill needs a teacher", "--option teacher=BUNDLE_OR_RUN (an embedding bundle or run)")
    embed = _teacher(Path(options["teacher"]))
    by_kind: dict[str, list[tuple[int, int, str]]] = {}
    for i, ex in enumerate(examples):
        for part, t in enumerate(_texts(ex)):
            if t is not None:
                kind = ("query" if part == 0 else "document") if "anchor" in ex else "none"
                by_kind.setdefault(kind, []).append((i, part, t))
    for ex in examples:
        ex["targets"] = {}
    log.info("embedding the %d training texts with the teacher %s", sum(map(len, by_kind.values())), options["teacher"])
    for kind, items in by_kind.items():
        vectors = embed([t for _, _, t in items], kind)
        for (i, part, _), v in zip(items, vectors):
            examples[i]["targets"][part] = v
    for ex in examples:
        ex["targets"] = [ex["targets"][p] for p in sorted(ex["targets"])]


def _teacher(path: Path) -> Any:
    """(texts, input type) -> float32 (n, D): an embedding bundle (onnxruntime) or run (PyTorch)."""
    if not path.exists():
        raise TaskError(f"teacher not found: {path}", "give an embedding bundle (mlmkit export) or a fine-tuned embedding run")
    if (path / "model.onnx").is_file():
        pipe = load_pipeline(path, command="embed")
        return lambda texts, kind: np.asarray([r["embedding"] for r in pipe(texts, input_type=kind)], dtype=np.float32)
    from mlmkit.model import load_finetuned, predict, torch_forward

    task, net, tok, meta = load_finetuned(path)
    if task.name != "embedding":
        raise TaskError(f"the teacher {path} is a {task.name} run", "give an embedding bundle or run")

    def embed(texts: list[str], kind: str) -> np.ndarray:
        ctx = meta.context(task.resolve_options({"input_type": kind}, saved=meta.options))
        got = predict(task, [{"text": t} for t in texts], tok, ctx, torch_forward(net, task.outputs))
        return np.asarray([p["embedding"] for p in got.predictions], dtype=np.float32)

    return embed


def _prompt(ex: dict[str, Any], part: int, options: Mapping[str, Any]) -> str:
    """The prompt before text ``part`` of ``ex``: a query's (an anchor, a retrieval query, an input
    declared a query) or a document's (a positive or negative, a corpus text, an input declared one);
    none for scored pairs and undeclared inputs."""
    if "anchor" in ex:
        kind = "query" if part == 0 else "document"
    elif "kind" in ex:
        kind = "query" if ex["kind"] == "query" else "document"
    else:
        kind = options.get("input_type", "none")
    return str(options.get(f"{kind}_prompt", "")) if kind != "none" else ""


def _texts(ex: dict[str, Any]) -> list[str | None]:
    if "anchor" in ex:
        return [ex["anchor"], ex["positive"], *ex["negatives"]]
    return [ex["text"], ex.get("text_pair")]


def _retrieval_metrics(predictions: list[dict[str, Any]], examples: list[dict[str, Any]], dims: list[int],
                       options: Mapping[str, Any]) -> dict[str, float]:
    """Every query searches the whole corpus (cosine, exact or through ``index``, infer/retrieval.py);
    the metrics at the full dimension, and with matryoshka dimensions the same at each as
    METRIC@dimD. ``save_run``: the full dimension's ranking goes to that file (TREC run format)."""
    queries = [(ex, p) for ex, p in zip(examples, predictions) if ex["kind"] == "query"]
    docs = [(ex, p) for ex, p in zip(examples, predictions) if ex["kind"] == "doc"]
    if not queries or not docs:
        raise TaskError("retrieval evaluation needs queries and documents")
    q = np.asarray([p["embedding"] for _, p in queries], dtype=np.float32)
    d = np.asarray([p["embedding"] for _, p in docs], dtype=np.float32)
    qids, dids = [ex["id"] for ex, _ in queries], [ex["id"] for ex, _ in docs]
    qrels = {ex["id"]: ex["judged"] for ex, _ in queries}
    out: dict[str, float] = {}
    for dim in [None, *[x for x in dims if x < q.shape[1]]]:
        ranked = retrieve(qids, q[:, :dim], dids, d[:, :dim], k=100, index=options.get("index", "exact"))
        if dim is None and options.get("save_run"):
            write_trec(options["save_run"], ranked)
        got = mean_metrics({k: [did for did, _ in v] for k, v in ranked.items()}, qrels)
        out.update(got if dim is None else {f"{m}@dim{dim}": v for m, v in got.items()})
    return out


task = EmbeddingTask()
