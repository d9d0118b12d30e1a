"""The family contract (models/family.py): what a family declares is all mlmkit knows of it.

Every registered family honours the declarations the rest of the package reads (attention blocks,
extra sizes, special tokens, pretraining); a family made here, in a test, plugs in by registering it
alone (config checks, names, the weight-shape hook, the exporter's attention check); the exporter
refuses an attention that does not declare itself; the shared helpers (mean pooling, tying) hold.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from typer.testing import CliRunner

from mlmkit.cli import app
from mlmkit.errors import ConfigError
from mlmkit.exporter.graphs import check_attention, torch_export
from mlmkit.models import BY_MODEL_TYPE, FAMILIES, core
from mlmkit.models.config import CEILINGS, ExtraSize, Family, ModelConfig
from mlmkit.models.presets import preset
from mlmkit.rundir.checkpoint import load_state_dict, save_weights
from mlmkit.rundir.config import load_config, save_config
from mlmkit.text.tokenizer import CONVENTIONS, SpecialIds
from mlmkit.train.pretrain import pretraining_family

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
SIZES = dict(vocab_size=120, max_position_embeddings=512, hidden_dropout_prob=0.0,
             attention_probs_dropout_prob=0.0)


def tiny(arch: str, **extra: Any) -> ModelConfig:
    cfg = preset("tiny", arch, **SIZES, **({"pad_token_id": 1} if arch == "roberta" else {}))
    return ModelConfig.from_dict({**cfg.to_dict(), **extra})


def ids_and_mask() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(5, 120, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    return ids, mask


# ---- every registered family -------------------------------------------------------------------
@pytest.mark.parametrize("fam", FAMILIES, ids=lambda f: f.name)
def test_every_family_declares_its_attention_and_exports_it_eager(fam: Family) -> None:
    cfg = tiny(fam.name)
    model = core.BertForPreTraining(cfg).eval()
    assert core.set_attention_impl(model, "sdpa") == cfg.num_hidden_layers  # one declared block a layer
    check_attention(model, ids_and_mask())  # no SDPA left once they are eager
    assert {m.impl for m in core.attention_blocks(model)} == {"eager"}


@pytest.mark.parametrize("fam", FAMILIES, ids=lambda f: f.name)
def test_declarations_the_rest_of_the_package_reads(fam: Family) -> None:
    assert fam.special_tokens in CONVENTIONS  # text/tokenizer.py has the convention as data
    assert set(fam.config_token_ids.values()) <= {f for f in SpecialIds.__dataclass_fields__}
    assert all(s.bound in CEILINGS for s in fam.extra_sizes)
    # no NSP: a pretraining run is the family's masked LM, derived once in Family.architecture
    mt = fam.model_types[0]
    want = "ForPreTraining" if fam.nsp else "ForMaskedLM"
    assert fam.architecture("BertForPreTraining", mt) == fam.class_prefixes[mt] + want


@pytest.mark.parametrize("fam", [f for f in FAMILIES if f.extra_sizes], ids=lambda f: f.name)
def test_each_declared_extra_size_is_checked(fam: Family) -> None:
    for size in fam.extra_sizes:
        ceiling = CEILINGS[size.bound]
        for bad in (0, ceiling + 1, "8", 2.0):
            if bad in size.unset:
                continue
            with pytest.raises(ConfigError,
                               match=f"config {size.key} must be a positive integer of at most {ceiling:,}"):
                tiny(fam.name, **{size.key: bad})
        for unset in size.unset:
            assert tiny(fam.name, **{size.key: unset}).extra[size.key] == unset


def test_the_pretraining_families_come_from_the_registry() -> None:
    names = [f.name for f in FAMILIES if f.pretrains]
    assert names[:3] == ["bert", "roberta", "modernbert"] and {"gte", "nomic_bert", "eurobert"} <= set(names)
    assert pretraining_family("roberta") is BY_MODEL_TYPE["roberta"]
    with pytest.raises(ConfigError, match="--arch electra is not a pretraining family") as e:
        pretraining_family("electra")
    assert e.value.hint == f"use one of: {', '.join(names)}"


def test_pretrain_refuses_arch_and_nsp_before_reading_anything(tmp_path: Path) -> None:
    """The corpus does not exist: the family's declarations are checked first, as one line, exit 2."""
    missing = str(tmp_path / "none.txt")
    r = runner.invoke(app, ["pretrain", missing, "--out", str(tmp_path / "r"), "--arch", "deberta-v2"])
    assert r.exit_code == 2 and "--arch deberta-v2 is not a pretraining family" in r.output
    assert f"use one of: {', '.join(f.name for f in FAMILIES if f.pretrains)}" in r.output
    r = runner.invoke(app,
                      ["pretrain", missing, "--out", str(tmp_path / "r"), "--arch", "modernbert", "--nsp"])
    assert r.exit_code == 2 and "next-sentence prediction is BERT's, not modernbert's" in r.output
    assert not (tmp_path / "r").exists()


def test_no_family_names_are_tested_outside_models() -> None:
    """What a family is, its module says; the rest of the package asks it."""
    pattern = re.compile(r"\b(fam|family)\.name\s*[!=]=")
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in (ROOT / "mlmkit").rglob("*.py") if "models" not in p.parts
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert hits == []


