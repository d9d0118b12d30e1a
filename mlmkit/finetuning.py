"""The old path of `mlmkit finetune`'s functions (mlmkit.train.finetune); ``mlmkit.finetune`` is the public one."""

from mlmkit.train.finetune import evaluate_run, finetune  # noqa: F401
