"""Sentence embeddings: one vector per text, pooled over the encoder's real tokens inside the graph,
fine-tuned for retrieval (or similarity) with one of the registry's embedding losses
(mlmkit.taskkit.losses).

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
  Precision@10 over an exact search of the whole corpus (retrieval/exact.py).

In a training batch an example's texts stay together (``group_features``); ``--batch-size`` counts
texts, so 64 holds 32 (anchor, positive) pairs.

Prompts (``query_prompt``, ``document_prompt``, as e5 and bge use them: "query: ", "passage: ") are
built into the model like its pooling: put before every query (an anchor) and every document (a
positive, a negative, a corpus text) in training and retrieval evaluation, and before an input the
caller declares one (``input_type``: `mlmkit embed --as query`, the OpenAI route's ``input_type``,
TEI's ``prompt_name``). A sentence-transformers directory's prompts are read from, and a run's written
to, config_sentence_transformers.json ({"prompts": {"query": ..., "document": ...}}).

This module holds the task itself (its options, features, model and outputs); what it reads of data
files, BEIR directories and a teacher is embedding_data.py's, the sentence-transformers directories
it reads and its runs are embedding_st.py's, its evaluation (retrieval metrics, the pairs'
correlations) embedding_metrics.py's, the checking of its options (matryoshka, Dense layers, the loss)
embedding_options.py's, and an input's chunks embedding_chunks.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mlmkit.taskkit import (
    BATCH,
    EXAMPLE,
    INDEXES,
    MAX_RECORD_BYTES,
    RETRIEVAL_METRICS,
    TRUNCATED,
    CheckpointInfo,
    Example,
    Feature,
    Input,
    Metrics,
    Prediction,
    Record,
    TaskContext,
    TaskError,
    TaskOption,
    TaskState,
    clip_text,
    get_loss,
    leading_dimensions,
    losses,
    tokenizer_settings,
)
from mlmkit_tasks.embedding_chunks import CHUNK, chunk_features, chunking_of
from mlmkit_tasks.embedding_data import (
    DATA_NAMES,
    FORMATS,
    NO_TARGET,
    check_loss_data,
    data_kind,
    example_texts,
    prompt_for,
    read_examples,
    training_fields,
)
from mlmkit_tasks.embedding_metrics import pair_correlations, retrieval_metrics
from mlmkit_tasks.embedding_options import (
    dense_layers,
    embedding_width,
    matryoshka_dims,
    matryoshka_weights,
    resolved_loss,
)
from mlmkit_tasks.embedding_st import (
    SPLADE_MODULES,
    ST_POOLING,
    ST_PROMPTS,
    is_multi_vector_directory,
    is_splade_directory,
    named_prompts,
    sentence_transformers_options,
    st_run_files,
)

if TYPE_CHECKING:  # the config type is torch's side (models/); a task imports torch in build_model only
    from mlmkit.model import ModelConfig

__all__ = [  # the data and evaluation helpers' public names are importable from here too, as before
    "DATA_NAMES", "FORMATS", "INPUT_TYPES", "NO_TARGET", "POOLINGS", "SPLADE_MODULES", "ST_POOLING",
    "ST_PROMPTS",
    "EmbeddingTask", "is_multi_vector_directory", "is_splade_directory", "task",
]

POOLINGS = ("mean", "cls", "max", "lasttoken", "weightedmean", "mean_sqrt_len_tokens")
INPUT_TYPES = ("none", "query", "document")


class EmbeddingTask:
    name = "embedding"
    description = ("Sentence embeddings: mean / cls / max pooling (+ L2 normalisation) in the graph; "
                   "fine-tuned with "
                   "mnrl, cached-mnrl (GradCache) or cosent; retrieval (nDCG@10) or STS evaluation.")
    formats: tuple[str, ...] = ("csv", "tsv", "jsonl", "parquet", "beir")
    metrics: tuple[str, ...] = (*RETRIEVAL_METRICS, "spearman", "pearson")
    outputs: dict[str, tuple[str, ...]] = {"embedding": (BATCH, "hidden")}
    options: tuple[TaskOption, ...] = (
        TaskOption("pooling", "mean",
                   "How token vectors become one, over the real tokens: mean, cls, max, lasttoken "
                   "(a decoder's), weightedmean or mean_sqrt_len_tokens.", choices=POOLINGS, fixed=True,
                   flags=("--pooling",)),
        TaskOption("dense_layers", "",
                   "Dense layers after the pooling, as a sentence-transformers model has them "
                   '(read from its modules): a JSON list of {"in", "out", "bias", "activation"}.',
                   fixed=True),
        TaskOption("normalize", False, "L2-normalise the embeddings (cosine similarity becomes a dot "
                                       "product).", fixed=True, flags=("--normalize/--no-normalize",)),
        TaskOption("query_prompt", "",
                   "Text put before every query (anchor) in training, evaluation and --as query "
                   "(e5: 'query: ').", fixed=True),
        TaskOption("document_prompt", "",
                   "Text put before every document (positive, negative, corpus text) in "
                   "training, evaluation and --as document (e5: 'passage: ').", fixed=True),
        TaskOption("prompts", "", "The model's named prompts beyond query and document, a JSON object (from "
                                  "a sentence-transformers model's "
                   "config_sentence_transformers.json); query and document are query_prompt and "
                   "document_prompt.", fixed=True),
        TaskOption("default_prompt_name", "",
                   "The prompt put before inputs that declare no other (sentence-transformers' "
                   "default_prompt_name).", fixed=True),
        TaskOption("prompt_name", "",
                   "The named prompt put before the inputs (the queries, where there are documents "
                   "too): `--prompt-name NAME`, as sentence-transformers' encode(prompt_name=...).",
                   saved=False,
                   flags=("--prompt-name",)),
        TaskOption("dimensions", 0,
                   "Keep the first N dimensions of each vector (Matryoshka; sentence-transformers' "
                   "truncate_dim), L2-normalised again where the model normalises; 0: all.", minimum=0,
                   flags=("--dimensions",)),
        TaskOption("input_type", "none",
                   "What the inputs are, for the prompt put before them: query, document or "
                   "none (`mlmkit embed --as query`).", choices=INPUT_TYPES, saved=False,
                   flags=("--input-type", "--as")),
        TaskOption("chunk_tokens", 0,
                   "Cut each input into chunks of at most this many tokens, at word boundaries, and "
                   "embed each (`mlmkit embed --chunk-tokens`); 0: a vector per input.", minimum=0,
                   saved=False),
        TaskOption("chunk_overlap", -1,
                   "With chunk_tokens: tokens each chunk repeats of the one before (-1: an eighth).",
                   minimum=-1, saved=False),
        TaskOption("chunk_sentences", False,
                   "With chunk_tokens: end each chunk at a sentence end where one is in its "
                   "second half.", saved=False),
        TaskOption("index", "exact",
                   "Retrieval evaluation: exact search, or a faiss HNSW index (approximate) for "
                   "corpora too large for it.", choices=INDEXES, saved=False, flags=("--index",),
                   evaluation=True),
        TaskOption("save_run", "",
                   "Retrieval evaluation: write the ranking (top 100 per query) to this file in TREC "
                   "run format.", saved=False, flags=("--save-run",), evaluation=True),
        TaskOption("loss", "auto",
                   "Fine-tuning loss: mnrl or cached-mnrl on (anchor, positive, negatives) rows or a "
                   "BEIR directory, margin-mse or kl-distill on rows with teacher scores, cosent on scored "
                   "pairs, mse-distill "
                   "toward a teacher; auto: mse-distill with a teacher, else mnrl or cosent by the data.",
                   choices=("auto", *losses("embedding"))),
        TaskOption("scale", 20.0, "Fine-tuning: the cosine's scale in the losses (20: temperature 0.05).",
                   minimum=0.0),
        TaskOption("symmetric", False, "Fine-tuning (mnrl): add the positive -> anchor direction."),
        TaskOption("mini_batch_size", 32,
                   "Fine-tuning (cached-mnrl): texts embedded at once; the batch is --batch-size.",
                   minimum=1),
        TaskOption("matryoshka_dims", "", "Fine-tuning: also train the first d dimensions for each d listed "
                   "(e.g. 384,256,128,64); evaluation reports each."),
        TaskOption("matryoshka_weights", "",
                   "Fine-tuning: the weight of each matryoshka dimension (default 1 each)."),
        TaskOption("teacher", "",
                   "Fine-tuning (mse-distill): an embedding bundle or run whose embeddings the model "
                   "learns (a learned projection where the sizes differ)."),
        TaskOption("scores_column", "scores",
                   "Training rows (margin-mse): the teacher's scores, the positive's then "
                   "each negative's (mlmkit mine --with-scores)."),
        TaskOption("anchor_column", "anchor", "Training rows: the anchor (query) field."),
        TaskOption("positive_column", "positive",
                   "Training rows: the positive field; hard negatives are negative, "
                   "negative_1, negative_2 ..."),
        TaskOption("text_column", "text", "Scored pairs: the first text of a pair.",
                   flags=("--text-column",)),
        TaskOption("pair_column", "text_pair", "Scored pairs: the second text of a pair.",
                   flags=("--pair-column",)),
        TaskOption("score_column", "score", "Scored pairs: the pair's gold similarity."),
    )
    label_names: tuple[str, ...] = ("part", "text_id", "score", "target")
    group_features = True
    kept_heads = ("dense.",)  # a sentence-transformers model's Dense layers carry over into fine-tuning
    default_max_length = 128
    command = "embed"
    pipeline_tag = "sentence-similarity"

    def main_metric(self, ctx: TaskContext) -> str:
        return ("spearman" if resolved_loss(ctx) == "cosent" or ctx.state.get("data") == "scored"
                else "ndcg@10")

    def fit_state(self, examples: list[Example]) -> TaskState:
        """The kind of training data ("rows", "scored" or "texts"), which ``loss=auto`` trains by, and
        the size of the teacher's embeddings (mse-distill)."""
        state: TaskState = {"data": data_kind(examples)}
        if examples and "targets" in examples[0]:
            state["teacher_dim"] = int(len(examples[0]["targets"][0]))
        return state

    def from_hf(self, config: ModelConfig, directory: Path) -> CheckpointInfo | None:
        """A sentence-transformers directory (modules.json), or a bare encoder (architectures BertModel)."""
        if (directory / "modules.json").is_file():
            if is_splade_directory(directory) or is_multi_vector_directory(directory):
                return None
            return sentence_transformers_options(directory)
        return {} if "BertModel" in (config.architectures or []) else None

    def read(self, path: Path, options: Mapping[str, Any], *, training: bool = False,
             max_bytes: int | None = MAX_RECORD_BYTES) -> list[Example]:
        """Examples of a data file or a BEIR directory (``DIR:SPLIT``): for training, rows {"anchor",
        "positive", "negatives"} or scored pairs {"text", "text_pair", "score"}; for evaluation, scored
        pairs or a retrieval set ({"kind": "query", "id", "text", "judged"} then {"kind": "doc", "id",
        "text"})."""
        return read_examples(path, options, training=training, max_bytes=max_bytes)

    def from_input(self, item: Input, options: Mapping[str, Any]) -> Example:
        """A text, or a record with a text field (its text_column)."""
        if isinstance(item, str):
            return {"text": item}
        return {"text": Record("<input>", None, item).text(options["text_column"])}

    def featurize(self, examples: list[Example], tokenizer: Any, ctx: TaskContext, *,
                  training: bool) -> list[Feature]:
        """A feature per text: ``part`` 0 the anchor (a pair's first text, a query, a document, an
        input), 1 the positive (the second), 2.. the hard negatives; for training also ``text_id``
        (equal texts, equal ids) and the pair's ``score`` (0 for rows)."""
        if training:
            check_loss_data(examples, resolved_loss(ctx),
                            "use --option loss=cosent for scored pairs, loss=mnrl (or "
                            "cached-mnrl) for rows, loss=mse-distill with --option teacher=BUNDLE for any")
        elif chunking_of(ctx.options) is not None:
            return chunk_features(examples, tokenizer, ctx)
        texts = [(i, part, clip_text(prompt_for(ex, part, ctx.options) + t, tokenizer, ctx.max_length))
                 for i, ex in enumerate(examples) for part, t in enumerate(example_texts(ex))
                 if t is not None]
        distill = training and resolved_loss(ctx) == "mse-distill"
        in_batch = training and get_loss("embedding", resolved_loss(ctx)).in_batch
        with tokenizer_settings(tokenizer, max_length=ctx.max_length) as tok:
            encodings = tok.encode_batch([t for _, _, t in texts]) if texts else []
        feats = []
        for (i, part, _), enc in zip(texts, encodings):
            f = {"input_ids": enc.ids, "token_type_ids": enc.type_ids, EXAMPLE: i, "part": part,
                 **({TRUNCATED: True} if enc.overflowing else {})}
            if training:
                f.update(training_fields(examples[i], part, enc.ids, in_batch))
                f["target"] = examples[i]["targets"][part] if distill else NO_TARGET
            feats.append(f)
        return feats

    def build_model(self, config: ModelConfig, ctx: TaskContext) -> Any:
        width = embedding_width(ctx.options, config.hidden_size)
        matryoshka_dims(ctx.options["matryoshka_dims"], width)  # a bad list is an error before training
        named_prompts(ctx.options)  # bad prompts too
        matryoshka_weights(ctx.options["matryoshka_weights"],
                           len(matryoshka_dims(ctx.options["matryoshka_dims"])))
        teacher_dim = ctx.state.get("teacher_dim") if resolved_loss(ctx) == "mse-distill" else None
        if teacher_dim and teacher_dim != width and ctx.options["matryoshka_dims"]:
            raise TaskError(f"matryoshka_dims with a teacher of another size ({teacher_dim}, the model "
                            f"{width})",
                            "distil from a teacher of the model's size, or leave matryoshka_dims out")
        from mlmkit_tasks.heads.embedding import BertForEmbedding

        o, loss = ctx.options, get_loss("embedding", resolved_loss(ctx))
        dims = matryoshka_dims(o["matryoshka_dims"], width)
        return BertForEmbedding(config, o["pooling"], bool(o["normalize"]), loss=loss, cached=loss.cached,
                                scale=float(o["scale"]), symmetric=bool(o["symmetric"]),
                                mini_batch_size=int(o["mini_batch_size"]), matryoshka=dims,
                                matryoshka_weights=matryoshka_weights(o["matryoshka_weights"], len(dims)),
                                teacher_dim=teacher_dim,
                                dense=dense_layers(o["dense_layers"], config.hidden_size))

    def run_files(self, config: ModelConfig, ctx: TaskContext) -> dict[str, str]:
        """The run is also a sentence-transformers directory: its modules (the encoder at the root, the
        pooling, the Dense layers, the normalisation), its prompts, truncate_dim and max length."""
        return st_run_files(ctx.options, config.hidden_size, ctx.max_length,
                            dense_layers(ctx.options["dense_layers"], config.hidden_size))

    def postprocess(
        self, outputs: dict[str, list[np.ndarray]], features: list[Feature], examples: list[Example],
        ctx: TaskContext
    ) -> list[Prediction]:
        """{"embedding": [...]} per text; a pair adds "embedding_pair" and their "cosine". With chunk_tokens,
        {"chunks": [{"start", "end", "embedding"}, ...]}: each chunk's character span in the text, in
        order."""
        preds: list[Prediction] = [{} for _ in examples]
        dims, normalize = int(ctx.options.get("dimensions") or 0), bool(ctx.options.get("normalize"))
        for f, v in zip(features, outputs["embedding"]):
            if dims:
                if dims > v.shape[-1]:
                    raise TaskError(f"--dimensions {dims} is more than the model's {v.shape[-1]}",
                                    f"give --dimensions 1 to {v.shape[-1]}")
                v = leading_dimensions(v, dims, normalize)  # unit length again where the model's vectors are
            vector = [float(x) for x in v]
            if CHUNK in f:  # chunk_tokens: the chunks in order, each with its span
                start, end = f[CHUNK]
                preds[f[EXAMPLE]].setdefault("chunks",
                                             []).append({"start": start, "end": end, "embedding": vector})
            else:
                preds[f[EXAMPLE]]["embedding_pair" if f["part"] else "embedding"] = vector
        for p in preds:
            if "embedding_pair" in p:
                a, b = np.asarray(p["embedding"]), np.asarray(p["embedding_pair"])
                den = float(np.linalg.norm(a) * np.linalg.norm(b))
                p["cosine"] = float(a @ b) / den if den > 0 else 0.0
        return preds

    def compute_metrics(self, predictions: list[Prediction], examples: list[Example],
                        ctx: TaskContext) -> Metrics:
        """Retrieval metrics (a retrieval set) or the pairs' Spearman and Pearson correlation (scored
        pairs)."""
        if examples and examples[0].get("kind") == "query":
            return retrieval_metrics(predictions, examples, matryoshka_dims(ctx.options["matryoshka_dims"]),
                                     ctx.options)
        return pair_correlations(predictions, examples)

    def summary(self, prediction: Prediction) -> dict[str, str]:
        if "chunks" in prediction:
            spans = [f"{c['start']}-{c['end']}" for c in prediction["chunks"]]
            return {"chunks": str(len(spans)), "dims": str(len(prediction["chunks"][0]["embedding"])),
                    "spans": ", ".join(spans[:4]) + (" ..." if len(spans) > 4 else "")}
        v = np.asarray(prediction["embedding"])
        return {"dims": str(v.size), "norm": f"{np.linalg.norm(v):.3f}",
                "start": ", ".join(f"{x:.3f}" for x in v[:4]) + " ..."}


task = EmbeddingTask()
