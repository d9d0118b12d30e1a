"""`mlmkit export`: a run directory -> a self-contained ONNX bundle (model.onnx, tokenizer.json, mlmkit.json).

The steps, each checked rather than assumed:

1. the model is rebuilt from the run by its task (a pretraining run's: the masked-LM task, which
   the built-in fill-mask is) and exports exactly the task's ``outputs`` from the task model's own
   forward, or from the module its ``export_module`` writes for inference;
2. attention is switched to its eager form and exported with the TorchScript exporter
   (``dynamo=False``): the only combination onnxruntime's BERT fusions recognise (docs/performance.md,
   "BERT fusions need the TorchScript exporter and eager attention");
   the graph's inputs are the family's (no token_type_ids for RoBERTa, DistilBERT, ModernBERT);
3. onnxruntime's transformer optimizer fuses Attention, EmbedLayerNormalization,
   SkipLayerNormalization and BiasGelu; the fused nodes are counted and a graph short of what its
   family's graphs were measured to fuse (``Family.fusions``) is refused;
4. PyTorch and onnxruntime run on a sample batch of mixed lengths (padded to the longest, as the
   runtime batches): the max abs difference per output and the top-1 agreement go into
   mlmkit.json, and an fp32 difference above ``ATOL`` raises ParityError;
5. optionally int8 dynamic quantisation (per-channel weights, CPU) or fp16 (CUDA), with the top-1
   agreement against the fp32 graph on the same sample.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from mlmkit.args import ExportArgs
from mlmkit.errors import ConfigError, ParityError
from mlmkit.exporter.graphs import build_graph, graph_inputs, torch_export
from mlmkit.exporter.parity import (
    ATOL,
    calibration_batches,
    check_fp16,
    compare,
    onnx_session,
    run_onnx,
    sample_batch,
    torch_outputs,
)
from mlmkit.exporter.passes import fuse, quantize_int8, quantize_int8_static, to_fp16
from mlmkit.files import JSONObject, atomic_write, atomic_write_text, write_json
from mlmkit.locks import exclusive
from mlmkit.models.config import ModelConfig
from mlmkit.models.core import set_attention_impl
from mlmkit.registry import Options, task_of, tasks
from mlmkit.rundir.checkpoint import is_model_dir
from mlmkit.rundir.config import load_config
from mlmkit.rundir.hub import describe
from mlmkit.rundir.meta import RunMeta
from mlmkit.runtime.bundle import LABELS_KEY, BundleMeta, ModelShape, tokenizer_fingerprint
from mlmkit.runtime.engines import ENGINES, cpu_feature
from mlmkit.runtime.precision import bf16_unavailable, cannot_run, gate_sample, judge, measure, padded, said
from mlmkit.runtime.prediction import agreement
from mlmkit.text.tokenizer import load_tokenizer, special_ids, write_special_tokens_map

log = logging.getLogger("mlmkit")

MIN_OPSET = 17  # LayerNormalization is a standard op from opset 17
MAX_OPSET = 23  # the TorchScript exporter's newest (torch.onnx ONNX_MAX_OPSET); 17-23 fuse and pass parity


def _top_k_option(plugin: Any, args: ExportArgs) -> Options:
    """The task options of the export: --top-k sets the task's ``top_k_option`` (fill-mask's
    candidates, the SPLADE task's max_terms); a task without one refuses it."""
    if args.top_k is None:
        return dict(args.options)
    name = plugin.top_k_option
    if name is None:
        takers = sorted(n for n, p in tasks().items() if p.top_k_option)
        raise ConfigError(f"--top-k is for {' and '.join(takers)} exports, not for task '{plugin.name}'",
                          "leave it out")
    if args.options.get(name, args.top_k) != args.top_k:
        raise ConfigError(f"--top-k {args.top_k} and --option {name}={args.options[name]} disagree",
                          "give one of them")
    return {**args.options, name: args.top_k}


# ---- the bundle --------------------------------------------------------------------------------
def export(args: ExportArgs) -> BundleMeta:
    """Export a run directory to an ONNX bundle in ``args.out``; returns the bundle's mlmkit.json.

    ``args.run``: a pretraining run (exported as the masked-LM task) or a fine-tuned run of any
    registered task; the bundle directory is created, and bundle files already there are replaced."""
    with exclusive(args.out):  # two exports into one bundle directory would mix their files
        return _export(args)


