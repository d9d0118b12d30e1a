"""ONNX export: PyTorch parity of all four kinds of bundle on mixed lengths, the fusions, int8, errors
(the fusion refused and static int8: test_passes.py; sparse parity: test_parity.py).

The runs come from tests/task_runs.py (one of every task kind, ``build_runs``), built once a worker by
conftest.py's session fixture ``runs``; the check that its ``TASK_SETUP`` names every registered task
is here.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from conftest import run_export
from task_runs import TASK_SETUP, sentence

import mlmkit.exporter.bundle as export_mod  # the steps, where the parity gate is called
from mlmkit import registry
from mlmkit.errors import ConfigError, ParityError
from mlmkit.models.core import BertForPreTraining
from mlmkit.registry import get_task, per_token
from mlmkit.rundir.checkpoint import load_state_dict, load_weights
from mlmkit.rundir.config import load_config
from mlmkit.text.batching import pad_features
from mlmkit.text.tokenizer import load_tokenizer, special_ids
from mlmkit.train.finetune import load_finetuned


@pytest.fixture(scope="module")
def bundles(runs, tmp_path_factory) -> dict[str, tuple[Path, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("bundles")
    return {kind: (root / kind, run_export(run, root / kind)) for kind, run in runs.items()}


# ---- helpers -----------------------------------------------------------------------------------
def mixed_batch(tok: Any, n: int = 6, seed: int = 3, masks: bool = False) -> dict[str, np.ndarray]:
    """Real sentences of 2..30 words in one padded batch; with ``masks`` 0-3 [MASK] per row."""
    rng = random.Random(seed)
    sp = special_ids(tok)
    feats = []
    for i in range(n):
        ids = tok.encode(sentence(rng, 2 + (i * 7) % 29)).ids
        if masks:
            for j in rng.sample(range(1, len(ids) - 1), k=min(i % 4, len(ids) - 2)):
                ids[j] = sp.mask
        feats.append({"input_ids": ids})
    return pad_features(feats, sp.pad)


def session(bundle: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])


def run_onnx(bundle: Path, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    s = session(bundle)
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(names, {i.name: batch[i.name] for i in s.get_inputs()})))


# ---- fill-mask ---------------------------------------------------------------------------------
def test_fill_mask_graph_matches_full_pytorch_logits(runs, bundles):
    """The in-graph gather + top-k equals PyTorch's full B x T x V logits at the [MASK] positions."""
    d = runs["fill-mask"]
    tok = load_tokenizer(d)
    batch = mixed_batch(tok, n=8, masks=True)
    got = run_onnx(bundles["fill-mask"][0], batch)
    model = BertForPreTraining(load_config(d))
    load_weights(model, load_state_dict(d))
    model.eval()
    with torch.no_grad():
        logits = model(**{k: torch.from_numpy(v) for k, v in batch.items()})["prediction_logits"]  # (B, T, V)
    is_mask = batch["input_ids"] == special_ids(tok).mask
    where = np.argwhere(is_mask)
    assert len(where) >= 8 and len(set(where[:, 0])) >= 5  # several rows, several masks in some
    B, T = batch["input_ids"].shape
    assert got["indices"].shape == got["values"].shape == (B, T, 5)
    probs = torch.softmax(logits[where[:, 0], where[:, 1]], -1).topk(5)
    np.testing.assert_allclose(got["values"][is_mask], probs.values.numpy(), atol=1e-5)
    np.testing.assert_array_equal(got["indices"][is_mask][:, 0], probs.indices[:, 0].numpy())
    # no [MASK], no candidates
    assert (got["indices"][~is_mask] == -1).all() and (got["values"][~is_mask] == 0).all()


def test_fill_mask_batch_without_any_mask_gives_no_candidates(runs, bundles):
    batch = mixed_batch(load_tokenizer(runs["fill-mask"]), n=3, masks=False)
    got = run_onnx(bundles["fill-mask"][0], batch)
    assert got["indices"].shape == (*batch["input_ids"].shape, 5)
    assert (got["indices"] == -1).all() and (got["values"] == 0).all()


