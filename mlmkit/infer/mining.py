"""`mlmkit mine`: hard negatives for (query, positive) data, from a retriever's ranking of a corpus.

For each (query, positive) pair: the retriever ranks the corpus (BM25, or an embedding bundle's
cosine), the query's known positives (and copies of their text) are passed over wherever they rank,
and the negatives are the next documents inside the rank window (``--range A:B``), optionally only
those scoring at most the positive's score minus a margin, or at most a ratio of it. A row that gets fewer negatives than asked
is still written, and counted with the reason. Rows are written as they are mined, and the output
appears whole or not at all. No torch.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlmkit.args import MineArgs
from mlmkit.errors import ConfigError, DataFormatError
from mlmkit.files import atomic_open
from mlmkit.infer.retrieval import BM25, Dense
from mlmkit.text.beir import is_beir, read_split
from mlmkit.text.readers import data_format, iter_jsonl, iter_records

log = logging.getLogger("mlmkit")

SHORT_WINDOW = "the rank window ran out (after the positives)"
SHORT_FILTER = "the margin or score-ratio filter"


@dataclass
class Pairs:
    """What is mined for: (query text, positive document index) pairs over ``docs``, and each query's
    positives (document indices) to pass over."""

    docs: list[str]
    pairs: list[tuple[str, int]]
    positives: dict[str, set[int]]


def read_pairs(args: MineArgs) -> Pairs:
    """A BEIR split (its corpus unless --corpus), or rows with --corpus (default: their positives)."""
    if is_beir(args.data):
        split = read_split(args.data, training=True)  # DIR:SPLIT names another split
        docs = _read_corpus(args.corpus) if args.corpus else list(split.corpus.values())
        index = {text: i for i, text in enumerate(docs)}
        where = {did: index[text] for did, text in split.corpus.items() if text in index}
        pairs, positives = [], {}
        for qid, text in split.queries.items():
            pos = {where[d] for d in split.positives(qid) if d in where}
            positives.setdefault(text, set()).update(pos)
            pairs += [(text, p) for p in sorted(pos)]
        return Pairs(docs, pairs, positives)
    rows = []
    fmt = data_format(args.data, {".jsonl": "jsonl", ".csv": "csv", ".tsv": "tsv"})
    for rec in iter_jsonl(args.data) if fmt == "jsonl" else iter_records(args.data, fmt):
        rows.append((rec.text(args.anchor_column, flag="--anchor-column"), rec.text(args.positive_column, flag="--positive-column")))
    if not rows:
        raise DataFormatError(args.data, "no rows", hint="one anchor and positive per record")
    docs = _read_corpus(args.corpus) if args.corpus else list(dict.fromkeys(p for _, p in rows))
    index: dict[str, int] = {}
    for i, text in enumerate(docs):
        index.setdefault(text, i)
    pairs, positives = [], {}
    for anchor, positive in rows:
        if positive not in index:  # a positive the corpus lacks: mined all the same, and passed over by text
            index[positive] = len(docs)
            docs.append(positive)
        pairs.append((anchor, index[positive]))
        positives.setdefault(anchor, set()).add(index[positive])
    return Pairs(docs, pairs, positives)


def _read_corpus(path: Path) -> list[str]:
    """Documents of a .txt file (one per non-blank line) or a .jsonl file (text, with a title before it)."""
    if data_format(path, {".txt": "txt", ".jsonl": "jsonl"}) == "txt":
        docs = [r.data.strip() for r in iter_records(path, "txt")]
    else:
        docs = []
        for rec in iter_jsonl(path):
            title = rec.fields().get("title")
            text = rec.text("text")
            docs.append(f"{title.strip()} {text}" if isinstance(title, str) and title.strip() else text)
    if not docs:
        raise DataFormatError(path, "no documents", hint="one document per line")
    return docs


def _negatives(ranked: Iterator[tuple[int, float]], docs: list[str], skip: set[int], want: int,
               ceiling: float | None) -> tuple[list[tuple[int, float]], str | None]:
    """The first ``want`` of ``ranked`` that are neither a positive nor a copy of one's text, nor above
    ``ceiling``; and why there were fewer, if there were."""
    got, filtered = [], False
    same = {docs[i] for i in skip}
    for doc, score in ranked:
        if doc in skip or docs[doc] in same:
            continue
        if ceiling is not None and score > ceiling:
            filtered = True
            continue
        got.append((doc, score))
        if len(got) == want:
            return got, None
    return got, SHORT_FILTER if filtered else SHORT_WINDOW


def mine(args: MineArgs) -> dict[str, Any]:
    """Mine, write ``args.out``, and return what happened: rows, negatives, and the rows that got fewer
    negatives than asked, by reason."""
    data = read_pairs(args)
    lo, hi = args.window()
    if lo >= len(data.docs):
        raise ConfigError(f"--range {args.rank_range} starts past the corpus's {len(data.docs):,} documents",
                          f"give a range below {len(data.docs):,}")
    short: Counter[str] = Counter()
    written = negatives = 0
    with tempfile.TemporaryDirectory(prefix="mlmkit-mine-") as work:
        retriever = BM25(data.docs) if args.retriever == "bm25" else Dense(args.retriever, data.docs, work, device=args.device)
        log.info("mining %d pairs over %d documents with %s", len(data.pairs), len(data.docs), args.retriever)
        need_pos = args.with_scores or args.margin is not None or args.max_score_ratio is not None
        with atomic_open(args.out) as f:
            for start in range(0, len(data.pairs), args.batch_size):
                batch = data.pairs[start:start + args.batch_size]
                queries = [q for q, _ in batch]
                idx, scores = retriever.search(queries, hi)
                pos_scores = retriever.pair_scores(queries, [p for _, p in batch]) if need_pos else None
                for n, (query, pos) in enumerate(batch):
                    ceiling = None
                    if args.margin is not None:
                        ceiling = float(pos_scores[n]) - args.margin
                    elif args.max_score_ratio is not None:
                        ceiling = float(pos_scores[n]) * args.max_score_ratio
                    window = zip(idx[n][lo:hi].tolist(), scores[n][lo:hi].tolist())
                    got, why = _negatives(window, data.docs, data.positives.get(query, set()) | {pos}, args.negatives, ceiling)
                    if why:
                        short[why] += 1
                    row: dict[str, Any] = {"anchor": query, "positive": data.docs[pos]}
                    row.update({f"negative_{i}": data.docs[d] for i, (d, _) in enumerate(got, 1)})
                    if args.with_scores:
                        row["scores"] = [float(pos_scores[n]), *(float(s) for _, s in got)]
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
                    written, negatives = written + 1, negatives + len(got)
    for why, n in short.items():
        log.warning("%d of %d rows got fewer than %d negatives: %s", n, written, args.negatives, why)
    return {"rows": written, "negatives": negatives, "documents": len(data.docs), "short": dict(short),
            "out": str(args.out)}