# ---- a family of the test's own ----------------------------------------------------------------
class Toy(Family):
    """A family as a new module would declare it: its names, no token types, an extra size, and a
    weight-shape check of its own (the rows of a table it would compute from ``buckets``)."""

    name = "toy"
    model_types = ("toy",)
    class_prefixes = {"toy": "Toy"}
    prefix = "toy"
    renames = (("bert", "toy"),)
    token_types = False
    config_defaults = {"type_vocab_size": 0}
    extra_sizes = (ExtraSize("buckets"),)

    def shape_mismatch(self, config: Any, shapes: dict[str, tuple[int, ...]]) -> tuple[str, Any, str] | None:
        rows = shapes["bert.embeddings.word_embeddings.weight"][0]
        if config.extra.get("buckets", rows) != rows:
            return "buckets", config.extra["buckets"], f"the word embeddings have {rows} rows"
        return None


@pytest.fixture
def toy() -> Iterator[Family]:
    fam = Toy()
    BY_MODEL_TYPE.add("toy", fam)  # what its one line in models/__init__.py does
    yield fam
    BY_MODEL_TYPE.remove("toy")


def toy_config(**extra: Any) -> ModelConfig:
    return ModelConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                       model_type="toy",
                       architectures=["BertForPreTraining"], type_vocab_size=0, **SIZES, extra=extra)


def test_a_new_family_plugs_in_by_its_declarations(toy: Family, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config buckets must be a positive integer"):
        toy_config(buckets=0)
    cfg = toy_config()
    assert cfg.to_dict()["architectures"] == ["ToyForMaskedLM"]  # no NSP, so its masked LM
    model = core.BertForPreTraining(cfg).eval()
    assert model.bert.embeddings.project is None and model.bert.encoder.final_norm is None
    save_config(cfg, tmp_path / "config.json")
    save_weights(model, tmp_path / "model.safetensors", cfg)
    loaded = load_state_dict(tmp_path)
    assert set(loaded) == set(model.state_dict()) - {"cls.predictions.decoder.weight"}
    assert load_config(tmp_path).family is toy
    # its own shape check, called by check_weights
    with pytest.raises(ConfigError, match="buckets 7 does not match the weights"):
        save_config(toy_config(buckets=7), tmp_path / "config.json")
        load_config(tmp_path)
    with pytest.raises(ConfigError, match="--arch toy is not a pretraining family"):
        pretraining_family("toy")
    check_attention(model, ids_and_mask())


# ---- the exporter's attention check -----------------------------------------------------------
class PlainAttention(nn.Module):
    """An attention that does not declare itself (not a core.Attention): it stays SDPA."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor,
                queries: torch.Tensor | None = None) -> torch.Tensor:
        q = x[:, None]  # (B, 1, T, H): one head
        return F.scaled_dot_product_attention(q, q, q, attn_mask=mask)[:, 0]


class Undeclared(nn.Module):
    def __init__(self, declared: bool) -> None:
        super().__init__()
        cfg = preset("tiny", "bert", **SIZES)
        self.bert = core.BertModel(cfg, add_pooling_layer=False).eval()
        if not declared:
            self.bert.encoder.layer[1].attention.self = PlainAttention()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.bert(input_ids, attention_mask)[0],)


def test_export_refuses_an_attention_that_does_not_declare_itself(tmp_path: Path) -> None:
    ids, mask = ids_and_mask()
    batch = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    with pytest.raises(ConfigError, match=r"^bert\.encoder\.layer\.1\.attention\.self \(PlainAttention\) "
                                          r"computes attention "
                                          r"with scaled_dot_product_attention but is not a declared "
                                          r"attention block"):
        torch_export(Undeclared(declared=False), batch, {"hidden": ("batch", "sequence", "hidden")},
                     tmp_path / "m.onnx", 17,
                     ("input_ids", "attention_mask"))
    assert not (tmp_path / "m.onnx").exists()
    check_attention(Undeclared(declared=True), (ids, mask))  # the same model with its declared block passes


def test_export_refuses_a_model_without_a_declared_attention() -> None:
    with pytest.raises(ConfigError, match="no attention block the exporter can switch"):
        check_attention(nn.Sequential(nn.Embedding(10, 4)), (torch.zeros(1, 3, dtype=torch.long),))


# ---- the shared helpers ----------------------------------------------------------------------
def test_mean_pool_is_sentence_transformers_mean() -> None:
    x = torch.randn(3, 5, 4)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
    m = mask.unsqueeze(-1).float()
    st = (x * m).sum(1) / torch.clamp(m.sum(1), min=1e-9)  # sentence_transformers.models.Pooling, mean
    assert torch.equal(core.mean_pool(x, mask), st)
    assert torch.equal(core.mean_pool(x, mask)[2], torch.zeros(4))  # a fully padded row: zeros, not NaN


def test_the_decoder_is_tied_by_one_helper_everywhere() -> None:
    from mlmkit_tasks.heads.sparse_embedding import SparseEncoder

    cfg = tiny("bert")
    for model in (core.BertForPreTraining(cfg), SparseEncoder(cfg, 8)):
        assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
