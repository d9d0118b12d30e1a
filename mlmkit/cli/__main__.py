"""`python -m mlmkit.cli ...` (as torchrun runs it): the `mlmkit` command."""

from mlmkit.cli import main

main()
