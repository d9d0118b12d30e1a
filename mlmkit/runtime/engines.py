"""The engines a bundle's model.onnx runs on, and what this CPU computes in hardware. No torch.

An engine turns a model file into a session with onnxruntime's surface (get_inputs, get_outputs,
get_modelmeta, get_providers, run), so the pipelines never know which one they hold. Two are
registered, here, in ENGINES:

    onnxruntime   fp32, int8 and fp16 graphs; the CPU and the CUDA execution provider
    openvino      an fp32 graph computed in bf16 on a CPU with bf16 units (AMX, AVX512-BF16): the
                  extra mlmkit[openvino]. onnxruntime's CPU provider has no bf16 matrix product.

Which precision and engine a bundle runs in is mlmkit.runtime.precision's choice; this module only
opens what it is asked for. The CPU's features are read from /proc/cpuinfo; MLMKIT_CPU_FLAGS forces
them for a test or a what-if ("-amx_bf16,-avx512_bf16": as if this CPU had no bf16 units;
"+amx_bf16": as if it had).
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mlmkit.errors import BundleError, ConfigError
from mlmkit.typed import Registry

log = logging.getLogger("mlmkit")

BF16_FEATURES = {"amx_bf16": "AMX-BF16", "avx512_bf16": "AVX512-BF16"}
"""CPU features (their /proc/cpuinfo flags) with bf16 matrix products in hardware, the fastest first."""
INT8_FEATURES = {"amx_int8": "AMX-INT8", "avx512_vnni": "AVX512-VNNI", "avx_vnni": "AVX-VNNI"}
"""CPU features with int8 dot products in hardware, the fastest first."""
FORCE_FLAGS = "MLMKIT_CPU_FLAGS"
"""The environment variable that forces CPU flags on (+flag) or off (-flag), comma-separated."""


# ---- the CPU ----------------------------------------------------------------------------------------
def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """This CPU's feature flags (empty where there is no /proc/cpuinfo), as forced by MLMKIT_CPU_FLAGS."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        text = ""
    flags = next((set(line.split(":", 1)[1].split()) for line in text.splitlines()
                  if line.startswith("flags")), set())
    for item in os.environ.get(FORCE_FLAGS, "").split(","):
        item = item.strip()
        if item[:1] not in ("+", "-") or len(item) < 2:
            if item:
                raise ConfigError(f"{FORCE_FLAGS}: '{item}' is not +FLAG or -FLAG",
                                  "e.g. MLMKIT_CPU_FLAGS=-amx_bf16,-avx512_bf16")
            continue
        (flags.add if item[0] == "+" else flags.discard)(item[1:])
    return frozenset(flags)


def cpu_feature(kind: str, flags: frozenset[str] | None = None) -> str | None:
    """The feature that makes ``kind`` ("bf16" or "int8") fast on this CPU (BF16_FEATURES,
    INT8_FEATURES), or None."""
    table = {"bf16": BF16_FEATURES, "int8": INT8_FEATURES}[kind]
    have = cpu_flags() if flags is None else flags
    return next((name for flag, name in table.items() if flag in have), None)


# ---- the engines ------------------------------------------------------------------------------------
class Engine:
    """One way to run a model.onnx: which precision it computes in is mlmkit.runtime.precision's choice."""

    name = ""
    install = ""  # the pip command that brings it

    def missing(self) -> str | None:
        """Why this engine cannot be used here (its package not installed), or None."""
        raise NotImplementedError

    def open(self, model: Path, *, precision: str, device: str, threads: int | None, spin: bool) -> Any:
        """A session of ``model`` computing in ``precision`` (onnxruntime's session surface)."""
        raise NotImplementedError


class OnnxRuntimeEngine(Engine):
    """fp32, int8 and fp16 graphs as they are, on the CPU or CUDA (make_session)."""

    name, install = "onnxruntime", "pip install onnxruntime"

    def missing(self) -> str | None:
        return None  # a base dependency

    def open(self, model: Path, *, precision: str, device: str, threads: int | None, spin: bool) -> Any:
        return make_session(model, device=device, threads=threads, spin=spin)


