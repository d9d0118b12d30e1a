"""A retrieval set built offline from the standard library's docstrings, in BEIR's layout.

Each docstring of two or more sentences is one query and one document: the query is its first
sentence (the summary line), the document the rest. Every fifth query is a test query; the corpus
holds every document, so a test query searches the training documents too. The same Python gives the
same set (files are read with ``ast`` in sorted order, as the pretraining corpus is).
"""

from __future__ import annotations

from pathlib import Path

from mlmkit.files import atomic_write_text, write_jsonl
from mlmkit.quickstart.stdlib_corpus import docstring_documents


def write_retrieval_set(out: str | Path, max_documents: int = 2000, test_every: int = 5) -> dict[str, int]:
    """Write ``out``/corpus.jsonl, queries.jsonl, qrels/train.tsv and qrels/test.tsv; returns the counts."""
    out = Path(out)
    corpus: list[dict[str, str]] = []
    queries: list[dict[str, str]] = []
    splits: dict[str, list[str]] = {"train": [], "test": []}
    seen: set[str] = set()
    for sents in docstring_documents():
        query, text = sents[0], " ".join(sents[1:])
        # one query per summary line and one document per text (a copy would be an unjudged right
        # answer); a document says something
        if query in seen or text in seen or len(text.split()) < 8:
            continue
        seen.update((query, text))
        n = len(corpus)
        corpus.append({"_id": f"d{n}", "title": "", "text": text})
        queries.append({"_id": f"q{n}", "text": query})
        splits["test" if n % test_every == test_every - 1 else "train"].append(f"q{n}\td{n}\t1")
        if len(corpus) >= max_documents:
            break
    write_jsonl(out / "corpus.jsonl", corpus)  # each file atomically
    write_jsonl(out / "queries.jsonl", queries)
    for split, rows in splits.items():
        atomic_write_text(out / "qrels" / f"{split}.tsv",
                          "query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n")
    return {"documents": len(corpus), "train_queries": len(splits["train"]),
            "test_queries": len(splits["test"])}
