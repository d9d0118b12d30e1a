"""The one forward and pooling of the models with an output per text (mlmkit.models.pooled)."""

from __future__ import annotations

import pytest
import torch

from mlmkit.models.core import BertModel
from mlmkit.models.pooled import PairBatch, TextEncoder, pool, token_states
from mlmkit.models.presets import preset


def test_pooling_reads_only_the_real_tokens():
    x = torch.tensor([[[1.0, 5.0], [3.0, -1.0], [100.0, 100.0]]])  # the third token is padding
    mask = torch.tensor([[1, 1, 0]])
    assert pool(x, mask, "mean").tolist() == [[2.0, 2.0]]
    assert pool(x, mask, "max").tolist() == [[3.0, 5.0]]
    assert pool(x, mask, "cls").tolist() == [[1.0, 5.0]]
    weighted = pool(x, torch.tensor([[3.0, 1.0, 0.0]]), "mean")  # a float mask weighs the tokens
    assert weighted.tolist() == [[1.5, 3.5]]
    # per token, 0 at padding
    assert pool(x, mask, "tokens").tolist() == [[[1.0, 5.0], [3.0, -1.0], [0.0, 0.0]]]
    with pytest.raises(ValueError, match="pooling 'sum'"):
        pool(x, mask, "sum")


def test_token_states_are_the_encoder_s_last_states_or_a_table_s_rows():
    torch.manual_seed(0)
    bert = BertModel(preset("tiny", vocab_size=50), add_pooling_layer=False).eval()
    ids, mask = torch.randint(5, 50, (2, 6)), torch.ones((2, 6), dtype=torch.long)
    assert torch.equal(token_states(bert, ids, mask, None), bert(ids, mask, None)[0])
    table = torch.randn(50, 4)
    assert torch.equal(token_states(table, ids, mask), table[ids])


class _Recorder(TextEncoder):
    def encode(self, input_ids, attention_mask, token_type_ids):
        return {"mask": attention_mask}

    def train_step(self, input_ids, attention_mask, token_type_ids, batch: PairBatch):
        return {"example": batch.example, "target": batch.target}


def test_the_forward_predicts_without_part_and_trains_with_it():
    model, ids = _Recorder(), torch.ones((4, 3), dtype=torch.long)
    assert model(ids)["mask"].tolist() == [[1] * 3] * 4
    part = torch.tensor([0, 1, 0, 1])
    out = model(ids, part=part, text_id=torch.arange(4), score=torch.zeros(4), target=torch.zeros((4, 0)))
    assert out["example"].tolist() == [0, 0, 1, 1] and out["target"] is None
    with pytest.raises(ValueError, match="text_id and score"):
        model(ids, part=part)
