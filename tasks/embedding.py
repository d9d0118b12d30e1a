"""Sentence embeddings: one vector per text, pooled over the encoder's real tokens inside the graph.

Pooling ``mean`` (the default), ``cls`` or ``max`` over the tokens the attention mask keeps, then an
optional L2 normalisation (``normalize``): what sentence-transformers does with a Pooling and a
Normalize module. A sentence-transformers directory (modules.json, 1_Pooling/config.json,
sentence_bert_config.json) is read as it says; any other BERT checkpoint is a plain encoder. The
bundle returns a (batch, hidden) tensor, never the batch x length x hidden one.

Evaluation data are sentence pairs with a similarity score (the STS benchmark's layout: CSV/TSV or
JSONL with text, text_pair, score): Spearman (the main metric) and Pearson correlation of the
cosine of the two embeddings with the gold scores. mlmkit does not fine-tune this task.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mlmkit.errors import TaskError
from mlmkit.plugin.taskkit import (
    BATCH,
    EXAMPLE,
    TRUNCATED,
    DataFormatError,
    Record,
    TaskContext,
    TaskOption,
    clip_text,
    data_format,
    iter_jsonl,
    iter_records,
    parse_json,
    tokenizer_settings,
)

POOLINGS = ("mean", "cls", "max")
ST_POOLING = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max"}
FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl"}


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
    info: dict[str, Any] = {"options": options}
    if (d / "sentence_bert_config.json").is_file():
        max_len = _json(d / "sentence_bert_config.json").get("max_seq_length")
        if isinstance(max_len, int) and max_len > 0:
            info["max_length"] = max_len
    return info


@functools.cache
def _model_class() -> type:
    """An encoder with pooling and normalisation (torch on demand)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from mlmkit.models.core import BertModel, mean_pool

    class BertForEmbedding(nn.Module):
        def __init__(self, config: Any, pooling: str, normalize: bool) -> None:
            super().__init__()
            self.config, self.pooling, self.normalize = config, pooling, normalize
            self.bert = BertModel(config, add_pooling_layer=False)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                    token_type_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
            if attention_mask is None:
                attention_mask = torch.ones_like(input_ids)
            seq, _ = self.bert(input_ids, attention_mask, token_type_ids)  # (B, T, H)
            if self.pooling == "cls":
                x = seq[:, 0]
            elif self.pooling == "max":  # padding can never win (sentence-transformers fills it with -1e9)
                m = attention_mask.unsqueeze(-1).to(seq.dtype)  # (B, T, 1)
                x = (seq + (m - 1.0) * 1e9).max(dim=1).values
            else:  # over the real tokens, as sentence-transformers' mean (and ModernBERT's head)
                x = mean_pool(seq, attention_mask)  # (B, H)
            if self.normalize:
                x = F.normalize(x, p=2.0, dim=-1)
            return {"embedding": x}

    return BertForEmbedding


class EmbeddingTask:
    name = "embedding"
    description = "Sentence embeddings: mean / cls / max pooling (+ L2 normalisation) in the graph; STS evaluation."
    formats = ("csv", "tsv", "jsonl")
    metrics = ("spearman", "pearson")
    outputs = {"embedding": (BATCH, "hidden")}
    options = (
        TaskOption("pooling", "mean", "How token vectors become one: mean, cls or max (over real tokens).", choices=POOLINGS,
                   fixed=True),
        TaskOption("normalize", False, "L2-normalise the embeddings (cosine similarity becomes a dot product).", fixed=True),
        TaskOption("text_column", "text", "Evaluation data: the first text of a pair."),
        TaskOption("pair_column", "text_pair", "Evaluation data: the second text of a pair."),
        TaskOption("score_column", "score", "Evaluation data: the pair's gold similarity."),
    )
    command = "embed"
    pipeline_tag = "sentence-similarity"
    trainable = False

    def from_hf(self, config: Any, directory: Path) -> dict[str, Any] | None:
        """A sentence-transformers directory (modules.json), or a bare encoder (architectures BertModel)."""
        if (directory / "modules.json").is_file():
            return None if is_splade_directory(directory) else _sentence_transformers(directory)
        return {} if "BertModel" in (config.architectures or []) else None

    def read(self, path: Path, options: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Scored pairs {"text", "text_pair", "score", "line", "source"} of a CSV/TSV/JSONL file."""
        fmt = data_format(path, FORMATS)
        examples = []
        for rec in iter_jsonl(path) if fmt == "jsonl" else iter_records(path, fmt):
            value = rec.fields().get(options["score_column"])
            try:
                score = float(value) if not isinstance(value, bool) else math.nan
            except (TypeError, ValueError):
                score = math.nan
            if not math.isfinite(score):
                raise rec.error(f"the score must be a finite number, not {value!r}", options["score_column"])
            examples.append({"text": rec.text(options["text_column"]), "text_pair": rec.text(options["pair_column"]),
                             "score": score, "line": rec.line, "source": rec.source})
        if not examples:
            raise DataFormatError(path, "no pairs", hint="evaluation data: text, text_pair and score per record")
        return examples

    def from_input(self, item: str | dict[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
        """A text, or a record with a text field (its text_column)."""
        if isinstance(item, str):
            return {"text": item}
        return {"text": Record("<input>", None, item).text(options["text_column"])}

    def featurize(self, examples: list[dict[str, Any]], tokenizer: Any, ctx: TaskContext, *, training: bool) -> list[dict[str, Any]]:
        """A feature per text: one per example, two for a pair (part 0 and 1)."""
        if training:
            raise TaskError("the embedding task is not fine-tuned by mlmkit",
                            "export the encoder as it is: mlmkit export MODEL --task embedding")
        texts = [(i, part, clip_text(t, tokenizer, ctx.max_length)) for i, ex in enumerate(examples)
                 for part, t in enumerate((ex["text"], ex.get("text_pair"))) if t is not None]
        with tokenizer_settings(tokenizer, max_length=ctx.max_length) as tok:
            encodings = tok.encode_batch([t for _, _, t in texts]) if texts else []
        return [{"input_ids": enc.ids, "token_type_ids": enc.type_ids, EXAMPLE: i, "part": part,
                 **({TRUNCATED: True} if enc.overflowing else {})} for (i, part, _), enc in zip(texts, encodings)]

    def build_model(self, config: Any, ctx: TaskContext) -> Any:
        return _model_class()(config, ctx.options["pooling"], bool(ctx.options["normalize"]))

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
        """Spearman and Pearson correlation of the pairs' cosine with their gold scores."""
        from scipy.stats import pearsonr, spearmanr

        if any("cosine" not in p or "score" not in ex for p, ex in zip(predictions, examples)):
            raise TaskError("embedding evaluation needs pairs with a score", "give text, text_pair and score per record")
        cos, gold = [p["cosine"] for p in predictions], [ex["score"] for ex in examples]
        if len(gold) < 2:
            raise TaskError("embedding evaluation needs at least two pairs")
        r, rho = float(pearsonr(cos, gold)[0]), float(spearmanr(cos, gold)[0])
        return {"spearman": 0.0 if rho != rho else rho, "pearson": 0.0 if r != r else r}

    def summary(self, prediction: dict[str, Any]) -> dict[str, str]:
        v = np.asarray(prediction["embedding"])
        return {"dims": str(v.size), "norm": f"{np.linalg.norm(v):.3f}", "start": ", ".join(f"{x:.3f}" for x in v[:4]) + " ..."}


task = EmbeddingTask()
