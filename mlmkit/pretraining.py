"""The old path of `mlmkit pretrain`'s function (mlmkit.train.pretrain); ``mlmkit.pretrain`` is the public one."""

from mlmkit.train.pretrain import pretrain  # noqa: F401
