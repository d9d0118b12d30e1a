"""`mlmkit data`: the built-in sets are written in the formats the commands read (each read back by the
reader of the command that takes it), the commands it prints exist with those flags, the same Python
gives the same bytes, it runs without torch, and bad input is one line with exit status 2."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from mlmkit.cli import app
from mlmkit.quickstart.sets import SETS, Written, write_sets
from mlmkit.registry import get_task
from mlmkit.text.beir import read_split
from mlmkit.train.corpus.files import iter_documents
from mlmkit_tasks.tagging import split_words

runner = CliRunner()


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Written]:
    out = tmp_path_factory.mktemp("sets")
    return {w.name: w for w in write_sets(out, retrieval_documents=300)}


def read(task: str, path: Path) -> list[dict]:
    plugin = get_task(task)
    return plugin.task.read(path, plugin.resolve_options())


def test_every_set_is_written(written):
    assert tuple(written) == SETS
    assert all(w.path.exists() and w.commands for w in written.values())


def test_corpus_reads_as_pretraining_documents(written):
    docs = list(iter_documents(written["corpus"].path))
    assert len(docs) > 1000 and all(len(d) >= 2 for d in docs)


def test_classification_reads_with_its_labels(written):
    d = written["classification"].path
    train, test = read("classification", d / "train.csv"), read("classification", d / "test.csv")
    assert (len(train), len(test)) == (300, 100)
    assert {e["label"] for e in train} == {"positive", "neutral", "negative"}


def test_tagging_reads_and_splits_as_the_tag_command_does(written):
    d = written["tagging"].path
    train, test = read("tagging", d / "train.jsonl"), read("tagging", d / "test.jsonl")
    assert len(train) > 1000 and len(test) > 200
    assert get_task("tagging").task.label_list(train) == ["B-CONST", "B-EXC", "O"]
    for e in train[:500]:  # `mlmkit tag` splits a text into these same words
        text = " ".join(e["tokens"])
        assert [text[a:b] for a, b in split_words(text)] == e["tokens"]
    entities = {w for e in train for w, t in zip(e["tokens"], e["tags"]) if t != "O"}
    assert {"ValueError", "None", "True"} <= entities and "Error" not in entities


def test_qa_reads_with_answers_in_their_contexts(written):
    d = written["qa"].path
    train, test = read("qa", d / "train.jsonl"), read("qa", d / "test.jsonl")
    assert len(train) > 1000 and len(test) > 200
    contexts = {e["context"] for e in train}
    assert not contexts & {e["context"] for e in test}  # a test context is never trained on
    for e in train + test:
        a = e["answers"][0]
        assert e["context"][a["answer_start"]:a["answer_start"] + len(a["text"])] == a["text"]
        name = e["question"].removeprefix("What does ").removesuffix(" do?")
        assert e["context"][:a["answer_start"]].endswith(f"{name}: ")


def test_retrieval_is_a_beir_directory(written):
    d = written["retrieval"].path
    test, train = read_split(f"{d}:test", training=False), read_split(d, training=True)
    assert len(test.corpus) == 300 and (len(train.queries), len(test.queries)) == (240, 60)


def test_the_printed_commands_exist_with_their_flags(written):
    """Each command printed with a set names a command of the CLI and only flags it has."""
    cli = typer.main.get_command(app)
    for w in written.values():
        for line in w.commands:
            for command in line.split(" && "):
                words = shlex.split(command)
                assert words[0] == "mlmkit", command
                cmd = cli.commands[words[1]]
                flags = {o for p in cmd.params for o in p.opts + p.secondary_opts}
                assert {x for x in words[2:] if x.startswith("--")} <= flags, command


def test_the_same_python_writes_the_same_sets(tmp_path, written):
    again = write_sets(tmp_path, ["tagging", "qa"])
    for w in again:
        for f in sorted(w.path.iterdir()):
            assert f.read_bytes() == (written[w.name].path / f.name).read_bytes(), f


def test_cli_writes_the_sets_asked_for_and_prints_how_to_use_them(tmp_path):
    r = runner.invoke(app, ["data", str(tmp_path / "d"), "--set", "classification", "--set", "tagging"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["classification", "tagging"]
    assert "mlmkit finetune tagging" in r.stdout and "mlmkit distill runs/quickstart/classifier" in r.stdout


@pytest.mark.parametrize("argv, says", [
    (["--set", "nope"], "--set nope is not a built-in set"),
    (["--retrieval-documents", "0"], "--retrieval-documents must be at least 1"),
])
def test_cli_refuses_bad_options_in_one_line(tmp_path, argv, says):
    r = runner.invoke(app, ["data", str(tmp_path / "d"), *argv])
    text = " ".join(r.stderr.split())
    assert (r.exit_code == 2 and text.startswith("error:") and says in text
            and "Traceback" not in r.output), r.output
    assert not (tmp_path / "d").exists()


def test_cli_refuses_a_file_as_the_directory(tmp_path):
    f = tmp_path / "taken"
    f.write_text("mine")
    r = runner.invoke(app, ["data", str(f), "--set", "qa"])
    assert r.exit_code == 2 and "is a file, not a directory" in " ".join(r.stderr.split()), r.output
    assert f.read_text() == "mine"


def test_runs_without_torch(tmp_path, stdlib_docstrings):
    """A base install (no torch) writes the sets: nothing on the way imports it."""
    code = ("import sys; sys.modules['torch'] = None; sys.argv = ['mlmkit', 'data', sys.argv[1], '--set', "
            "'corpus', "
            "'--set', 'classification', '--retrieval-documents', '50', '--set', 'retrieval']; "
            "from mlmkit.cli import main; main()")
    # the standard library parsed once a session, not again here
    shutil.copytree(stdlib_docstrings, tmp_path / "cache")
    env = {**os.environ, "MLMKIT_CACHE": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "retrieval" / "qrels" / "test.tsv").is_file() and (tmp_path / "corpus.txt").is_file()
