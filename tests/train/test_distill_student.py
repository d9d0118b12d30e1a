"""The student of `mlmkit distill` (mlmkit/train/distill_student.py): layer maps and the weights they copy,
and the student's layer types, the copied layers' whatever the family's rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from mlmkit.cli import app
from mlmkit.errors import ConfigError
from mlmkit.files import read_json
from mlmkit.models.config import ModelConfig
from mlmkit.train.distill_student import layer_map, student_config, student_weights
from mlmkit.train.finetune import load_finetuned


def test_layer_maps_and_weights():
    assert layer_map(6, 3) == [0, 2, 4] and layer_map(12, 4) == [0, 3, 6, 9] and layer_map(2, 2) == [0, 1]
    assert layer_map(6, 2, "1,5") == [1, 5]
    for k, spec, match in ((0, None, "--layers 0"), (7, None, "--layers 7"),
                           (2, "1,1", "each teacher layer once"),
                           (2, "3,1", "increasing"), (2, "0,6", "0 to 5"), (2, "0", "names 1 layers"),
                           (1, "x", "not a list")):
        with pytest.raises(ConfigError, match=match):
            layer_map(6, k, spec)
    sd = {"bert.embeddings.w": torch.zeros(1), "bert.encoder.layer.0.a": torch.zeros(1),
          "bert.encoder.layer.2.a": torch.ones(1), "bert.encoder.layer.10.a": torch.full((1,), 2.0),
          "classifier.w": torch.zeros(1)}
    got = student_weights(sd, [2, 10])
    assert set(got) == {"bert.embeddings.w", "bert.encoder.layer.0.a", "bert.encoder.layer.1.a",
                        "classifier.w"}
    assert float(got["bert.encoder.layer.0.a"]) == 1.0 and float(got["bert.encoder.layer.1.a"]) == 2.0


def test_a_modernbert_teacher_with_layer_types_distils_into_fewer_layers(tmp_path):
    """transformers 5 writes ModernBERT's ``layer_types``, one per layer: the student's are the copied
    layers' (here sliding then full), and transformers runs the student as mlmkit does."""
    from family_checkpoints import save_checkpoint, sentences, transformers

    teacher, out = tmp_path / "teacher", tmp_path / "student"
    save_checkpoint(teacher, "modernbert", "ForSequenceClassification")  # 3 layers, a window of 8
    assert read_json(teacher / "config.json")["layer_types"] == ["full_attention", "sliding_attention",
                                                                 "full_attention"]
    (tmp_path / "texts.txt").write_text("\n".join(sentences(40)) + "\n")
    r = CliRunner().invoke(app, ["distill", str(teacher), "--train", str(tmp_path / "texts.txt"), "--out",
                                 str(out), "--layers", "2", "--layer-map", "1,2", "--steps", "3"])
    assert r.exit_code == 0, r.output
    cfg = read_json(out / "config.json")
    assert cfg["num_hidden_layers"] == 2 and cfg["layer_types"] == ["sliding_attention", "full_attention"]
    assert read_json(out / "mlmkit.json")["distill"]["layer_map"] == [1, 2]
    _, ours, tok, _ = load_finetuned(out)
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    ids = torch.tensor([tok.encode(" ".join(sentences(1, seed=3)[0].split() * 3)).ids])  # past the window
    with torch.no_grad():
        a = ours(ids, torch.ones_like(ids), None)["logits"]
        b = theirs(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-4)


def test_the_students_layer_types_are_the_copied_layers_whatever_the_rule():
    """A teacher without ``layer_types`` has its family's rule: kept where it gives the copied layers'
    attention at the student's depth, else the copied layers' types are written."""
    F, S = "full_attention", "sliding_attention"
    sizes = dict(vocab_size=100, hidden_size=32, num_attention_heads=4, intermediate_size=64, pad_token_id=0)
    prenorm = dict(sizes, num_key_value_heads=2, head_dim=16, sliding_window=8)
    cases = [  # (config.json, layer map, the student's layer_types; None: the rule's, none written)
        (dict(model_type="modernbert", num_hidden_layers=6, global_attn_every_n_layers=3, local_attention=8),
         [0, 3], [F, F]),  # the rule at 2 layers: F S
        (dict(model_type="modernbert", num_hidden_layers=6, global_attn_every_n_layers=3, local_attention=8),
         [0, 2, 4], None),  # F L L at 3 layers too
        (dict(model_type="modernbert", num_hidden_layers=3, layer_types=[F, S, F]), [1, 2], [S, F]),
        (dict(model_type="gemma3_text", num_hidden_layers=6, sliding_window_pattern=3), [0, 2, 4], [S, F, S]),
        (dict(model_type="gemma3_text", num_hidden_layers=4, layer_types=[S, F, S, F]), [1, 3], [F, F]),
        (dict(model_type="qwen3", num_hidden_layers=6, use_sliding_window=True, max_window_layers=3),
         [0, 2, 4], [F, F, S]),
        (dict(model_type="bert", num_hidden_layers=6), [1, 3], None),
    ]
    for d, mapping, want in cases:
        kw = prenorm if d["model_type"] in ("gemma3_text", "qwen3") else sizes
        got = student_config(ModelConfig.from_dict({**kw, **d}), mapping)
        assert got.num_hidden_layers == len(mapping) and got.extra.get("layer_types") == want, (d, mapping)
