"""`mlmkit mine`: hard negatives for (query, positive) data, from a retriever's ranking of a corpus.

For each (query, positive) pair: the retriever ranks the corpus (BM25, or an embedding bundle's
cosine), the query's known positives (and copies of their text) are passed over wherever they rank,
and the negatives are the next documents inside the rank window (``--range A:B``, ranks counting the
documents that are not the query's positives, so that a query with several positives still has B - A
candidates: the retriever is asked for B plus the most positives a query of the batch has), optionally
only those scoring at most the positive's score minus a margin, or at most a ratio of it. A row that gets
fewer negatives than asked is still written, and counted with the reason. Rows are written as they are mined,
a batch of queries at a time, into OUT's job directory (jobs/jobdir.py's Job, as batch inference does), and
OUT appears whole, by a rename, when every batch is there; a killed run continues with ``--resume``
after the batches it finished (an embedding bundle's corpus vectors, kept in the job directory, are
not computed again), and refuses to when the data, the retriever or the settings changed.

From a BEIR directory, the documents judged relevant in its other splits (the test answers, when
training rows are mined) are left out of the corpus unless ``--keep-other-splits``: mined as negatives
they teach a model that every test answer is wrong (measured on the built-in set: docs/retrieval.md,
"Hard negatives"). No torch.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypedDict

from mlmkit.args import MineArgs, fusion_weights
from mlmkit.errors import ConfigError, DataFormatError
from mlmkit.files import JSONObject
from mlmkit.jobs.batch import Done, Job, Window, job_dir, owned_output, remove_empty
from mlmkit.locks import exclusive
from mlmkit.registry import Prediction
from mlmkit.retrieval.exact import BM25, Dense
from mlmkit.retrieval.index import IndexRetriever
from mlmkit.retrieval.index.hybrid import FusedRetriever
from mlmkit.text.beir import BeirSplit, is_beir, other_splits_answers, read_split, split_spec
from mlmkit.text.readers import data_format, iter_jsonl, iter_records, numbered
from mlmkit.text.records import identity

log = logging.getLogger("mlmkit")

Retriever = BM25 | Dense | IndexRetriever | FusedRetriever

SHORT_WINDOW = "the rank window ran out (after the positives)"
SHORT_FILTER = "the margin or score-ratio filter"


@dataclass
class Pairs:
    """What is mined for: (query text, positive document index) pairs over ``docs``, and each query's
    positives (document indices) to pass over."""

    docs: list[str]
    pairs: list[tuple[str, int]]
    positives: dict[str, set[int]]
    held_out: int = 0  # documents left out of ``docs``: another split's answers
    ids: dict[str, int] | None = None  # a BEIR corpus's: document id -> its place in ``docs`` (None: rows)


def _hold_out(split: BeirSplit, docs: list[str]) -> int:
    """Take out of ``docs`` (in place) the texts of the other splits' answers that are not also this
    split's positives, log what went, and return how many documents did."""
    answers = other_splits_answers(split)
    keep = {split.corpus[d] for q in split.qrels for d in split.positives(q)}
    gone = {split.corpus[d] for ds in answers.values() for d in ds} - keep
    before = len(docs)
    docs[:] = [t for t in docs if t not in gone]
    if before > len(docs):
        log.info("%d documents judged relevant in the %s split%s of %s are not mined (a negative that is "
                 "another "
                 "split's answer teaches the model that split; --keep-other-splits mines them)",
                 before - len(docs),
                 " and ".join(answers), "s" if len(answers) > 1 else "", split.directory)
    return before - len(docs)


