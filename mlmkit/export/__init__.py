"""`mlmkit export`: a run directory -> a self-contained ONNX bundle.

graphs.py (the torch modules exported, the TorchScript export), passes.py (fusions, int8, fp16),
parity.py (the gates: the graph against PyTorch), bundle.py (the command: the steps, the bundle's
files). The bundle's format itself is mlmkit.infer.bundle, which reads what this package writes.

``mlmkit.export`` is both this package and the function: ``mlmkit.export(ExportArgs(...))`` calls
``bundle.export``, whichever of the two an import made ``mlmkit.export`` refer to.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from mlmkit.export.bundle import export

__all__ = ["export"]


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return export(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
