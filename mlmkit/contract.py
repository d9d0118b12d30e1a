"""The task contract: what a task plugin provides (``Task``, required) and may provide
(``TaskDefaults``, each member with a default), its options (``TaskOption``), the context its hooks
see (``TaskContext``), and the feature keys and output axes the core reads.

Plugin authors import these names from ``mlmkit.registry`` (or ``mlmkit.taskkit``), the public paths;
this module is where they are declared. The registry (mlmkit/registry.py) wraps each task in a
``Plugin`` and finds tasks through entry points.

How data flows through a task (docs/plugins.md walks through writing one):

    read(path) / from_input(item)  -> examples   plain dicts, the task's own keys
    featurize(examples, tok, ctx)  -> features   input_ids, token_type_ids, "example" (the index of
                                                 the example it came from), the label_names when
                                                 training, anything postprocess needs
    the model (torch or onnxruntime) -> outputs   {name: array per feature}, named and shaped as
                                                 ``outputs`` declares
    postprocess(outputs, ...)      -> predictions one JSON-able dict per example
    compute_metrics(predictions, examples, ctx) -> {metric: value}

Signatures name these dicts by their role (``Input``, ``Example``, ``Feature``, ``Prediction``,
``Metrics``, and ``TaskState``, ``Options``, ``HFConfig``, ``CheckpointInfo`` for the hooks' other
results): they are plain dicts, each alias below says what it holds.

This module, and everything a task runs at inference time (read, from_input, featurize,
postprocess, compute_metrics and the optional hooks but build_model / export_module), must not
import torch: the onnxruntime runtime calls them. Tasks import torch inside build_model only (a head
is a module-level class in a module of its own, which build_model imports).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypedDict, runtime_checkable

from mlmkit.errors import ConfigError, DataFormatError

EXAMPLE = "example"
"""Feature key: the index, in the list given to featurize, of the example a feature belongs to."""
TRUNCATED = "truncated"
"""Feature key: True when featurize cut its example to the max length (results say so to the user)."""
DISTINCT = "distinct"
"""Training feature key of a task with group_features: no two features of a batch should share its
value (the embedding task's text hash: a text twice in a batch would be its own false negative); an
example that would bring a second one goes to a later batch, and the log counts them."""
BATCH = "batch"
"""Output axis: one entry per feature of the batch (always axis 0)."""
SEQUENCE = "sequence"
"""Output axis: one entry per token; results are trimmed to each feature's own length."""
LABEL = "label"
"""Output axis: one entry per label of the run (ctx.labels); bundles are checked to have as many."""

Example = dict[str, Any]
"""One input of a task, a plain dict of the task's own keys: what ``read`` gives per record (with the
gold labels) and ``from_input`` per runtime input."""
Feature = dict[str, Any]
"""One model input that ``featurize`` makes of an example: input_ids, token_type_ids, EXAMPLE, the
label_names when training, and anything ``postprocess`` needs."""
Prediction = dict[str, Any]
"""One JSON-able prediction per example, the task's own keys (``postprocess``): what inference returns,
writes and serves, and what ``compute_metrics`` and ``summary`` read."""
Metrics = dict[str, Any]
"""Metric name -> value (``compute_metrics``, an evaluation, a run's best and final figures): the
declared ``metrics`` are numbers; more keys may hold a group of numbers (a dict), a list or names (a
confusion matrix and its labels)."""
TaskState = dict[str, Any]
"""What a task derived from data, by name (``fit_state``, ``calibrate``): JSON-able, saved with the
model (mlmkit.json "task_state") and read back as ``TaskContext.state``."""
Options = dict[str, Any]
"""Task option values by option name: as given (a typed value, or the text of ``--option NAME=VALUE``,
which ``TaskOption.parse`` converts), resolved (every declared option, ``Plugin.resolve_options``) or
saved with a model (mlmkit.json "options")."""
Input = str | dict[str, Any]
"""One runtime input as the user gives it (a line or record of --input, an item of a request body, an
element of a Pipeline call's list): a text, or a record of the task's fields; ``from_input`` makes an
example of it."""
HFConfig = dict[str, Any]
"""Keys of a Hugging Face config.json (``hf_config``: what a fine-tuned run writes beside id2label)."""


class CheckpointInfo(TypedDict, total=False):
    """What ``from_hf`` reads off a Hugging Face checkpoint of its task, each key optional."""

    labels: list[str] | None
    options: Options
    task_state: TaskState
    max_length: int


# ---- options and context -----------------------------------------------------------------------
@dataclass(frozen=True)
class TaskOption:
    """A setting of a task, given on the command line as ``--option name=value`` (or ``--name value``).

    The type is the default's (bool, int, float or str) unless ``value_type`` says otherwise. A
    ``fixed`` option is built into the model (its head, its graph): it is set when a model is
    fine-tuned or exported, and a saved model refuses another value. An option that is not ``saved``
    is a setting of one call (a file to write, how to search): never kept in a run or bundle.

    ``flags``: the option's own command-line flags besides ``--option NAME=VALUE`` (click's
    declarations: ``("--doc-stride",)``, ``("--normalize/--no-normalize",)`` for a bool, aliases after
    the first); the commands that run the task take them (docs/plugins.md says which). An
    ``evaluation`` option is a setting of evaluation only: its flag is on `mlmkit evaluate` alone."""

    name: str
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    value_type: type | None = None
    fixed: bool = False
    saved: bool = True
    flags: tuple[str, ...] = ()
    evaluation: bool = False

    @property
    def kind(self) -> type:
        return self.value_type or type(self.default)

    @property
    def flag(self) -> str:
        """How the command line spells this option: its first flag, else ``--option NAME=VALUE`` (the
        one spelling every option has)."""
        return self.flags[0].split("/")[0] if self.flags else f"--option {self.name}=VALUE"

    def parse(self, value: Any) -> Any:
        """``value`` (a string from the command line, or a typed value) checked and converted."""
        kind = self.kind
        if isinstance(value, str) and kind is not str:
            value = _from_string(value, kind)
        ok = isinstance(value, kind) and (kind is bool) == isinstance(value, bool)  # bool is an int too
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            problem = f"expects {'true or false' if kind is bool else f'a value of type {kind.__name__}'}"
        elif isinstance(value, float) and not math.isfinite(value):
            problem = "expects a finite number"
        elif self.choices is not None and value not in self.choices:
            problem = f"must be one of: {', '.join(map(str, self.choices))}"
        elif self.minimum is not None and value < self.minimum:
            problem = f"must be at least {self.minimum:g}"
        elif self.maximum is not None and value > self.maximum:
            problem = f"must be at most {self.maximum:g}"
        else:
            return value
        raise ConfigError(f"task option {self.flag} {problem}, got {value!r}", self.help)


def _from_string(text: str, kind: type) -> Any:
    s = text.strip()
    if kind is bool:
        return {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}.get(s.lower(),
                                                                                                   text)
    try:
        return kind(s)
    except ValueError:
        return text


@dataclass(frozen=True)
class TaskContext:
    """What a task's hooks see of the model they serve.

    ``labels``: the label list of the run (config.json's id2label), None for label-free tasks;
    ``options``: every declared option, resolved; ``state``: what ``fit_state`` and ``calibrate``
    returned, saved with the model (mlmkit.json "task_state") and read back with it; ``tokenizer``: the
    tokenizer of the model (a ``tokenizers.Tokenizer``), for a hook that turns token ids back into text
    or needs a special token's id (the prediction loop, export and the places fine-tuning and evaluation
    build a model set it; None where no hook needs it)."""

    max_length: int
    options: Mapping[str, Any] = field(default_factory=dict)
    labels: tuple[str, ...] | None = None
    state: Mapping[str, Any] = field(default_factory=dict)
    tokenizer: Any = field(default=None, compare=False, repr=False)

    def with_state(self, update: Mapping[str, Any]) -> TaskContext:
        return replace(self, state={**self.state, **update}) if update else self


# ---- the contract ------------------------------------------------------------------------------
@runtime_checkable
class Task(Protocol):
    """What every task provides. Features, outputs and predictions are plain Python / numpy."""

    name: str
    """The registered name (must equal the entry-point name); runs and bundles record it."""
    description: str
    metrics: tuple[str, ...]
    """Keys of ``compute_metrics``; the first is the main one (best model, early stopping)."""
    outputs: dict[str, tuple[str, ...]]
    """The model's outputs and the names of their axes, e.g. {"probabilities": (BATCH, "label")}:
    axis 0 is BATCH; SEQUENCE at axis 1 makes an output per token. Exported graphs have exactly these."""

    def read(self, path: Path, options: Mapping[str, Any]) -> list[Example]:
        """Labelled examples of a data file; DataFormatError (file, line, field) on bad input. Two
        keywords are optional: ``training`` (True for --train, False otherwise), for a task whose
        training and evaluation data differ in one source (a BEIR directory's train and test splits),
        and ``max_bytes``, the record ceiling the user gave (--max-record-bytes), to pass to the kit's
        readers: a task without it reads with their default, MAX_RECORD_BYTES."""

    def featurize(self, examples: list[Example], tokenizer: Any, ctx: TaskContext, *,
                  training: bool) -> list[Feature]:
        """Model features (see the module docstring), at most ``ctx.max_length`` tokens each; long
        inputs may become several features. With ``training`` the label_names keys are filled."""

    def build_model(self, config: Any, ctx: TaskContext) -> Any:
        """The torch module for this config (a ModelConfig) and these options: Hugging Face parameter
        names (bert.* for the encoder); forward(input_ids, attention_mask, token_type_ids, **labels)
        returns a dict with the ``outputs`` and, given labels, "loss". A module may also define
        ``derived_weights(sd) -> sd``: the weights it derives from a checkpoint's where the checkpoint
        lacks them, which every load of weights into it goes through (rundir/checkpoint.load_weights;
        the rerank task's classifier from a causal LM's answer-token rows)."""

    def postprocess(
        self, outputs: dict[str, list[Any]], features: list[Feature], examples: list[Example],
        ctx: TaskContext
    ) -> list[Prediction]:
        """One JSON-able prediction per example from the outputs of each feature (numpy)."""

    def compute_metrics(self, predictions: list[Prediction], examples: list[Example],
                        ctx: TaskContext) -> Metrics:
        """The ``metrics`` (floats) of predictions against the examples' gold labels; may add more keys."""


class TaskDefaults:
    """The optional members of a task, with the value a task gets when it leaves one out."""

    formats: tuple[str, ...] = ()
    """Data formats ``read`` accepts, for `mlmkit tasks`, e.g. ("csv", "jsonl")."""
    options: tuple[TaskOption, ...] = ()
    """Settings of the task; resolved values reach every hook as ``ctx.options`` (and ``read``)."""
    label_names: tuple[str, ...] = ("labels",)
    """Feature keys that are training targets, passed to the model's forward by these names."""
    hf_architecture: str = "BertModel"
    """config.json's architectures entry of a fine-tuned run, e.g. "BertForSequenceClassification"."""
    default_max_length: int = 128
    """Tokens per input when fine-tuning is given no --max-length."""
    greater_is_better: bool = True
    """Whether a larger main metric is better."""
    trainable: bool = True
    """Whether `mlmkit finetune` trains this task (False: it is exported and served as it comes)."""
    command: str | None = None
    """The inference command that serves bundles of this task besides `mlmkit predict` (e.g. "classify")."""
    fresh_head_lr: float | None = None
    """The peak learning rate of this task's head when it starts fresh (not carried over from the base)
    and fine-tuning is given no --head-lr (colbert: its new projection); None: --lr."""
    partial_layers: int = 0
    """Trailing encoder layers that ``export_module`` computes for a few positions only (the fusion
    check does not expect their attention to fuse)."""
    group_features: bool = False
    """Keep the features of one example together in training batches (multiple choice, listwise
    ranking: a loss over an example's features). A batch then holds whole examples (one example with
    more features than --batch-size is a batch of its own), and the model's forward also gets
    ``example``: int64 [batch], the example of each feature numbered 0, 1, ... within the batch."""
    base_heads: tuple[str, ...] = ()
    """Prefixes of a base model's head weights this task's model takes over besides the encoder (the
    SPLADE task: the masked-LM head, "cls.predictions."); fine-tuning refuses a base without them."""
    kept_heads: tuple[str, ...] = ()
    """Prefixes of a base model's module weights this task's model takes over where the base has them
    (the embedding task: a sentence-transformers model's Dense layers after pooling, "dense."; the
    rerank task: a causal LM's head, "lm_head.", which its answer tokens make the classifier of)."""
    top_k_option: str | None = None
    """The option `mlmkit export --top-k` sets for this task (the SPLADE task: "max_terms", fill-mask:
    "candidates"); None: the flag is refused for it."""
    masked_lm: bool = False
    """Whether this task is what a masked LM is exported and served as when no other task claims it: a
    pretraining run, a BertForMaskedLM or BertForPreTraining checkpoint (the built-in fill-mask). At
    most one registered task says so."""
    pipeline_tag: str = "feature-extraction"
    """The Hugging Face Hub's pipeline tag of this task's models, for the model card (e.g.
    "text-classification", "token-classification", "question-answering", "sentence-similarity")."""

    def from_input(self, item: Input, options: Mapping[str, Any]) -> Example:
        """An example from one runtime input: a text becomes {"text": item}; a record must have a "text"."""
        if isinstance(item, str):
            return {"text": item}
        if isinstance(item, dict) and isinstance(item.get("text"), str):
            return dict(item)
        have = ", ".join(item) if isinstance(item, dict) else type(item).__name__
        raise DataFormatError("<input>", f"expected a text or a record with a 'text' field, got: {have}",
                              field="text")

    def label_list(self, examples: list[Example]) -> list[str] | None:
        """Labels found in training data (saved as config.json's id2label); None: a label-free task."""
        return None

    def fit_state(self, examples: list[Example]) -> TaskState:
        """Settings derived from the training examples, saved with the model (ctx.state)."""
        return {}

    def calibrate(
        self, outputs: dict[str, list[Any]], features: list[Feature], examples: list[Example],
        ctx: TaskContext
    ) -> TaskState:
        """Decision settings tuned on fine-tuning's evaluation set (never on test data), saved with
        the model (ctx.state), e.g. QA's null-score threshold."""
        return {}

    def main_metric(self, ctx: TaskContext) -> str | None:
        """The metric that picks the best model and stops training early, for these options (a task
        whose options change what it measures); None: the first of ``metrics``."""
        return None

    def hf_config(self, ctx: TaskContext) -> HFConfig:
        """Keys config.json of a fine-tuned run gets beside id2label, so transformers reads it the same
        way, e.g. {"problem_type": "multi_label_classification"}."""
        return {}

    def run_files(self, config: Any, ctx: TaskContext) -> dict[str, str]:
        """Files a fine-tuned run directory gets beside the Hugging Face ones: {relative path: text},
        so another library reads the run as its own (the embedding task's sentence-transformers
        modules.json, 1_Pooling/config.json, ...)."""
        return {}

    def from_hf(self, config: Any, directory: Path) -> CheckpointInfo | None:
        """Whether a Hugging Face checkpoint directory (its config, a ModelConfig) is a model of this task,
        and if so its run description (CheckpointInfo): {"labels", "options", "task_state", "max_length"},
        each optional. None (the default): not this task's. `mlmkit export DIR` asks every task; `--task` asks
        one."""
        return None

    def export_module(self, model: Any) -> Any:
        """The module to export instead of the model: same inputs and outputs, written for inference.
        Export checks it against the model's own forward."""
        return model

    def summary(self, prediction: Prediction) -> dict[str, str]:
        """Columns of the terminal table for one prediction (JSON output is the prediction itself)."""
        return {k: _cell(v) for k, v in prediction.items() if isinstance(v, (str, int, float, bool))}


def _cell(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


# the members, read off the two classes above (never a list kept in step by hand)
REQUIRED = (*Task.__annotations__,
            *(k for k, v in vars(Task).items() if callable(v) and not k.startswith("_")))
OPTIONAL = tuple(k for k in vars(TaskDefaults) if not k.startswith("_"))


def per_token(axes: Sequence[str]) -> bool:
    """Whether an output with these axes has one entry per token (axis 1 is SEQUENCE)."""
    return len(axes) > 1 and axes[1] == SEQUENCE
