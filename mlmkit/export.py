"""`mlmkit export`: a run directory -> a self-contained ONNX bundle (model.onnx, tokenizer.json, mlmkit.json).

The steps, each checked rather than assumed:

1. the model is rebuilt from the run (a pretraining run becomes a fill-mask graph; a fine-tuned run
   exports exactly its task's ``onnx_outputs()`` from the task model's own forward);
2. attention is switched to its eager form and exported with the TorchScript exporter
   (``dynamo=False``): the only combination onnxruntime's BERT fusions recognise (PERF_NOTES);
3. onnxruntime's transformer optimizer fuses Attention, EmbedLayerNormalization,
   SkipLayerNormalization and BiasGelu; the fused nodes are counted and a graph whose attention or
   layer norms did not fuse is refused;
4. PyTorch and onnxruntime run on a sample batch of mixed lengths (padded to the longest, as the
   runtime batches): the max abs difference per output and the top-1 agreement go into
   mlmkit.json, and an fp32 difference above ``ATOL`` raises ParityError;
5. optionally int8 dynamic quantisation (per-channel weights, CPU) or fp16 (CUDA), with the top-1
   agreement against the fp32 graph on the same sample.

The fill-mask graph finds the [MASK] positions itself (input_ids == mask id, on real tokens), runs
the MLM head on those rows only and returns the top-k inside the graph, so no batch x length x
vocabulary tensor is ever built. Its outputs are one row per [MASK] of the batch:

    mask_positions  (N, 2) int64    [batch row, token position] of each [MASK], row-major order
    top_ids         (N, k) int64    the k most likely token ids, best first
    top_probs       (N, k) float32  their softmax probabilities over the whole vocabulary

so any number of [MASK] per text works, and a batch without any gives N = 0.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .checkpoint import (
    atomic_write,
    atomic_write_text,
    is_model_dir,
    load_state_dict,
    load_weights,
    read_json,
    write_json,
)
from .config import BertConfig
from .errors import ConfigError, MlmkitError, ParityError
from .model import BertForPreTraining, extended_mask, set_attention_impl
from .registry import get_task
from .runtime import tokenizer_fingerprint
from .tokenizer import load_tokenizer, special_ids

log = logging.getLogger("mlmkit")

ATOL = 1e-4  # fp32 ONNX vs PyTorch, per output (optimum uses the same for BERT)
MIN_OPSET = 17  # LayerNormalization is a standard op from opset 17
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
INPUT_AXES = {0: "batch", 1: "sequence"}
FILL_MASK_OUTPUTS = {
    "mask_positions": {0: "masks"},
    "top_ids": {0: "masks"},
    "top_probs": {0: "masks"},
}
FUSED_OPS = ("Attention", "MultiHeadAttention", "EmbedLayerNormalization", "SkipLayerNormalization", "BiasGelu", "FastGelu", "Gelu", "LayerNormalization")
SAMPLE_ROWS = 24
BUNDLE_FORMAT = 1


# ---- the graphs ------------------------------------------------------------------------------
class FillMaskGraph(nn.Module):
    """Encoder + MLM head at the [MASK] positions only + top-k: the exported fill-mask model."""

    def __init__(self, model: BertForPreTraining, mask_id: int, top_k: int) -> None:
        super().__init__()
        self.bert, self.head = model.bert, model.cls.predictions
        self.mask_id, self.top_k = mask_id, top_k

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.bert.embeddings(input_ids, token_type_ids)
        x = self.bert.encoder(x, extended_mask(attention_mask, x.dtype))  # (B, T, H); no pooler needed
        B, T, H = x.shape
        is_mask = ((input_ids == self.mask_id) & (attention_mask != 0)).reshape(-1)  # (B*T,)
        flat = torch.nonzero(is_mask).squeeze(1)  # (N,) indices into B*T, row-major
        h = self.head.transform(x.reshape(-1, H).index_select(0, flat))  # (N, H)
        # F.linear on a 2-D input exports as Gemm(transB=1) reading the embedding matrix itself, so the
        # tied decoder weight is stored once (a MatMul on its transpose would get a folded second copy)
        logits = F.linear(h, self.head.decoder.weight, self.head.bias)  # (N, V)
        probs, ids = torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)  # (N, k)
        positions = torch.stack([flat // T, flat % T], dim=1)  # (N, 2): [row, position]
        return positions, ids, probs


class TaskGraph(nn.Module):
    """A task model's forward, returning its ``onnx_outputs()`` as a tuple in a fixed order."""

    def __init__(self, model: nn.Module, names: list[str]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        out = self.model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return tuple(out[n].float() for n in self.names)


# ---- loading the run -------------------------------------------------------------------------
def _run_meta(d: Path, cfg: BertConfig) -> dict[str, Any]:
    """mlmkit.json of a run; a Hugging Face masked-LM directory without one counts as pretraining."""
    if (d / "mlmkit.json").exists():
        return read_json(d / "mlmkit.json")
    archs = cfg.architectures or []
    if any(a in ("BertForPreTraining", "BertForMaskedLM") for a in archs):
        return {"task": "pretraining", "max_length": min(512, cfg.max_position_embeddings)}
    raise ConfigError(f"{d} has no mlmkit.json", "export an mlmkit run, or a Hugging Face BertForMaskedLM directory")


def _build(
    d: Path, meta: dict[str, Any], cfg: BertConfig, mask_id: int, top_k: int
) -> tuple[nn.Module, nn.Module, dict[str, dict[int, str]]]:
    """(module to export, PyTorch reference it must match, outputs with their dynamic axes).

    A task may provide ``export_module(model)``: a module with the same forward signature and
    outputs, written for inference (e.g. skipping work its outputs do not need); it is exported
    instead of the model and checked against the model's own forward."""
    sd = load_state_dict(d)
    if meta.get("task") in (None, "pretraining"):
        model = BertForPreTraining(cfg)
        # a BertForMaskedLM checkpoint has no NSP head or pooler; neither is in the fill-mask graph
        load_weights(model, sd, allow_missing=("cls.seq_relationship", "bert.pooler"))
        model.tie_weights()
        if top_k < 1 or top_k > cfg.vocab_size:
            raise ConfigError(f"--top-k must be between 1 and the vocabulary size {cfg.vocab_size}, got {top_k}")
        graph = FillMaskGraph(model, mask_id, top_k)
        return graph, graph, dict(FILL_MASK_OUTPUTS)
    task = get_task(meta["task"])
    model = task.build_model(cfg)
    load_weights(model, sd)
    model.eval()
    axes = {k: dict(v) for k, v in task.onnx_outputs().items()}
    reference = TaskGraph(model, list(axes))
    make = getattr(task, "export_module", None)
    return (TaskGraph(make(model), list(axes)) if make else reference), reference, axes


# ---- the sample batch ------------------------------------------------------------------------
def sample_batch(
    vocab_size: int, specials: Any, max_length: int, *, fill_mask: bool, rows: int = SAMPLE_ROWS, seed: int = 0
) -> dict[str, np.ndarray]:
    """Random token ids of mixed lengths (3 .. min(max_length, 128)) padded to the longest, half of
    them sentence pairs; for fill-mask 1-3 [MASK] per row except the first, which has none."""
    rng = np.random.default_rng(seed)
    longest = max(3, min(max_length, 128))
    lengths = np.linspace(3, longest, rows).round().astype(int)
    rng.shuffle(lengths)
    words = np.setdiff1d(np.arange(vocab_size), np.asarray(specials.all))
    T = int(lengths.max())
    ids = np.full((rows, T), specials.pad, dtype=np.int64)
    mask = np.zeros((rows, T), dtype=np.int64)
    types = np.zeros((rows, T), dtype=np.int64)
    for r, n in enumerate(lengths):
        seq = rng.choice(words, size=n)
        seq[0], seq[-1] = specials.cls, specials.sep
        if r % 2 and n >= 5:  # a pair: [CLS] A [SEP] B [SEP]
            cut = n // 2
            seq[cut] = specials.sep
            types[r, cut + 1 : n] = 1
        if fill_mask and r > 0:
            inner = [i for i in range(1, n - 1) if seq[i] != specials.sep]
            for i in rng.choice(inner, size=min(len(inner), int(rng.integers(1, 4))), replace=False):
                seq[i] = specials.mask
        ids[r, :n], mask[r, :n] = seq, 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


# ---- comparing outputs -----------------------------------------------------------------------
def _real(name: str, arr: np.ndarray, axes: dict[int, str], mask: np.ndarray) -> np.ndarray:
    """Per-token outputs at the real (unpadded) tokens only; others unchanged."""
    if any(i == 1 and "seq" in a for i, a in axes.items()):
        return arr[mask.astype(bool)]  # (tokens, ...)
    return arr


def _decisions(name: str, arr: np.ndarray, axes: dict[int, str], mask: np.ndarray) -> np.ndarray:
    """The top-1 choices an output stands for: argmax over labels, or over positions (QA logits)."""
    if name == "top_ids":
        return arr[:, 0]
    if arr.dtype.kind != "f":
        return arr.reshape(-1)
    if arr.ndim == 2 and any(i == 1 and "seq" in a for i, a in axes.items()):  # (B, T) position logits
        return np.where(mask.astype(bool), arr, -np.inf).argmax(axis=1)
    return _real(name, arr, axes, mask).argmax(axis=-1).reshape(-1)


def compare(
    ref: dict[str, np.ndarray], got: dict[str, np.ndarray], axes: dict[str, dict[int, str]], mask: np.ndarray
) -> dict[str, Any]:
    """Max abs difference per float output (real tokens only) and top-1 agreement over all outputs."""
    diffs: dict[str, float] = {}
    agree = total = 0
    for name, a in ref.items():
        b = got[name]
        if a.shape != b.shape:
            raise ParityError(f"output '{name}' has shape {b.shape} in onnxruntime but {a.shape} in PyTorch")
        if a.dtype.kind == "f" and name != "mask_positions":
            diffs[name] = float(np.abs(_real(name, a, axes[name], mask) - _real(name, b.astype(np.float32), axes[name], mask)).max(initial=0.0))
        if name == "mask_positions":
            if not np.array_equal(a, b):
                raise ParityError("output 'mask_positions' differs between onnxruntime and PyTorch")
            continue
        da, db = _decisions(name, a, axes[name], mask), _decisions(name, b, axes[name], mask)
        agree += int((da == db).sum())
        total += da.size
    return {"max_abs_diff": diffs, "top1_agreement": agree / total if total else 1.0}


# ---- onnx steps --------------------------------------------------------------------------------
@contextlib.contextmanager
def _quiet_onnxruntime() -> Iterator[None]:
    """onnxruntime's python tools log through the root logger (and configure it on first use):
    silence them during a call and leave the process's logging as it was."""
    handlers, disabled = list(logging.root.handlers), logging.root.manager.disable
    logging.disable(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(disabled)
        logging.root.handlers[:] = handlers


def _session(path: Path, providers: list[str] | None = None) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=providers or ["CPUExecutionProvider"])


def _run_onnx(session: Any, batch: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    feed = {i.name: batch[i.name] for i in session.get_inputs()}
    return dict(zip(names, session.run(names, feed)))


def _torch_outputs(graph: nn.Module, batch: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    set_attention_impl(graph, "sdpa")  # the reference is the model as PyTorch runs it
    with torch.no_grad():
        out = graph(*(torch.from_numpy(batch[k]) for k in INPUTS))
    return {n: o.numpy() for n, o in zip(names, out)}


def _torch_export(graph: nn.Module, batch: dict[str, np.ndarray], axes: dict[str, dict[int, str]], path: Path, opset: int) -> None:
    dummy = tuple(torch.from_numpy(batch[k][:2, : max(2, int(batch["attention_mask"][:2].sum(1).max()))]) for k in INPUTS)
    dynamic = {**{k: dict(INPUT_AXES) for k in INPUTS}, **axes}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(
            graph, dummy, str(path), dynamo=False, opset_version=opset, input_names=list(INPUTS),
            output_names=list(axes), dynamic_axes=dynamic, do_constant_folding=True,
        )


def fuse(src: Path, dst: Path, cfg: BertConfig, *, use_gpu: bool = False, partial_layers: int = 0) -> dict[str, int]:
    """onnxruntime's BERT fusions; returns the fused operator counts. Refuses a graph whose attention,
    embedding or skip layer norms did not fuse (an unfused graph runs, but several times slower).

    ``partial_layers``: trailing layers the graph computes for a few positions only (the
    classification graph's [CLS]-only last layer); their attention has no fused form and is small."""
    with _quiet_onnxruntime():
        from onnxruntime.transformers.optimizer import optimize_model

        om = optimize_model(
            str(src), model_type="bert", num_heads=cfg.num_attention_heads, hidden_size=cfg.hidden_size, use_gpu=use_gpu
        )
    stats = om.get_fused_operator_statistics()
    counts = {k: int(stats.get(k, 0)) for k in FUSED_OPS if stats.get(k, 0)}
    L = cfg.num_hidden_layers - partial_layers
    found = {**counts, "Attention": counts.get("Attention", 0) + counts.get("MultiHeadAttention", 0)}
    expected = {"Attention": L, "SkipLayerNormalization": 2 * L, "EmbedLayerNormalization": 1}
    short = {k: (found.get(k, 0), n) for k, n in expected.items() if found.get(k, 0) < n}
    if short:
        got = ", ".join(f"{k} {have} of {n}" for k, (have, n) in short.items())
        raise MlmkitError(
            f"onnxruntime's transformer fusion did not happen: {got} fused",
            "the attention was not exported in the eager form the fusion recognises; "
            "report it, or export the plain graph with --no-optimize",
        )
    om.save_model_to_file(str(dst))
    return counts


def quantize_int8(src: Path, dst: Path) -> None:
    """Dynamic int8 quantisation: int8 weights per output channel, activations quantised on the fly."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _quiet_onnxruntime():
        quantize_dynamic(
            src, dst, per_channel=True, weight_type=QuantType.QInt8,
            # the encoder's matmuls; the embeddings and the heads (a few rows per batch) stay fp32
            op_types_to_quantize=["MatMul", "Attention"],
            # the fused graph's contrib ops defeat ONNX shape inference without this (PERF_NOTES)
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )


def to_fp16(src: Path, dst: Path) -> None:
    """fp16 weights and compute, fp32 inputs/outputs: for the CUDA execution provider."""
    import onnx
    from onnxruntime.transformers.onnx_model import OnnxModel

    with _quiet_onnxruntime():
        om = OnnxModel(onnx.load(str(src)))
        om.convert_float_to_float16(keep_io_types=True)
        om.save_model_to_file(str(dst))


# ---- the bundle --------------------------------------------------------------------------------
def export(
    run_dir: str | Path,
    out_dir: str | Path,
    *,
    quantize: str | None = None,
    fp16: bool = False,
    optimize: bool = True,
    opset: int = 17,
    top_k: int = 5,
) -> dict[str, Any]:
    """Export a run directory to an ONNX bundle in ``out_dir``; returns the bundle's mlmkit.json.

    Args:
        run_dir: a pretraining run (exported as fill-mask) or a fine-tuned run of any registered task.
        out_dir: the bundle directory (created; existing bundle files are replaced).
        quantize: None or "int8" (dynamic, per-channel int8 weights; for the CPU).
        fp16: fp16 weights and compute for the CUDA execution provider.
        optimize: apply onnxruntime's transformer fusions (refusing a graph that does not fuse).
        opset: ONNX opset, at least 17.
        top_k: fill-mask candidates computed in the graph (the runtime can ask for fewer).
    """
    d = Path(run_dir)
    if not is_model_dir(d):
        raise ConfigError(f"{d} is not a run directory", "it needs config.json and model.safetensors (an mlmkit run)")
    if quantize not in (None, "int8"):
        raise ConfigError(f"--quantize {quantize} is not supported", "use --quantize int8")
    if quantize and fp16:
        raise ConfigError("--quantize int8 and --fp16 exclude each other", "int8 is for the CPU, fp16 for CUDA")
    if opset < MIN_OPSET:
        raise ConfigError(f"--opset {opset} is too old", f"use {MIN_OPSET} or newer")
    if (quantize or fp16) and not optimize:
        log.info("converting the unfused graph: expect it to be slower than with the fusions")
    cfg = BertConfig.load(d)
    meta = _run_meta(d, cfg)
    tok = load_tokenizer(d)
    if tok.get_vocab_size() > cfg.vocab_size:
        raise ConfigError(f"the tokenizer of {d} has {tok.get_vocab_size()} tokens, the model only {cfg.vocab_size}")
    specials = special_ids(tok)
    fill_mask = meta.get("task") in (None, "pretraining")
    max_length = int(min(meta.get("max_length") or 512, cfg.max_position_embeddings))

    graph, reference, axes = _build(d, meta, cfg, specials.mask, top_k)
    graph.eval()
    reference.eval()
    names = list(axes)
    batch = sample_batch(tok.get_vocab_size(), specials, max_length, fill_mask=fill_mask)
    ref = _torch_outputs(reference, batch, names)
    set_attention_impl(graph, "eager")

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".export-", dir=out))
    try:
        plain = work / "plain.onnx"
        _torch_export(graph, batch, axes, plain, opset)
        fp32, fused = plain, {}
        if optimize:
            fp32 = work / "fused.onnx"
            partial = int(getattr(getattr(graph, "model", None), "partial_layers", 0))
            fused = fuse(plain, fp32, cfg, use_gpu=fp16, partial_layers=partial)
        fp32_out = _run_onnx(_session(fp32), batch, names)
        parity = compare(ref, fp32_out, axes, batch["attention_mask"])
        bad = {k: v for k, v in parity["max_abs_diff"].items() if not v <= ATOL}
        if bad:
            listing = ", ".join(f"{k}: max diff {v:.2e}" for k, v in bad.items())
            raise ParityError(
                f"the exported graph differs from PyTorch beyond {ATOL:g}: {listing}",
                "export with --no-optimize to see whether the fusions cause it, and report it",
            )
        final, precision, steps = fp32, "fp32", (["transformer-fusion"] if optimize else [])
        if quantize:
            final, precision = work / "int8.onnx", "int8"
            quantize_int8(fp32, final)
            steps.append("int8-dynamic-per-channel")
            q = compare(fp32_out, _run_onnx(_session(final), batch, names), axes, batch["attention_mask"])
            parity["int8_top1_agreement_vs_fp32"] = q["top1_agreement"]
            parity["int8_max_abs_diff"] = q["max_abs_diff"]
        elif fp16:
            final, precision = work / "fp16.onnx", "fp16"
            to_fp16(fp32, final)
            steps.append("fp16")
            try:
                h = compare(fp32_out, _run_onnx(_session(final), batch, names), axes, batch["attention_mask"])
                parity["fp16_top1_agreement_vs_fp32"] = h["top1_agreement"]
                parity["fp16_max_abs_diff"] = h["max_abs_diff"]
            except ParityError:
                raise
            except Exception as e:  # fp16 contrib kernels exist for CUDA only; nothing to measure here
                parity["fp16_top1_agreement_vs_fp32"] = None
                log.info("fp16 graph not checked on this machine (%s)", type(e).__name__)
        parity["sample"] = {
            "rows": int(batch["input_ids"].shape[0]),
            "min_length": int(batch["attention_mask"].sum(1).min()),
            "max_length": int(batch["attention_mask"].sum(1).max()),
        }

        bundle_meta = _bundle_meta(meta, cfg, tok, axes, final, fill_mask=fill_mask, max_length=max_length, opset=opset,
                                   precision=precision, steps=steps, fused=fused, parity=parity, top_k=top_k, source=d)
        atomic_write(out / "model.onnx", lambda tmp: shutil.copyfile(final, tmp))
        atomic_write_text(out / "tokenizer.json", tok.to_str(pretty=False))
        write_json(out / "mlmkit.json", bundle_meta)  # last: a reader seeing it sees the new model
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return bundle_meta


def _bundle_meta(
    meta: dict[str, Any], cfg: BertConfig, tok: Any, axes: dict[str, dict[int, str]], final: Path, *,
    fill_mask: bool, max_length: int, opset: int, precision: str, steps: list[str], fused: dict[str, int],
    parity: dict[str, Any], top_k: int, source: Path,
) -> dict[str, Any]:
    # the run's metadata travels along (labels, options, QA's null threshold ...): the task's
    # featurize / postprocess read it at inference time exactly as at evaluation
    keep = {k: v for k, v in meta.items() if k not in ("train_args", "history", "state")}
    import onnx

    graph_inputs = [i.name for i in onnx.load(str(final), load_external_data=False).graph.input]
    return {
        **keep,
        "format": "mlmkit-onnx-bundle",
        "format_version": BUNDLE_FORMAT,
        "task": "fill-mask" if fill_mask else meta["task"],
        "trained_as": meta.get("task", "pretraining"),
        "labels": meta.get("labels"),
        "max_length": max_length,
        "options": meta.get("options", {}),
        "inputs": graph_inputs,
        "outputs": {k: {str(i): a for i, a in v.items()} for k, v in axes.items()},
        "top_k": top_k if fill_mask else None,
        "opset": opset,
        "precision": precision,
        "optimizations": steps,
        "fused_operators": fused,
        "parity": parity,
        "tokenizer": tokenizer_fingerprint(tok),
        "model": {
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_hidden_layers,
            "num_attention_heads": cfg.num_attention_heads, "max_position_embeddings": cfg.max_position_embeddings,
        },
        "model_bytes": os.path.getsize(final),
        "source": str(source),
    }
