"""BEIR directories: ``corpus.jsonl`` ({"_id", "title", "text"}), ``queries.jsonl`` ({"_id", "text"})
and ``qrels/SPLIT.tsv`` (a header, then query-id, corpus-id, score), the layout retrieval sets ship in.

Read streaming with file/line errors like every other reader (text/readers.py). ``DIR:SPLIT`` names a
split (``scifact/:dev``); without one, training reads ``train`` and evaluation ``test`` (``dev`` when
there is no test). A document is ``title + " " + text``, as BEIR joins them. No torch.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from mlmkit.errors import DataFormatError
from mlmkit.files import MAX_RECORD_BYTES
from mlmkit.text.readers import iter_jsonl, iter_table
from mlmkit.text.record import Record

FILES = ("corpus.jsonl", "queries.jsonl")
TRAIN_SPLITS = ("train",)
EVAL_SPLITS = ("test", "dev")


@dataclass
class BeirSplit:
    """One split of a BEIR directory: the judged queries, every document, and the judgements."""

    directory: Path
    split: str
    corpus: dict[str, str]  # document id -> title + " " + text, in file order
    queries: dict[str, str]  # query id -> text, only the queries the split judges, in qrels order
    qrels: dict[str, dict[str, int]]  # query id -> {document id: grade}, grades > 0 relevant
    skipped: dict[str, int] = field(default_factory=dict)  # why -> how many queries were left out

    def positives(self, qid: str) -> list[str]:
        return [d for d, g in self.qrels[qid].items() if g > 0]


def split_spec(path: str | Path) -> tuple[Path, str | None]:
    """``DIR:SPLIT`` -> (DIR, SPLIT); a plain path -> (path, None). A colon inside a name is kept when
    no directory ends before it (a Windows drive letter, a file named a:b)."""
    s = str(path)
    m = re.fullmatch(r"(.+?)/?:([A-Za-z0-9_.-]+)", s)
    if m and Path(m.group(1)).is_dir():
        return Path(m.group(1)), m.group(2)
    return Path(s), None


def is_beir(path: str | Path) -> bool:
    """Whether ``path`` (or its ``DIR:SPLIT`` directory) is a BEIR directory."""
    d, _ = split_spec(path)
    return d.is_dir() and all((d / f).is_file() for f in FILES) and (d / "qrels").is_dir()


def pick_split(d: Path, split: str | None, preferred: tuple[str, ...]) -> str:
    """The split to read: the one named, else the first of ``preferred`` the directory has."""
    have = sorted(p.stem for p in (d / "qrels").glob("*.tsv"))
    if split is not None:
        if split not in have:
            raise DataFormatError(d / "qrels" / f"{split}.tsv", "no such split",
                                  hint=f"the splits here: {', '.join(have) or 'none'}")
        return split
    for s in preferred:
        if s in have:
            return s
    raise DataFormatError(d / "qrels", f"no {' or '.join(f'{s}.tsv' for s in preferred)}",
                          hint=f"name a split as {d}:SPLIT (here: {', '.join(have) or 'none'})")


def _records(path: Path, what: str, max_bytes: int | None = MAX_RECORD_BYTES) -> Iterator[tuple[Record, str]]:
    """(record, its _id) of a corpus or queries file; an id seen twice is an error naming both lines."""
    seen: dict[str, int | None] = {}
    for rec in iter_jsonl(path, max_bytes=max_bytes):
        rid = rec.fields().get("_id")
        if isinstance(rid, int) and not isinstance(rid, bool):
            rid = str(rid)
        if not isinstance(rid, str) or not rid:
            raise rec.error(f"every {what} needs an \"_id\" (a string)", "_id")
        if rid in seen:
            raise rec.error(f"the id {rid!r} again (first on line {seen[rid]})", "_id",
                            hint="ids must be unique")
        seen[rid] = rec.line
        yield rec, rid


def _optional(rec: Record, key: str) -> str:
    """A field that may be missing, null or empty (BEIR titles often are), else a string."""
    v = rec.fields().get(key)
    if v is None:
        return ""
    if not isinstance(v, str):
        raise rec.error(f"expected a string, got {type(v).__name__}", key)
    return v.strip()


def read_corpus(d: Path, max_bytes: int | None = MAX_RECORD_BYTES) -> dict[str, str]:
    corpus: dict[str, str] = {}
    for rec, did in _records(d / "corpus.jsonl", "document", max_bytes):
        title, text = _optional(rec, "title"), _optional(rec, "text")
        if not title and not text:
            raise rec.error("a document needs a title or a text", "text")
        corpus[did] = f"{title} {text}".strip() if title else text
    if not corpus:
        raise DataFormatError(d / "corpus.jsonl", "no documents",
                              hint="one JSON object per line: _id, title, text")
    return corpus


def read_qrels(path: Path,
               max_bytes: int | None = MAX_RECORD_BYTES) -> Iterator[tuple[Record, str, str, int]]:
    """(record, query id, document id, grade) per judgement row of a qrels TSV file (a header first)."""
    for rec in iter_table(path, "\t", max_bytes=max_bytes):
        row = list(rec.fields().values())
        if len(row) < 3:
            raise rec.error("expected query-id, corpus-id and score",
                            hint="a header, then one judgement per line")
        qid, did, grade = (str(v).strip() for v in row[:3])
        try:
            g = int(float(grade))
        except ValueError:
            raise rec.error(f"the score must be a number, not {grade!r}",
                            (rec.columns or ("", "", "score"))[2]) from None
        yield rec, qid, did, g


def read_split(path: str | Path, *, training: bool, max_bytes: int | None = MAX_RECORD_BYTES) -> BeirSplit:
    """A BEIR directory's split (``DIR:SPLIT``, or train / test-then-dev by default). A judgement
    naming an unknown query or document is an error naming the qrels file and line; a judged query
    with no relevant document is left out and counted in ``skipped``; a line of more than
    ``max_bytes`` is a bad record."""
    d, split = split_spec(path)
    split = pick_split(d, split, TRAIN_SPLITS if training else EVAL_SPLITS)
    corpus = read_corpus(d, max_bytes)
    texts = {qid: rec.text("text") for rec, qid in _records(d / "queries.jsonl", "query", max_bytes)}
    qrels: dict[str, dict[str, int]] = {}
    qrels_file = d / "qrels" / f"{split}.tsv"
    for rec, qid, did, g in read_qrels(qrels_file, max_bytes):
        if qid not in texts:
            raise rec.error(f"query {qid!r} is not in queries.jsonl",
                            hint="the qrels and the queries disagree")
        if did not in corpus:
            raise rec.error(f"document {did!r} is not in corpus.jsonl",
                            hint="the qrels and the corpus disagree")
        qrels.setdefault(qid, {})[did] = g
    skipped: dict[str, int] = {}
    for qid in [q for q, judged in qrels.items() if not any(g > 0 for g in judged.values())]:
        del qrels[qid]
        skipped["no relevant document"] = skipped.get("no relevant document", 0) + 1
    if not qrels:
        raise DataFormatError(qrels_file, "no query with a relevant document",
                              hint="a qrels row per (query, document, score > 0)")
    return BeirSplit(d, split, corpus, {q: texts[q] for q in qrels}, qrels, skipped)


def other_splits_answers(split: BeirSplit) -> dict[str, set[str]]:
    """Per other split of ``split``'s directory (each qrels/*.tsv but its own), the documents judged
    relevant there and in no judgement of ``split``: that split's answers. Mined as negatives for
    training, they teach a model that the other split's answers are wrong."""
    here = {d for judged in split.qrels.values() for d in judged}
    out: dict[str, set[str]] = {}
    for f in sorted((split.directory / "qrels").glob("*.tsv")):
        if f.stem != split.split:
            docs = {did for _, _, did, g in read_qrels(f) if g > 0 and did not in here}
            if docs:
                out[f.stem] = docs
    return out
