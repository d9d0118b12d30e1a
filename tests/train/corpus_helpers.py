"""What the corpus tests share (tests/train/: test_corpus.py, test_shards.py, test_instances.py,
test_data.py, test_workers.py): a word tokenizer (the module-scoped fixture ``tok``), corpus files of
documents written as text, and the token shards of a cache."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from mlmkit.text.tokenizer import train_tokenizer
from mlmkit.train.corpus.files import iter_documents

FIRST_ID = 5  # ids 0-4 are the special tokens


@pytest.fixture(scope="module", name="tok")
def tok_fixture():
    words = [f"w{i}" for i in range(60)]
    rng = random.Random(0)
    return train_tokenizer([" ".join(rng.choices(words, k=8)) for _ in range(500)], vocab_size=200,
                           min_frequency=1)


DOCS = [["First sentence here.", "Second one, café."], ["Another document.", "With two lines.", "And three."]]


def write_txt(path: Path, docs=DOCS, opener=open) -> Path:
    with opener(path, "wt", encoding="utf-8") as f:
        f.write("\n\n".join("\n".join(d) for d in docs) + "\n")
    return path


def shards(cache: Path) -> list[Path]:
    return [d for d in cache.iterdir() if (d / "manifest.json").is_file()]


def in_memory(paths: list[Path], tok) -> list[list[list[int]]]:
    """Every document's sentences' ids, tokenized directly: what a shard must hold."""
    return [[tok.encode(s, add_special_tokens=False).ids for s in doc] for p in paths
            for doc in iter_documents(p)]