def _export(args: ExportArgs) -> BundleMeta:
    """The export itself (export() holds the bundle directory): the run checked and rebuilt, its graph
    exported, fused and checked against PyTorch in a scratch directory, then the bundle written."""
    d = Path(args.run)
    _check_args(args, d)
    cfg = load_config(d)
    meta = _run_meta(args, d, cfg)
    tok = load_tokenizer(d)
    if tok.get_vocab_size() > cfg.vocab_size:
        raise ConfigError(f"the tokenizer of {d} has {tok.get_vocab_size()} tokens, the model only "
                          f"{cfg.vocab_size}")
    specials = special_ids(tok)
    max_length = min(meta.max_length, cfg.max_tokens)

    graph, reference, axes, partial = build_graph(d, meta, cfg, tok)
    graph.eval()
    reference.eval()
    batch = sample_batch(tok.get_vocab_size(), specials, max_length)
    inputs = graph_inputs(cfg)
    ref = torch_outputs(reference, batch, list(axes), inputs)
    set_attention_impl(graph, "eager")
    calib = (calibration_batches(args.calibrate, meta, tok, specials.pad, max_length, inputs)
             if args.calibrate is not None else None)

    out = Path(args.out)
    work = Path(tempfile.mkdtemp(prefix=".export-", dir=out))
    try:
        onnx_graph = _onnx_graph(args, cfg, graph, batch, axes, inputs, ref, work, partial=partial,
                                 calib=calib)
        record_labels(onnx_graph.path, list(meta.labels) if meta.labels is not None else None)
        bundle_meta = _bundle_meta(meta, cfg, tok, axes, onnx_graph.path, max_length=max_length,
                                   opset=args.opset,
                                   precision=onnx_graph.precision, steps=onnx_graph.steps,
                                   fused=onnx_graph.fused,
                                   parity=onnx_graph.parity, source=d)
        real = calib or None
        gate = _gate(args, onnx_graph, real or [batch], axes, specials.pad,
                     on=f"{sum(len(b['input_ids']) for b in real)} --calibrate inputs" if real
                     else "the sample batch")
        bundle_meta = replace(bundle_meta, gate=gate,
                              run_precision="fp32" if args.precision == "fp32" else "auto")
        _write_bundle(out, d, onnx_graph.path, tok, bundle_meta)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if (onnx_graph.precision == "fp32" and not bundle_meta.gate.get("bf16", {}).get("passed")
        and (feature := cpu_feature("int8"))):
        log.info("this CPU has %s: an int8 bundle (the same command with --precision int8) ran the "
                 "MiniLM-size classifier "
                 "%s fp32's speed on such a CPU; its top-1 agreement with fp32 is in mlmkit.json "
                 "(docs/performance.md, "
                 "\"GEMM ceilings and CPU kinds\")", feature, INT8_SPEEDUP)
    return bundle_meta


def _check_args(args: ExportArgs, d: Path) -> None:
    """What is refused before anything is loaded (not a run directory, an opset outside 17-23), and a
    word on converting an unfused graph."""
    if not is_model_dir(d):
        raise ConfigError(f"{d} is not a run directory",
                          "it needs config.json and model.safetensors (an mlmkit run)")
    if not MIN_OPSET <= args.opset <= MAX_OPSET:
        raise ConfigError(f"--opset {args.opset} is not supported", f"use {MIN_OPSET} to {MAX_OPSET}")
    if (args.quantize or args.fp16) and not args.optimize:
        log.info("converting the unfused graph: expect it to be slower than with the fusions")


def _run_meta(args: ExportArgs, d: Path, cfg: ModelConfig) -> RunMeta:
    """The run's metadata with the export's task options resolved into it: the options are fixed in
    the graph, so they are settled before it is built."""
    meta = describe(d, cfg, args.task)
    plugin = task_of(meta.task)
    given, saved = _top_k_option(plugin, args), dict(meta.options)
    if args.top_k is not None:  # the graph is built now: --top-k chooses again what the run was trained with
        saved.pop(plugin.top_k_option or "", None)
    # a trained model's fixed options stay; a foreign checkpoint's are a reading
    from_mlmkit = (meta.source or {}).get("format") == "mlmkit"
    return replace(meta, options=plugin.saved_options(plugin.resolve_options(given, saved=saved,
                                                                             model=from_mlmkit)))


class _OnnxGraph(NamedTuple):
    """The graph a bundle ships, and how it was made: its precision, the steps applied, the fused
    operators counted, and its parity figures against PyTorch."""

    path: Path
    precision: str
    steps: list[str]
    fused: dict[str, int]
    parity: JSONObject  # mlmkit.json's "parity"
    fp32_session: Any  # onnxruntime's session of the fp32 graph the parity ran on (the gates' reference)


