"""GTE v1.5 (gte-base-en-v1.5, gte-large-en-v1.5, gte-multilingual-base; as Hugging Face's GteModel;
Li et al. 2023, "Towards General Text Embeddings with Multi-stage Contrastive Learning", and Zhang et
al. 2024, "mGTE").

The post-LN rotary encoder of models/rotary_bert.py with:
- a fused ``qkv_proj`` and ``o_proj`` with biases, the layer norms ``attn_ln`` and ``mlp_ln``;
- a gated MLP: one ``up_gate_proj`` (the up rows, then the gate rows; no bias), act(gate) * up,
  dropout, ``down_proj`` with a bias;
- rotary positions at base 160,000 by default, as transformers' ``rope_parameters`` say (rope types
  "default", "linear" and "dynamic" run; models/rotary.py's ``rope_config``);
- embeddings: words, token types where ``type_vocab_size`` says (none in gte-base-en-v1.5, one whose
  row is added everywhere in gte-multilingual-base), LayerNorm, under ``gte.`` in the heads;
- the MLM head ``lm_head`` (dense, GELU whatever hidden_act says, ``norm``, the decoder with its own
  bias, its weight tied to the word embeddings); the sequence head BERT's (``gte.pooler`` on [CLS],
  tanh, ``classifier``), the token head BERT's. transformers has no span (QA) head for GTE: mlmkit's
  qa task puts its ``qa_outputs`` on the encoder, saved under the family's backbone names.

Checkpoints are read and written in the layout transformers saves them, the hub's original ``new``
models' (whose ``new.`` backbone prefix is read as the bare model's, as transformers does):
``gte.encoder.layer.N.attention.qkv_proj`` ..., which transformers splits into q_proj / k_proj /
v_proj (and up_proj / gate_proj) when it loads them. The original configs' own rotary scaling
(``rope_scaling`` of type "ntk") is not one of transformers' rope types and is refused.

`mlmkit pretrain --arch gte` makes a gte-multilingual-base kind of model: XLM-R's SentencePiece
(unigram) tokens and pair framing, one token type, base 160,000, 8,192 positions (no table to grow).
"""

from __future__ import annotations

from torch import nn

from mlmkit.models.config import ModelConfig, StateDict
from mlmkit.models.rotary import Rope, rope_config
from mlmkit.models.rotary_bert import GatedMLP, RotaryBert, layer_renames
from mlmkit.registry import HFConfig
from mlmkit.text.tokenizer import ANGLES

DEFAULT_THETA = 160_000.0
LAYER_NAMES = {
    "attention.qkv": "attention.qkv_proj", "attention.out": "attention.o_proj", "attn_norm": "attn_ln",
    "mlp.up_gate": "mlp.up_gate_proj", "mlp.down": "mlp.down_proj", "mlp_norm": "mlp_ln",
}


class Gte(RotaryBert):
    name = "gte"
    model_types = ("gte",)
    class_prefixes = {"gte": "Gte"}
    prefix = "gte"
    # GteConfig's defaults where the core's readers default otherwise (not the sizes, which every
    # config.json states; a preset's would give way to them)
    config_defaults = {"vocab_size": 250048, "max_position_embeddings": 8192, "type_vocab_size": 1,
                       "pad_token_id": 1,
                       "attention_probs_dropout_prob": 0.0}
    renames = (
        *layer_renames("gte.encoder.layer.{n}", LAYER_NAMES),
        ("cls.predictions.transform.dense", "lm_head.dense"),
        ("cls.predictions.transform.LayerNorm", "lm_head.norm"),
        # the decoder's own bias (no separate one, as in BERT)
        ("cls.predictions.bias", "lm_head.decoder.bias"),
        ("cls.predictions.decoder", "lm_head.decoder"),
        ("bert", "gte"),
    )
    # measured (a 2-layer graph of each head): the residual adds + LayerNorms fuse, two a layer, and GELU
    # does (Gelu, an activation the config may change); the attention does not (the rotary is outside
    # onnxruntime's BERT Attention pattern), nor the embeddings (no position table)
    fusions: dict[str, int] = {"SkipLayerNormalization": 2}
    # pretraining: gte-multilingual-base's kind of model (XLM-R's SentencePiece tokens and pair framing,
    # one token type), its rotary base and its context (no table: a new model keeps 8,192 positions)
    pretrains = True
    max_length = 8192
    config_token_ids = {"bos_token_id": "cls", "eos_token_id": "sep"}
    tokenizer_kind = "unigram"
    special_tokens = ANGLES.tokens

    def preset_extra(self) -> HFConfig:
        return {"rope_parameters": {"rope_type": "default", "rope_theta": DEFAULT_THETA}}

    def rope(self, config: ModelConfig) -> Rope:
        return rope_config(config.extra, family=self.name, head_dim=config.head_dim,
                           max_positions=config.max_position_embeddings,
                           default_theta=DEFAULT_THETA)

    def mlp(self, config: ModelConfig) -> nn.Module:
        return GatedMLP(config, fused=True, down_bias=True, dropout=config.hidden_dropout_prob)

    def mlm_act(self, config: ModelConfig) -> str:
        return "gelu"  # GteLMHead calls gelu whatever hidden_act says

    def from_family(self, sd: StateDict) -> StateDict:
        """As the base class, the hub's original ``new.`` backbone read as the bare one (as transformers'
        conversion drops that prefix)."""
        return super().from_family({k[len("new."):] if k.startswith("new.") else k: v for k, v in sd.items()})


family = Gte()
