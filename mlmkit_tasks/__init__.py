"""Built-in mlmkit task plugins, registered through the `mlmkit.tasks` entry points."""
