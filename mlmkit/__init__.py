"""mlmkit: pre-train BERT encoders (MLM + NSP), fine-tune task heads, export to ONNX, serve with onnxruntime.

The package root imports nothing heavy: ``mlmkit.runtime`` (onnxruntime, no torch) must stay fast
to import. The API lives in its modules, one function per command taking one argument dataclass:

    from mlmkit.args import PretrainArgs, FinetuneArgs, ExportArgs, TrainArgs
    from mlmkit.pretraining import pretrain          # pretrain(PretrainArgs(...))
    from mlmkit.finetuning import finetune, evaluate_run
    from mlmkit.export import export
    from mlmkit.runtime import Pipeline              # Pipeline.load(bundle)(inputs)
    from mlmkit.registry import get_task, tasks      # the task plugins
"""

__version__ = "0.1.0"
