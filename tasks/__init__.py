"""Built-in mlmkit task plugins, installed as `mlmkit_tasks` and registered through the `mlmkit.tasks` entry points."""