def read_pairs(args: MineArgs) -> Pairs:
    """A BEIR split (its corpus unless --corpus), or rows with --corpus (default: their positives)."""
    if is_beir(args.data):
        split = read_split(args.data, training=True)  # DIR:SPLIT names another split
        docs = _read_corpus(args.corpus) if args.corpus else list(split.corpus.values())
        held_out = 0 if args.keep_other_splits else _hold_out(split, docs)
        index = {text: i for i, text in enumerate(docs)}
        where = {did: index[text] for did, text in split.corpus.items() if text in index}
        pairs: list[tuple[str, int]] = []
        positives: dict[str, set[int]] = {}
        for qid, text in split.queries.items():
            pos = {where[d] for d in split.positives(qid) if d in where}
            positives.setdefault(text, set()).update(pos)
            pairs += [(text, p) for p in sorted(pos)]
        return Pairs(docs, pairs, positives, held_out, where)
    rows = []
    fmt = data_format(args.data, {".jsonl": "jsonl", ".csv": "csv", ".tsv": "tsv"})
    for rec in iter_jsonl(args.data) if fmt == "jsonl" else iter_records(args.data, fmt):
        rows.append((rec.text(args.anchor_column, flag="--anchor-column"),
                     rec.text(args.positive_column, flag="--positive-column")))
    if not rows:
        raise DataFormatError(args.data, "no rows", hint="one anchor and positive per record")
    docs = _read_corpus(args.corpus) if args.corpus else list(dict.fromkeys(p for _, p in rows))
    index = {}
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
        if doc < 0 or doc in skip or docs[doc] in same:  # -1: past a faiss graph's reach
            continue
        if ceiling is not None and score > ceiling:
            filtered = True
            continue
        got.append((doc, score))
        if len(got) == want:
            return got, None
    return got, SHORT_FILTER if filtered else SHORT_WINDOW


def _what(args: MineArgs) -> JSONObject:
    """What a resumed mining job must find unchanged: the data, the corpus and the retriever's files
    (paths, sizes, times) and every setting."""
    def files(p: Path | None) -> list[list[Any]] | None:
        if p is None:
            return None
        d, split = split_spec(p) if is_beir(p) else (p, None)
        return identity(sorted(f for f in d.rglob("*") if f.is_file()) if d.is_dir()
                        else [d]) + ([[split]] if split else [])

    bundle, *hybrid = [None if r == "bm25" else files(Path(r))
                       for r in [args.retriever, *(args.hybrid or [])]]
    return {**{k: v for k, v in asdict(args).items() if k not in ("out", "resume", "device", "precision")},
            "data": files(args.data), "corpus": files(args.corpus), "bundle": bundle,
            "score_with": files(args.score_with),
            **({"hybrid_files": hybrid} if hybrid else {})}


class Mined(TypedDict):
    """What a mining job did (mine): its rows and negatives, the corpus's documents, the other splits'
    answers left out, the rows short of negatives by reason, and the output."""

    rows: int
    negatives: int
    documents: int
    held_out: int
    short: dict[str, int]
    out: str


def mine(args: MineArgs) -> Mined:
    """Mine, write ``args.out``, and return what happened: rows, negatives, and the rows that got fewer
    negatives than asked, by reason (over the whole job, a resumed one too)."""
    data = read_pairs(args)
    lo, hi = args.window()
    if lo >= len(data.docs):
        raise ConfigError(f"--range {args.rank_range} starts past the corpus's {len(data.docs):,} documents",
                          f"give a range below {len(data.docs):,}")
    out = owned_output(Path(args.out))
    try:
        with exclusive(job_dir(out)):
            job = Job(out, _what(args), resume=args.resume, errors=None)
            try:
                retriever = _retriever(args.retriever, data, args, job.dir)
                if args.hybrid:
                    retriever = FusedRetriever([(args.retriever, retriever),
                                                *((h, _retriever(h, data, args, job.dir))
                                                 for h in args.hybrid)],
                                               args.fusion,
                                               fusion_weights(args.weights, args.hybrid, args.fusion))
                log.info("mining %d pairs over %d documents with %s", len(data.pairs), len(data.docs),
                         " + ".join([args.retriever, *(args.hybrid or [])]))
                # the positive's score from the retriever: for a filter, or the row's scores where no
                # cross-encoder gives them
                need_pos = ((args.with_scores and args.score_with is None) or args.margin is not None
                            or args.max_score_ratio is not None)
                scorer = _scorer(args.score_with, args.device,
                                 args.precision) if args.score_with is not None else None
                for k, start in enumerate(range(0, len(data.pairs), args.batch_size)):
                    if k < job.done:
                        continue
                    batch = data.pairs[start:start + args.batch_size]
                    done = _mine_batch(batch, retriever, data, args, (lo, hi), need_pos)
                    job.add(Window(k, start + 1, list(batch)),
                            _rescored(done, scorer) if scorer is not None else done)
            except BaseException:
                if job.done == 0:
                    job.discard()  # nothing finished: nothing to resume
                raise
            written, negatives = job.written, job.counts.get("negatives", 0)
            short = {k.removeprefix("short: "): n for k, n in job.counts.items() if k.startswith("short: ")}
            job.finish()
    finally:
        remove_empty(job_dir(out))  # once the lock is let go: a job directory with nothing in it goes
    for why, n in short.items():
        log.warning("%d of %d rows got fewer than %d negatives: %s", n, written, args.negatives, why)
    return {"rows": written, "negatives": negatives, "documents": len(data.docs), "held_out": data.held_out,
            "short": short,
            "out": str(args.out)}


