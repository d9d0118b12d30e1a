"""The built-in data sets, written to a directory in the formats the commands read (`mlmkit data`).

- corpus: the quickstart's pretraining corpus, the docstrings of Python's standard library
  (stdlib_corpus.py): corpus.txt, a sentence per line, a blank line between documents.
- classification: the sentiment set shipped in data/ (product reviews labelled positive, neutral,
  negative): classification/train.csv and test.csv (text, label).
- tagging: the docstrings' sentences with two kinds of entity: EXC a built-in exception or warning
  (ValueError, as Python's builtins name them) and CONST None / True / False. Words are split as
  `mlmkit tag` splits a text (runs of word characters, each other character alone), IOB2 tags:
  tagging/train.jsonl and test.jsonl ({"tokens", "tags"}).
- qa: extractive questions over the docstrings' summary lines: a context lists four functions or
  classes of one module as "NAME: summary line", the question asks "What does NAME do?" and the
  answer is that summary: qa/train.jsonl and test.jsonl ({"id", "question", "context", "answers"}).
- retrieval: the quickstart's BEIR directory (retrieval_set.py): summary line -> the rest of the
  docstring.

Every fifth document (tagging), context (qa) or query (retrieval) is held out as the test split.
The same Python gives the same sets. Nothing here imports torch: the sets are written on a base
install too.
"""

from __future__ import annotations

import builtins
import csv
import io
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from mlmkit.errors import ConfigError
from mlmkit.files import atomic_write_text, write_jsonl
from mlmkit.quickstart.stdlib_corpus import definitions

SETS = ("corpus", "classification", "tagging", "qa", "retrieval")
"""The built-in sets, in the order they are written."""
CORPUS_CHARS = 1_500_000
"""The quickstart's corpus size (the whole standard library is about 1.1 M characters)."""
RETRIEVAL_DOCUMENTS = 1000
"""The quickstart's retrieval set size."""
PRETRAINED = "runs/quickstart/pretrain"
"""The run the commands printed with each set start from: the quickstart's tiny BERT."""


@dataclass(frozen=True)
class Written:
    """One set as written: its name, its file or directory, what it holds, and commands that use it."""

    name: str
    path: Path
    holds: str
    commands: tuple[str, ...]


def write_sets(out: str | Path, names: Sequence[str] = (), *,
               retrieval_documents: int = RETRIEVAL_DOCUMENTS) -> list[Written]:
    """Write the sets ``names`` (default: all of SETS) under ``out``, each file atomically (those of an
    earlier call are replaced); returns what was written, in SETS' order."""
    out = Path(out)
    unknown = [n for n in names if n not in SETS]
    if unknown:
        raise ConfigError(f"--set {unknown[0]} is not a built-in set", f"use one of: {', '.join(SETS)}")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} is a file, not a directory", "give a directory to write the sets into")
    if retrieval_documents < 1:
        raise ConfigError(f"--retrieval-documents must be at least 1, got {retrieval_documents}")
    writers = {"corpus": _corpus, "classification": _classification, "tagging": _tagging, "qa": _qa,
               "retrieval": lambda d: _retrieval(d, retrieval_documents)}
    return [writers[n](out) for n in SETS if n in (names or SETS)]


def _corpus(out: Path) -> Written:
    from mlmkit.quickstart.stdlib_corpus import write_corpus

    path = out / "corpus.txt"
    n = write_corpus(path, max_chars=CORPUS_CHARS)
    return Written("corpus", path, f"{n['documents']:,} documents, {n['sentences']:,} sentences",
                   (f"mlmkit pretrain {path} --out runs/bert --steps 1000",))


def _classification(out: Path) -> Written:
    from mlmkit.quickstart.demo import data_file

    d = out / "classification"
    sizes = {}
    for split, shipped in (("train", "quickstart_train.csv"), ("test", "quickstart_eval.csv")):
        text = data_file(shipped).read_text(encoding="utf-8")
        atomic_write_text(d / f"{split}.csv", text)
        sizes[split] = len(list(csv.DictReader(io.StringIO(text))))
    return Written("classification", d, f"{sizes['train']} train + {sizes['test']} test product reviews; "
                                        "labels positive, neutral, negative",
                   (f"mlmkit finetune classification --model {PRETRAINED} --train {d / 'train.csv'} --eval "
                    f"{d / 'test.csv'} --out runs/clf --epochs 8 --lr 1e-3",
                    f"mlmkit distill runs/quickstart/classifier --train {d / 'train.csv'} --eval "
                    f"{d / 'test.csv'} "
                    "--out runs/student --layers 1 --epochs 8 --lr 1e-3"))


# ---- tagging ---------------------------------------------------------------------------------------
_WORDS = re.compile(r"\w+|[^\w\s]")
CONSTANTS = frozenset({"None", "True", "False"})


