"""fill-mask's model: the encoder and the masked-LM head at the [MASK] positions only, top-k in the graph."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mlmkit.model import BertModel, BertPreTrainingHeads, ModelConfig, init_weights, tie_decoder


class FillMask(torch.nn.Module):
    """The ``k`` most likely tokens at each [MASK] (``mask_id`` on a real token), per token:
    ``indices`` (B, T, k) as float token ids, best first, -1 elsewhere, and ``values`` their softmax
    probabilities over the whole vocabulary, 0 elsewhere. The MLM head runs for the [MASK] rows only,
    so a batch never builds a (B, T, vocabulary) tensor. Parameter names are BertForMaskedLM's (bert.*,
    cls.predictions.*): a pretraining run's or a masked-LM checkpoint's weights load as they are."""

    def __init__(self, config: ModelConfig, mask_id: int, k: int) -> None:
        super().__init__()
        self.config, self.mask_id, self.k = config, mask_id, k
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls = BertPreTrainingHeads(config, nsp=False)
        init_weights(self, config.initializer_range)
        tie_decoder(self.cls, self.bert)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        x, _ = self.bert(input_ids, attention_mask, token_type_ids)  # (B, T, H)
        B, T, H = x.shape
        is_mask = ((input_ids == self.mask_id) & (attention_mask != 0)).reshape(-1)  # (B*T,)
        rows = torch.nonzero(is_mask).squeeze(1)  # (N,): the [MASK]s, as indices into B*T
        head = self.cls.predictions
        h = head.transform(x.reshape(-1, H).index_select(0, rows))  # (N, H)
        # F.linear on a 2-D input exports as Gemm(transB=1) reading the embedding matrix itself, so the
        # tied decoder weight is stored once (a MatMul on its transpose would get a folded second copy)
        probs, ids = torch.topk(torch.softmax(F.linear(h, head.decoder.weight, head.bias), dim=-1), self.k,
                                dim=-1)
        # float32 whatever autocast computes in: ids stay exact
        flat = x.new_zeros(B * T, self.k, dtype=torch.float32)
        indices = (flat - 1).index_put((rows,), ids.float())
        values = flat.index_put((rows,), probs.float())
        return {"indices": indices.reshape(B, T, self.k), "values": values.reshape(B, T, self.k)}
