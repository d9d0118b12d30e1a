"""`mlmkit quickstart`: the built-in data (data/, the standard library's docstrings) and the demo."""
