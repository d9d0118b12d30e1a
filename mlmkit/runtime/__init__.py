"""The bundle runtime: the bundle format, the engines a model.onnx runs on, the precision chosen per
machine and its gate, the pipeline, and the one prediction loop. No torch."""
