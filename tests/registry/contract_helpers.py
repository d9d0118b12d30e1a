"""What the registry's tests share (tests/registry/test_contract.py, test_registry.py): ``Minimal``, a
task with only the contract's required members."""

from __future__ import annotations

from mlmkit.registry import BATCH


class Minimal:
    """Only the required members."""

    name, description, metrics, outputs = ("minimal", "the least a task can be", ("score",),
                                           {"score": (BATCH,)})

    def read(self, path, options): return []  # noqa: E704
    def featurize(self, examples, tokenizer, ctx, *, training): return []  # noqa: E704
    def build_model(self, config): raise NotImplementedError  # noqa: E704
    def postprocess(self, outputs, features, examples, ctx): return []  # noqa: E704
    def compute_metrics(self, predictions, examples, ctx): return {"score": 0.0}  # noqa: E704
