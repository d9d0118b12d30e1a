"""What the rotary BERT-style families' parity tests share (test_gte.py, test_nomic_bert.py,
test_jina.py, over models/rotary_bert.py): tiny random transformers models saved by save_pretrained,
right-padded batches of mixed lengths, and each head of mlmkit's core against transformers' class,
with either attention form on both sides; a model loaded by mlmkit saved back and loaded by
transformers. Weights are perturbed well beyond their init (family_parity.save_hf) so every
parameter shows in the outputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from family_parity import (
    ATOL,  # noqa: F401  (the family tests' tolerance, imported from here)
    BUILDS,
    head_diff,
    load_ours,
    random_batch,
    real_diff,
    save_hf,
    write_ours,
)
from family_parity import hf_model as hf_class_model
from torch import nn

from mlmkit.models import core

V = 100  # vocabulary of the tiny models; ids 0-4 are special tokens
SIZES = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48)


def hf_dir(tmp_path: Path, prefix: str, head: str, config: dict[str, Any], name: str = "hf",
           seed: int = 0) -> Path:
    """A random transformers model ``prefix + head`` of ``config`` (its config class's keywords), perturbed
    and saved by save_pretrained."""
    import transformers

    save_hf(tmp_path / name, prefix + head, getattr(transformers, f"{prefix}Config")(**config), seed=seed)
    return tmp_path / name


def hf_model(prefix: str, head: str, d: Path, impl: str = "eager") -> nn.Module:
    return hf_class_model(prefix + head, d, impl)


def inputs(T: int = 20, lengths: tuple[int, ...] = (20, 13, 5), pad: int = 1, seed: int = 1,
           types: bool = False) -> dict[str, torch.Tensor]:
    """A right-padded batch: id 2 first, ``pad`` with attention_mask 0 after each length; with
    ``types`` token_type_ids 1 over the second half of each row's real tokens (a pair)."""
    return random_batch(V, T, lengths, seed, pad=pad, first=2, types=types)


def parity(d: Path, prefix: str, head: str, x: dict[str, torch.Tensor]) -> tuple[float, list[str]]:
    """(the largest difference between mlmkit's model of ``d`` and transformers', over mlmkit's eager
    and SDPA forms against transformers' eager and SDPA ones; the checkpoint's keys mlmkit's model
    did not take). Nothing may be missing."""
    _, ours, unexpected = load_ours(d, BUILDS[head])
    worst = 0.0
    for impl in ("eager", "sdpa"):
        theirs = hf_model(prefix, head, d, impl)
        for ours_impl in ("eager", "sdpa"):
            core.set_attention_impl(ours, ours_impl)
            worst = max(worst, head_diff(ours, theirs, head, x))
    return worst, unexpected


def save_back(d: Path, prefix: str, head: str, out: Path, x: dict[str, torch.Tensor]) -> tuple[float, Any]:
    """mlmkit's model of ``d`` saved by mlmkit (config.json, model.safetensors) into ``out`` and loaded
    by transformers: (the largest difference of their outputs, transformers' loading info)."""
    import transformers

    cfg, ours, _ = load_ours(d, BUILDS[head])
    theirs, info = getattr(transformers, prefix + head).from_pretrained(write_ours(cfg, ours, out),
                                                                        attn_implementation="eager",
                                                                        output_loading_info=True)
    return head_diff(ours, theirs.eval(), head, x), info


def cls_only_diff(d: Path, x: dict[str, torch.Tensor]) -> float:
    """The sequence head's logits through core.encode_cls (the last layer at [CLS] only, the export's
    classification graph) against the whole forward's."""
    _, ours, _ = load_ours(d, BUILDS["ForSequenceClassification"])
    with torch.no_grad():
        fast = ours.classifier(core.encode_cls(ours.bert, x["input_ids"], x["attention_mask"],
                                               x.get("token_type_ids")))
        return (fast - ours(**x)["logits"]).abs().max().item()


def pretrain_loads_in_transformers(tmp_path: Path, arch: str, prefix: str) -> tuple[dict[str, Any], float]:
    """`mlmkit pretrain --arch ARCH` (the tiny preset, its tokenizer trained on a small corpus, two
    steps), the run loaded by transformers' ``prefix``ForMaskedLM with no missing or unexpected weight:
    (the run's config.json, the largest difference of the two models' logits on a mixed batch)."""
    import transformers
    from conftest import run_pretrain
    from family_checkpoints import encode_batch, sentences

    from mlmkit.rundir.checkpoint import load_state_dict, load_weights
    from mlmkit.rundir.config import load_config

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join("\n".join(sentences(5, seed=d)) for d in range(20)) + "\n")
    run = tmp_path / "run"
    run_pretrain([corpus], run, arch=arch, batch_size=8, seq_len=32, vocab_size=300, lr=1e-3, eval_every=1000,
                 seed=0,
                 steps=2, progress=False)
    theirs, info = getattr(transformers, prefix + "ForMaskedLM").from_pretrained(run,
                                                                                 output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ours = core.BertForPreTraining(load_config(run))
    load_weights(ours, load_state_dict(run))
    b = encode_batch(run, ["the film was good", ("a very dull story", "was the plot and john went to paris")])
    x = {k: torch.from_numpy(b[k]) for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        got, ref = ours.eval()(**x)["prediction_logits"], theirs.eval()(**x).logits
    return json.loads((run / "config.json").read_text()), real_diff(got, ref, x["attention_mask"])
