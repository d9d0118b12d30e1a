"""Parity with transformers.BertForPreTraining: same weights, same MLM and NSP logits; both load
directions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mlmkit.models.config import ModelConfig
from mlmkit.models.core import BertForPreTraining, BertModel
from mlmkit.rundir.checkpoint import load_state_dict, load_weights, save_run
from mlmkit.rundir.config import load_config
from mlmkit.rundir.meta import RunMeta
from mlmkit.text.tokenizer import SPECIAL_TOKENS, load_tokenizer

transformers = pytest.importorskip("transformers")

WORDS = [f"w{i}" for i in range(90)]
VOCAB = SPECIAL_TOKENS + WORDS + ["##s", "##ed"]  # 97 tokens
ATOL = 1e-5


def config(**kw) -> ModelConfig:
    base = dict(vocab_size=len(VOCAB), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=128, max_position_embeddings=64)
    return ModelConfig(**{**base, **kw})


def scramble(model: torch.nn.Module, seed: int = 0) -> None:
    """Random values everywhere (BERT init leaves biases at 0 and LayerNorm at 1: too easy to match)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1
                    + (1.0 if p.dim() == 1 and p.numel() == 64 else 0.0))


def inputs(seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    B, T = 3, 20
    ids = torch.randint(5, len(VOCAB), (B, T), generator=g)
    ids[:, 0] = 2  # [CLS]
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 12:] = 0
    mask[2, 17:] = 0
    ids[mask == 0] = 0
    types = torch.zeros(B, T, dtype=torch.long)
    types[:, 8:] = 1
    types[mask == 0] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def assert_same_logits(ours: BertForPreTraining, theirs: torch.nn.Module) -> None:
    ours.eval()
    theirs.eval()
    x = inputs()
    with torch.no_grad():
        a = ours(**x)
        b = theirs(**x)
    real = x["attention_mask"].bool()
    mlm = (a["prediction_logits"] - b.prediction_logits)[real].abs().max().item()
    nsp = (a["nsp_logits"] - b.seq_relationship_logits).abs().max().item()
    assert mlm <= ATOL and nsp <= ATOL, (mlm, nsp)
    assert b.prediction_logits.abs().max() > 1.0  # the comparison is not between two near-zero tensors
    # the masked-only head gives the same numbers as transformers' full head
    labels = torch.full_like(x["input_ids"], -100)
    labels[:, 3:6] = x["input_ids"][:, 3:6]
    with torch.no_grad():
        part = ours(**x, labels=labels)
    d = (part["mlm_logits"] - b.prediction_logits[labels != -100]).abs().max().item()
    assert d <= ATOL, d


def write_vocab(d: Path) -> None:
    (d / "vocab.txt").write_text("".join(t + "\n" for t in VOCAB), encoding="utf-8")


@pytest.fixture
def our_run(tmp_path) -> tuple[Path, BertForPreTraining]:
    cfg = config()
    cfg.architectures = ["BertForPreTraining"]
    model = BertForPreTraining(cfg)
    scramble(model)
    write_vocab(tmp_path)
    tok = load_tokenizer(tmp_path / "vocab.txt")
    run = tmp_path / "run"
    save_run(model, run, config=cfg, tokenizer=tok, meta=RunMeta(task="pretraining", max_length=64))
    return run, model


def test_mlmkit_run_loads_in_transformers(our_run):
    run, model = our_run
    theirs, info = transformers.BertForPreTraining.from_pretrained(run, output_loading_info=True)
    assert info["missing_keys"] in (set(), []) and info["unexpected_keys"] in (set(), [])
    assert not info.get("mismatched_keys")
    assert_same_logits(model, theirs)
    # and its tokenizer files load in transformers, with the same ids as ours
    hf_tok = transformers.AutoTokenizer.from_pretrained(run)
    ours = load_tokenizer(run)
    assert hf_tok("w3 w17", "w5")["input_ids"] == ours.encode("w3 w17", "w5").ids


def test_parity_holds_for_eager_attention_too(our_run):
    from mlmkit.models.core import set_attention_impl

    run, model = our_run
    theirs = transformers.BertForPreTraining.from_pretrained(run, attn_implementation="eager")
    set_attention_impl(model, "eager")
    assert_same_logits(model, theirs)


def hf_model(tmp_path: Path, **cfg_kw) -> tuple[Path, torch.nn.Module]:
    hf_cfg = transformers.BertConfig(**config(**cfg_kw).to_dict())
    theirs = transformers.BertForPreTraining(hf_cfg)
    scramble(theirs, seed=7)
    theirs.tie_weights()
    d = tmp_path / "hf"
    theirs.save_pretrained(d)
    write_vocab(d)
    return d, theirs


def test_transformers_directory_loads_in_mlmkit(tmp_path):
    d, theirs = hf_model(tmp_path)
    cfg = load_config(d)
    assert cfg.hidden_size == 64 and cfg.vocab_size == len(VOCAB)
    ours = BertForPreTraining(cfg)
    missing, unexpected = load_weights(ours, load_state_dict(d))
    assert missing == [] and unexpected == []
    assert_same_logits(ours, theirs)
    assert load_tokenizer(d).token_to_id("w5") == VOCAB.index("w5")  # vocab.txt alone is a tokenizer
    # config.json round trip keeps the keys transformers wrote
    ours_cfg = cfg.to_dict()
    theirs_cfg = json.loads((d / "config.json").read_text())
    assert {k for k in theirs_cfg if k != "transformers_version"} <= set(ours_cfg)


def test_old_style_bin_with_gamma_beta_names_loads(tmp_path):
    d, theirs = hf_model(tmp_path)
    sd = {}
    for k, v in theirs.state_dict().items():
        if "LayerNorm" in k:
            k = k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        sd[k] = v.clone()
    sd["cls.predictions.decoder.bias"] = sd.pop("cls.predictions.bias")  # older transformers' spelling
    (d / "model.safetensors").unlink()
    torch.save(sd, d / "pytorch_model.bin")
    ours = BertForPreTraining(load_config(d))
    missing, unexpected = load_weights(ours, load_state_dict(d))
    assert missing == [] and unexpected == []
    assert_same_logits(ours, theirs)


def test_bare_bert_model_checkpoint_loads_into_the_encoder(tmp_path):
    # a BertModel checkpoint (no "bert." prefix, no heads): the encoder matches transformers' BertModel
    hf_cfg = transformers.BertConfig(**config().to_dict())
    theirs = transformers.BertModel(hf_cfg)
    scramble(theirs, seed=3)
    d = tmp_path / "bare"
    theirs.save_pretrained(d)
    ours = BertForPreTraining(load_config(d))
    missing, unexpected = load_weights(ours, load_state_dict(d), allow_missing=("cls.",))
    assert unexpected == [] and all(k.startswith("cls.") for k in missing) and missing
    x = inputs()
    ours.eval()
    theirs.eval()
    with torch.no_grad():
        seq, pooled = ours.bert(**x)
        ref = theirs(**x)
    real = x["attention_mask"].bool()
    assert (seq - ref.last_hidden_state)[real].abs().max() <= ATOL
    assert (pooled - ref.pooler_output).abs().max() <= ATOL
    # and a headless BertModel of ours reads the same weights
    enc = BertModel(load_config(d))
    sd = {k.removeprefix("bert."): v for k, v in load_state_dict(d).items()}
    enc.load_state_dict(sd)