def _exceptions() -> frozenset[str]:
    return frozenset(n for n, v in vars(builtins).items() if isinstance(v, type)
                     and issubclass(v, BaseException))


def tag_sentence(sentence: str, exceptions: frozenset[str]) -> tuple[list[str], list[str]]:
    """The words of ``sentence`` and their IOB2 tags: B-EXC for a built-in exception, B-CONST for None,
    True or False, O for the rest."""
    words = _WORDS.findall(sentence)
    return words, ["B-EXC" if w in exceptions else "B-CONST" if w in CONSTANTS else "O" for w in words]


def tagging_rows() -> Iterator[tuple[str, list[str], list[str]]]:
    """(split, words, tags) of each sentence that names an entity, and of every eighth that names none."""
    exceptions = _exceptions()
    seen: set[str] = set()
    plain = 0
    for n, (_, _, sents) in enumerate(definitions()):
        for s in sents:
            if s in seen:
                continue
            seen.add(s)
            words, tags = tag_sentence(s, exceptions)
            if all(t == "O" for t in tags):
                plain += 1
                if plain % 8:
                    continue
            yield "test" if n % 5 == 4 else "train", words, tags


def _tagging(out: Path) -> Written:
    d = out / "tagging"
    rows: dict[str, list[dict[str, list[str]]]] = {"train": [], "test": []}
    for split, words, tags in tagging_rows():
        rows[split].append({"tokens": words, "tags": tags})
    for split, r in rows.items():
        write_jsonl(d / f"{split}.jsonl", r)
    return Written("tagging", d, f"{len(rows['train']):,} train + {len(rows['test']):,} test sentences; "
                                 "entities EXC, CONST",
                   (f"mlmkit finetune tagging --model {PRETRAINED} --train {d / 'train.jsonl'} --eval "
                    f"{d / 'test.jsonl'} --out runs/tagger --epochs 5 --lr 1e-3",))


# ---- qa ----------------------------------------------------------------------------------------------
def qa_rows(per_context: int = 4, max_words: int = 16) -> Iterator[tuple[str, dict]]:
    """(split, SQuAD-style record): contexts of ``per_context`` public functions and classes of one
    module whose summary line has at most ``max_words`` words, a question for each."""
    group: list[tuple[str, str]] = []
    module = None
    contexts = 0

    def flush() -> Iterator[tuple[str, dict]]:
        nonlocal contexts
        if len(group) < 2:
            return
        context, starts = "", []
        for name, summary in group:
            starts.append(len(context) + len(name) + 2)
            context += f"{name}: {summary}{'' if summary.endswith(('.', '!', '?')) else '.'} "
        split = "test" if contexts % 5 == 4 else "train"
        for k, ((name, summary), start) in enumerate(zip(group, starts)):
            yield split, {"id": f"c{contexts}-{k}", "question": f"What does {name} do?",
                          "context": context.rstrip(),
                          "answers": [{"text": summary, "answer_start": start}]}
        contexts += 1

    for mod, name, sents in definitions():
        if module != mod or len(group) == per_context:
            yield from flush()
            group, module = [], mod
        public = name and not any(p.startswith("_") for p in name.split("."))
        if public and len(sents[0].split()) <= max_words and all(name != g for g, _ in group):
            group.append((name, sents[0]))
    yield from flush()


def _qa(out: Path) -> Written:
    d = out / "qa"
    rows: dict[str, list[dict]] = {"train": [], "test": []}
    for split, row in qa_rows():
        rows[split].append(row)
    for split, r in rows.items():
        write_jsonl(d / f"{split}.jsonl", r)
    return Written("qa", d,
                   f"{len(rows['train']):,} train + {len(rows['test']):,} test questions: What does NAME do?",
                   (f"mlmkit finetune qa --model {PRETRAINED} --train {d / 'train.jsonl'} --eval "
                    f"{d / 'test.jsonl'} "
                    "--out runs/qa --epochs 3 --lr 1e-3 --max-length 128 --doc-stride 32",))


def _retrieval(out: Path, documents: int) -> Written:
    from mlmkit.quickstart.retrieval_set import write_retrieval_set

    d = out / "retrieval"
    n = write_retrieval_set(d, max_documents=documents)
    return Written("retrieval", d,
                   f"a BEIR directory: {n['documents']:,} documents, {n['train_queries']:,} training and "
                   f"{n['test_queries']:,} test queries",
                   ("mlmkit export runs/quickstart/embedding --out exports/emb",
                    f"mlmkit index exports/emb --corpus {d / 'corpus.jsonl'} --out ix && mlmkit search ix "
                    "\"read a file\"",
                    f"mlmkit evaluate exports/emb --data {d}:test"))