class OpenVinoEngine(Engine):
    """An fp32 graph computed in bf16 (or fp32) on the CPU (OpenVinoSession)."""

    name, install = "openvino", "pip install 'mlmkit[openvino]'"

    def missing(self) -> str | None:
        try:
            import openvino  # noqa: F401
        except ImportError:
            return f"OpenVINO is not installed ({self.install})"
        except Exception as e:  # noqa: BLE001 - a broken install (a library it loads, a version clash)
            why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            return f"OpenVINO is installed but does not import ({type(e).__name__}: {why})"
        return None

    def open(self, model: Path, *, precision: str, device: str, threads: int | None, spin: bool) -> Any:
        return OpenVinoSession(model, precision=precision, threads=_threads(threads))


ENGINES: Registry[Engine] = Registry("engine")
"""The registered engines, by name: the one place a new engine is added."""
for _engine in (OnnxRuntimeEngine(), OpenVinoEngine()):
    ENGINES.add(_engine.name, _engine)


def thread_budget() -> int | None:
    """The threads OMP_NUM_THREADS gives each process (its first level where it names several), or
    None where it is not set or not a positive whole number: the budget torch reads too, so a process
    that several share the cores with (a test worker, a job's worker) holds onnxruntime to it."""
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(first) if first.isdigit() and int(first) >= 1 else None


def _threads(threads: int | None) -> int | None:
    """``threads`` checked against the cores (more is cut to the cores, with a warning); without it,
    ``thread_budget()``, else None (onnxruntime's default: one per physical core)."""
    if threads is not None and threads < 1:
        raise ConfigError(f"--threads must be at least 1, got {threads}")
    cores = os.cpu_count() or 1
    if threads is None:
        budget = thread_budget()
        return min(budget, cores) if budget is not None else None
    if threads is not None and threads > cores:
        log.warning("--threads %d is more than the %d cores of this machine: using %d", threads, cores, cores)
        return cores
    return threads


def make_session(model: str | Path, *, device: str = "cpu", threads: int | None = None,
                 spin: bool = True) -> Any:
    """An onnxruntime session on ``device`` ("cpu" or "cuda"). Without onnxruntime-gpu or without a
    GPU, "cuda" logs a warning and runs on the CPU. ``spin``: onnxruntime's threads spin a while
    between runs (fastest when nothing else needs the cores)."""
    import onnxruntime as ort

    if device not in ("cpu", "cuda"):
        raise ConfigError(f"--device {device} is not supported", "use cpu or cuda")
    threads = _threads(threads)
    providers = ["CPUExecutionProvider"]
    if device == "cuda":
        if "CUDAExecutionProvider" in ort.get_available_providers():
            providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
        else:
            log.warning("--device cuda: this onnxruntime has no CUDA execution provider (pip install "
                        "onnxruntime-gpu); "
                        "running on the CPU")
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads or 0  # 0: onnxruntime's default, one per physical core
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    # idle pool threads sleep at once instead of spinning: the cores are shared (a server's event loop)
    if not spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        with warnings.catch_warnings():  # onnxruntime's own "provider not available": said below, once
            warnings.simplefilter("ignore")
            session = ort.InferenceSession(str(model), so, providers=providers)
    except Exception as e:  # onnxruntime raises its own exception types for unreadable graphs
        # drop the "[ONNXRuntimeError] ... path" preamble
        reason = str(e).rsplit("failed:", 1)[-1].strip()[:200]
        raise BundleError(f"{model} is corrupted or not an ONNX model ({reason})",
                          "re-create the bundle with `mlmkit export`") from None
    if (device == "cuda" and "CUDAExecutionProvider" in providers
        and "CUDAExecutionProvider" not in session.get_providers()):
        log.warning("--device cuda: no usable GPU for onnxruntime; running on the CPU")
    return session


# ---- OpenVINO behind onnxruntime's session surface ---------------------------------------------------
_OV_TYPES = {"f32": "tensor(float)", "f16": "tensor(float16)", "bf16": "tensor(bfloat16)",
             "i64": "tensor(int64)",
             "i32": "tensor(int32)", "i8": "tensor(int8)", "u8": "tensor(uint8)", "boolean": "tensor(bool)"}
_OV_PRECISION = {"bf16": "bf16", "fp32": "f32"}


@dataclass(frozen=True)
class NodeArg:
    """An input or output as onnxruntime describes it: its name, shape (an int per fixed axis, None
    per varying one) and element type ("tensor(float)")."""

    name: str
    shape: list[int | None]
    type: str


@dataclass(frozen=True)
class ModelMeta:
    custom_metadata_map: dict[str, str]


