"""The bundle's description, typed (mlmkit.runtime.bundle.BundleMeta): read, checked, written back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlmkit.errors import BundleError
from mlmkit.runtime.bundle import BundleMeta, TokenizerPrint

PATH = Path("b/mlmkit.json")


def _described(**changes) -> dict:
    """A classification bundle's mlmkit.json as the exporter has written it since format 2 (no gate,
    run_precision or task_state: the keys later versions added are optional)."""
    data = {"format": "mlmkit-onnx-bundle", "format_version": 2, "task": "classification",
            "trained_as": "classification",
            "labels": ["neg", "pos"], "max_length": 128, "options": {"text_column": "text"},
            "inputs": ["input_ids", "attention_mask", "token_type_ids"],
            "outputs": {"probabilities": ["batch", "label"]},
            "top_k": None, "opset": 17, "precision": "fp32", "optimizations": ["fusion"],
            "fused_operators": {"Attention": 2},
            "parity": {"top1_agreement": 1.0}, "model_bytes": 1000, "source": {"path": "runs/clf"},
            "tokenizer": {"vocab_sha256": "ab" * 32, "vocab_size": 100, "lowercase": True, "pad_id": 0,
                          "mask_id": 4},
            "model": {"model_type": "bert", "vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2,
                      "num_attention_heads": 2, "max_position_embeddings": 512},
            "final_metrics": {"eval_accuracy": 0.9}, "data": {"train": "train.csv"}}
    return {**data, **changes}


def test_an_older_description_loads_typed_and_writes_back_the_same_keys():
    meta = BundleMeta.from_json(_described(), PATH)
    assert meta.labels == ("neg", "pos") and meta.outputs == {"probabilities": ("batch", "label")}
    assert meta.tokenizer == TokenizerPrint("ab" * 32, 100, True, 0, 4) and meta.model.hidden_size == 32
    assert meta.gate == {} and meta.run_precision == "auto" and meta.task_state == {}  # the keys it predates
    assert meta.run == {"top_k": None, "final_metrics": {"eval_accuracy": 0.9},  # carried, unread
                        "data": {"train": "train.csv"}}
    again = meta.to_json()
    assert {k: v for k, v in again.items()
            if k not in ("gate", "run_precision", "task_state")} == _described()
    assert BundleMeta.from_json(json.loads(json.dumps(again)), PATH) == meta
    assert meta.context({"text_column": "t"}).labels == ("neg", "pos")


@pytest.mark.parametrize(("changes", "field"), [
    ({"max_length": "128"}, "'max_length'"),
    ({"labels": ["neg", 3]}, "'labels'"),
    ({"tokenizer": {"vocab_size": 100}}, "'tokenizer.pad_id'"),
    ({"gate": []}, "'gate'"),
    ({"precision": "fp8"}, "'precision'"),
    ({"outputs": {"probabilities": "batch"}}, "'outputs'"),
])
def test_a_field_of_the_wrong_type_is_refused_in_one_line_naming_it(changes, field):
    with pytest.raises(BundleError, match=f"b/mlmkit.json: {field}") as e:
        BundleMeta.from_json(_described(**changes), PATH)
    assert "\n" not in str(e.value)


def test_a_missing_field_or_another_format_is_named():
    data = _described()
    del data["tokenizer"]
    with pytest.raises(BundleError, match=r"not a bundle description \(no tokenizer\)"):
        BundleMeta.from_json(data, PATH)
    with pytest.raises(BundleError, match="a bundle of format 1; this mlmkit reads format 2"):
        BundleMeta.from_json(_described(format_version=1), PATH)
