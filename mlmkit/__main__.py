"""`python -m mlmkit ...` (and `torchrun -m mlmkit ...`): the same app as the `mlmkit` command."""

from mlmkit.cli import main

main()