def _retriever(spec: str, data: Pairs, args: MineArgs, work: Path) -> Retriever:
    """``--retriever`` (or a ``--hybrid``): bm25, an index of the data's corpus, or an embedding bundle."""
    if spec == "bm25":
        return BM25(data.docs)
    if (Path(spec) / "manifest.json").is_file():
        if data.ids is None:
            raise ConfigError(f"{spec} is an index: mining from one needs a BEIR directory, whose corpus ids "
                              "the index holds",
                              "give the BEIR directory the index was built from")
        return IndexRetriever(Path(spec), data.ids, device=args.device, precision=args.precision)
    return Dense(spec, data.docs, work, device=args.device, index=args.index, precision=args.precision)


Scorer = Callable[[Sequence[tuple[str, str]]], list[float]]


def _scorer(bundle: Path, device: str, precision: str | None = None) -> Scorer:
    """A cross-encoder bundle's raw logits of (query, document) pairs."""
    from mlmkit.runtime.pipeline import Pipeline

    pipe = Pipeline.load(bundle, device=device, command="classify", precision=precision)
    if len(pipe.meta.labels or ()) != 1:
        raise ConfigError(f"--score-with {bundle} is not a cross-encoder ({pipe.task}, "
                          f"{len(pipe.meta.labels or ())} labels)",
                          "give a rerank bundle, or a one-label sequence classifier's")
    def logit(r: Prediction) -> float:
        score: float = r["score"]  # read first, as ever: a result without one is an error, logit or not
        return float(r.get("logit", score))

    return lambda pairs: [logit(r) for r in pipe([{"text": q, "text_pair": d} for q, d in pairs])]


def _rescored(done: Done, scorer: Scorer) -> Done:
    """The rows' "scores" from the cross-encoder: its logit of the positive, then of each negative."""
    pairs = [(row["anchor"], row[k]) for row in done.results for k in _documents(row)]
    scores = iter(scorer(pairs))
    for row in done.results:
        row["scores"] = [next(scores) for _ in _documents(row)]
    return done


def _documents(row: JSONObject) -> list[str]:
    return ["positive", *numbered(row, "negative")]


def _mine_batch(batch: list[tuple[str, int]], retriever: Retriever, data: Pairs, args: MineArgs,
                window: tuple[int, int],
                need_pos: bool) -> Done:
    """The rows of one batch of (query, positive) pairs, and their tallies (negatives; short rows by
    reason)."""
    lo, hi = window
    queries = [q for q, _ in batch]
    known = [data.positives.get(q, set()) | {p} for q, p in batch]
    # ranks count the documents that are not positives: a query's positives are passed over, and searched past
    idx, scores = retriever.search(queries, hi + max(len(k) for k in known))
    pos_scores = retriever.pair_scores(queries, [p for _, p in batch]) if need_pos else None
    rows, counts = [], Counter[str]()
    for n, (query, pos) in enumerate(batch):
        # there whenever need_pos: each use below
        pos_score = float(pos_scores[n]) if pos_scores is not None else None
        ceiling = None
        if args.margin is not None and pos_score is not None:
            ceiling = pos_score - args.margin
        elif args.max_score_ratio is not None and pos_score is not None:
            ceiling = pos_score * args.max_score_ratio
        ranked = [(d, s) for d, s in zip(idx[n].tolist(), scores[n].tolist()) if d not in known[n]][lo:hi]
        got, why = _negatives(iter(ranked), data.docs, known[n], args.negatives, ceiling)
        if why:
            counts[f"short: {why}"] += 1
        row: JSONObject = {"anchor": query, "positive": data.docs[pos]}
        row.update({f"negative_{i}": data.docs[d] for i, (d, _) in enumerate(got, 1)})
        if args.with_scores:
            row["scores"] = [pos_score, *(float(s) for _, s in got)]
        rows.append(row)
        counts["negatives"] += len(got)
    return Done(rows, counts=dict(counts))
