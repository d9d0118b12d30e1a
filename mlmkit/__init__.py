"""mlmkit: pre-train BERT encoders (MLM + NSP), fine-tune task heads, export to ONNX, serve with onnxruntime.

The package root imports nothing heavy: ``mlmkit.runtime`` (onnxruntime, no torch) must stay fast
to import. The API lives in its modules:

    from mlmkit.pretraining import pretrain
    from mlmkit.finetuning import finetune, evaluate_run
    from mlmkit.export import export
    from mlmkit.runtime import Pipeline
"""

__version__ = "0.1.0"
