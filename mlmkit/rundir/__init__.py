"""Run directories: model config, weight files, reading and writing runs, foreign checkpoints, model cards."""
