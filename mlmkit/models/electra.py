"""ELECTRA (as Hugging Face's ElectraModel): BERT's layers, embeddings at ``embedding_size`` projected
to the hidden size (``electra.embeddings_project``), no pooler, no NSP.

Discriminator checkpoints (ElectraForPreTraining) fine-tune like any encoder; the generator's MLM head
(ElectraForMaskedLM: generator_predictions dense to the embedding size, GELU, LayerNorm, then
generator_lm_head tied to the word embeddings) is what fill-mask runs; the sequence head is
classifier.dense + GELU + classifier.out_proj on [CLS].
"""

from __future__ import annotations

from mlmkit.models.config import ExtraSize, Family, ModelConfig
from mlmkit.models.roberta import SEQUENCE_HEAD


class Electra(Family):
    name = "electra"
    model_types = ("electra",)
    class_prefixes = {"electra": "Electra"}
    prefix = "electra"
    bare_roots = ("embeddings", "embeddings_project", "encoder")
    renames = (
        ("bert.embeddings.project", "electra.embeddings_project"),
        ("bert", "electra"),
        ("cls.predictions.transform.dense", "generator_predictions.dense"),
        ("cls.predictions.transform.LayerNorm", "generator_predictions.LayerNorm"),
        ("cls.predictions.bias", "generator_lm_head.bias"),
        ("cls.predictions.decoder", "generator_lm_head"),
    )
    extra_sizes = (ExtraSize("embedding_size"),)

    def embedding_size(self, config: ModelConfig) -> int:
        return int(config.extra.get("embedding_size") or config.hidden_size)

    def pooler_act(self, config: ModelConfig) -> str:
        return "gelu"

    def mlm_act(self, config: ModelConfig) -> str:
        return "gelu"  # ElectraGeneratorPredictions: get_activation("gelu")

    def head_renames(self, keys: set[str], *, to_family: bool) -> tuple[tuple[str, str], ...]:
        seq = {"bert.pooler.dense.weight",
               "classifier.weight"} <= keys if to_family else "classifier.out_proj.weight" in keys
        return SEQUENCE_HEAD if seq else ()


family = Electra()