RUNTIME_CACHE = 200
"""Entries of the OpenVINO CPU plugin's cache of kernels made for each input shape (its internal
CPU_RUNTIME_CACHE_CAPACITY). Its default, 5,000, lets a long job's memory grow with every new (batch,
length) shape; 200 holds it flat at the same speed (docs/performance.md, "Precision and engines")."""

SHORT_SEQUENCE = 128
"""Batches of up to this many tokens run on a compilation without OpenVINO's fused attention kernels
(SNIPPETS_MODE=DISABLE: attention as AMX matrix products and a softmax), longer ones on its default:
the unfused form is faster on short batches and slower on long ones (docs/performance.md, "Precision
and engines", has the figures). The second compilation is made at the first long batch."""


class OpenVinoSession:
    """A model.onnx compiled by OpenVINO for the CPU in ``precision`` (its INFERENCE_PRECISION_HINT),
    with onnxruntime's session surface: twice, for short and for long batches (SHORT_SEQUENCE). A
    request per thread: OpenVINO's are not shared between threads."""

    def __init__(self, model: Path, *, precision: str, threads: int | None) -> None:
        import openvino as ov

        self.core, self.precision = ov.Core(), precision
        self.config: dict[str, str | int] = {"INFERENCE_PRECISION_HINT": _OV_PRECISION[precision],
                                             "PERFORMANCE_HINT": "LATENCY"}
        if threads:
            self.config["INFERENCE_NUM_THREADS"] = threads
        try:
            self.model = self.core.read_model(str(model))
            self.short = self._compile(short=True)
        except Exception as e:  # OpenVINO raises its own exception types, with a C++ report
            reason = " ".join(str(e).split())[:200]
            raise BundleError(f"OpenVINO cannot read {model} ({reason})",
                              "run it with --precision fp32 (onnxruntime), or re-create the bundle with "
                              "`mlmkit export`") from None
        self.long: Any = None  # compiled at the first batch longer than SHORT_SEQUENCE
        self._lock = threading.Lock()
        m = self.model
        self._inputs = [self._arg(p, p.get_any_name()) for p in self.short.inputs]
        # an output tensor may carry several names (the ONNX output's and an inner node's): the ONNX
        # output's is the one its Result node is named after ("embedding/sink_port_0")
        results = [r.get_friendly_name().rsplit("/sink_port_", 1)[0] for r in m.get_results()]
        self._outputs = [self._arg(p, r if r in p.get_names() else p.get_any_name())
                         for p, r in zip(self.short.outputs, results)]
        rt = m.get_rt_info()  # the ONNX file's metadata_props, as OpenVINO's ONNX reader keeps them
        framework = rt["framework"] if "framework" in rt else {}
        self._meta = {str(k): (v.astype(str) if hasattr(v, "astype") else str(v))
                      for k, v in dict(framework).items()}
        self._local = threading.local()

    def _compile(self, *, short: bool) -> Any:
        config = {**self.config, **({"SNIPPETS_MODE": "DISABLE"} if short else {})}
        try:
            return self.core.compile_model(self.model, "CPU",
                                           {**config, "CPU_RUNTIME_CACHE_CAPACITY": RUNTIME_CACHE})
        except RuntimeError as e:  # an OpenVINO that does not take the property: its default cache
            if "CPU_RUNTIME_CACHE_CAPACITY" not in str(e):
                raise
            return self.core.compile_model(self.model, "CPU", config)

    @staticmethod
    def _arg(port: Any, name: str) -> NodeArg:
        shape = [d.get_length() if d.is_static else None for d in port.get_partial_shape()]
        return NodeArg(name, shape, _OV_TYPES.get(port.get_element_type().get_type_name(), "tensor(unknown)"))

    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_modelmeta(self) -> ModelMeta:
        return ModelMeta(dict(self._meta))

    def get_providers(self) -> list[str]:
        return [f"OpenVINO CPU ({self.precision})"]

    def run(self, names: list[str] | None, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        short = feed["input_ids"].shape[-1] <= SHORT_SEQUENCE
        if not short and self.long is None:
            with self._lock:
                if self.long is None:
                    self.long = self._compile(short=False)
        compiled = self.short if short else self.long
        requests = self._local.__dict__.setdefault("requests", {})
        if short not in requests:
            requests[short] = compiled.create_infer_request()
        got = requests[short].infer(feed)
        by_name = {o.name: np.array(got[p]) for o, p in zip(self._outputs, compiled.outputs)}
        return [by_name[n] for n in (names or [o.name for o in self._outputs])]
