"""`mlmkit export`: a run directory -> a self-contained ONNX bundle.

graphs.py (the torch modules exported, the TorchScript export), passes.py (fusions, int8, fp16),
parity.py (the gates: the graph against PyTorch), bundle.py (the command: the steps, the bundle's
files). The bundle's format itself is mlmkit.runtime.bundle, which reads what this package writes.
The function is ``mlmkit.export`` (``bundle.export``); this package is named apart from it.
"""
