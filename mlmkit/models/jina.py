"""jina-embeddings-v3 (as Hugging Face's JinaEmbeddingsV3Model; Sturua et al. 2024, "jina-embeddings-v3:
Multilingual Embeddings With Task LoRA"): XLM-RoBERTa with rotary positions and per-task LoRA adapters.

The post-LN rotary encoder of models/rotary_bert.py with:
- a fused ``mixer.Wqkv`` and ``mixer.out_proj`` with biases, the layer norms ``norm1`` and ``norm2``;
- a plain MLP ``fc1``, GELU, ``fc2`` with biases;
- XLM-R's embeddings without the position table: words, one token type (its row added everywhere;
  the graphs take no token_type_ids) and the LayerNorm ``emb_ln`` beside them, under ``roberta.``;
- rotary positions at base 20,000 by default, as transformers' ``rope_parameters`` say (rope types
  "default", "linear", "dynamic"; models/rotary.py's ``rope_config``; the original config's
  ``rotary_emb_base`` where it names none);
- XLM-R's heads: ``lm_head`` (dense, GELU, layer_norm, the decoder tied to the word embeddings, its
  bias ``lm_head.bias``), the sequence head ``classifier.dense`` + tanh + ``classifier.out_proj`` on
  <s>, the token ``classifier`` and the span ``qa_outputs``.

The task adapters. jina-embeddings-v3 adapts every linear layer and embedding table with one LoRA
per task (``lora_adaptations``: retrieval.query, retrieval.passage, separation, classification,
text-matching), each W + lora_alpha / lora_rank * B A; its own code picks the task per call, and
transformers' JinaEmbeddingsV3Model has no adapters at all (its checkpoints hold the base weights).
mlmkit's encoder runs one task: the adapter of the task config.json names in ``lora_task`` is
merged into the weights it adapts when the checkpoint is loaded (``fold_weights``), so the model,
its fine-tuning and its exported graph are the plain encoder's, at its cost, and a run saved
afterwards holds the merged weights under transformers' names (transformers loads it and computes
the same). Without ``lora_task`` the base weights run, as jina's own model does without a task
and as transformers does. The adapters are read from the layout jina's checkpoints store them in
(torch parametrizations: ``<layer>.parametrizations.weight.original`` the base weight,
``.parametrizations.weight.0.lora_A`` / ``lora_B`` the adapters of every task stacked, linear
layers' as (tasks, rank, in) / (tasks, out, rank), embeddings' as (tasks, rows, rank) /
(tasks, rank, size)). Merging at load rather than selecting per call keeps the one-task-per-model
contract every other family has (a bundle is one model, its graph one set of weights); a second
task is a second bundle of the same checkpoint with another ``lora_task``.

jina's published checkpoint (jinaai/jina-embeddings-v3) names its model_type "xlm-roberta": its keys
(``lora_adaptations``) claim it for this family (``claims``), and a run made from it names
"jina_embeddings_v3", the transformers model type of the same model.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from mlmkit.errors import ConfigError
from mlmkit.models.config import ModelConfig, StateDict
from mlmkit.models.roberta import Roberta
from mlmkit.models.roberta import family as roberta_family
from mlmkit.models.rotary import Rope, rope_config
from mlmkit.models.rotary_bert import PlainMLP, RotaryBert, layer_renames
from mlmkit.registry import HFConfig
from mlmkit.text.tokenizer import ANGLES

DEFAULT_THETA = 20_000.0
LAYER_NAMES = {
    "attention.qkv": "mixer.Wqkv", "attention.out": "mixer.out_proj", "attn_norm": "norm1",
    "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2", "mlp_norm": "norm2",
}
# jina's adapted layers as torch parametrizations store them -> the layer's weight and its adapters
PARAMETRIZED = re.compile(r"\.parametrizations\.weight\.(original|0\.lora_A|0\.lora_B)$")
AS_PLAIN = {"original": ".weight", "0.lora_A": ".lora_A", "0.lora_B": ".lora_B"}


def _lora(config: ModelConfig) -> tuple[list[str], float, str | None]:
    """(the tasks, the adapters' scale lora_alpha / lora_rank, the task to merge or None), checked."""
    tasks = config.extra.get("lora_adaptations") or []
    task = config.extra.get("lora_task")
    if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
        raise ConfigError(f"config lora_adaptations must be a list of task names, got {tasks!r}",
                          "fix the config.json")
    if task is not None and task not in tasks:
        raise ConfigError(f"config lora_task {task!r} is not one of lora_adaptations {tasks}",
                          "name one of lora_adaptations, or leave lora_task out for the base weights")
    rank, alpha = config.extra.get("lora_rank", 4), config.extra.get("lora_alpha", 1)
    for key, v in (("lora_rank", rank), ("lora_alpha", alpha)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < float("inf"):
            raise ConfigError(f"config {key} must be a positive number, got {v!r}", "fix the config.json")
    return tasks, alpha / rank, task


def merge_adapter(name: str, weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, task: int,
                  scale: float) -> torch.Tensor:
    """``weight`` with the ``task``-th adapter merged: W + scale * B A for a linear layer (A (tasks,
    rank, in), B (tasks, out, rank)), W + scale * A B for an embedding table (A (tasks, rows, rank),
    B (tasks, rank, size)), computed in float32 as jina's parametrization does (in the weights' dtype)."""
    embedding = ".embeddings." in name
    delta = a[task].float() @ b[task].float() if embedding else b[task].float() @ a[task].float()
    if delta.shape != weight.shape:
        raise ConfigError(f"the LoRA adapter of {name} makes a {tuple(delta.shape)} update for a "
                          f"{tuple(weight.shape)} weight",
                          "the checkpoint's adapters are not jina-embeddings-v3's layout")
    return (weight.float() + scale * delta).to(weight.dtype)


class Jina(RotaryBert):
    name = "jina_embeddings_v3"
    model_types = ("jina_embeddings_v3",)
    class_prefixes = {"jina_embeddings_v3": "JinaEmbeddingsV3"}
    prefix = "roberta"
    bare_roots = ("embeddings", "emb_ln", "encoder", "pooler")
    # JinaEmbeddingsV3Config's defaults where the core's readers default otherwise (not the sizes)
    config_defaults = {"vocab_size": 250002, "max_position_embeddings": 8194, "type_vocab_size": 1,
                       "layer_norm_eps": 1e-5,
                       "pad_token_id": 1}
    renames = (
        *layer_renames("roberta.encoder.layers.{n}", LAYER_NAMES),
        ("bert.embeddings.LayerNorm", "roberta.emb_ln"),
        *Roberta.renames,  # the MLM head lm_head.*, the backbone roberta.*
    )
    # measured (a 2-layer graph of each head): the residual adds + LayerNorms fuse, two a layer, and fc1's
    # bias + GELU (BiasGelu, an activation the config may change); the attention does not (rotary)
    fusions: dict[str, int] = {"SkipLayerNormalization": 2}
    tokenizer_kind = "unigram"  # XLM-R's SentencePiece tokens and pair framing (it does not pretrain here)
    special_tokens = ANGLES.tokens

    def claims(self, config: HFConfig) -> bool:
        """jina's published checkpoint: model_type "xlm-roberta" with the task adapters' keys."""
        return config.get("model_type") == "xlm-roberta" and "lora_adaptations" in config

    def rope(self, config: ModelConfig) -> Rope:
        extra = config.extra
        if (not extra.get("rope_parameters") and not extra.get("rope_scaling")
            and extra.get("rotary_emb_base") is not None):
            extra = {**extra, "rope_theta": extra["rotary_emb_base"]}
        return rope_config(extra, family=self.name, head_dim=config.head_dim,
                           max_positions=config.max_position_embeddings,
                           default_theta=DEFAULT_THETA)

    def mlp(self, config: ModelConfig) -> nn.Module:
        return PlainMLP(config)

    def mlm_act(self, config: ModelConfig) -> str:
        return "gelu"  # XLMRobertaLMHead calls gelu whatever hidden_act says

    def check(self, config: ModelConfig) -> None:
        _lora(config)
        super().check(config)

    def head_renames(self, keys: set[str], *, to_family: bool) -> tuple[tuple[str, str], ...]:
        # the sequence head's classifier.dense / out_proj
        return roberta_family.head_renames(keys, to_family=to_family)

    def from_family(self, sd: StateDict) -> StateDict:
        """As the base class, after jina's parametrized layout (``<layer>.parametrizations.weight.*``)
        is read as the layer's ``weight`` and its ``lora_A`` / ``lora_B`` (merged by ``fold_weights``)."""
        return super().from_family({PARAMETRIZED.sub(lambda m: AS_PLAIN[m.group(1)], k): v
                                    for k, v in sd.items()})

    def fold_weights(self, config: ModelConfig, sd: StateDict) -> StateDict:
        """The checkpoint's adapters (``<layer>.lora_A`` / ``lora_B``, mlmkit's names) gone: the
        ``lora_task``'s merged into each adapted weight, or none without a task (the base weights)."""
        adapted = sorted(k[: -len(".lora_A")] for k in sd if k.endswith(".lora_A"))
        if not adapted:
            return sd
        tasks, scale, task = _lora(config)
        out = {k: v for k, v in sd.items() if not k.endswith((".lora_A", ".lora_B"))}
        if task is None:
            return out
        for layer in adapted:
            a, b, w = sd[layer + ".lora_A"], sd.get(layer + ".lora_B"), sd.get(layer + ".weight")
            if b is None or w is None or a.size(0) != len(tasks) or b.size(0) != len(tasks):
                raise ConfigError(f"the LoRA adapters of {layer} are not one a task of lora_adaptations "
                                  f"({len(tasks)}) with its weight",
                                  "the checkpoint's adapters are not jina-embeddings-v3's layout")
            out[layer + ".weight"] = merge_adapter(layer, w, a, b, tasks.index(task), scale)
        return out


family = Jina()
