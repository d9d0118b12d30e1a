"""Any checkpoint directory of a supported family, as mlmkit or transformers (or sentence-transformers)
wrote it: what
it is, described as a run (the mlmkit.json it would have), so that export, evaluation and serving
treat it like an mlmkit run.

What a directory is comes from, in order: ``--task``; its own mlmkit.json (a pretraining run is a
model of the masked-LM task, registry.masked_lm_task: the built-in fill-mask); every registered task
asked (``from_hf``) whether the checkpoint is one of its models — classification takes
BertForSequenceClassification, tagging BertForTokenClassification, qa BertForQuestionAnswering,
embedding a BertModel or a sentence-transformers layout, rerank a causal LM whose tokenizer has "yes" and
"no" (a yes/no judge: Qwen3-Reranker) — of which exactly one must answer, except
that a masked LM (config.json's ``architectures``, read as BERT's names whatever the family:
RobertaForMaskedLM is BertForMaskedLM) that no task claims is the masked-LM task's.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from mlmkit.errors import ConfigError
from mlmkit.files import parse_json
from mlmkit.models.config import ModelConfig
from mlmkit.registry import masked_lm_task, task_of, tasks
from mlmkit.rundir.checkpoint import read_run_meta
from mlmkit.rundir.meta import RunMeta
from mlmkit.rundir.weights import weights_digest

MASKED_LM = ("BertForMaskedLM", "BertForPreTraining")
DEFAULT_MAX_LENGTH = 512


def describe(d: Path, config: ModelConfig, task: str | None = None) -> RunMeta:
    """The run description of a checkpoint directory (its task, labels, max length, options, task
    state ...), with ``source`` saying where it came from (path, name, a hash of its weights). A
    pretraining run keeps its task, "pretraining": registry.task_of reads it as the masked-LM task."""
    source = {"path": str(d.resolve()), "name": d.resolve().name, "weights_sha256": weights_digest(d)}
    if (d / "mlmkit.json").exists():
        own = read_run_meta(d, config)
        if task is None or task_of(task).name == task_of(own.task).name:
            return replace(own, source={**source, "format": "mlmkit"})
    source["format"] = "sentence-transformers" if (d / "modules.json").exists() else "transformers"
    archs = list(config.architectures or [])
    claims = {n: info for n, p in sorted(tasks().items())
              if (info := p.from_hf(config, d)) is not None} if task is None else {}
    if task is None and set(archs) & set(MASKED_LM) and not claims:  # a masked LM no task claims
        task = masked_lm_task().name
    if task is not None:
        plugin = task_of(task)
        info = plugin.from_hf(config, d) or {}
        name = plugin.name
    else:
        if len(claims) != 1:
            known = ", ".join(sorted(tasks()))
            found = f"config.json's architectures: {', '.join(archs) or 'none'}"
            if not claims:
                raise ConfigError(f"{d}: cannot tell which task this checkpoint is for ({found})",
                                  f"pass --task, one of: {known}")
            raise ConfigError(f"{d} could be a model of {' or '.join(claims)} ({found})",
                              f"pass --task, one of: {known}")
        (name, info), = claims.items()
    labels = info.get("labels")
    # it has no labels
    if labels is None and config.id2label and task is not None and not task_of(task).masked_lm:
        labels = [config.id2label[i] for i in sorted(config.id2label)]
    return RunMeta(task=name, labels=tuple(labels) if labels is not None else None,
                   max_length=int(info.get("max_length") or default_max_length(d, config)),
                   options=dict(info.get("options") or {}), task_state=dict(info.get("task_state") or {}),
                   source=source)


def default_max_length(d: Path, config: ModelConfig) -> int:
    """The tokenizer's model_max_length (tokenizer_config.json) when it is a real limit, else 512,
    never more than the model's positions."""
    limit = DEFAULT_MAX_LENGTH
    tc = d / "tokenizer_config.json"
    if tc.is_file():
        try:
            m = parse_json(tc.read_text(encoding="utf-8")).get("model_max_length")
        except (ValueError, AttributeError):
            m = None
        if isinstance(m, int) and 0 < m < 1_000_000:  # transformers writes a huge number for "no limit"
            limit = m
    return min(limit, config.max_tokens)
