"""NomicBERT (nomic-embed-text-v1 / v1.5, nomic-bert-2048; as Hugging Face's NomicBertModel; Nussbaum
et al. 2024, "Nomic Embed: Training a Reproducible Long Context Text Embedder").

The post-LN rotary encoder of models/rotary_bert.py with:
- a fused ``Wqkv`` and ``out_proj`` without biases, the layer norms ``norm1`` and ``norm2``;
- a SwiGLU MLP without biases: silu(``fc12`` x) * ``fc11`` x, then ``fc2``;
- BERT's token types (two; the graphs take token_type_ids) and the embeddings' LayerNorm ``emb_ln``
  beside the embeddings, under ``nomic_bert.`` in the heads;
- BERT's heads (``cls.predictions`` with the transform's norm ``layer_norm`` and the activation
  hidden_act, silu by default; ``nomic_bert.pooler`` + ``classifier``; the token ``classifier``).
  transformers has no span (QA) head for NomicBERT: mlmkit's qa task puts its ``qa_outputs`` on
  the encoder.

Rotary positions, base 1,000 by default: transformers' ``rope_parameters`` (rope types "default",
"linear", "dynamic"; models/rotary.py's ``rope_config``), and the keys of NomicBERT's own configs
(the published checkpoints' config.json, model_type nomic_bert as well), which transformers 5
ignores: ``rotary_emb_base`` (the base where no ``rope_parameters`` names one),
``rotary_emb_fraction`` (a partial rotary: the first fraction of each head's dimensions turn),
``rotary_emb_interleaved`` (dimensions 2i and 2i + 1 turn together) and ``rotary_scaling_factor``
(the dynamic NTK scaling beyond ``max_trained_positions``, NomicBERT's long-context setting). mlmkit
computes what these keys say, as NomicBERT's own code does; the published checkpoints hold them at
the values transformers assumes (base 1,000, the whole head, half-split, no scaling), where both
agree. Of the original layout's other keys, those that would make another model than transformers'
(a pre-LN or parallel block, biases, RMSNorm, sizes that disagree with the transformers fields) are
refused with a clear line.

`mlmkit pretrain --arch nomic_bert` makes a nomic-bert-2048 kind of model: BERT's WordPiece tokens and
two token types, SwiGLU, base 1,000, 2,048 positions (no table to grow).
"""

from __future__ import annotations

from torch import nn

from mlmkit.errors import ConfigError
from mlmkit.models.config import ModelConfig
from mlmkit.models.rotary import Rope, rope_config
from mlmkit.models.rotary_bert import GatedMLP, RotaryBert, layer_renames
from mlmkit.registry import HFConfig

DEFAULT_THETA = 1000.0
LAYER_NAMES = {
    "attention.qkv": "attn.Wqkv", "attention.out": "attn.out_proj", "attn_norm": "norm1",
    "mlp.up": "mlp.fc11", "mlp.gate": "mlp.fc12", "mlp.down": "mlp.fc2", "mlp_norm": "norm2",
}
# the original layout's sizes (GPT-2 names) and the transformers fields they must agree with
ORIGINAL_SIZES = {"n_embd": "hidden_size", "n_head": "num_attention_heads", "n_layer": "num_hidden_layers",
                  "n_inner": "intermediate_size", "layer_norm_epsilon": "layer_norm_eps"}
# the original layout's switches of other blocks than transformers' NomicBERT has: refused when on
OTHER_BLOCKS = {"prenorm": "a pre-LN block", "parallel_block": "a parallel block",
                "qkv_proj_bias": "biases in Wqkv",
                "mlp_fc1_bias": "biases in fc11 / fc12", "mlp_fc2_bias": "a bias in fc2",
                "use_rms_norm": "RMSNorm",
                "causal": "causal attention"}
GATED = {"swiglu": "silu", "geglu": "gelu"}  # activation_function -> the gate's hidden_act


def _original_layout(config: ModelConfig) -> None:
    """Refuse the original layout's keys that say another model than the one the transformers fields make."""
    for key, field in ORIGINAL_SIZES.items():
        v = config.extra.get(key)
        if v is not None and v != getattr(config, field):
            raise ConfigError(f"config {key} {v!r} (NomicBERT's original layout) is not {field} "
                              f"{getattr(config, field)!r}",
                              f"state the size as {field} too, as transformers' NomicBertConfig reads it")
    on = [what for key, what in OTHER_BLOCKS.items() if config.extra.get(key)]
    if on:
        raise ConfigError(f"NomicBERT with {on[0]} is not supported",
                          "mlmkit runs transformers' NomicBERT: post-LN, no biases, LayerNorm")
    act = config.extra.get("activation_function")
    if act is not None and GATED.get(act) != config.hidden_act:
        raise ConfigError(f"config activation_function {act!r} with hidden_act {config.hidden_act!r} is not "
                          "supported for nomic_bert",
                          "mlmkit runs NomicBERT's gated MLP: activation_function 'swiglu' with hidden_act "
                          "'silu' (or 'geglu' with 'gelu')")


