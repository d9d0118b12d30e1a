"""SPLADE sparse vectors: per vocabulary entry, the max over the real tokens of log(1 + relu(MLM logit)).

Any masked-LM checkpoint exports as a sparse encoder (`mlmkit export MODEL --task sparse-embedding`);
a sentence-transformers SparseEncoder directory (an MLMTransformer + SpladePooling) is recognised as
one. The graph runs the MLM head at every real token, pools inside onnxruntime and keeps the
``max_terms`` largest weights (top-k in the graph), so the batch x length x vocabulary tensor never
leaves it; a result is {"indices": [...], "values": [...]}, highest first, zeros dropped.

Fine-tuning (``mlmkit finetune sparse-embedding`` from any masked-LM checkpoint or run: its MLM head
is where SPLADE starts) reads what the embedding task's mnrl reads ((anchor, positive, negatives)
rows, a BEIR directory), and trains the contrastive loss over sparse dot products (in-batch and hard
negatives) plus the FLOPS regulariser, with separate weights for queries (anchors) and documents
(``query_flops``, ``document_flops``; 0 turns one off) reached by a quadratic warm-up over
``flops_warmup`` steps; the log has the mean number of non-zero terms per query and per document.
The run is also a sentence-transformers SparseEncoder directory.

Evaluation: on a BEIR directory (or rows), retrieval through an inverted index (scipy.sparse: every
query's dot product with the documents it shares a term with): the retrieval metrics and the mean
non-zeros (``query_terms``, ``document_terms``); on scored pairs, as for the embedding task, the
Spearman and Pearson correlation of the pairs' cosine with the gold scores.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mlmkit.taskkit import (
    BATCH,
    EXAMPLE,
    MAX_RECORD_BYTES,
    RETRIEVAL_METRICS,
    CheckpointInfo,
    Example,
    Feature,
    Metrics,
    Options,
    Prediction,
    TaskContext,
    TaskOption,
    get_loss,
    losses,
    mean_metrics,
)
from mlmkit_tasks.embedding import EmbeddingTask
from mlmkit_tasks.embedding_st import is_splade_directory

if TYPE_CHECKING:  # the config type is torch's side (models/); a task imports torch in build_model only
    from mlmkit.model import ModelConfig

RANKING_LOSSES = tuple(name for name, loss in losses("embedding").items() if not loss.cached
                       and "texts" not in loss.data)
"""The embedding losses SPLADE's ranking term may be: not those embedded in mini-batches (the sparse
head embeds a batch at once) nor those of a teacher's embeddings (the task has no teacher option)."""


