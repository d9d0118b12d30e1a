"""mlmkit: pre-train encoders (MLM, + NSP for BERT), fine-tune task heads, export to ONNX, serve with
onnxruntime.

The Python API is this package's top level, one function per command taking one argument dataclass:

    import mlmkit
    mlmkit.pretrain(mlmkit.PretrainArgs(...))
    mlmkit.finetune(mlmkit.FinetuneArgs(...)); mlmkit.evaluate_run(run, data)
    mlmkit.export(mlmkit.ExportArgs(...))
    mlmkit.Pipeline.load(bundle)(inputs)

Each name is imported when first used, so ``import mlmkit`` stays fast and torch-free (the inference
side never imports torch; docs/architecture.md has the packages and the rule).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_API = {
    "pretrain": "mlmkit.train.pretrain",
    "export": "mlmkit.exporter.bundle",
    "finetune": "mlmkit.train.finetune",
    "distill": "mlmkit.train.distill",
    "evaluate_run": "mlmkit.train.finetune",
    "Pipeline": "mlmkit.runtime.pipeline",
    "Args": "mlmkit.args",
    "TrainArgs": "mlmkit.args",
    "TokenizerArgs": "mlmkit.args",
    "TokenizeArgs": "mlmkit.args",
    "PretrainArgs": "mlmkit.args",
    "FinetuneArgs": "mlmkit.args",
    "DistillArgs": "mlmkit.args",
    "SweepArgs": "mlmkit.args",
    "ExportArgs": "mlmkit.args",
    "ServeArgs": "mlmkit.args",
}
__all__ = list(_API)


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'mlmkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
