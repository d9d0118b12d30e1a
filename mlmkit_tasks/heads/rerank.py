"""The cross-encoder: a one-label BertForLabels trained with a rerank loss over a query's candidates;
with answer tokens, its classifier row derived from a causal LM's head when a checkpoint without one
is loaded (``derived_weights``)."""

from __future__ import annotations

import logging

import torch

from mlmkit.model import BertForLabels, ModelConfig, rank_loss
from mlmkit.taskkit import ConfigError, Loss
from mlmkit_tasks.classification import REGRESSION

log = logging.getLogger("mlmkit")
LM_HEAD = "lm_head."  # transformers' name of a causal LM's output layer, whatever the family
EMBEDDINGS = "bert.embeddings.word_embeddings.weight"


class BertForRerank(BertForLabels):
    """One relevance logit per (query, document) pair; ``loss`` is a rank loss of the registry
    (bce, listnet ...), computed over the pairs of each query (``example``). ``answers``: the (TRUE,
    FALSE) token ids of a causal LM judging the pair, whose LM head gives the classifier its row."""

    def __init__(self, config: ModelConfig, loss: Loss, max_label: float,
                 answers: tuple[int, int] | None = None) -> None:
        super().__init__(config, per_token=False, problem_type=REGRESSION)
        self.objective = rank_loss(loss, max_label=max_label)
        self.answers = answers

    def derived_weights(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``sd`` (a checkpoint's weights, mlmkit's names) with the classifier a causal LM's answer tokens
        make, where it has none: the LM head's TRUE row less its FALSE row (``lm_head.weight``, or the
        token embeddings where the config ties them to it), the bias likewise: logit_TRUE - logit_FALSE
        at the last token, whose sigmoid is P(TRUE) of the two. rundir/checkpoint.load_weights calls it."""
        if self.answers is None or "classifier.weight" in sd:
            return sd
        tied = bool(self.config.extra.get("tie_word_embeddings", True))
        rows = sd.get(LM_HEAD + "weight", sd.get(EMBEDDINGS) if tied else None)
        if rows is None:
            raise ConfigError("the checkpoint has no LM head (lm_head.weight) to read the answer tokens' "
                              "rows from"
                              + ("" if tied else ", and its config does not tie it to the token embeddings"),
                              "give a causal LM's checkpoint, or leave answer_tokens empty")
        yes, no = self.answers
        out = dict(sd)
        out["classifier.weight"] = (rows[yes].float() - rows[no].float())[None, :]  # (1, H)
        bias = sd.get(LM_HEAD + "bias")
        if self.classifier.bias is not None:
            out["classifier.bias"] = ((bias[yes].float() - bias[no].float())[None] if bias is not None
                                      else torch.zeros(1))
        elif bias is not None and float(bias[yes]) != float(bias[no]):
            raise ConfigError("the LM head's answer rows have biases, which this family's head has no place "
                              "for",
                              "leave answer_tokens empty and fine-tune a fresh head")
        log.info("the rerank head is the LM head's answer rows (token %d less token %d)", yes, no)
        return out

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                example: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = super().forward(input_ids, attention_mask, token_type_ids)["logits"]  # (B, 1)
        out = {"logits": logits}
        if labels is not None:
            group = example if example is not None else torch.zeros_like(labels, dtype=torch.long)
            out["loss"] = self.objective(logits.float().squeeze(-1), labels.float(), group)
        return out