def _onnx_graph(args: ExportArgs, cfg: ModelConfig, graph: Any, batch: dict[str, np.ndarray],
                axes: dict[str, tuple[str, ...]], inputs: tuple[str, ...], ref: dict[str, np.ndarray],
                work: Path, *,
                partial: int, calib: list[dict[str, np.ndarray]] | None = None) -> _OnnxGraph:
    """The ONNX graph in ``work``: exported, fused (--optimize), checked against PyTorch's outputs ``ref``
    (ParityError beyond ATOL), then int8 or fp16 when asked, each with its agreement against fp32."""
    names, mask = list(axes), batch["attention_mask"]
    plain = work / "plain.onnx"
    torch_export(graph, batch, axes, plain, args.opset, inputs)
    fp32, fused = plain, {}
    if args.optimize:
        fp32 = work / "fused.onnx"
        fused = fuse(plain, fp32, cfg, use_gpu=args.fp16, partial_layers=partial)
    fp32_session = onnx_session(fp32)
    fp32_out = run_onnx(fp32_session, batch, names)
    parity: JSONObject = {**compare(ref, fp32_out, axes, mask)}
    _check_parity(parity)
    final, precision, steps = fp32, "fp32", (["transformer-fusion"] if args.optimize else [])
    if args.quantize:
        final, precision = work / "int8.onnx", "int8"
        steps.append(_int8(args, fp32, final, calib))
        int8_session = onnx_session(final)
        q = compare(fp32_out, run_onnx(int8_session, batch, names), axes, mask)
        parity["int8_top1_agreement_vs_fp32"] = q["top1_agreement"]
        parity["int8_max_abs_diff"] = q["max_abs_diff"]
        on = f"{sum(len(b['input_ids']) for b in calib)} --calibrate inputs" if calib else "the sample batch"
        parity["int8_agreement"] = _int8_agreement(args, fp32_session, int8_session, calib or [batch], axes,
                                                   names,
                                                   on=on)
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
    return _OnnxGraph(final, precision, steps, fused, parity, fp32_session)


def _int8(args: ExportArgs, fp32: Path, final: Path, calib: list[dict[str, np.ndarray]] | None) -> str:
    """The int8 graph: activation ranges calibrated on ``calib`` (static, QDQ), else computed per call
    (dynamic); weights per output channel either way. Returns the step's name."""
    if calib:
        quantize_int8_static(fp32, final, calib)
        return "int8-static-qdq-per-channel"
    quantize_int8(fp32, final)
    return "int8-dynamic-per-channel"


def _int8_agreement(args: ExportArgs, a: Any, b: Any, batches: list[dict[str, np.ndarray]],
                    axes: dict[str, tuple[str, ...]], names: list[str], *,
                    on: str) -> dict[str, float | str | None]:
    """The agreement of the int8 session ``b`` with the fp32 one ``a`` on ``batches``
    (runtime.prediction.agreement), held to --min-agreement: below it, ParityError, and the bundle is not
    written."""
    got = agreement([run_onnx(a, x, names) for x in batches], [run_onnx(b, x, names) for x in batches], axes,
                    [x["attention_mask"] for x in batches])
    measure = ("top-1 agreement" if got["top1"] is not None else "mean cosine" if got["cosine"] is not None
               else "score correlation")
    if args.min_agreement is not None and (got["value"] is None or got["value"] < args.min_agreement):
        # rounded down: a value just below the gate must not print as the gate
        shown = ("nothing to compare" if got["value"] is None
                 else f"{math.floor(got['value'] * 1e6) / 1e6:.6f}")
        raise ParityError(f"the int8 graph's {measure} with fp32 on {on} is {shown}, below --min-agreement "
                          f"{args.min_agreement:g}; no bundle written",
                          "calibrate on inputs like the ones it will serve (--calibrate), use dynamic int8 "
                          "(without --calibrate), or export fp32")
    return {**got, "measure": measure, "on": on}