def _flag(config: ModelConfig, key: str) -> bool:
    v = config.extra.get(key, False)
    if not isinstance(v, bool):
        raise ConfigError(f"config {key} must be true or false, got {v!r}", "fix the config.json")
    return v


def nomic_rope(config: ModelConfig) -> Rope:
    """The rotary of a NomicBERT config: transformers' keys, with NomicBERT's own over them (above)."""
    extra: HFConfig = dict(config.extra)
    if (not extra.get("rope_parameters") and not extra.get("rope_scaling")
        and extra.get("rotary_emb_base") is not None):
        extra["rope_theta"] = extra["rotary_emb_base"]
    rope = rope_config(extra, family="nomic_bert", head_dim=config.head_dim,
                       max_positions=config.max_position_embeddings,
                       default_theta=DEFAULT_THETA)
    fraction = extra.get("rotary_emb_fraction", 1.0)
    number = isinstance(fraction, int | float) and not isinstance(fraction, bool) and 0 < fraction <= 1
    dim = int(config.head_dim * fraction) if number else 0
    if dim < 2 or dim % 2:
        raise ConfigError(f"config rotary_emb_fraction must make an even number of rotary dimensions from 2 "
                          f"to the head's "
                          f"{config.head_dim}, got {fraction!r}", "fix the config.json")
    factor = extra.get("rotary_scaling_factor")
    scaling: HFConfig = {}
    if factor is not None:
        if rope.scaling != "default":
            raise ConfigError(f"config rotary_scaling_factor and rope type {rope.scaling!r} both scale the "
                              "rotary",
                              "keep one of them")
        trained = extra.get("max_trained_positions", config.max_position_embeddings)
        if isinstance(factor, bool) or not isinstance(factor, int
                                                      | float) or not factor >= 1 or isinstance(trained,
                                                                                                bool) \
                or not isinstance(trained, int) or trained < 1:
            raise ConfigError(f"config rotary_scaling_factor must be a number of at least 1 (with "
                              f"max_trained_positions a positive "
                              f"integer), got {factor!r} ({trained!r})", "fix the config.json")
        scaling = dict(scaling="dynamic", factor=float(factor), trained=trained)
    elif rope.scaling != "default":
        scaling = dict(scaling=rope.scaling, factor=rope.factor, trained=rope.trained)
    if scaling.get("scaling") == "dynamic" and dim <= 2:
        raise ConfigError(f"dynamic rope scaling needs more than 2 rotary dimensions, got {dim}",
                          "fix the config.json")
    return Rope(rope.theta, dim, _flag(config, "rotary_emb_interleaved"), **scaling)


class NomicBert(RotaryBert):
    name = "nomic_bert"
    model_types = ("nomic_bert",)
    class_prefixes = {"nomic_bert": "NomicBert"}
    prefix = "nomic_bert"
    bare_roots = ("embeddings", "emb_ln", "encoder", "pooler")
    # NomicBertConfig's defaults where the core's readers default otherwise (not the sizes)
    config_defaults = {"vocab_size": 30528, "hidden_act": "silu", "hidden_dropout_prob": 0.0,
                       "attention_probs_dropout_prob": 0.0,
                       "max_position_embeddings": 2048}
    renames = (
        *layer_renames("nomic_bert.encoder.layers.{n}", LAYER_NAMES),
        ("bert.embeddings.LayerNorm", "nomic_bert.emb_ln"),
        ("cls.predictions.transform.LayerNorm", "cls.predictions.transform.layer_norm"),
        ("bert", "nomic_bert"),
    )
    attention_bias = False
    # measured (a 2-layer graph of each head): the residual adds + LayerNorms fuse, two a layer (and the
    # embeddings' token-type add + emb_ln, once); the attention does not (rotary)
    fusions: dict[str, int] = {"SkipLayerNormalization": 2}
    # pretraining: nomic-bert-2048's kind of model (BERT's WordPiece tokens and two token types, the base
    # class's), its rotary base and its context (no table: a new model keeps 2,048 positions)
    pretrains = True
    max_length = 2048

    def preset_extra(self) -> HFConfig:
        return {"rope_parameters": {"rope_type": "default", "rope_theta": DEFAULT_THETA}}

    def rope(self, config: ModelConfig) -> Rope:
        return nomic_rope(config)

    def mlp(self, config: ModelConfig) -> nn.Module:
        return GatedMLP(config, fused=False, down_bias=False)

    def check(self, config: ModelConfig) -> None:
        _original_layout(config)
        super().check(config)


family = NomicBert()
