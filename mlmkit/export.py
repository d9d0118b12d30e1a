"""`mlmkit export`: a run directory -> a self-contained ONNX bundle (model.onnx, tokenizer.json, mlmkit.json).

The steps, each checked rather than assumed:

1. the model is rebuilt from the run (a pretraining run becomes a fill-mask graph; a fine-tuned run
   exports exactly its task's ``onnx_outputs()`` from the task model's own forward);
2. attention is switched to its eager form and exported with the TorchScript exporter
   (``dynamo=False``): the only combination onnxruntime's BERT fusions recognise (PERF_NOTES);
   the graph's inputs are the family's (no token_type_ids for RoBERTa, DistilBERT, ModernBERT);
3. onnxruntime's transformer optimizer fuses Attention, EmbedLayerNormalization,
   SkipLayerNormalization and BiasGelu; the fused nodes are counted and a graph short of what its
   family's graphs were measured to fuse (``Family.fusions``) is refused;
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
import json
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

from .args import ExportArgs
from .checkpoint import is_model_dir, load_state_dict, load_weights
from .config import ModelConfig
from .errors import ConfigError, MlmkitError, ParityError
from .files import atomic_write, atomic_write_text, exclusive, write_json
from .hub import describe
from .models.core import BertForPreTraining, extended_mask, set_attention_impl
from .registry import BATCH, SEQUENCE, TaskContext, get_task, per_token
from .runtime import BUNDLE_FORMAT, LABELS_KEY, tokenizer_fingerprint
from .tokenizer import load_tokenizer, special_ids

log = logging.getLogger("mlmkit")

ATOL = 1e-4  # fp32 ONNX vs PyTorch, per output (optimum uses the same for BERT)
MIN_OPSET = 17  # LayerNormalization is a standard op from opset 17
MAX_OPSET = 23  # the TorchScript exporter's newest (torch.onnx ONNX_MAX_OPSET); 17-23 fuse and pass parity
INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # the graph's, less token_type_ids where the family has none
MASKS = "masks"  # the fill-mask graph's rows: one per [MASK] of the batch
DYNAMIC_AXES = (BATCH, SEQUENCE, MASKS)  # axes whose size varies from one run of the graph to the next
FILL_MASK_OUTPUTS = {
    "mask_positions": (MASKS, "coordinate"),
    "top_ids": (MASKS, "k"),
    "top_probs": (MASKS, "k"),
}
FUSED_OPS = ("Attention", "MultiHeadAttention", "EmbedLayerNormalization", "SkipLayerNormalization", "BiasGelu", "FastGelu", "Gelu",
             "LayerNormalization", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization", "RotaryEmbedding",
             "GroupQueryAttention")
FUSED_ONCE = ("EmbedLayerNormalization",)  # one per graph; Family.fusions counts the others per layer
SAMPLE_ROWS = 24


# ---- the graphs ------------------------------------------------------------------------------
class FillMaskGraph(nn.Module):
    """Encoder + MLM head at the [MASK] positions only + top-k: the exported fill-mask model."""

    def __init__(self, model: BertForPreTraining, mask_id: int, top_k: int) -> None:
        super().__init__()
        self.bert, self.head = model.bert, model.cls.predictions
        self.mask_id, self.top_k = mask_id, top_k

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
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
    """A task model's forward, returning its declared ``outputs`` as a tuple in a fixed order."""

    def __init__(self, model: nn.Module, names: list[str]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        out = self.model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return tuple(out[n].float() for n in self.names)


# ---- loading the run -------------------------------------------------------------------------
def _build(
    d: Path, meta: dict[str, Any], cfg: ModelConfig, mask_id: int, top_k: int
) -> tuple[nn.Module, nn.Module, dict[str, tuple[str, ...]], int]:
    """(module to export, PyTorch reference it must match, outputs with their axes, partial layers).

    A task's ``export_module(model)`` (the model itself by default) is exported and checked against
    the model's own forward; ``partial_layers`` tells the fusion check what it skipped (nothing
    when the task kept the model as it is, as for a head that reads every position)."""
    sd = load_state_dict(d, cfg)
    if meta["task"] == "pretraining":
        model = BertForPreTraining(cfg)
        # a BertForMaskedLM checkpoint has no NSP head or pooler; neither is in the fill-mask graph
        load_weights(model, sd, allow_missing=("cls.seq_relationship", "bert.pooler"))
        model.tie_weights()
        if top_k > cfg.vocab_size:
            raise ConfigError(f"--top-k must be between 1 and the vocabulary size {cfg.vocab_size}, got {top_k}")
        graph = FillMaskGraph(model, mask_id, top_k)
        return graph, graph, dict(FILL_MASK_OUTPUTS), 0
    task = get_task(meta["task"])
    model = task.build_model(cfg, TaskContext.from_meta(meta, task.resolve_options(saved=meta.get("options"))))
    load_weights(model, sd)
    model.eval()
    names = list(task.outputs)
    module = task.export_module(model)
    partial = task.partial_layers if module is not model else 0
    return TaskGraph(module, names), TaskGraph(model, names), dict(task.outputs), partial


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
def _real(arr: np.ndarray, axes: tuple[str, ...], mask: np.ndarray) -> np.ndarray:
    """Per-token outputs at the real (unpadded) tokens only; others unchanged."""
    return arr[mask.astype(bool)] if per_token(axes) else arr  # (tokens, ...)


def _decisions(name: str, arr: np.ndarray, axes: tuple[str, ...], mask: np.ndarray) -> np.ndarray | None:
    """The top-1 choices an output stands for: argmax over its last axis (labels), over positions for
    (batch, sequence) scores (QA), the ids themselves for integer outputs; None for an output that
    makes no choice (one number per row, such as a regression score, or fill-mask's sorted probabilities)."""
    if name == "top_ids":
        return arr[:, 0]
    if name == "top_probs" or (arr.dtype.kind == "f" and len(axes) == 1):
        return None
    if arr.dtype.kind != "f":
        return arr.reshape(-1)
    if tuple(axes) == (BATCH, SEQUENCE):
        return np.where(mask.astype(bool), arr, -np.inf).argmax(axis=1)
    return _real(arr, axes, mask).argmax(axis=-1).reshape(-1)


def compare(
    ref: dict[str, np.ndarray], got: dict[str, np.ndarray], axes: dict[str, tuple[str, ...]], mask: np.ndarray
) -> dict[str, Any]:
    """Max abs difference per float output (real tokens only) and the top-1 agreement over the outputs
    that make choices (None when none does)."""
    diffs: dict[str, float] = {}
    agree = total = 0
    for name, a in ref.items():
        b = got[name]
        if a.shape != b.shape:
            raise ParityError(f"output '{name}' has shape {b.shape} in onnxruntime but {a.shape} in PyTorch")
        if name == "mask_positions":
            if not np.array_equal(a, b):
                raise ParityError("output 'mask_positions' differs between onnxruntime and PyTorch")
            continue
        if a.dtype.kind == "f":
            diffs[name] = float(np.abs(_real(a, axes[name], mask) - _real(b.astype(np.float32), axes[name], mask)).max(initial=0.0))
        da, db = _decisions(name, a, axes[name], mask), _decisions(name, b, axes[name], mask)
        if da is not None:
            agree += int((da == db).sum())
            total += da.size
    return {"max_abs_diff": diffs, "top1_agreement": agree / total if total else None}


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


def graph_inputs(cfg: ModelConfig) -> tuple[str, ...]:
    """The exported graph's inputs: token_type_ids only for families that have token types."""
    return INPUTS if cfg.family.uses_token_types(cfg) else INPUTS[:2]


def _torch_outputs(graph: nn.Module, batch: dict[str, np.ndarray], names: list[str], inputs: tuple[str, ...]) -> dict[str, np.ndarray]:
    set_attention_impl(graph, "sdpa")  # the reference is the model as PyTorch runs it
    with torch.no_grad():
        out = graph(*(torch.from_numpy(batch[k]) for k in inputs))
    return {n: o.numpy() for n, o in zip(names, out)}


def _torch_export(graph: nn.Module, batch: dict[str, np.ndarray], axes: dict[str, tuple[str, ...]], path: Path, opset: int,
                  inputs: tuple[str, ...]) -> None:
    dummy = tuple(torch.from_numpy(batch[k][:2, : max(2, int(batch["attention_mask"][:2].sum(1).max()))]) for k in inputs)
    dynamic = {name: {i: a for i, a in enumerate(ax) if a in DYNAMIC_AXES} for name, ax in {**dict.fromkeys(inputs, (BATCH, SEQUENCE)), **axes}.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(
            graph, dummy, str(path), dynamo=False, opset_version=opset, input_names=list(inputs),
            output_names=list(axes), dynamic_axes=dynamic, do_constant_folding=True,
        )


def fuse(src: Path, dst: Path, cfg: ModelConfig, *, use_gpu: bool = False, partial_layers: int = 0) -> dict[str, int]:
    """onnxruntime's BERT fusions; returns the fused operator counts. Refuses a graph short of what
    its family's graphs fuse (``Family.fusions``: an unfused graph runs, but several times slower).

    ``partial_layers``: trailing layers the graph computes for a few positions only (the
    classification graph's [CLS]-only last layer); their attention has no fused form and is small.
    ``use_gpu`` (fp16 bundles) lets onnxruntime pick its CUDA forms; where those need the symbolic
    shape inference a graph defeats (ModernBERT's rotary), the CPU forms are fused instead: they run
    on the CUDA execution provider as well."""
    om, counts, short = _optimize(src, cfg, use_gpu, partial_layers)
    if short and use_gpu:
        om, counts, short = _optimize(src, cfg, False, partial_layers)
    if short:
        got = ", ".join(f"{k} {have} of {n}" for k, (have, n) in short.items())
        raise MlmkitError(
            f"onnxruntime's transformer fusion did not happen: {got} fused",
            "the attention was not exported in the eager form the fusion recognises; "
            "report it, or export the plain graph with --no-optimize",
        )
    om.save_model_to_file(str(dst))
    return counts


def _optimize(src: Path, cfg: ModelConfig, use_gpu: bool, partial_layers: int) -> tuple[Any, dict[str, int], dict[str, tuple[int, int]]]:
    """(optimized model, fused operator counts, what fell short of the family's fusions)."""
    with _quiet_onnxruntime():
        from onnxruntime.transformers.optimizer import optimize_model

        om = optimize_model(
            str(src), model_type="bert", num_heads=cfg.num_attention_heads, hidden_size=cfg.hidden_size, use_gpu=use_gpu
        )
    stats = om.get_fused_operator_statistics()
    counts = {k: int(stats.get(k, 0)) for k in FUSED_OPS if stats.get(k, 0)}
    L = cfg.num_hidden_layers - partial_layers
    found = {**counts, "Attention": counts.get("Attention", 0) + counts.get("MultiHeadAttention", 0)}
    expected = {k: n if k in FUSED_ONCE else n * L for k, n in cfg.family.fusions.items()}
    return om, counts, {k: (found.get(k, 0), n) for k, n in expected.items() if found.get(k, 0) < n}


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


def check_fp16(
    path: Path, fp32_out: dict[str, np.ndarray], batch: dict[str, np.ndarray], axes: dict[str, tuple[str, ...]],
    names: list[str],
) -> dict[str, Any]:
    """The fp16 graph against the fp32 one, measured where it can run: onnxruntime's fp16 kernels of
    the fused operators exist for CUDA only, so without a usable CUDA execution provider the check is
    skipped and says why. Errors on CUDA are raised, never swallowed."""
    import onnxruntime as ort

    skipped = {"fp16_top1_agreement_vs_fp32": None, "fp16_max_abs_diff": None}
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return {**skipped, "fp16_check": "skipped: this onnxruntime has no CUDA execution provider"}
    session = _session(path, ["CUDAExecutionProvider", "CPUExecutionProvider"])
    if "CUDAExecutionProvider" not in session.get_providers():
        return {**skipped, "fp16_check": "skipped: no usable CUDA GPU"}
    h = compare(fp32_out, _run_onnx(session, batch, names), axes, batch["attention_mask"])
    return {"fp16_top1_agreement_vs_fp32": h["top1_agreement"], "fp16_max_abs_diff": h["max_abs_diff"],
            "fp16_check": "measured with the CUDA execution provider"}


def to_fp16(src: Path, dst: Path) -> None:
    """fp16 weights and compute, fp32 inputs/outputs: for the CUDA execution provider."""
    import onnx
    from onnxruntime.transformers.onnx_model import OnnxModel

    with _quiet_onnxruntime():
        om = OnnxModel(onnx.load(str(src)))
        om.convert_float_to_float16(keep_io_types=True)
        om.save_model_to_file(str(dst))


# ---- the bundle --------------------------------------------------------------------------------
def export(args: ExportArgs) -> dict[str, Any]:
    """Export a run directory to an ONNX bundle in ``args.out``; returns the bundle's mlmkit.json.

    ``args.run``: a pretraining run (exported as fill-mask) or a fine-tuned run of any registered
    task; the bundle directory is created, and bundle files already there are replaced."""
    with exclusive(args.out):  # two exports into one bundle directory would mix their files
        return _export(args)


def _export(args: ExportArgs) -> dict[str, Any]:
    d = Path(args.run)
    if not is_model_dir(d):
        raise ConfigError(f"{d} is not a run directory", "it needs config.json and model.safetensors (an mlmkit run)")
    if not MIN_OPSET <= args.opset <= MAX_OPSET:
        raise ConfigError(f"--opset {args.opset} is not supported", f"use {MIN_OPSET} to {MAX_OPSET}")
    if (args.quantize or args.fp16) and not args.optimize:
        log.info("converting the unfused graph: expect it to be slower than with the fusions")
    cfg = ModelConfig.load(d)
    meta = describe(d, cfg, args.task)
    if meta["task"] == "pretraining" and args.options:
        raise ConfigError(f"--{next(iter(args.options)).replace('_', '-')}: a fill-mask bundle takes no task options")
    if meta["task"] != "pretraining":  # a trained model's fixed options stay; a foreign checkpoint's are a reading
        plugin = get_task(meta["task"])
        meta["options"] = plugin.resolve_options(args.options, saved=meta.get("options"), model=meta["source"]["format"] == "mlmkit")
    tok = load_tokenizer(d)
    if tok.get_vocab_size() > cfg.vocab_size:
        raise ConfigError(f"the tokenizer of {d} has {tok.get_vocab_size()} tokens, the model only {cfg.vocab_size}")
    specials = special_ids(tok)
    fill_mask = meta["task"] == "pretraining"
    max_length = int(min(meta.get("max_length") or 512, cfg.max_tokens))

    graph, reference, axes, partial = _build(d, meta, cfg, specials.mask, args.top_k)
    graph.eval()
    reference.eval()
    names = list(axes)
    batch = sample_batch(tok.get_vocab_size(), specials, max_length, fill_mask=fill_mask)
    inputs = graph_inputs(cfg)
    ref = _torch_outputs(reference, batch, names, inputs)
    set_attention_impl(graph, "eager")
    mask = batch["attention_mask"]

    out = Path(args.out)
    work = Path(tempfile.mkdtemp(prefix=".export-", dir=out))
    try:
        plain = work / "plain.onnx"
        _torch_export(graph, batch, axes, plain, args.opset, inputs)
        fp32, fused = plain, {}
        if args.optimize:
            fp32 = work / "fused.onnx"
            fused = fuse(plain, fp32, cfg, use_gpu=args.fp16, partial_layers=partial)
        fp32_out = _run_onnx(_session(fp32), batch, names)
        parity = compare(ref, fp32_out, axes, mask)
        bad = {k: v for k, v in parity["max_abs_diff"].items() if not v <= ATOL}
        if bad:
            listing = ", ".join(f"{k}: max diff {v:.2e}" for k, v in bad.items())
            raise ParityError(
                f"the exported graph differs from PyTorch beyond {ATOL:g}: {listing}",
                "export with --no-optimize to see whether the fusions cause it, and report it",
            )
        final, precision, steps = fp32, "fp32", (["transformer-fusion"] if args.optimize else [])
        if args.quantize:
            final, precision = work / "int8.onnx", "int8"
            quantize_int8(fp32, final)
            steps.append("int8-dynamic-per-channel")
            q = compare(fp32_out, _run_onnx(_session(final), batch, names), axes, mask)
            parity["int8_top1_agreement_vs_fp32"] = q["top1_agreement"]
            parity["int8_max_abs_diff"] = q["max_abs_diff"]
        elif args.fp16:
            final, precision = work / "fp16.onnx", "fp16"
            to_fp16(fp32, final)
            steps.append("fp16")
            parity.update(check_fp16(final, fp32_out, batch, axes, names))
        parity["sample"] = {
            "rows": int(batch["input_ids"].shape[0]),
            "min_length": int(batch["attention_mask"].sum(1).min()),
            "max_length": int(batch["attention_mask"].sum(1).max()),
        }

        record_labels(final, meta.get("labels"))
        bundle_meta = _bundle_meta(meta, cfg, tok, axes, final, fill_mask=fill_mask, max_length=max_length, opset=args.opset,
                                   precision=precision, steps=steps, fused=fused, parity=parity, top_k=args.top_k, source=d)
        atomic_write(out / "model.onnx", lambda tmp: shutil.copyfile(final, tmp))
        atomic_write_text(out / "tokenizer.json", tok.to_str(pretty=False))
        write_json(out / "mlmkit.json", bundle_meta)  # last: a reader seeing it sees the new model
        if (d / "curves.png").is_file():
            atomic_write(out / "curves.png", lambda tmp: shutil.copyfile(d / "curves.png", tmp))
        from .cards import write_card

        write_card(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return bundle_meta


def record_labels(path: Path, labels: list[str] | None) -> None:
    """Write the label order the head was trained with into the graph's own metadata (metadata_props),
    where an edit of mlmkit.json cannot change it: the runtime refuses a bundle whose labels differ
    (reordered labels would answer every input with the wrong name)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)  # external weights, if any, stay where they are
    for p in [p for p in model.metadata_props if p.key == LABELS_KEY]:
        model.metadata_props.remove(p)
    model.metadata_props.add(key=LABELS_KEY, value=json.dumps(labels, ensure_ascii=False))
    onnx.save(model, str(path))


def _bundle_meta(
    meta: dict[str, Any], cfg: ModelConfig, tok: Any, axes: dict[str, tuple[str, ...]], final: Path, *,
    fill_mask: bool, max_length: int, opset: int, precision: str, steps: list[str], fused: dict[str, int],
    parity: dict[str, Any], top_k: int, source: Path,
) -> dict[str, Any]:
    # the run's metadata travels along (labels, options, the task's saved state ...): the task's
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
        "outputs": {k: list(v) for k, v in axes.items()},
        "top_k": top_k if fill_mask else None,
        "opset": opset,
        "precision": precision,
        "optimizations": steps,
        "fused_operators": fused,
        "parity": parity,
        "tokenizer": tokenizer_fingerprint(tok),
        "model": {
            "model_type": cfg.model_type, "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_hidden_layers,
            "num_attention_heads": cfg.num_attention_heads, "max_position_embeddings": cfg.max_tokens,
        },
        "model_bytes": os.path.getsize(final),
        "source": meta.get("source", {"path": str(source)}),
    }
