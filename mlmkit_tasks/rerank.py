"""Reranking: a cross-encoder scoring (query, document) pairs, fine-tuned pointwise or listwise.

The model is a one-label sequence classifier (transformers' BertForSequenceClassification of the
family, num_labels 1: the logit is the relevance), so the run loads in sentence-transformers'
CrossEncoder with the same scores, and its bundle is what `mlmkit rerank`, `/v1/rerank` and TEI's
`/rerank` serve. The activation applied to the logit (``activation``: sigmoid, as CrossEncoder's
default for one label, or identity) is built into the model: config.json records it for
CrossEncoder, and evaluation, `mlmkit classify` and the routes apply it, so no two of them disagree.

Data, one example per query (its candidates stay in one batch, ``group_features``; in training with the
pointwise ``bce``, one per pair, batched by length):

- rows of a query, a document and a label (``query``, ``document``, ``label``: 0/1 or graded up to
  ``max_label``), the rows of one query gathered;
- rows of an anchor (or query), its positive and negatives (what `mlmkit mine` writes): the
  positive labelled 1, the negatives 0;
- for evaluation, a BEIR directory (``DIR[:SPLIT]``): each query's top ``rerank_top`` documents of a
  first stage (``first_stage``: BM25, or an embedding bundle) are reranked, and the retrieval metrics
  of both are reported (the first stage's under "first_stage").

Losses (the registry's rank losses, mlmkit.taskkit.losses): ``bce`` (pointwise), ``mnrl`` (a relevant
candidate's softmax against the query's irrelevant ones), ``listnet``, ``lambda`` (NDCG-weighted pairs). For
the three listwise losses a query whose candidates are all relevant or all irrelevant teaches nothing:
it is left out of training and counted in the log.

A causal LM that judges a pair by answering yes or no (a chat model trained as a reranker:
Qwen3-Reranker) is this same one-label classifier, not a second kind of scorer: its score, P(yes) =
the softmax of the logits of "yes" and "no" at the last position, is sigmoid(logit_yes - logit_no), and
logit_yes - logit_no = h_last . (W[yes] - W[no]) (+ the bias difference). So the head is the family's
last-token sequence head (a decoder's ``score`` layer, transformers' *ForSequenceClassification) whose
one row is the LM head's TRUE row less its FALSE row, under the sigmoid this task applies anyway; the
graph, the runtime, the routes and fine-tuning are the cross-encoder's. Two options say so, both built
into the model:

- ``answer_tokens`` (TRUE,FALSE, e.g. ``yes,no``): where a checkpoint has no classifier, the model derives
  it from the LM head (``lm_head``, or the token embeddings it is tied to) when its weights are loaded
  (heads/rerank.py's ``derived_weights``, which every load goes through): export, evaluation and
  fine-tuning all start from it, and a fine-tuned run is the family's *ForSequenceClassification, which
  transformers loads as it is;
- ``template`` (with {query}, {document} and {instruction}, the ``instruction`` option's text, which a
  call may change): each pair is written as one text in it and tokenized with the tokenizer's own
  special tokens, as the embedding task's prompts are; too long, the document's end is what is cut, and
  the template's fixed prefix and suffix are kept whole (rerank_template.py). Without a template, a
  pair is the tokenizer's ([CLS] query [SEP] document [SEP]).

``from_hf`` reads both off a causal-LM checkpoint (architectures *ForCausalLM) of a family whose
sequence head reads the last token, whose tokenizer has the single tokens "yes" and "no": answer_tokens
yes,no, and where the tokenizer has the chat tokens <|im_start|> and <|im_end|>, the chat-format judge
template Qwen3-Reranker was trained on (rerank_template.JUDGE_TEMPLATE; ``instruction``'s default is its
default instruction). A sentence-transformers directory (modules.json) is not read so: it is the
embedding task's. Fine-tuning any other causal LM takes both by hand (--option answer_tokens=... etc.).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mlmkit.taskkit import (
    BATCH,
    BM25,
    EXAMPLE,
    LABEL,
    MAX_RECORD_BYTES,
    RETRIEVAL_METRICS,
    TRUNCATED,
    CheckpointInfo,
    ConfigError,
    DataFormatError,
    Dense,
    Example,
    Feature,
    HFConfig,
    Input,
    Metrics,
    Prediction,
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
    losses,
    mean_metrics,
    numbered,
    read_split,
    tokenizer_settings,
)
from mlmkit_tasks.classification import HF_ARCHITECTURE, REGRESSION
from mlmkit_tasks.rerank_template import (
    DEFAULT_INSTRUCTION,
    Encoded,
    answer_ids,
    answer_tokens,
    judge_reading,
    parse_template,
    write_pairs,
)

if TYPE_CHECKING:  # the config type is torch's side (models/); a task imports torch in build_model only
    from mlmkit.model import ModelConfig

log = logging.getLogger("mlmkit")

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl"}
ACTIVATIONS = {"sigmoid": "torch.nn.modules.activation.Sigmoid",
               "identity": "torch.nn.modules.linear.Identity"}
"""The activation option and the class sentence-transformers' CrossEncoder reads from config.json."""
SKIPPED = "all of its candidates have one label (a listwise loss learns nothing from it)"