def test_fill_mask_bundle_description(runs, bundles):
    path, meta = bundles["fill-mask"]
    on_disk = json.loads((path / "mlmkit.json").read_text())
    assert on_disk["task"] == meta["task"] == "fill-mask" and on_disk["trained_as"] == "pretraining"
    assert on_disk["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
    assert on_disk["outputs"] == {"indices": ["batch", "sequence", "k"], "values": ["batch", "sequence", "k"]}
    assert (on_disk["opset"] >= 17 and on_disk["precision"] == "fp32" and on_disk["options"]
            == {"candidates": 5})
    # two layers: 2 fused attentions, 2 skip layer norms each, one embedding layer norm, the GELUs
    f = on_disk["fused_operators"]
    assert f["Attention"] == 2 and f["SkipLayerNormalization"] == 4 and f["EmbedLayerNormalization"] == 1
    assert f.get("BiasGelu", 0) == 2
    p = on_disk["parity"]
    assert p["max_abs_diff"]["values"] <= 1e-4 and p["top1_agreement"] == 1.0
    assert p["sample"]["min_length"] < p["sample"]["max_length"]
    assert on_disk["tokenizer"]["vocab_size"] == load_tokenizer(path).get_vocab_size()
    assert (path / "tokenizer.json").exists() and not list(path.glob(".export-*"))


def test_fill_mask_graph_is_fused_and_stores_tied_weight_once(runs, bundles):
    m = onnx.load(str(bundles["fill-mask"][0] / "model.onnx"))
    ops = {n.op_type for n in m.graph.node}
    assert {"Attention", "SkipLayerNormalization", "EmbedLayerNormalization", "TopK"} <= ops
    cfg = load_config(runs["fill-mask"])
    big = [i.name for i in m.graph.initializer
           if list(i.dims) in ([cfg.vocab_size, cfg.hidden_size], [cfg.hidden_size, cfg.vocab_size])]
    assert len(big) == 1, big  # the word embeddings double as the MLM decoder
    # no output has a vocabulary-sized axis: only top-k leaves the graph
    assert [o.name for o in m.graph.output] == ["indices", "values"]
    assert all(o.type.tensor_type.shape.dim[2].dim_value == 5 for o in m.graph.output)


def test_unoptimized_and_int8_exports(runs, bundles, tmp_path, monkeypatch, caplog):
    d = runs["fill-mask"]
    # such a CPU, without bf16 units: an fp32 export says int8 pays
    monkeypatch.setattr(export_mod, "cpu_feature", lambda kind: "AVX512-VNNI" if kind == "int8" else None)
    # no bf16 gate passed: int8 is the way to speed
    monkeypatch.setenv("MLMKIT_CPU_FLAGS", "-amx_bf16,-avx512_bf16")
    with caplog.at_level("INFO", logger="mlmkit"):
        plain = run_export(d, tmp_path / "plain", optimize=False, top_k=3)
    assert "this CPU has AVX512-VNNI" in caplog.text and "--precision int8" in caplog.text
    caplog.clear()
    assert (plain["fused_operators"] == {} and plain["optimizations"] == [] and plain["options"]
            == {"candidates": 3})
    assert "Attention" not in {n.op_type
                               for n in onnx.load(str(tmp_path / "plain" / "model.onnx")).graph.node}
    with caplog.at_level("INFO", logger="mlmkit"):
        q = run_export(d, tmp_path / "int8", quantize="int8")
    assert "this CPU has" not in caplog.text  # int8 already
    assert q["precision"] == "int8" and "int8-dynamic-per-channel" in q["optimizations"]
    ops = {n.op_type for n in onnx.load(str(tmp_path / "int8" / "model.onnx")).graph.node}
    assert ops & {"QAttention", "DynamicQuantizeMatMul", "MatMulInteger"}
    assert 0.8 <= q["parity"]["int8_top1_agreement_vs_fp32"] <= 1.0
    assert q["model_bytes"] < bundles["fill-mask"][1]["model_bytes"]


def test_min_agreement_refuses_a_bundle_below_it_and_writes_nothing(runs, tmp_path):
    """An embedding's int8 vectors are never exactly fp32's (cosine < 1): --min-agreement 1 refuses the
    bundle in one ParityError naming the measure, and the bundle directory gets no model."""
    with pytest.raises(ParityError,
                       match=r"int8 graph's mean cosine with fp32 on the sample batch is 0\.\d+, below "
                             r"--min-agreement 1; no bundle written"):
        run_export(runs["embedding"], tmp_path / "b", quantize="int8", min_agreement=1.0)
    assert not (tmp_path / "b" / "model.onnx").exists() and not (tmp_path / "b" / "mlmkit.json").exists()
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(ConfigError, match="--calibrate .* has no inputs"):
        run_export(runs["embedding"], tmp_path / "c", quantize="int8", calibrate=tmp_path / "empty.txt")


# ---- task bundles ------------------------------------------------------------------------------
def test_every_registered_task_has_a_setup():
    """The task bundles below are the registry's tasks: a new built-in task must add its setup to
    TASK_SETUP (tests/task_runs.py); the masked-LM task's run is the base model itself."""
    registry.reset()
    trained = {n for n, p in registry.tasks().items() if not p.masked_lm}
    assert set(TASK_SETUP) == trained, "add the new tasks to TASK_SETUP in tests/task_runs.py"
    assert registry.masked_lm_task().name == "fill-mask"


@pytest.mark.parametrize("kind", list(TASK_SETUP))
def test_task_bundle_matches_pytorch_on_mixed_lengths(kind, runs, bundles):
    d = runs[kind]
    task, net, _, _ = load_finetuned(d)
    net.eval()
    batch = mixed_batch(load_tokenizer(d), n=7)
    with torch.no_grad():
        ref = net(**{k: torch.from_numpy(v) for k, v in batch.items()})
    got = run_onnx(bundles[kind][0], batch)
    assert set(got) == set(task.outputs)
    real = batch["attention_mask"].astype(bool)
    for name, axes in task.outputs.items():
        a, b = ref[name].numpy(), got[name]
        assert a.shape == b.shape
        if per_token(axes):  # per token: compare at the real tokens
            a, b = a[real], b[real]
        assert np.abs(a - b).max() < 1e-4, name
        assert np.abs(a).max() > 1e-3  # outputs are not flat, so the comparison means something
    meta = bundles[kind][1]
    assert meta["task"] == kind and meta["labels"] == TASK_SETUP[kind][0]
    # the classification graph runs its last layer for [CLS] only: that attention stays unfused
    assert meta["fused_operators"]["Attention"] == (1 if kind in ("classification", "rerank") else 2)
    assert meta["options"] == task.saved_options(task.resolve_options(TASK_SETUP[kind][2]))
    assert meta["outputs"] == {k: list(v) for k, v in task.outputs.items()}


# ---- failures ----------------------------------------------------------------------------------
def test_parity_failure_names_the_output(runs, tmp_path, monkeypatch):
    real = export_mod.torch_outputs

    def off(*a: Any) -> dict[str, np.ndarray]:
        out = real(*a)
        out["logits"] = out["logits"] + 1e-3
        return out

    monkeypatch.setattr(export_mod, "torch_outputs", off)
    with pytest.raises(ParityError, match=r"logits: max diff 1\.00e-03"):
        run_export(runs["classification"], tmp_path / "b")
    assert not (tmp_path / "b" / "mlmkit.json").exists()


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"quantize": "int4"}, "--quantize int4 is not supported"),
        ({"quantize": "int8", "fp16": True}, "exclude each other"),
        ({"opset": 13}, "--opset 13 is not supported"),
        ({"opset": 99}, "--opset 99 is not supported"),
        ({"top_k": 0}, "--top-k must be at least 1"),
        ({"top_k": 10**6}, "--top-k must be between 1 and the vocabulary size"),
        ({"calibrate": Path("x.txt")}, "--calibrate is for --quantize int8"),
        ({"precision": "bf17"}, "--precision bf17 is not a precision"),
        ({"precision": "int8", "fp16": True}, "--precision int8 and --fp16 disagree"),
        ({"quantize": "int8", "min_agreement": 0.0}, "--min-agreement must be above 0 and at most 1"),
        ({"quantize": "int8", "min_agreement": 1.5}, "--min-agreement must be above 0 and at most 1"),
        ({"quantize": "int8", "min_agreement": float("nan")},
         "--min-agreement must be above 0 and at most 1"),
    ],
)
def test_bad_export_options(runs, tmp_path, kw, match):
    with pytest.raises(ConfigError, match=match):
        run_export(runs["fill-mask"], tmp_path / "b", **kw)