class SparseEmbeddingTask(EmbeddingTask):
    name = "sparse-embedding"
    description = ("SPLADE sparse vectors from a masked-LM head: max over tokens of log(1 + relu(logit)), "
                   "top terms in the graph.")
    outputs = {"indices": (BATCH, "terms"), "values": (BATCH, "terms")}
    top_k_option = "max_terms"  # `mlmkit export --top-k`
    options = (
        TaskOption("max_terms", 256,
                   "Most non-zero entries kept per text (the largest, chosen in the graph).", minimum=1,
                   fixed=True),
        TaskOption("loss", "mnrl", "Fine-tuning: the ranking loss of the sparse vectors (dot products), the "
                   "FLOPS regulariser added to it: mnrl on rows or a BEIR directory, margin-mse or "
                   "kl-distill on "
                   "rows with teacher scores, cosent on scored pairs.", choices=RANKING_LOSSES),
        TaskOption("query_flops", 5e-5,
                   "Fine-tuning: the FLOPS regulariser's weight on the queries (anchors); 0: off.",
                   minimum=0.0),
        TaskOption("document_flops", 3e-5,
                   "Fine-tuning: the FLOPS regulariser's weight on the documents; 0: off.",
                   minimum=0.0),
        TaskOption("flops_warmup", 100,
                   "Fine-tuning: steps over which the FLOPS weights grow quadratically to their "
                   "value.", minimum=0),
        TaskOption("scale", 1.0, "Fine-tuning: the dot products' scale in the contrastive loss.",
                   minimum=0.0),
        TaskOption("anchor_column", "anchor", "Training rows: the anchor (query) field."),
        TaskOption("positive_column", "positive",
                   "Training rows: the positive field; hard negatives are negative_1 ..."),
        TaskOption("text_column", "text", "Evaluation data: the first text of a pair.",
                   flags=("--text-column",)),
        TaskOption("pair_column", "text_pair", "Evaluation data: the second text of a pair.",
                   flags=("--pair-column",)),
        TaskOption("score_column", "score", "Evaluation data: the pair's gold similarity."),
    )
    hf_architecture = "BertForMaskedLM"
    base_heads = ("cls.predictions.",)
    formats = ("csv", "tsv", "jsonl", "parquet", "beir")
    metrics = (*RETRIEVAL_METRICS, "query_terms", "document_terms", "spearman", "pearson")
    trainable = True
    label_names = ("part", "text_id", "score")
    group_features = True

    def read(self, path: Path, options: Mapping[str, Any], *, training: bool = False,
             max_bytes: int | None = MAX_RECORD_BYTES) -> list[Example]:
        """What the embedding task reads for mnrl (rows, BEIR directories) and scored pairs."""
        return super().read(path, _as_embedding(options), training=training, max_bytes=max_bytes)

    def main_metric(self, ctx: TaskContext) -> str:
        return "ndcg@10" if ctx.state.get("data") == "rows" else "spearman"

    def run_files(self, config: ModelConfig, ctx: TaskContext) -> dict[str, str]:
        """The run is also a sentence-transformers SparseEncoder directory: the masked LM at the root,
        SPLADE's max pooling of log(1 + relu), the max length."""
        import json

        modules = [{"idx": 0, "name": "0", "path": "",
                    "type": "sentence_transformers.sparse_encoder.models.MLMTransformer"},
                   {"idx": 1, "name": "1", "path": "1_SpladePooling",
                    "type": "sentence_transformers.sparse_encoder.models.SpladePooling"}]
        dump = lambda x: json.dumps(x, indent=2) + "\n"  # noqa: E731
        return {"modules.json": dump(modules),
                "1_SpladePooling/config.json": dump({"pooling_strategy": "max", "activation_function": "relu",
                                                     "word_embedding_dimension": config.vocab_size}),
                "sentence_bert_config.json": dump({"max_seq_length": ctx.max_length, "do_lower_case": False}),
                "config_sentence_transformers.json": dump({"model_type": "SparseEncoder",
                                                           "similarity_fn_name": "dot"})}

    def featurize(self, examples: list[Example], tokenizer: Any, ctx: TaskContext, *,
                  training: bool) -> list[Feature]:
        feats = super().featurize(examples, tokenizer,
                                  TaskContext(ctx.max_length, _as_embedding(ctx.options), ctx.labels,
                                               ctx.state), training=training)
        for f in feats:
            f.pop("target", None)  # no teacher here
        return feats

    def from_hf(self, config: ModelConfig, directory: Path) -> CheckpointInfo | None:
        """A sentence-transformers SparseEncoder directory (SpladePooling); any masked LM with --task."""
        return {} if is_splade_directory(directory) else None

    def build_model(self, config: ModelConfig, ctx: TaskContext) -> Any:
        from mlmkit.model import DistributedLoss, SpladeLoss, embedding_loss
        from mlmkit_tasks.heads.sparse_embedding import SparseEncoder

        o = ctx.options
        ranking = embedding_loss(get_loss("embedding", o["loss"]), scale=float(o["scale"]), dot=True)
        # the ranking term's in-batch negatives from every rank under torchrun; the FLOPS term each rank's own
        objective = SpladeLoss(DistributedLoss(ranking), query_weight=float(o["query_flops"]),
                               document_weight=float(o["document_flops"]), warmup=int(o["flops_warmup"]))
        return SparseEncoder(config, int(o["max_terms"]), objective)

    def compute_metrics(self, predictions: list[Prediction], examples: list[Example],
                        ctx: TaskContext) -> Metrics:
        """Retrieval through an inverted index (a retrieval set), or the pairs' correlations."""
        if examples and examples[0].get("kind") == "query":
            return _sparse_retrieval(predictions, examples)
        return super().compute_metrics(predictions, examples, ctx)

    def postprocess(
        self, outputs: dict[str, list[np.ndarray]], features: list[Feature], examples: list[Example],
        ctx: TaskContext
    ) -> list[Prediction]:
        """{"indices", "values"} per text (non-zero entries, highest first); a pair adds
        "indices_pair" / "values_pair" and their "cosine"."""
        preds: list[Prediction] = [{} for _ in examples]
        for f, ids, vals in zip(features, outputs["indices"], outputs["values"]):
            keep = np.asarray(vals) > 0
            suffix = "_pair" if f["part"] else ""
            p = preds[f[EXAMPLE]]
            p["indices" + suffix] = [int(i) for i in np.asarray(ids)[keep]]
            p["values" + suffix] = [float(v) for v in np.asarray(vals)[keep]]
        for p in preds:
            if "indices_pair" in p:
                a = dict(zip(p["indices"], p["values"]))
                b = dict(zip(p["indices_pair"], p["values_pair"]))
                dot = sum(v * b.get(i, 0.0) for i, v in a.items())
                den = float(np.linalg.norm(list(a.values()))
                            * np.linalg.norm(list(b.values()))) if a and b else 0.0
                p["cosine"] = dot / den if den > 0 else 0.0
        return preds

    def summary(self, prediction: Prediction) -> dict[str, str]:
        top = ", ".join(f"{i}:{v:.2f}" for i, v in list(zip(prediction["indices"], prediction["values"]))[:5])
        return {"terms": str(len(prediction["indices"])),
                "top": top + (" ..." if len(prediction["indices"]) > 5 else "")}



