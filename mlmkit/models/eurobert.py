"""EuroBERT (as transformers' EuroBertModel; Boizard et al. 2025, "EuroBERT: Scaling Multilingual
Encoders for European Languages"): Llama's layer run bidirectionally, 210m / 610m / 2.1b.

What differs from BERT (the blocks are models/prenorm.py's):
- Llama's pre-norm layer: RMSNorm, grouped-query attention (``num_key_value_heads``) with rotary
  positions (rope_parameters' rope_theta, EuroBERT-210m's 250,000), a SwiGLU MLP (gate_proj, up_proj,
  down_proj), biases only where ``attention_bias`` / ``mlp_bias`` say, a final norm; every token sees
  every real token (no causal mask, no window);
- no positions table, token types, embedding norm or dropout;
- the MLM head is ``lm_head`` alone (no transform), with a bias where ``mlp_bias``, its weight the
  token embeddings' where ``tie_word_embeddings`` (EuroBertConfig's default: not tied);
- the sequence head pools by ``classifier_pooling``: "bos" (the first token), "mean", or "late"
  (EuroBertConfig's default: ``dense`` and GELU at every token, the classifier's logits averaged over
  the real tokens, computed here as the classifier of the averaged states, the same up to rounding),
  then ``dense`` + GELU + ``classifier``; the token head a ``classifier`` on every token.
  transformers has no span head for EuroBERT: the qa task trains one under mlmkit's names.

config.json: ``rms_norm_eps``, ``attention_dropout``, ``head_dim`` and ``num_key_value_heads``
(extra sizes; head_dim null: hidden / heads); the hub's remote-code configs name the pooling
``clf_pooling``, which transformers' EuroBertConfig does not read (its default, "late", applies), nor here.
"""

from __future__ import annotations

from mlmkit.errors import ConfigError
from mlmkit.models.config import ModelConfig
from mlmkit.models.prenorm import AttnSpec, PrenormFamily, rope_of
from mlmkit.registry import HFConfig

POOLING = {"bos": "cls", "mean": "mean", "late": "late"}  # classifier_pooling -> BertPooler's pool


class EuroBert(PrenormFamily):
    name = "eurobert"
    model_types = ("eurobert",)
    class_prefixes = {"eurobert": "EuroBert"}
    # EuroBertConfig's defaults where the core's readers default otherwise (the family keys land in
    # ``extra``); not the sizes, which every config.json states and a size preset sets
    config_defaults = {
        "vocab_size": 128256, "hidden_act": "silu", "max_position_embeddings": 8192, "layer_norm_eps": 1e-5,
        "pad_token_id": 128001, "type_vocab_size": 0, "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "classifier_pooling": "late", "tie_word_embeddings": False,
    }
    renames = (
        *PrenormFamily.renames,
        ("cls.predictions.bias", "lm_head.bias"),
        ("cls.predictions.decoder", "lm_head"),
        ("bert.pooler.dense", "dense"),  # EuroBertForSequenceClassification's, beside the classifier
    )
    # measured (`mlmkit export`, 2 and 3 layers, every head): the residual adds with the RMSNorms after
    # them (SkipSimplifiedLayerNormalization, two a layer; the first layer's input norm
    # SimplifiedLayerNormalization, once); not the attention (rotary, grouped heads)
    fusions = {"SkipSimplifiedLayerNormalization": 2}
    # pretraining (`mlmkit pretrain --arch eurobert`, MLM only): EuroBERT's blocks at a preset's size, a
    # byte-level BPE with BERT's special-token names (as ModernBERT's; the releases' Llama-3 tokenizer
    # is not trained here), no position table: a new model keeps 8,192 positions
    pretrains = True
    max_length = 8192
    config_token_ids = {"bos_token_id": "cls", "eos_token_id": "sep", "mask_token_id": "mask"}
    tokenizer_kind = "bpe"

    def spec(self, config: ModelConfig, index: int) -> AttnSpec:
        return AttnSpec(rope_of(config, self.name))

    def mlp_bias(self, config: ModelConfig) -> bool:
        return bool(config.extra.get("mlp_bias", False))

    def check(self, config: ModelConfig) -> None:
        super().check(config)
        pool = config.extra.get("classifier_pooling", "late")
        if pool not in POOLING:
            raise ConfigError(f"config classifier_pooling must be one of {', '.join(map(repr, POOLING))}, "
                              f"got {pool!r}",
                              "fix the config.json")

    # ---- heads -------------------------------------------------------------------------------
    def sequence_pool(self, config: ModelConfig) -> str:
        return POOLING[config.extra.get("classifier_pooling", "late")]

    def pooler_act(self, config: ModelConfig) -> str:
        return "gelu"  # EuroBertForSequenceClassification's nn.GELU(), the exact one

    def mlm_transform(self, config: ModelConfig) -> bool:
        return False

    def decoder_bias(self, config: ModelConfig) -> bool:
        return self.mlp_bias(config)

    def ties_decoder(self, config: ModelConfig) -> bool:
        return bool(config.extra.get("tie_word_embeddings", False))

    def preset_overrides(self, hidden: int, intermediate: int) -> HFConfig:
        # SwiGLU at Llama's ratio (three matrices of 2/3 of the preset's width: its MLP's parameters);
        # pad 0: [PAD]'s id in a tokenizer trained with this family's special tokens
        return {"pad_token_id": 0, "intermediate_size": intermediate * 2 // 3}

    def preset_extra(self) -> HFConfig:
        # one key / value head a query head and hidden / heads dimensions at a preset's sizes, as
        # EuroBertConfig resolves its None; the ids of a tokenizer trained with the family's special
        # tokens ([PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4)
        return {"num_key_value_heads": None, "head_dim": None, "tie_word_embeddings": False,
                "mlp_bias": False,
                "attention_bias": False, "classifier_pooling": "late",
                "rope_parameters": {"rope_type": "default",
                                  "rope_theta": 250_000.0}}


family = EuroBert()
