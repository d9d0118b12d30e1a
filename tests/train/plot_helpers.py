"""What the tests of a run's curves and model cards share (tests/train/test_plots.py, test_tracking.py):
a PNG's size, the file verified first, and a model card's YAML front matter."""

from __future__ import annotations

from pathlib import Path

import yaml


def png_size(path: Path) -> tuple[int, int]:
    from PIL import Image

    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        return im.size


def front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n", 2)[1])