def _as_embedding(options: Mapping[str, Any]) -> Options:
    """These options as the embedding task's reader and featurizer take them (its defaults, the ranking
    loss: mnrl where none is given)."""
    from mlmkit_tasks.embedding import task as embedding

    return {**{o.name: o.default for o in embedding.options}, **options, "loss": options.get("loss", "mnrl")}


def _csr(preds: list[Prediction], width: int) -> Any:
    from scipy.sparse import csr_matrix

    indptr = np.cumsum([0] + [len(p["indices"]) for p in preds])
    idx = np.asarray([i for p in preds for i in p["indices"]], dtype=np.int64)
    val = np.asarray([v for p in preds for v in p["values"]], dtype=np.float32)
    return csr_matrix((val, idx, indptr), shape=(len(preds), width))


def _sparse_retrieval(predictions: list[Prediction], examples: list[Example], k: int = 100,
                      chunk: int = 64) -> dict[str, float]:
    """Each query's top ``k`` documents by the dot product of sparse vectors, through an inverted
    index (the documents' csr matrix, transposed: term -> documents), ``chunk`` queries at a time;
    the retrieval metrics and the mean number of terms per query and per document."""
    queries = [(ex, p) for ex, p in zip(examples, predictions) if ex["kind"] == "query"]
    docs = [(ex, p) for ex, p in zip(examples, predictions) if ex["kind"] == "doc"]
    width = 1 + max([i for _, p in queries + docs for i in p["indices"]] or [0])
    D = _csr([p for _, p in docs], width).T.tocsr()  # (V, documents): the inverted index
    dids = [ex["id"] for ex, _ in docs]
    runs: dict[str, list[str]] = {}
    for start in range(0, len(queries), chunk):
        part = queries[start:start + chunk]
        S = (_csr([p for _, p in part], width) @ D).toarray()  # (chunk, documents)
        top = np.argsort(-S, axis=1, kind="stable")[:, :k]
        for (ex, _), row, srow in zip(part, top, S):
            runs[ex["id"]] = [dids[j] for j in row if srow[j] > 0]
    out = mean_metrics(runs, {ex["id"]: ex["judged"] for ex, _ in queries})
    out["query_terms"] = float(np.mean([len(p["indices"]) for _, p in queries]))
    out["document_terms"] = float(np.mean([len(p["indices"]) for _, p in docs]))
    return out


task = SparseEmbeddingTask()