def test_not_a_run_directory(tmp_path):
    with pytest.raises(ConfigError, match="is not a run directory"):
        run_export(tmp_path, tmp_path / "b")


def test_task_export_module_is_checked_against_the_model(runs, tmp_path, monkeypatch):
    """A task's optional export_module(model) is exported instead of the model, and held to the
    model's own forward: a module that drifts from it is refused."""
    task = get_task("classification")

    class Drifting(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask=None, token_type_ids=None):
            out = self.model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return {**out, "logits": out["logits"] * 0.99}

    monkeypatch.setattr(task, "export_module", Drifting, raising=False)
    with pytest.raises(ParityError, match="logits: max diff"):
        run_export(runs["classification"], tmp_path / "b")
    monkeypatch.setattr(task, "export_module", lambda model: model, raising=False)
    assert run_export(runs["classification"], tmp_path / "c")["parity"]["top1_agreement"] == 1.0


def test_fp16_export(runs, bundles, tmp_path):
    m = run_export(runs["classification"], tmp_path / "h", fp16=True)
    assert m["precision"] == "fp16" and "fp16" in m["optimizations"]
    assert m["model_bytes"] < 0.7 * bundles["classification"][1]["model_bytes"]
    g = onnx.load(str(tmp_path / "h" / "model.onnx"))
    assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in g.graph.initializer)
    # fp32 outputs kept
    assert [i.type.tensor_type.elem_type for i in g.graph.output] == [onnx.TensorProto.FLOAT]
    p = m["parity"]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert p["fp16_check"].startswith(("measured", "skipped: no usable CUDA GPU"))
    else:  # onnxruntime's fp16 kernels of the fused operators exist for CUDA only: said, not guessed
        assert p["fp16_check"] == "skipped: this onnxruntime has no CUDA execution provider"
    if p["fp16_check"].startswith("measured"):
        assert p["fp16_top1_agreement_vs_fp32"] >= 0.9
    else:
        assert p["fp16_top1_agreement_vs_fp32"] is None


