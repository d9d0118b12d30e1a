"""ONNX passes: onnxruntime's transformer fusions (counted, not assumed), int8 dynamic quantisation and
fp16 conversion.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlmkit.errors import MlmkitError
from mlmkit.exporter.parity import quiet_onnxruntime
from mlmkit.models.config import ModelConfig

if TYPE_CHECKING:
    import numpy as np

FUSED_OPS = ("Attention", "MultiHeadAttention", "EmbedLayerNormalization", "SkipLayerNormalization",
             "BiasGelu", "FastGelu", "Gelu",
             "LayerNormalization", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization",
             "RotaryEmbedding",
             "GroupQueryAttention")


FUSED_ONCE = ("EmbedLayerNormalization",)  # one per graph; Family.fusions counts the others per layer


def fuse(src: Path, dst: Path, cfg: ModelConfig, *, use_gpu: bool = False,
         partial_layers: int = 0) -> dict[str, int]:
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


def _optimize(src: Path, cfg: ModelConfig, use_gpu: bool,
              partial_layers: int) -> tuple[Any, dict[str, int], dict[str, tuple[int, int]]]:
    """(optimized model, fused operator counts, what fell short of the family's fusions)."""
    with quiet_onnxruntime():
        from onnxruntime.transformers.optimizer import optimize_model

        om = optimize_model(
            str(src), model_type="bert", num_heads=cfg.num_attention_heads, hidden_size=cfg.hidden_size,
            use_gpu=use_gpu
        )
    stats = om.get_fused_operator_statistics()
    counts = {k: int(stats.get(k, 0)) for k in FUSED_OPS if stats.get(k, 0)}
    L = cfg.num_hidden_layers - partial_layers
    found = {**counts, "Attention": counts.get("Attention", 0) + counts.get("MultiHeadAttention", 0)}
    # with no full layer (a 1-layer classifier: its one layer is the [CLS]-only one) onnxruntime finds
    # no attention to fuse the embeddings' normalisation with, so nothing is expected of the graph
    expected = {k: n if k in FUSED_ONCE else n * L for k, n in cfg.family.fusions.items() if L > 0}
    return om, counts, {k: (found.get(k, 0), n) for k, n in expected.items() if found.get(k, 0) < n}


def activation_matmuls(path: Path) -> list[str]:
    """The MatMul nodes of a graph whose second input is not a weight matrix: attention's scores where
    no fused Attention holds them, and the relative-position tables folded into (heads, positions,
    head size) constants (DeBERTa's disentangled attention). Per-channel int8 needs a 2-D constant B:
    onnxruntime refuses the graph at run time otherwise ("b zero point is not valid")."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    matrices = {i.name for i in graph.initializer if len(i.dims) == 2}
    return [n.name for n in graph.node if n.op_type == "MatMul" and n.input[1] not in matrices]


def quantize_int8(src: Path, dst: Path) -> None:
    """Dynamic int8 quantisation: int8 weights per output channel, activations quantised on the fly."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with quiet_onnxruntime():
        quantize_dynamic(
            src, dst, per_channel=True, weight_type=QuantType.QInt8,
            # the encoder's matmuls; the embeddings and the heads (a few rows per batch) stay fp32
            op_types_to_quantize=["MatMul", "Attention"], nodes_to_exclude=activation_matmuls(src),
            # the fused graph's contrib ops defeat ONNX shape inference without this
            # (docs/performance.md, "int8 quantization of the fused graph")
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )


class Feeds:
    """Calibration batches as onnxruntime's quantizer reads them (a CalibrationDataReader: get_next)."""

    def __init__(self, batches: list[dict[str, np.ndarray]]) -> None:
        self.rest = iter(batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.rest, None)


def quantize_int8_static(src: Path, dst: Path, batches: list[dict[str, np.ndarray]]) -> None:
    """Static int8 quantisation (QDQ): int8 weights per output channel, and the activations' ranges
    calibrated on ``batches`` (feeds of the graph's inputs), so no range is computed per call. The
    encoder's matmuls are quantised, as in quantize_int8."""
    import onnx
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    typed = dst.with_name(dst.stem + "-typed.onnx")
    with quiet_onnxruntime():
        # symbolic shape inference knows onnxruntime's contrib ops (Attention, SkipLayerNormalization ...),
        # where ONNX's does not: without it the quantizer skips the activations it cannot type
        quant_pre_process(src, typed, skip_optimization=True)
        quantize_static(
            typed, dst, Feeds(batches), quant_format=QuantFormat.QDQ, per_channel=True,
            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,  # onnxruntime's x86 recommendation
            op_types_to_quantize=["MatMul"], nodes_to_exclude=activation_matmuls(typed),
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )


def to_fp16(src: Path, dst: Path) -> None:
    """fp16 weights and compute, fp32 inputs/outputs: for the CUDA execution provider."""
    import onnx
    from onnxruntime.transformers.onnx_model import OnnxModel

    with quiet_onnxruntime():
        om = OnnxModel(onnx.load(str(src)))
        om.convert_float_to_float16(keep_io_types=True)
        om.save_model_to_file(str(dst))
