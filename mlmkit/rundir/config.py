"""config.json files: reading one (every field checked, and against the directory's weights) and writing one.

The config itself, and the family it is read through, are mlmkit/models/config.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

from mlmkit.errors import ConfigError
from mlmkit.files import atomic_write_text, parse_json
from mlmkit.models.config import ModelConfig


def save_config(config: ModelConfig, path: str | Path) -> None:
    """config.json as the family's transformers config writes it, replaced whole."""
    atomic_write_text(path, json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n")


def load_config(path: str | Path) -> ModelConfig:
    """config.json of a model directory (or the file itself), every field checked; of a directory
    also against the shapes its weights' headers declare, so that nothing is built on a config
    that does not describe its weights (weights.check_weights)."""
    p = Path(path)
    model_dir = p if p.is_dir() else None
    if model_dir is not None:
        p = p / "config.json"
    try:
        d = parse_json(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config not found: {p}", "pass a run directory or a config.json") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: not a valid config.json ({e})") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{p}: a config.json holds a JSON object, not a {type(d).__name__}",
                          "pass a model's config.json")
    try:
        config = ModelConfig.from_dict(d)
    except ConfigError as e:
        raise ConfigError(f"{p}: {e.message}", e.hint) from None
    except (TypeError, ValueError, AttributeError) as e:
        raise ConfigError(f"{p}: not a valid config.json ({e})") from None
    if model_dir is not None:
        from mlmkit.rundir.weights import check_weights

        check_weights(model_dir, config)
    return config