def _masked_lm(out: Path, **sizes) -> Path:
    """A randomly initialised BertForMaskedLM with a WordPiece vocabulary of BERT's size (30,522
    tokens: the vocabulary a SPLADE bundle picks its top terms from); ``sizes``: the encoder's, tiny
    by default."""
    import itertools

    from transformers import BertConfig as HFConfig
    from transformers import BertForMaskedLM

    words = ["".join(p) for p in itertools.product("abcdefghijklmnopqrstuvwxyz", repeat=3)]
    pieces = [*words, *(f"##{w}" for w in words)]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"the quick brown fox jumps over lazy dog".split()]
    vocab += [p for p in pieces if p not in vocab][: 30522 - len(vocab)]
    out.mkdir(parents=True)
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    cfg = HFConfig(vocab_size=len(vocab),
                   **{"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                      "intermediate_size": 128, **sizes})
    BertForMaskedLM(cfg).save_pretrained(out)
    return out


def _sparse_export_sizes(base: Path, tmp_path: Path, sizes: tuple[int | None, ...]) -> None:
    from mlmkit.runtime.pipeline import Pipeline

    for k in sizes:
        # the parity gate passes
        meta = run_export(base, tmp_path / f"k{k}", task="sparse-embedding", top_k=k)
        want = 256 if k is None else k
        assert meta["options"]["max_terms"] == want and "top_k" not in meta
        (vec,) = Pipeline.load(tmp_path / f"k{k}")(["the quick brown fox jumps over the lazy dog"])
        assert 0 < len(vec["indices"]) <= want and len(vec["indices"]) == len(vec["values"])


def test_sparse_export_of_a_full_vocabulary_at_the_default_and_what_top_k_sets(tmp_path):
    """A failure found before: the default 256 terms of a 30,522-token masked LM failed the parity gate
    (near-equal terms trading places at the cut). --top-k sets the terms; a task without a top-k refuses
    it."""
    from mlmkit.exporter.bundle import _top_k_option

    base = _masked_lm(tmp_path / "mlm")
    _sparse_export_sizes(base, tmp_path, (None,))  # more sizes: the slow test, at MiniLM's size
    from mlmkit.args import ExportArgs

    sparse = get_task("sparse-embedding")
    assert _top_k_option(sparse, ExportArgs(run=base, out=tmp_path / "o", top_k=64)) == {"max_terms": 64}
    assert _top_k_option(sparse, ExportArgs(run=base, out=tmp_path / "o",
                                            options={"max_terms": 8})) == {"max_terms": 8}
    with pytest.raises(ConfigError, match="--top-k 64 and --option max_terms=32 disagree"):
        run_export(base, tmp_path / "x", task="sparse-embedding", top_k=64, options={"max_terms": 32})
    with pytest.raises(ConfigError, match="--top-k is for fill-mask and sparse-embedding exports, not for "
                                          "task 'embedding'"):
        run_export(base, tmp_path / "y", task="embedding", top_k=8)


@pytest.mark.slow
def test_sparse_export_of_a_minilm_size_masked_lm(tmp_path):
    base = _masked_lm(tmp_path / "mlm", hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                      intermediate_size=1536)
    _sparse_export_sizes(base, tmp_path, (None, 64, 512))


def test_a_one_layer_classifier_exports_fused_and_agrees(tmp_path):
    """Its one layer is the [CLS]-only layer: there is no full attention for onnxruntime to fuse the
    embeddings' normalisation with, and the export must not demand it (a distilled 1-layer student)."""
    from conftest import make_base_model
    from task_runs import corpus, make_task_run

    base = make_base_model(tmp_path / "base", corpus(), num_hidden_layers=1)
    run = make_task_run(base, "classification", tmp_path / "clf")
    meta = run_export(run, tmp_path / "bundle")
    assert meta["fused_operators"].get("SkipLayerNormalization") and meta["parity"]["top1_agreement"] == 1.0