def activate(logit: float, activation: str) -> float:
    """The relevance score of a logit under the model's activation."""
    return float(1.0 / (1.0 + np.exp(-logit))) if activation == "sigmoid" else float(logit)


class RerankTask:
    name = "rerank"
    description = ("Cross-encoder reranking of (query, document) pairs: bce, mnrl, listnet or lambda over a "
                   "query's "
                   "candidates; evaluated by reranking a first stage (BM25 or a bundle) on BEIR data.")
    formats = ("csv", "tsv", "jsonl", "parquet", "beir")
    metrics = RETRIEVAL_METRICS
    outputs = {"logits": (BATCH, LABEL)}
    options = (
        TaskOption("loss", "bce",
                   "Fine-tuning loss: bce (pointwise), mnrl, listnet or lambda (over a query's candidates).",
                   choices=tuple(losses("rank"))),
        TaskOption("activation", "sigmoid",
                   "The score of a logit, at evaluation and serving: sigmoid or identity (raw).",
                   choices=tuple(ACTIVATIONS), fixed=True),
        TaskOption("max_label", 1.0,
                   "The largest graded label (labels run from 0 to it; bce's target is label / max_label).",
                   minimum=1e-9),
        TaskOption("query_column", "query",
                   "The query field (rows from mlmkit mine: their anchor is the query)."),
        TaskOption("document_column", "document", "The document field of (query, document, label) rows."),
        TaskOption("label_column", "label", "The label field of (query, document, label) rows.",
                   flags=("--label-column",)),
        TaskOption("first_stage", "bm25",
                   "BEIR evaluation: the first stage whose top documents are reranked: bm25, "
                   "or an embedding bundle.", saved=False, flags=("--first-stage",), evaluation=True),
        TaskOption("rerank_top", 100, "BEIR evaluation: the first stage's documents reranked per query.",
                   minimum=1,
                   saved=False, flags=("--rerank-top",), evaluation=True),
        TaskOption("answer_tokens", "",
                   "A causal LM that answers yes or no: its two answer tokens TRUE,FALSE as its vocabulary "
                   "spells them (yes,no); the head is the LM head's TRUE row less its FALSE row at the last "
                   "token, so the score "
                   "is P(TRUE) of the two. Read off such a checkpoint; empty: the head is the checkpoint's "
                   "(or fresh).", fixed=True),
        TaskOption("template", "",
                   "The text a pair is written as, with {query}, {document} and {instruction} ({{ and }} for "
                   "braces); too long, the document is cut. Empty: the tokenizer's pair. A yes/no judge's is "
                   "read off its "
                   "checkpoint.", fixed=True),
        TaskOption("instruction", DEFAULT_INSTRUCTION,
                   "The template's {instruction}: what the judge is asked to judge."),
    )
    label_names = ("labels",)
    kept_heads = ("lm_head.",)  # a causal LM's head, which answer_tokens derive the classifier from
    group_features = True
    hf_architecture = HF_ARCHITECTURE
    pipeline_tag = "text-ranking"
    command = "classify"  # a one-label classifier of pairs: `mlmkit rerank` and the rerank routes serve it
    partial_layers = 1
    default_max_length = 256

    def label_list(self, examples: list[Example]) -> list[str]:
        return ["score"]

    def hf_config(self, ctx: TaskContext) -> HFConfig:
        return {"problem_type": REGRESSION,
                "sentence_transformers": {"activation_fn": ACTIVATIONS[ctx.options["activation"]]}}

    def main_metric(self, ctx: TaskContext) -> str:
        return "ndcg@10"

    def read(self, path: Path, options: Mapping[str, Any], *, training: bool = False,
             max_bytes: int | None = MAX_RECORD_BYTES) -> list[Example]:
        """One example per query: {"query", "docs", "labels", "source", "line"} (training and rows),
        and for evaluation its "judged" documents ({doc id: grade}) and the first stage's ranking
        ("first", doc ids best first); doc ids are "d0", "d1" ... within a query, or the corpus's."""
        check_options(options)  # before any data is read
        if is_beir(path):
            if training:
                raise TaskError("a BEIR split has positives only; a reranker trains on rows with negatives",
                                f"mine them: mlmkit mine {path} --out rows.jsonl, then --train rows.jsonl")
            return first_stage(path, options, max_bytes)
        fmt = data_format(path, FORMATS)
        by_query: dict[str, Example] = {}
        top = float(options["max_label"])
        records = (iter_jsonl(path, max_bytes=max_bytes) if fmt == "jsonl"
                   else iter_records(path, fmt, max_bytes=max_bytes))
        for rec in records:
            fields = rec.fields()
            qcol = (options["query_column"] if options["query_column"] in fields or "anchor" not in fields
                    else "anchor")
            query = rec.text(qcol)
            ex = by_query.setdefault(query, {"query": query, "docs": [], "labels": [], "source": rec.source,
                                             "line": rec.line})
            if "positive" in fields:
                negs = numbered(fields, "negative")
                texts = [rec.text("positive")] + [t for t in (rec.text(k, required=False) for k in negs) if t]
                ex["docs"] += texts
                ex["labels"] += [top] + [0.0] * (len(texts) - 1)
            else:
                ex["docs"].append(rec.text(options["document_column"]))
                ex["labels"].append(_grade(rec, options["label_column"], top))
        if not by_query:
            raise DataFormatError(path, "no examples",
                                  hint="query, document and label per record, or anchor, positive "
                                       "and negatives (mlmkit mine)")
        examples = list(by_query.values())
        if training and get_loss("rank", options["loss"]).listwise:
            kept = [ex for ex in examples if 0 < sum(y > 0 for y in ex["labels"]) < len(ex["labels"])]
            if len(kept) < len(examples):
                log.warning("%s: %d of %d queries left out of training: %s", path, len(examples) - len(kept),
                            len(examples), SKIPPED)
            if not kept:
                raise TaskError(f"{path}: no query has both relevant and irrelevant candidates",
                                f"the {options['loss']} loss ranks a query's candidates against each other; "
                                "use loss=bce")
            examples = kept
        elif training:
            # a pointwise loss needs no query's candidates together: each pair is an example of its own,
            # so the batches are cut by length alone (less padding than whole queries)
            examples = [{**ex, "docs": [doc], "labels": [y]} for ex in examples
                        for doc, y in zip(ex["docs"], ex["labels"])]
        if not training:
            for ex in examples:
                ex["judged"] = {f"d{i}": y for i, y in enumerate(ex["labels"]) if y > 0}
                ex["first"] = [f"d{i}" for i in range(len(ex["docs"]))]
        return examples

    def from_input(self, item: Input, options: Mapping[str, Any]) -> Example:
        """A (query, document) pair: {"text", "text_pair"} (what `mlmkit rerank` and the routes send) or
        the option's query and document fields."""
        if isinstance(item, str):
            raise DataFormatError("<input>", "a reranker scores pairs, not single texts",
                                  hint='give {"text": QUERY, "text_pair": DOCUMENT} records, or use mlmkit '
                                       'rerank')
        rec = Record("<input>", None, item)
        if "text" in item:
            return {"query": rec.text("text"), "docs": [rec.text("text_pair")]}
        return {"query": rec.text(options["query_column"]), "docs": [rec.text(options["document_column"])]}

    def featurize(self, examples: list[Example], tokenizer: Any, ctx: TaskContext, *,
                  training: bool) -> list[Feature]:
        """A feature per (query, candidate): [CLS] query [SEP] document [SEP] truncated to the max length,
        or the pair written into the ``template`` (rerank_template.write_pairs)."""
        L = ctx.max_length
        where = [(i, j) for i, ex in enumerate(examples) for j in range(len(ex["docs"]))]
        pairs = [(examples[i]["query"], examples[i]["docs"][j]) for i, j in where]
        if ctx.options.get("template"):
            encoded = write_pairs(pairs, tokenizer, ctx.options["template"], ctx.options["instruction"], L)
        else:
            clipped = [(clip_text(q, tokenizer, L), clip_text(d, tokenizer, L)) for q, d in pairs]
            with tokenizer_settings(tokenizer, max_length=L) as tok:
                encodings = tok.encode_batch(clipped) if clipped else []
            encoded = [Encoded(enc.ids, enc.type_ids, bool(enc.overflowing)) for enc in encodings]
        feats = []
        for (i, j), (ids, type_ids, truncated) in zip(where, encoded):
            f: Feature = {"input_ids": ids, "token_type_ids": type_ids, EXAMPLE: i, "candidate": j,
                          **({TRUNCATED: True} if truncated else {})}
            if training:
                f["labels"] = float(examples[i]["labels"][j])
            feats.append(f)
        return feats

    def from_hf(self, config: ModelConfig, directory: Path) -> CheckpointInfo | None:
        """A causal LM that judges pairs yes or no (rerank_template.judge_reading: the module docstring says
        which); a transformers cross-encoder is the classification task's (BertForSequenceClassification)."""
        return judge_reading(config, directory)

    def build_model(self, config: ModelConfig, ctx: TaskContext) -> Any:
        """The one-label classifier of the config's family; with ``answer_tokens``, one that derives its
        row from the LM head where the checkpoint it loads has none."""
        check_options(ctx.options)
        if not config.id2label:  # a bare encoder (evaluated before fine-tuning): the one relevance output
            config.id2label, config.label2id = {0: "score"}, {"score": 0}
        if config.num_labels != 1:
            raise TaskError(f"a reranker has one output (its relevance), the config has {config.num_labels}",
                            "fine-tune from an encoder or a one-label cross-encoder")
        pool = config.family.sequence_pool(config)
        if answer_tokens(ctx.options) is not None and pool != "last":
            raise ConfigError("task option answer_tokens reads the answer at the last token, and the "
                              f"{config.family.name} "
                              f"sequence head pools '{pool}'",
                              "answer tokens are for a causal LM (a decoder's last-token head)")
        answers = answer_ids(ctx.options, ctx.tokenizer)
        from mlmkit_tasks.heads.rerank import BertForRerank

        return BertForRerank(config, get_loss("rank", ctx.options["loss"]), float(ctx.options["max_label"]),
                             answers=answers)

    def export_module(self, model: Any) -> Any:
        from mlmkit_tasks.classification import cls_only

        return cls_only(model)

    def postprocess(self, outputs: dict[str, list[np.ndarray]], features: list[Feature],
                    examples: list[Example],
                    ctx: TaskContext) -> list[Prediction]:
        """{"score"} for an input pair (the activated logit, and "logit"); {"scores": [...]} for a
        query's candidates, in their order."""
        logits: list[list[float]] = [[0.0] * len(ex["docs"]) for ex in examples]
        for f, v in zip(features, outputs["logits"]):
            logits[f[EXAMPLE]][f["candidate"]] = float(np.asarray(v).reshape(-1)[0])
        act = ctx.options["activation"]
        preds = []
        for row in logits:
            scores = [activate(x, act) for x in row]
            preds.append({"score": scores[0], "logit": row[0]} if len(row) == 1
                         else {"scores": scores, "logits": row})
        return preds

    def compute_metrics(self, predictions: list[Prediction], examples: list[Example],
                        ctx: TaskContext) -> Metrics:
        """The retrieval metrics of the reranked candidates (ties in the first stage's order), and the
        first stage's own under "first_stage"."""
        if not examples or "judged" not in examples[0]:
            raise TaskError("rerank evaluation needs labelled candidates or a BEIR directory")
        reranked, first, qrels = {}, {}, {}
        for n, (ex, p) in enumerate(zip(examples, predictions)):
            scores = p["scores"] if "scores" in p else [p["score"]]
            ids = ex.get("ids") or [f"d{i}" for i in range(len(ex["docs"]))]
            order = sorted(range(len(ids)), key=lambda i: (-scores[i], i))
            key = ex.get("id", f"q{n}")
            reranked[key], first[key], qrels[key] = [ids[i] for i in order], ex["first"], ex["judged"]
        return {**mean_metrics(reranked, qrels), "first_stage": mean_metrics(first, qrels)}

    def summary(self, prediction: Prediction) -> dict[str, str]:
        return ({"score": f"{prediction['score']:.4f}"} if "score" in prediction
                else {"candidates": str(len(prediction["scores"]))})


