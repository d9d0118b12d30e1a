"""The one forward of the models that give each text an output of its own: dense embeddings, SPLADE's
sparse vectors, static tables (and token vectors for late interaction), with the pooling they share.

Every such model computes its output in the same two steps: ``token_states`` (the encoder's vector of
each token, or a static table's row) and ``pool`` (the token vectors to one per text). A
``TextEncoder`` is called as every training and prediction loop calls a model (the batch's
features as keyword arguments). Without ``part`` it predicts (``encode``); with it, it trains on the
batch's texts as a ``PairBatch`` says they belong together (``train_step``), the batch structure
every embedding loss reads (mlmkit.train.losses).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mlmkit.models.core import BertModel, mean_pool
from mlmkit.models.core import token_states as encoder_states

POOLINGS = ("mean", "cls", "max", "lasttoken", "weightedmean", "mean_sqrt_len_tokens", "tokens")
"""``pool``'s modes: one vector per text, or per token (``tokens``: late interaction's)."""
ACTIVATIONS = {"identity": nn.Identity, "tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU,
               "sigmoid": nn.Sigmoid, "silu": nn.SiLU}
"""What a Dense module after pooling may apply (sentence-transformers saves the torch class's name)."""


@dataclass
class PairBatch:
    example: torch.Tensor  # (F,) int64: the example of each feature, 0.. within the batch
    part: torch.Tensor  # (F,) int64: 0 anchor (or a pair's first text), 1 positive (second), 2.. negatives
    text_id: torch.Tensor  # (F,) int64: equal for features with equal token ids
    score: torch.Tensor  # (F,) float: the example's gold score (scored pairs), or the teacher's score of
    # this text for its anchor (margin-mse rows; 0 for the anchor)
    target: torch.Tensor | None = None  # (F, D) float: the teacher's embedding of each text (mse-distill)


def token_states(encoder: BertModel | torch.Tensor, input_ids: torch.Tensor,
                 attention_mask: torch.Tensor | None,
                 token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T, H) token vectors of a batch: the encoder's last states (through the per-token transform
    where the family has one), ``attention_mask`` the tokens they attend to; or, where ``encoder`` is a
    static table (V, H), each token's row (the mask is for ``pool``)."""
    if isinstance(encoder, torch.Tensor):
        return encoder[input_ids]
    return encoder_states(encoder, input_ids, attention_mask, token_type_ids)


def pool(x: torch.Tensor, attention_mask: torch.Tensor, mode: str = "mean") -> torch.Tensor:
    """(B, T, D) token states -> (B, D), over the tokens ``attention_mask`` (B, T) keeps, as
    sentence-transformers' Pooling module computes them over right-padded rows: ``mean`` (a float mask
    weighs the tokens: a static table's counted tokens), ``cls`` (the first token), ``max`` (padding can
    never win: filled with -1e9), ``lasttoken`` (the last real token: a decoder's, Qwen3-Embedding's),
    ``weightedmean`` (token i of a row weighs i + 1, SGPT's) or ``mean_sqrt_len_tokens`` (the sum over
    the square root of the count); or ``tokens``: (B, T, D), each token's own vector, zero where the mask
    is 0 (late interaction's vectors)."""
    if mode == "tokens":
        return x * (attention_mask != 0).unsqueeze(-1).to(x.dtype)
    if mode == "cls":
        return x[:, 0]
    if mode == "max":
        m = attention_mask.unsqueeze(-1).to(x.dtype)  # (B, T, 1)
        return (x + (m - 1.0) * 1e9).max(dim=1).values
    if mode == "mean":
        return mean_pool(x, attention_mask)
    if mode == "lasttoken":
        last = (attention_mask.long().sum(dim=1) - 1).clamp(min=0)  # (B,): right padding, so the count - 1
        return x[torch.arange(x.size(0), device=x.device), last]
    m = attention_mask.unsqueeze(-1).to(x.dtype)  # (B, T, 1)
    if mode == "weightedmean":
        m = m * torch.arange(1, x.size(1) + 1, device=x.device, dtype=x.dtype)[None, :, None]
        return (x * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)
    if mode == "mean_sqrt_len_tokens":
        return (x * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9).sqrt()
    raise ValueError(f"pooling {mode!r} is not one of {POOLINGS}")


class Dense(nn.Module):
    """sentence-transformers' Dense module after pooling: ``activation(linear(x))``, its weights under
    the same names (``linear.weight``, ``linear.bias``). EmbeddingGemma has two (768 -> 3072 -> 768,
    no bias, identity); a model's Dense layers run in the graph, before the normalisation."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 activation: str = "tanh") -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"Dense activation {activation!r} is not one of {', '.join(ACTIVATIONS)}")
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.activation = ACTIVATIONS[activation]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.linear(x))


class TextEncoder(nn.Module):
    """The forward the pooled heads share; a subclass gives ``encode`` (prediction: a dict of outputs)
    and ``train_step`` (the loss over a batch of texts, with the outputs), and may give
    ``module_weights``: weights a run also keeps where another library's loader reads them."""

    def module_weights(self) -> dict[str, dict[str, torch.Tensor]]:
        """{file in the run directory: its tensors}, written beside model.safetensors (the colbert
        projection as sentence-transformers' Dense module); none by default."""
        return {}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, part: torch.Tensor | None = None,
                text_id: torch.Tensor | None = None, score: torch.Tensor | None = None,
                example: torch.Tensor | None = None,
                target: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if part is None:
            return self.encode(input_ids, attention_mask, token_type_ids)
        if text_id is None or score is None:
            raise ValueError("a training batch of texts needs their text_id and score with their part")
        if example is None:  # an example's features come together, its anchor (part 0) first
            example = torch.cumsum(part == 0, 0) - 1
        if target is not None and target.shape[-1] == 0:  # no teacher (the embedding task's NO_TARGET)
            target = None
        batch = PairBatch(example, part, text_id, score, target)
        return self.train_step(input_ids, attention_mask, token_type_ids, batch)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               token_type_ids: torch.Tensor | None) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def train_step(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   token_type_ids: torch.Tensor | None, batch: PairBatch) -> dict[str, torch.Tensor]:
        raise NotImplementedError
