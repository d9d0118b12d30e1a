"""The pool of processes that tokenizes a corpus's files into a token shard (each a run of the files,
joined in file order), and the progress of a tokenization in the log."""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

log = logging.getLogger("mlmkit")


def split_by_size(paths: Sequence[Path], workers: int) -> list[list[Path]]:
    """``paths`` in at most ``workers`` consecutive runs of about equal bytes."""
    if workers <= 1 or len(paths) <= 1:
        return [list(paths)]
    sizes = [max(1, p.stat().st_size) for p in paths]
    target = sum(sizes) / workers
    groups: list[list[Path]] = [[]]
    done = 0.0
    for p, n in zip(paths, sizes):
        if groups[-1] and done >= target * len(groups) and len(groups) < workers:
            groups.append([])
        groups[-1].append(p)
        done += n
    return groups


def _tokenizer_threads(threads: int) -> None:
    # the tokenizers library's thread pool reads these when it first starts, after this runs
    os.environ["RAYON_NUM_THREADS"] = os.environ["RAYON_RS_NUM_CPUS"] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true"


Tokenize = Callable[[Path, list[Path], Tokenizer, Any, int, str, None, "int | None"], dict[str, int]]
"""shards.tokenize_into: a run of files into one directory's tokens, sentences and documents."""


def _tokenize_part(tokenize: Tokenize, d: str, paths: list[str], tok_json: str, dtype: str, batch: int,
                   text_column: str, max_bytes: int | None) -> dict[str, int]:
    Path(d).mkdir()
    return tokenize(Path(d), [Path(p) for p in paths], Tokenizer.from_str(tok_json), np.dtype(dtype), batch,
                    text_column, None, max_bytes)


def tokenize_in_processes(tokenize: Tokenize, tmp: Path, groups: list[list[Path]], tok: Tokenizer, dtype: Any,
                          batch: int, text_column: str, max_bytes: int | None) -> dict[str, int]:
    """Each run of files tokenized by its own process (``tokenize``, a module-level function the
    processes import) into tmp/part-K, then joined in order: tokens copied, offsets shifted by what
    came before (a chunk at a time)."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    threads = max(1, (os.cpu_count() or 1) // len(groups))
    parts = [tmp / f"part-{k}" for k in range(len(groups))]
    with ProcessPoolExecutor(len(groups), mp_context=get_context("spawn"), initializer=_tokenizer_threads,
                             initargs=(threads,)) as pool:
        futures = [pool.submit(_tokenize_part, tokenize, str(d), [str(p) for p in g], tok.to_str(),
                               np.dtype(dtype).name, batch, text_column, max_bytes)
                   for d, g in zip(parts, groups)]
        counts = []
        for k, f in enumerate(futures):
            counts.append(f.result())
            log.info("tokenized part %d of %d (%s tokens)", k + 1, len(groups), f"{counts[-1]['tokens']:,}")
    total = {"tokens": 0, "sentences": 0, "documents": 0}
    with (open(tmp / "tokens.bin", "wb") as out, open(tmp / "sentences.bin", "wb") as sents,
          open(tmp / "documents.bin", "wb") as docs):
        np.zeros(1, np.int64).tofile(sents)
        np.zeros(1, np.int64).tofile(docs)
        for d, c in zip(parts, counts):
            with open(d / "tokens.bin", "rb") as part:
                shutil.copyfileobj(part, out, 1 << 24)
            for name, base, n, into in (("sentences.bin", total["tokens"], c["sentences"], sents),
                                        ("documents.bin", total["sentences"], c["documents"], docs)):
                offsets = np.memmap(d / name, dtype=np.int64, mode="r", shape=(n + 1,))
                for i in range(1, n + 1, 1 << 20):
                    (offsets[i : i + (1 << 20)] + base).tofile(into)
                del offsets
            for key in total:
                total[key] += c[key]
            shutil.rmtree(d)
    return total


class Progress:
    """Tokenization progress in the log every few seconds: MB read, MB/s, tokens/s, time left."""

    def __init__(self, total_bytes: int, compressed: bool, every: float = 10.0) -> None:
        self.total, self.compressed, self.every = total_bytes, compressed, every
        self.bytes = self.sentences = self.tokens = 0
        self.start = self.shown = time.monotonic()

    def update(self, n_bytes: int, n_sentences: int) -> None:
        self.bytes += n_bytes
        self.sentences += n_sentences
        now = time.monotonic()
        if now - self.shown >= self.every:
            self.shown = now
            log.info("tokenizing: %s", self.line(now))

    def line(self, now: float, eta: bool = True) -> str:
        dt = max(now - self.start, 1e-9)
        mb = self.bytes / 1e6
        text = f"{mb:,.0f} MB, {mb / dt:.1f} MB/s, {self.tokens / dt:,.0f} tokens/s"
        # text read against file sizes (a .gz file's is not comparable)
        if eta and not self.compressed and self.bytes:
            text += f", about {max(0.0, (self.total - self.bytes) / (self.bytes / dt)):.0f} s left"
        return text

    def done(self) -> None:
        if time.monotonic() - self.start >= self.every:
            log.info("tokenized: %s; %d sentences", self.line(time.monotonic(), eta=False), self.sentences)
