"""DistilBERT (as Hugging Face's DistilBertModel): BERT's post-LN layers under other names, no token
types, no pooler, no NSP.

Config keys dim / n_layers / n_heads / hidden_dim / activation / dropout / attention_dropout; every
LayerNorm at eps 1e-12; layers at ``distilbert.transformer.layer.N`` with attention.{q,k,v,out}_lin,
sa_layer_norm, ffn.lin1 / lin2, output_layer_norm; the MLM head vocab_transform + activation +
vocab_layer_norm + vocab_projector; the sequence head pre_classifier + ReLU + classifier on [CLS].
"""

from __future__ import annotations

from mlmkit.models.config import Family, ModelConfig

LAYER = "bert.encoder.layer.{n}"
FAMILY_LAYER = "distilbert.transformer.layer.{n}"


class DistilBert(Family):
    name = "distilbert"
    model_types = ("distilbert",)
    class_prefixes = {"distilbert": "DistilBert"}
    prefix = "distilbert"
    bare_roots = ("embeddings", "transformer")
    config_aliases = {
        "hidden_size": "dim", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
        "intermediate_size": "hidden_dim", "hidden_act": "activation", "hidden_dropout_prob": "dropout",
        "attention_probs_dropout_prob": "attention_dropout",
    }
    config_defaults = {"type_vocab_size": 0, "layer_norm_eps": 1e-12}
    renames = (
        (f"{LAYER}.attention.self.query", f"{FAMILY_LAYER}.attention.q_lin"),
        (f"{LAYER}.attention.self.key", f"{FAMILY_LAYER}.attention.k_lin"),
        (f"{LAYER}.attention.self.value", f"{FAMILY_LAYER}.attention.v_lin"),
        (f"{LAYER}.attention.output.dense", f"{FAMILY_LAYER}.attention.out_lin"),
        (f"{LAYER}.attention.output.LayerNorm", f"{FAMILY_LAYER}.sa_layer_norm"),
        (f"{LAYER}.intermediate.dense", f"{FAMILY_LAYER}.ffn.lin1"),
        (f"{LAYER}.output.dense", f"{FAMILY_LAYER}.ffn.lin2"),
        (f"{LAYER}.output.LayerNorm", f"{FAMILY_LAYER}.output_layer_norm"),
        ("bert.embeddings", "distilbert.embeddings"),
        ("bert.pooler.dense", "pre_classifier"),
        ("cls.predictions.transform.dense", "vocab_transform"),
        ("cls.predictions.transform.LayerNorm", "vocab_layer_norm"),
        ("cls.predictions.bias", "vocab_projector.bias"),
        ("cls.predictions.decoder", "vocab_projector"),
    )
    token_types = False
    classifier_dropout_key = "seq_classif_dropout"

    def pooler_act(self, config: ModelConfig) -> str:
        return "relu"


family = DistilBert()
