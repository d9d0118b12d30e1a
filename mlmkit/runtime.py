"""The old path of the onnxruntime side (mlmkit.infer.pipeline and mlmkit.infer.bundle); ``mlmkit.Pipeline``
is the public one. No torch."""

from mlmkit.infer.bundle import BUNDLE_FILES, load_bundle_tokenizer, read_bundle_meta  # noqa: F401
from mlmkit.infer.pipeline import (  # noqa: F401
    FillMaskPipeline,
    Pipeline,
    TaskPipeline,
    evaluate_bundle,
    make_session,
    read_inputs,
)
