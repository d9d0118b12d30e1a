"""The built-in tasks' heads: one module per task, module-level torch classes that the task's
``build_model`` imports (the task modules themselves never import torch at module level)."""
