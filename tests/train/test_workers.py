"""Tokenizing a corpus in worker processes (mlmkit/train/corpus/workers.py): the same shard as one
process, and an error raised in a worker named here."""

from __future__ import annotations

import json

import pytest
from corpus_helpers import tok_fixture, write_txt  # noqa: F401  (the fixture `tok`)

from mlmkit.errors import DataFormatError
from mlmkit.train.corpus import shards as corpus_shards


def test_tokenizing_in_worker_processes_gives_the_same_shard(tmp_path, tok):
    docs = [[f"w{i} w{(i * 7) % 60} w{(i * 11) % 60}.", f"w{(i * 3) % 60} w{i % 9}."] for i in range(60)]
    parts = [write_txt(tmp_path / f"part{k}.txt", docs=docs[k * 12 : (k + 1) * 12]) for k in range(5)]
    one = tmp_path / "one"
    corpus_shards.tokenize_to(parts, tok, one)
    two = tmp_path / "two"
    corpus_shards.tokenize_to(parts, tok, two, workers=2)
    for name in ("tokens.bin", "sentences.bin", "documents.bin"):
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    assert json.loads((one / "manifest.json").read_text()) == json.loads((two / "manifest.json").read_text())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no part left behind
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine."}\n{"txt": "no text"}\n')
    # raised in a worker, named here
    with pytest.raises(DataFormatError, match=r"bad\.jsonl, line 2, field 'text'"):
        corpus_shards.tokenize_to([*parts, bad], tok, tmp_path / "three", workers=2)
    assert not (tmp_path / "three").exists()
