"""SPLADE sparse vectors: per vocabulary entry, the max over the real tokens of log(1 + relu(MLM logit)).

Any masked-LM checkpoint exports as a sparse encoder (`mlmkit export MODEL --task sparse-embedding`);
a sentence-transformers SparseEncoder directory (an MLMTransformer + SpladePooling) is recognised as
one. The graph runs the MLM head at every real token, pools inside onnxruntime and keeps the
``max_terms`` largest weights (top-k in the graph), so the batch x length x vocabulary tensor never
leaves it; a result is {"indices": [...], "values": [...]}, highest first, zeros dropped.

Evaluation data are scored pairs as for the embedding task: Spearman and Pearson correlation of the
pairs' cosine (of their sparse vectors) with the gold scores. mlmkit does not fine-tune this task.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from mlmkit_tasks.embedding import EmbeddingTask, is_splade_directory, read_scored_pairs

from mlmkit.errors import TaskError
from mlmkit.plugin.taskkit import BATCH, EXAMPLE, TaskContext, TaskOption


@functools.cache
def _model_class() -> type:
    """The encoder, the MLM head at every token, SPLADE's pooling and the top terms (torch on demand)."""
    import torch
    from torch import nn

    from mlmkit.models.core import BertModel, BertPreTrainingHeads, init_weights, tie_decoder

    class SparseEncoder(nn.Module):
        def __init__(self, config: Any, max_terms: int) -> None:
            super().__init__()
            self.config, self.max_terms = config, min(max_terms, config.vocab_size)
            self.bert = BertModel(config, add_pooling_layer=False)
            self.cls = BertPreTrainingHeads(config, nsp=False)
            init_weights(self, config.initializer_range)
            tie_decoder(self.cls, self.bert)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                    token_type_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
            if attention_mask is None:
                attention_mask = torch.ones_like(input_ids)
            seq, _ = self.bert(input_ids, attention_mask, token_type_ids)  # (B, T, H)
            logits = self.cls.predictions(seq)  # (B, T, V): inside the graph only
            weights = torch.log1p(torch.relu(logits)) * attention_mask.unsqueeze(-1).to(logits.dtype)
            values, indices = torch.topk(weights.max(dim=1).values, self.max_terms, dim=-1)  # (B, k)
            # entries of weight 0 are no terms: -1, so that which of the tied zeros topk picks never matters
            return {"indices": torch.where(values > 0, indices, torch.full_like(indices, -1)), "values": values}

    return SparseEncoder


class SparseEmbeddingTask(EmbeddingTask):
    name = "sparse-embedding"
    description = "SPLADE sparse vectors from a masked-LM head: max over tokens of log(1 + relu(logit)), top terms in the graph."
    outputs = {"indices": (BATCH, "terms"), "values": (BATCH, "terms")}
    options = (
        TaskOption("max_terms", 256, "Most non-zero entries kept per text (the largest, chosen in the graph).", minimum=1,
                   fixed=True),
        TaskOption("text_column", "text", "Evaluation data: the first text of a pair."),
        TaskOption("pair_column", "text_pair", "Evaluation data: the second text of a pair."),
        TaskOption("score_column", "score", "Evaluation data: the pair's gold similarity."),
    )
    hf_architecture = "BertForMaskedLM"
    # the embedding task's evaluation on scored pairs; its fine-tuning (and retrieval data) are not this task's
    formats = ("csv", "tsv", "jsonl")
    metrics = ("spearman", "pearson")
    trainable = False
    label_names = ("labels",)
    group_features = False

    def read(self, path: Path, options: Mapping[str, Any]) -> list[dict[str, Any]]:
        return read_scored_pairs(path, options)

    def main_metric(self, ctx: TaskContext) -> str | None:
        return None

    def fit_state(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        return {}

    def run_files(self, config: Any, ctx: TaskContext) -> dict[str, str]:
        return {}

    def featurize(self, examples: list[dict[str, Any]], tokenizer: Any, ctx: TaskContext, *, training: bool) -> list[dict[str, Any]]:
        if training:
            raise TaskError("the sparse-embedding task is not fine-tuned by mlmkit",
                            "export the masked LM as it is: mlmkit export MODEL --task sparse-embedding")
        return super().featurize(examples, tokenizer, ctx, training=False)

    def from_hf(self, config: Any, directory: Path) -> dict[str, Any] | None:
        """A sentence-transformers SparseEncoder directory (SpladePooling); any masked LM with --task."""
        return {} if is_splade_directory(directory) else None

    def build_model(self, config: Any, ctx: TaskContext) -> Any:
        return _model_class()(config, int(ctx.options["max_terms"]))

    def postprocess(
        self, outputs: dict[str, Any], features: list[dict[str, Any]], examples: list[dict[str, Any]], ctx: TaskContext
    ) -> list[dict[str, Any]]:
        """{"indices", "values"} per text (non-zero entries, highest first); a pair adds
        "indices_pair" / "values_pair" and their "cosine"."""
        preds: list[dict[str, Any]] = [{} for _ in examples]
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
                den = float(np.linalg.norm(list(a.values())) * np.linalg.norm(list(b.values()))) if a and b else 0.0
                p["cosine"] = dot / den if den > 0 else 0.0
        return preds

    def summary(self, prediction: dict[str, Any]) -> dict[str, str]:
        top = ", ".join(f"{i}:{v:.2f}" for i, v in list(zip(prediction["indices"], prediction["values"]))[:5])
        return {"terms": str(len(prediction["indices"])), "top": top + (" ..." if len(prediction["indices"]) > 5 else "")}


task = SparseEmbeddingTask()