def _gate(args: ExportArgs, graph: _OnnxGraph, batches: list[dict[str, np.ndarray]],
          axes: dict[str, tuple[str, ...]],
          pad_id: int, *, on: str) -> JSONObject:
    """mlmkit.json's "gate": its sample (GATE_ROWS of ``batches``, which every machine measures a
    precision on again) and, for an fp32 graph, the bf16 gate measured here where this machine can
    (OpenVINO on bf16 units) or why not. --precision bf16 whose gate fails or cannot be measured is
    refused, no bundle written."""
    gate: JSONObject = {**gate_sample(batches, on)}
    if graph.precision != "fp32":
        return gate
    why_not = bf16_unavailable("cpu")
    if why_not is not None:
        if args.precision == "bf16":
            raise ConfigError(f"--precision bf16: {why_not}; no bundle written",
                              "export on a machine with bf16 units, or with --precision auto (each machine "
                              "gates bf16 itself)")
        gate["bf16"] = {"precision": "bf16", "passed": None, "not_measured": why_not}
        return gate
    try:  # the fp32 graph is the shipped one: its parity session is the reference
        bf16 = ENGINES["openvino"].open(graph.path, precision="bf16", device="cpu", threads=None, spin=True)
        result = judge(measure(graph.fp32_session, bf16, padded(gate, pad_id), axes), "bf16",
                       args.min_agreement,
                       f"{len(gate['input_ids'])}-input sample ({on})")
    except Exception as e:  # noqa: BLE001 - a graph OpenVINO cannot read or run: recorded, and each machine runs fp32
        why = cannot_run(e)
        if args.precision == "bf16":
            raise ConfigError(f"--precision bf16: {why}; no bundle written",
                              "export with --precision auto or fp32") from None
        gate["bf16"] = {"precision": "bf16", "passed": None, "not_measured": why}  # each machine tries again
        return gate
    if args.precision == "bf16" and not result["passed"]:
        raise ParityError(f"--precision bf16: its gate failed: {said(result)}; no bundle written",
                          "export with --precision auto or fp32, or set another threshold with "
                          "--min-agreement")
    gate["bf16"] = result
    return gate


def _check_parity(parity: Mapping[str, Any]) -> None:
    """ParityError naming each output whose fp32 difference from PyTorch is above ATOL (or NaN)."""
    bad = {k: v for k, v in parity["max_abs_diff"].items() if not v <= ATOL}
    if bad:
        listing = ", ".join(f"{k}: max diff {v:.2e}" for k, v in bad.items())
        raise ParityError(
            f"the exported graph differs from PyTorch beyond {ATOL:g}: {listing}",
            "export with --no-optimize to see whether the fusions cause it, and report it",
        )


def _write_bundle(out: Path, d: Path, final: Path, tok: Any, bundle_meta: BundleMeta) -> None:
    """The bundle's files, each replaced atomically: model.onnx, tokenizer.json and its
    special_tokens_map.json before mlmkit.json (a reader that sees the new mlmkit.json sees the new
    model), then the run's curves and the model card."""
    atomic_write(out / "model.onnx", lambda tmp: shutil.copyfile(final, tmp))
    atomic_write_text(out / "tokenizer.json", tok.to_str(pretty=False))
    write_special_tokens_map(tok, out)  # its special tokens' roles, which tokenizer.json cannot hold
    write_json(out / "mlmkit.json", bundle_meta.to_json())  # last: a reader seeing it sees the new model
    if (d / "curves.png").is_file():
        atomic_write(out / "curves.png", lambda tmp: shutil.copyfile(d / "curves.png", tmp))
    from mlmkit.rundir.cards import write_card

    write_card(out)


INT8_SPEEDUP = "at 1.8x-2.3x"
"""int8 against fp32 on CPUs with int8 dot products (the MiniLM-size classifier, offline, 2 threads,
top-1 agreement 1.00): 1.76x on an AMD EPYC with AVX512-VNNI, 2.31x on an Intel Xeon with AMX
(docs/performance.md, "GEMM ceilings and CPU kinds")."""


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
    meta: RunMeta, cfg: ModelConfig, tok: Any, axes: dict[str, tuple[str, ...]], final: Path, *,
    max_length: int, opset: int, precision: str, steps: list[str], fused: dict[str, int],
    parity: JSONObject, source: Path,
) -> BundleMeta:
    """The bundle's description. The run's metadata travels along (labels, options, the task's saved
    state ...: the task's featurize / postprocess read them at inference time exactly as at evaluation;
    the rest, its data and metrics, in ``run`` for the model card; not its training arguments)."""
    import onnx

    graph_inputs = [i.name for i in onnx.load(str(final), load_external_data=False).graph.input]
    typed = {f.name for f in fields(BundleMeta)} | {"format", "format_version", "train_args", "history",
                                                    "state"}
    return BundleMeta(
        task=task_of(meta.task).name,
        trained_as=meta.task,
        labels=meta.labels,
        max_length=max_length,
        options=meta.options,
        task_state=meta.task_state,
        inputs=tuple(graph_inputs),
        outputs={k: tuple(v) for k, v in axes.items()},
        opset=opset,
        precision=precision,
        optimizations=tuple(steps),
        fused_operators=fused,
        parity=parity,
        tokenizer=tokenizer_fingerprint(tok),
        model=ModelShape(model_type=cfg.model_type, vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                         num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
                         max_position_embeddings=cfg.max_tokens),
        model_bytes=os.path.getsize(final),
        source=meta.source or {"path": str(source)},
        run={k: v for k, v in meta.to_json().items() if k not in typed},
    )
