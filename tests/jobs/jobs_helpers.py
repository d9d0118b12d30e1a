"""The bundle and inputs the batch-job tests share (tests/jobs/): a classification bundle (the fixture
``bundle``), rows of random sentences and a JSON lines file of them (the CLI run in-process: hostile.py's
``cli``)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from task_runs import sentence


@pytest.fixture(name="bundle")
def bundle_fixture(classification_bundle: Path) -> Path:
    """conftest.py's ``classification_bundle``, exported once a worker, by the name these tests use."""
    return classification_bundle


def rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"id": f"r{i}", "text": sentence(rng, rng.randint(1, 30))} for i in range(n)]


def jsonl(p: Path, data: list[dict]) -> Path:
    p.write_text("".join(json.dumps(r) + "\n" for r in data))
    return p
