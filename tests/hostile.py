"""Hostile but ordinary use, the helpers the reliability tests share: ``cli`` runs a command through
CliRunner as a wide terminal would (``mine``, `mlmkit mine --json` and the rows it wrote), ``one_line``
asserts a user error (exit status 2, a single 'error: ...' line on stderr, no traceback), the
module-scoped ``data`` fixture holds a tiny corpus, tokenizer and config for ``tiny`` pretraining runs
(``pretraining_inputs`` makes them in other sizes, ``word_corpus`` the corpus alone), and ``PEAK`` is
the code that prints a process's peak resident memory. A test module that wants the fixture imports it:
``from hostile import data_fixture`` (named apart from the ``data`` argument, which would shadow the
import)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from mlmkit.cli import app
from mlmkit.text.tokenizer import save_tokenizer, train_tokenizer

runner = CliRunner()
WORDS = [f"w{i}" for i in range(40)]


def one_line(r, *parts: str) -> str:
    """Exit status 2, a single 'error: ...' line, no traceback, containing ``parts`` (the run's own log
    lines before it, such as "bf16 autocast: on", are not the error's)."""
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    text = " ".join(r.stderr.split())
    assert text.count("error:") == 1 and "Traceback" not in r.output, r.stderr
    before, text = text[: text.index("error:")], text[text.index("error:"):]
    assert not before or before.startswith(("INFO", "WARNING")), r.stderr  # log lines only
    for p in parts:
        assert p in text, (p, text)
    return text


def cli(*args: str | Path, **kw):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "1000"}, **kw)


def mine(*args: str) -> tuple[Result, list[dict]]:
    """`mlmkit mine ARGS --json` through ``cli``: its result, and the rows of its (last) .jsonl argument
    where it succeeded."""
    out = [a for a in args if a.endswith(".jsonl")][-1]
    r = cli("mine", *args, "--json")
    rows = [json.loads(line) for line in open(out)] if r.exit_code == 0 else []
    return r, rows


def word_corpus(path: Path, n_docs: int, words: tuple[int, int] = (5, 12),
                sentences: int | tuple[int, int] = 4) -> Path:
    """``n_docs`` documents of random sentences of WORDS, a blank line between two (seed 0): each of
    ``sentences`` sentences (a number, or the bounds of one drawn a document) of ``words`` words (the
    bounds of the number drawn)."""
    rng = random.Random(0)
    docs = ["\n".join(" ".join(rng.choices(WORDS, k=rng.randint(*words)))
                      for _ in range(sentences if isinstance(sentences, int) else rng.randint(*sentences)))
            for _ in range(n_docs)]
    path.write_text("\n\n".join(docs) + "\n")
    return path


def pretraining_inputs(d: Path, n_docs: int = 40, sentences: int | tuple[int, int] = 4,
                       **config) -> dict[str, Path]:
    """In ``d``: a ``word_corpus``, a tokenizer of 120 words trained on it and a tiny config (one layer
    unless ``config`` says otherwise)."""
    from mlmkit.models.config import ModelConfig
    from mlmkit.rundir.config import save_config

    corpus = word_corpus(d / "corpus.txt", n_docs, sentences=sentences)
    tok = train_tokenizer(corpus.read_text().split("\n"), vocab_size=120, min_frequency=1)
    save_tokenizer(tok, d / "tok")
    save_config(ModelConfig(**{"vocab_size": tok.get_vocab_size(), "hidden_size": 32, "num_hidden_layers": 1,
                               "num_attention_heads": 2, "intermediate_size": 64,
                               "max_position_embeddings": 64, **config}), d / "config.json")
    return {"dir": d, "corpus": corpus, "tok": d / "tok" / "tokenizer.json", "config": d / "config.json"}


@pytest.fixture(scope="module", name="data")
def data_fixture(tmp_path_factory) -> dict[str, Path]:
    return pretraining_inputs(tmp_path_factory.mktemp("rel"))


def tiny(data: dict[str, Path], out: Path, *extra: str) -> list[str | Path]:
    return ["pretrain", data["corpus"], "--out", out, "--tokenizer", data["tok"], "--config", data["config"],
            "--steps", "4", "--batch-size", "4", "--seq-len", "32", "--save-every", "2", *extra]


# the process's own high-water mark (ru_maxrss would count the forked parent's pages too)
PEAK = "print(next(x.split()[1] for x in open('/proc/self/status') if x.startswith('VmHWM')))"