def check_options(options: Mapping[str, Any]) -> None:
    """ConfigError for an answer_tokens or template value that is not one."""
    answer_tokens(options)
    if options.get("template"):
        parse_template(str(options["template"]))


def _grade(rec: Record, field: str, top: float) -> float:
    value = rec.fields().get(field)
    try:
        y = float("nan") if value is None else float(value) if not isinstance(value,
                                                                              bool) else float(int(value))
    except (TypeError, ValueError):
        y = float("nan")
    if not 0.0 <= y <= top:  # NaN too
        raise rec.error(f"a label must be a number from 0 to {top:g}, not {value!r}", field,
                        hint="graded labels: --option max_label=N declares the largest")
    return y


def first_stage(path: Path, options: Mapping[str, Any], max_bytes: int | None) -> list[Example]:
    """A BEIR evaluation split's queries with the first stage's top ``rerank_top`` documents as their
    candidates (BM25 over the corpus, or an embedding bundle's exact search); the colbert task's too."""
    split = read_split(path, training=False, max_bytes=max_bytes)
    for why, n in split.skipped.items():
        log.warning("%s: %d queries of the %s split left out: %s", split.directory, n, split.split, why)
    dids = list(split.corpus)
    k = int(options["rerank_top"])
    if k > len(dids):
        raise ConfigError(f"--rerank-top {k} is more than the {len(dids):,} documents the first stage can "
                          "return",
                          f"give at most {len(dids):,}")
    qids = [q for q in split.queries if q in split.qrels]
    texts = [split.corpus[d] for d in dids]
    with tempfile.TemporaryDirectory(prefix="mlmkit-rerank-") as work:
        stage = BM25(texts) if options["first_stage"] == "bm25" else Dense(options["first_stage"], texts,
                                                                           work)
        idx, _ = stage.search([split.queries[q] for q in qids], k)
    out = []
    for q, row in zip(qids, idx):
        ids = [dids[i] for i in row if i >= 0]
        out.append({"id": q, "query": split.queries[q], "docs": [split.corpus[d] for d in ids], "ids": ids,
                    "first": ids,
                    "judged": split.qrels[q]})
    return out


task = RerankTask()
