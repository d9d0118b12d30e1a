"""The task author's kit: everything a task plugin needs from mlmkit at module level, without torch.

The onnxruntime runtime imports tasks to featurize and postprocess, so nothing here reaches torch (an
import-linter contract holds it). A plugin, built-in or a third party's, imports from here and from
``mlmkit.registry`` (the contract) at module level, and from ``mlmkit.model`` (the torch side) inside
``build_model`` only (docs/plugins.md):

    from mlmkit.taskkit import EXAMPLE, BATCH, TaskContext, TaskOption, iter_records, tokenizer_settings

This module is the one public path of these names; each is defined where the core uses it:

- the contract's names: mlmkit.registry;
- readers that stream a file and know each record's line (CSV/TSV, JSONL, text, Parquet, `datasets`
  directories) and BEIR directories: mlmkit.text.readers, mlmkit.text.record, mlmkit.text.tables,
  mlmkit.text.beir;
- tokenizer settings for one block and clipping huge texts: mlmkit.text.truncation; a tokenizer's
  special token ids and its mask token, and a model directory's tokenizer: mlmkit.text.tokenizer;
  long texts cut into chunks of a model's tokens at word boundaries: mlmkit.text.chunks;
- retrieval: exact (or faiss) search, the IR metrics, TREC run files, BM25 and dense retrievers over
  a bundle: mlmkit.retrieval.exact; late interaction's MaxSim and exact ranking: mlmkit.retrieval.maxsim;
- an exported bundle's pipeline (onnxruntime): mlmkit.runtime.pipeline;
- the loss registry (a task's ``loss`` option's choices, what each loss trains on): mlmkit.objectives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlmkit.errors import ConfigError, DataFormatError, MlmkitError, TaskError
from mlmkit.files import MAX_RECORD_BYTES, parse_json
from mlmkit.objectives import Loss, get_loss, losses, register_loss
from mlmkit.registry import (
    BATCH,
    DISTINCT,
    EXAMPLE,
    LABEL,
    SEQUENCE,
    TRUNCATED,
    CheckpointInfo,
    Example,
    Feature,
    HFConfig,
    Input,
    Metrics,
    Options,
    Prediction,
    TaskContext,
    TaskOption,
    TaskState,
)
from mlmkit.retrieval.exact import (
    BM25,
    INDEXES,
    Dense,
    leading_dimensions,
    mean_metrics,
    retrieve,
    write_trec,
)
from mlmkit.retrieval.exact import METRICS as RETRIEVAL_METRICS
from mlmkit.retrieval.maxsim import maxsim, padded, rank
from mlmkit.text.beir import BeirSplit, is_beir, read_split
from mlmkit.text.chunks import Chunker, Chunking
from mlmkit.text.readers import (
    FORMATS,
    data_format,
    iter_jsonl,
    iter_lines,
    iter_records,
    iter_table,
    numbered,
    read_text,
)
from mlmkit.text.record import Record
from mlmkit.text.tables import is_table, iter_table_rows
from mlmkit.text.tokenizer import MASK, load_tokenizer, mask_token, special_ids
from mlmkit.text.truncation import clip_text, tokenizer_settings

__all__ = [
    # the contract's names
    "BATCH", "DISTINCT", "EXAMPLE", "LABEL", "SEQUENCE", "TRUNCATED", "TaskContext", "TaskOption",
    # the roles of the dicts a task takes and returns (plain dicts: these name them in signatures)
    "Example", "Feature", "Input", "Prediction", "Metrics", "TaskState", "Options", "HFConfig",
    "CheckpointInfo",
    # errors the CLI prints as one line
    "ConfigError", "DataFormatError", "MlmkitError", "TaskError",
    # readers
    "Record", "FORMATS", "data_format", "iter_lines", "iter_jsonl", "iter_table", "iter_records", "read_text",
    "is_table", "iter_table_rows", "numbered", "parse_json", "MAX_RECORD_BYTES",
    "BeirSplit", "is_beir", "read_split",
    # tokenizers
    "tokenizer_settings", "clip_text", "special_ids", "mask_token", "MASK", "Chunker", "Chunking",
    "load_tokenizer",
    # retrieval
    "RETRIEVAL_METRICS", "INDEXES", "retrieve", "mean_metrics", "write_trec", "BM25", "Dense",
    "leading_dimensions",
    "maxsim", "padded", "rank",
    # inference on bundles
    "load_pipeline",
    # the loss registry (the classes: mlmkit.model.register_loss_class)
    "Loss", "get_loss", "losses", "register_loss",
]


def load_pipeline(bundle: str | Path, **kwargs: Any) -> Any:
    """An exported bundle's ``Pipeline`` (mlmkit.runtime.pipeline; onnxruntime is imported on first use,
    so importing a task stays cheap): ``load_pipeline(path, command="embed")(texts)``."""
    from mlmkit.runtime.pipeline import Pipeline

    return Pipeline.load(bundle, **kwargs)
