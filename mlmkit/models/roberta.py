"""RoBERTa, XLM-RoBERTa and CamemBERT (as Hugging Face's RobertaModel, XLMRobertaModel and
CamembertModel).

What differs from BERT: positions count from padding_idx + 1 over the real tokens (padding keeps
padding_idx), one token type (the embedding is there, the graphs take no token_type_ids), no NSP
(pretraining is MLM only and the run is a *ForMaskedLM), the backbone under ``roberta.``, the MLM head
as ``lm_head.{dense,layer_norm,bias}`` with GELU, and the sequence head as ``classifier.dense`` +
tanh + ``classifier.out_proj`` on <s> (no pooler).
"""

from __future__ import annotations

from mlmkit.models.config import CLS_SEP_IDS, Family, ModelConfig
from mlmkit.text.tokenizer import ANGLES

SEQUENCE_HEAD = (("bert.pooler.dense", "classifier.dense"), ("classifier", "classifier.out_proj"))


class Roberta(Family):
    name = "roberta"
    model_types = ("roberta", "xlm-roberta", "camembert")
    class_prefixes = {"roberta": "Roberta", "xlm-roberta": "XLMRoberta", "camembert": "Camembert"}
    prefix = "roberta"
    config_defaults = {"type_vocab_size": 1, "layer_norm_eps": 1e-5, "pad_token_id": 1,
                       "max_position_embeddings": 514}
    renames = (
        ("cls.predictions.transform.dense", "lm_head.dense"),
        ("cls.predictions.transform.LayerNorm", "lm_head.layer_norm"),
        ("cls.predictions.decoder", "lm_head.decoder"),
        ("cls.predictions.bias", "lm_head.bias"),
        ("bert", "roberta"),
    )
    token_types = False
    positions = "padding_offset"
    pretrains = True
    config_token_ids = CLS_SEP_IDS
    # no EmbedLayerNormalization: the cumulative positions
    fusions = {"Attention": 1, "SkipLayerNormalization": 2}
    tokenizer_kind = "bpe"
    special_tokens = ANGLES.tokens  # <pad> <unk> <s> </s> <mask>, and <s> A </s></s> B </s>

    def mlm_act(self, config: ModelConfig) -> str:
        return "gelu"  # RobertaLMHead calls gelu whatever hidden_act says

    def head_renames(self, keys: set[str], *, to_family: bool) -> tuple[tuple[str, str], ...]:
        seq = {"bert.pooler.dense.weight",
               "classifier.weight"} <= keys if to_family else "classifier.out_proj.weight" in keys
        return SEQUENCE_HEAD if seq else ()


family = Roberta()
