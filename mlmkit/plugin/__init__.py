"""The task contract (registry.py) and the task author's kit (taskkit.py). No torch."""
