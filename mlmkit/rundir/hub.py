"""Any checkpoint directory of a supported family, as mlmkit or transformers (or sentence-transformers)
wrote it: what
it is, described as a run (the mlmkit.json it would have), so that export, evaluation and serving
treat it like an mlmkit run.

What a directory is comes from, in order: ``--task``; its own mlmkit.json; config.json's
``architectures``, read as BERT's names whatever the family (RobertaForMaskedLM is BertForMaskedLM:
fill-mask, as BertForPreTraining); else every registered task is
asked (``from_hf``) whether the checkpoint is one of its models — classification takes
BertForSequenceClassification, tagging BertForTokenClassification, qa BertForQuestionAnswering,
embedding a BertModel or a sentence-transformers layout. Exactly one must answer.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from mlmkit.errors import ConfigError
from mlmkit.files import parse_json
from mlmkit.models.config import ModelConfig
from mlmkit.registry import get_task, tasks
from mlmkit.rundir.checkpoint import read_run_meta
from mlmkit.rundir.meta import RunMeta
from mlmkit.rundir.weights import weights_digest

FILL_MASK = ("fill-mask", "pretraining")
MASKED_LM = ("BertForMaskedLM", "BertForPreTraining")
DEFAULT_MAX_LENGTH = 512


def describe(d: Path, config: ModelConfig, task: str | None = None) -> RunMeta:
    """The run description of a checkpoint directory (its task, labels, max length, options, task
    state ...), with ``source`` saying where it came from (path, name, a hash of its weights)."""
    source = {"path": str(d.resolve()), "name": d.resolve().name, "weights_sha256": weights_digest(d)}
    if (d / "mlmkit.json").exists():
        own = read_run_meta(d, config)
        if task is None or task == own.task or (task in FILL_MASK and own.task in FILL_MASK):
            return replace(own, source={**source, "format": "mlmkit"})
    source["format"] = "sentence-transformers" if (d / "modules.json").exists() else "transformers"
    archs = list(config.architectures or [])
    claims = {n: info for n, p in sorted(tasks().items()) if (info := p.from_hf(config, d)) is not None} if task is None else {}
    if task in FILL_MASK or (task is None and set(archs) & set(MASKED_LM) and not claims):  # a masked LM no task claims
        return RunMeta(task="pretraining", max_length=default_max_length(d, config), source=source)
    if task is not None:
        info = get_task(task).from_hf(config, d) or {}
        name = task
    else:
        if len(claims) != 1:
            known = ", ".join(["fill-mask", *sorted(tasks())])
            found = f"config.json's architectures: {', '.join(archs) or 'none'}"
            if not claims:
                raise ConfigError(f"{d}: cannot tell which task this checkpoint is for ({found})", f"pass --task, one of: {known}")
            raise ConfigError(f"{d} could be a model of {' or '.join(claims)} ({found})", f"pass --task, one of: {known}")
        (name, info), = claims.items()
    labels = info.get("labels")
    if labels is None and config.id2label and task is not None:
        labels = [config.id2label[i] for i in sorted(config.id2label)]
    return RunMeta(task=name, labels=tuple(labels) if labels is not None else None,
                   max_length=int(info.get("max_length") or default_max_length(d, config)),
                   options=dict(info.get("options") or {}), task_state=dict(info.get("task_state") or {}), source=source)


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
