"""Pretraining data: read a corpus, tokenize it once into cached shards, build NSP instances.

Corpus format (DESIGN.md): UTF-8 text (.txt or .txt.gz), one sentence per line, a blank line between
documents; or JSONL with a "text" field, one document per line (its text split on newlines, or on
sentence ends when it has none).

NSP instances follow the original BERT recipe (create_pretraining_data.py): a target length
(shorter with probability 0.1), segment A from consecutive sentences, B the true continuation half
of the time and a span of another document otherwise, the longer side truncated. Two deviations:
a chunk of a single sentence borrows the next sentence when there is one (the previous one at the end
of a document), so IsNext stays near 50% (the original forces a random B for such chunks); and a
random B is as long as the true continuation would have been, not filled up to the target length, so
sequence length alone does not predict the label (with the original, short documents let a model
reach ~61% NSP accuracy from lengths alone).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import random
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from .errors import DataFormatError, MlmkitError
from .files import atomic_write, parse_json
from .masking import mask_tokens
from .tokenizer import SpecialIds, continuation_flags, special_ids

log = logging.getLogger("mlmkit")
_SENT_END = re.compile(r"(?<=[.!?])\s+")


def _open_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) for each line of a .txt/.txt.gz/.jsonl file; bad UTF-8 names the line, a
    damaged .gz file the file and the line it broke at."""
    raw = gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
    n = 0
    try:
        with raw as f:
            for n, b in enumerate(f, start=1):
                try:
                    yield n, b.decode("utf-8").rstrip("\r\n")
                except UnicodeDecodeError as e:
                    raise DataFormatError(
                        path, f"bytes that are not UTF-8 at column {e.start + 1}", line=n, hint="re-encode the file as UTF-8"
                    ) from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        what = "ends early: the file is truncated" if isinstance(e, EOFError) else f"is not valid gzip data ({e})"
        raise DataFormatError(path, f"the compressed stream {what}", line=n + 1 if n else None,
                              hint="re-create the .gz file, or give the uncompressed text") from None


def iter_documents(path: str | Path) -> Iterator[list[str]]:
    """Yield each document of a corpus file as its list of sentences."""
    p = _corpus_file(path)
    is_jsonl = p.name.endswith((".jsonl", ".jsonl.gz"))
    doc: list[str] = []
    for n, line in _open_lines(p):
        if is_jsonl:
            if not line.strip():
                continue
            try:
                rec = parse_json(line)
                text = rec["text"]
            except json.JSONDecodeError as e:
                raise DataFormatError(p, f"malformed JSON ({e.msg})", line=n, hint="one JSON object per line") from None
            except (KeyError, TypeError):
                raise DataFormatError(p, "missing", line=n, field="text", hint='each line needs {"text": ...}') from None
            if not isinstance(text, str):
                raise DataFormatError(p, "must be a string", line=n, field="text")
            parts = [s.strip() for s in (text.splitlines() if "\n" in text else _SENT_END.split(text))]
            parts = [s for s in parts if s]
            if parts:
                yield parts
        elif line.strip():
            doc.append(line.strip())
        elif doc:
            yield doc
            doc = []
    if doc:
        yield doc


def _corpus_file(path: str | Path) -> Path:
    p = Path(path)
    if p.is_dir():
        raise MlmkitError(f"{p} is a directory, not a corpus file", "give the text files in it")
    if not p.is_file():
        raise MlmkitError(f"corpus file not found: {p}", "check the path")
    return p


def iter_sentences(paths: Sequence[str | Path]) -> Iterator[str]:
    for p in paths:
        for doc in iter_documents(p):
            yield from doc


@dataclass
class TokenizedCorpus:
    """All sentences' token ids concatenated; offsets delimit sentences and documents."""

    tokens: np.ndarray  # (N,) int32
    sent_offsets: np.ndarray  # (S+1,) int64 into tokens
    doc_offsets: np.ndarray  # (D+1,) int64 into sentences

    @property
    def num_docs(self) -> int:
        return len(self.doc_offsets) - 1

    def document(self, d: int) -> list[np.ndarray]:
        s0, s1 = self.doc_offsets[d], self.doc_offsets[d + 1]
        return [self.tokens[self.sent_offsets[s] : self.sent_offsets[s + 1]] for s in range(s0, s1)]


def file_identity(paths: Sequence[str | Path]) -> list[list[Any]]:
    """[absolute path, size] of each file: what a resumed run must find unchanged."""
    return [[str(Path(p).resolve()), Path(p).stat().st_size if Path(p).is_file() else None] for p in paths]


def _cache_key(paths: Sequence[Path], tok: Tokenizer) -> str:
    h = hashlib.sha256(tok.to_str().encode())
    for p in paths:
        st = p.stat()
        h.update(f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:20]


def default_cache_dir() -> Path:
    return Path(os.environ.get("MLMKIT_CACHE", Path.home() / ".cache" / "mlmkit")) / "corpus"


def tokenize_corpus(
    paths: Sequence[str | Path], tok: Tokenizer, cache_dir: str | Path | None = None, batch: int = 1024
) -> TokenizedCorpus:
    """Tokenize every sentence once; reuse the cached shard when the files and tokenizer are unchanged."""
    ps = [_corpus_file(p) for p in paths]
    shard = Path(cache_dir or default_cache_dir()) / f"{_cache_key(ps, tok)}.npz"
    if shard.exists():
        try:
            z = np.load(shard)
            return TokenizedCorpus(z["tokens"], z["sent_offsets"], z["doc_offsets"])
        except Exception:
            shard.unlink(missing_ok=True)  # a damaged cache is rebuilt, never trusted
    chunks: list[np.ndarray] = []
    sent_lens: list[int] = []
    doc_sizes: list[int] = []
    pending: list[str] = []

    def flush() -> None:
        short = [s for s in pending if len(s) <= LONG_LINE]
        encoded = iter(tok.encode_batch(short, add_special_tokens=False))
        for s in pending:  # a very long line is encoded in pieces, never whole (bounded memory)
            ids = next(encoded).ids if len(s) <= LONG_LINE else [i for piece in _pieces(s) for i in
                                                                 tok.encode(piece, add_special_tokens=False).ids]
            chunks.append(np.asarray(ids, dtype=np.int32))
            sent_lens.append(len(ids))
        pending.clear()

    for p in ps:
        for doc in iter_documents(p):
            doc_sizes.append(len(doc))
            pending.extend(doc)
            if len(pending) >= batch:
                flush()
    flush()
    if not sent_lens or sum(sent_lens) == 0:
        raise MlmkitError(
            f"the corpus {', '.join(map(str, ps))} is empty", "give text files with one sentence per line"
        )
    corpus = TokenizedCorpus(
        tokens=np.concatenate(chunks) if chunks else np.zeros(0, np.int32),
        sent_offsets=np.concatenate([[0], np.cumsum(sent_lens)]).astype(np.int64),
        doc_offsets=np.concatenate([[0], np.cumsum(doc_sizes)]).astype(np.int64),
    )
    shard.parent.mkdir(parents=True, exist_ok=True)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            np.savez(f, **corpus.__dict__)

    atomic_write(shard, write)
    return corpus


LONG_LINE = 100_000  # characters: a longer line is tokenized in pieces


def _pieces(text: str, size: int = LONG_LINE) -> Iterator[str]:
    """``text`` in pieces of about ``size`` characters cut at whitespace (where tokenization splits
    anyway, so the pieces' tokens are the whole's); a run without whitespace is cut where it must be."""
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            cut = text.rfind(" ", start + size // 2, end)
            end = cut + 1 if cut > 0 else end
        yield text[start:end]
        start = end


@dataclass
class Instance:
    a: np.ndarray
    b: np.ndarray | None
    is_next: int  # 0 = IsNext (B follows A), 1 = NotNext, as transformers' next_sentence_label


def _truncate_pair(a: list[int], b: list[int], max_tokens: int, rng: random.Random) -> None:
    """Trim the longer side one token at a time, from the front or the back at random (BERT
    truncate_seq_pair). The draws are made first and the cuts once, so a pair of n tokens costs O(n),
    not O(n^2) of deleting from the front of a list."""
    la, lb = len(a), len(b)
    cut = {"a": [0, 0], "b": [0, 0]}  # tokens to drop from the front, from the back
    while la + lb > max_tokens:
        side = "a" if la > lb else "b"
        cut[side][0 if rng.random() < 0.5 else 1] += 1
        if side == "a":
            la -= 1
        else:
            lb -= 1
    for seq, (front, back) in ((a, cut["a"]), (b, cut["b"])):
        del seq[len(seq) - back :]
        del seq[:front]


def _random_b(doc: list[np.ndarray], want: int, rng: random.Random, tries: int = 4) -> list[int]:
    """Consecutive sentences of ``doc`` about ``want`` tokens long: the span nearest that length
    among a few random starts, so the length of a random B tells nothing about IsNext."""
    best: list[int] = []
    for _ in range(tries):
        span: list[int] = []
        for s in doc[rng.randrange(len(doc)) :]:
            if span and abs(len(span) + len(s) - want) >= abs(len(span) - want):
                break
            span.extend(s.tolist())
        if not best or abs(len(span) - want) < abs(len(best) - want):
            best = span
    return best


def nsp_instances(
    corpus: TokenizedCorpus, max_len: int, rng: random.Random, short_seq_prob: float = 0.1
) -> list[Instance]:
    """One pass of NSP instances over every document, as BERT's create_instances_from_document."""
    if corpus.num_docs < 2:
        raise MlmkitError(
            "next-sentence prediction needs at least 2 documents (blank lines separate them)",
            "add blank lines between documents, or pass --no-nsp",
        )
    max_tokens = max_len - 3  # [CLS] A [SEP] B [SEP]
    out: list[Instance] = []
    for d in range(corpus.num_docs):
        doc = corpus.document(d)
        target = rng.randint(2, max_tokens) if rng.random() < short_seq_prob else max_tokens
        chunk: list[np.ndarray] = []
        length, i = 0, 0
        while i < len(doc):
            chunk.append(doc[i])
            length += len(doc[i])
            if i == len(doc) - 1 or length >= target:
                borrowed_prev = False
                if len(chunk) == 1 and i + 1 < len(doc):  # borrow the next sentence (see module doc)
                    i += 1
                    chunk.append(doc[i])
                elif len(chunk) == 1 and i > 0:  # the last sentence alone: borrow the previous one
                    chunk.insert(0, doc[i - 1])
                    borrowed_prev = True
                a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                a = [t for s in chunk[:a_end] for t in s.tolist()]
                if len(chunk) == 1 or rng.random() < 0.5:
                    is_next = 1
                    other = d
                    for _ in range(10):
                        other = rng.randrange(corpus.num_docs)
                        if other != d:
                            break
                    if other == d:
                        other = (d + 1) % corpus.num_docs
                    odoc = corpus.document(other)
                    b = _random_b(odoc, sum(map(len, chunk[a_end:])) or target - len(a), rng)
                    if not borrowed_prev:  # the unused sentences are read again
                        i -= len(chunk) - a_end
                else:
                    is_next = 0
                    b = [t for s in chunk[a_end:] for t in s.tolist()]
                _truncate_pair(a, b, max_tokens, rng)
                if a and b:
                    out.append(Instance(np.asarray(a, np.int32), np.asarray(b, np.int32), is_next))
                chunk, length = [], 0
            i += 1
    return out


def packed_instances(corpus: TokenizedCorpus, max_len: int) -> list[Instance]:
    """--no-nsp: consecutive sentences of a document packed up to max_len - 2 tokens."""
    cap = max_len - 2
    out: list[Instance] = []
    for d in range(corpus.num_docs):
        cur: list[int] = []
        for s in corpus.document(d):
            s = s.tolist()
            if cur and len(cur) + len(s) > cap:
                out.append(Instance(np.asarray(cur, np.int32), None, 0))
                cur = []
            whole = len(s) - len(s) % cap if len(s) > cap else 0
            for k in range(0, whole, cap):  # a sentence longer than the window is split
                out.append(Instance(np.asarray(s[k : k + cap], np.int32), None, 0))
            cur.extend(s[whole:])
        if cur:
            out.append(Instance(np.asarray(cur, np.int32), None, 0))
    return out


class PretrainData:
    """The training loop's data source for pretraining: deterministic per (seed, epoch, step).

    Instances are rebuilt per epoch from a seeded RNG (new NSP pairings each epoch) and masks are
    drawn per step from a generator seeded with (seed, step, rank), so resuming at step k needs no
    saved data state and no replay: the loop asks for batch k directly.
    """

    def __init__(
        self,
        corpus: TokenizedCorpus,
        tok: Tokenizer,
        *,
        max_len: int = 128,
        batch_size: int = 32,
        nsp: bool = True,
        mask_prob: float = 0.15,
        whole_word: bool = False,
        seed: int = 0,
    ) -> None:
        if max_len < 8:
            raise MlmkitError(f"--seq-len {max_len} is too short", "use at least 8")
        self.corpus, self.max_len, self.batch_size, self.nsp = corpus, max_len, batch_size, nsp
        self.mask_prob, self.whole_word, self.seed = mask_prob, whole_word, seed
        self.ids: SpecialIds = special_ids(tok)
        self.vocab_size = tok.get_vocab_size()
        self.special = torch.tensor(self.ids.all, dtype=torch.long)
        self.continuation = torch.tensor(continuation_flags(tok), dtype=torch.bool)
        self._epoch: int | None = None
        self._instances: list[Instance] = []
        self._warned = False

    def instances(self, epoch: int) -> list[Instance]:
        if self._epoch != epoch:
            rng = random.Random(self.seed * 1_000_003 + epoch)
            if self.nsp:
                inst = nsp_instances(self.corpus, self.max_len, rng)
            else:
                inst = packed_instances(self.corpus, self.max_len)
            rng.shuffle(inst)
            if not inst:
                raise MlmkitError("the corpus yields no training sequences", "give it more text")
            if self.batch_size > len(inst) and not self._warned:
                log.warning("--batch-size %d is more than the %d sequences of the corpus: each batch holds %d",
                            self.batch_size, len(inst), len(inst))
                self._warned = True
            self._epoch, self._instances = epoch, inst
        return self._instances

    def num_batches(self, epoch: int) -> int:
        return max(1, len(self.instances(epoch)) // self.batch_size)

    def batch(self, epoch: int, index: int, seed: int) -> dict[str, torch.Tensor]:
        inst = self.instances(epoch)
        start = (index * self.batch_size) % len(inst)
        chosen = [inst[(start + j) % len(inst)] for j in range(min(self.batch_size, len(inst)))]  # never a repeat
        return self.collate(chosen, torch.Generator().manual_seed(seed))

    def collate(self, chosen: Sequence[Instance], gen: torch.Generator) -> dict[str, torch.Tensor]:
        """[CLS] A [SEP] (B [SEP]), padded to the longest in the batch, then masked."""
        rows, segs = [], []
        for x in chosen:
            ids = [self.ids.cls, *x.a.tolist(), self.ids.sep]
            seg = [0] * len(ids)
            if x.b is not None:
                ids += [*x.b.tolist(), self.ids.sep]
                seg += [1] * (len(x.b) + 1)
            rows.append(ids)
            segs.append(seg)
        T = max(map(len, rows))
        input_ids = torch.full((len(rows), T), self.ids.pad, dtype=torch.long)
        token_type_ids = torch.zeros_like(input_ids)
        attention_mask = torch.zeros_like(input_ids)
        for r, (ids, seg) in enumerate(zip(rows, segs)):
            input_ids[r, : len(ids)] = torch.tensor(ids)
            token_type_ids[r, : len(ids)] = torch.tensor(seg)
            attention_mask[r, : len(ids)] = 1
        masked, labels = mask_tokens(
            input_ids,
            mask_id=self.ids.mask,
            special_ids=self.special,
            vocab_size=self.vocab_size,
            mask_prob=self.mask_prob,
            generator=gen,
            continuation=self.continuation,
            whole_word=self.whole_word,
        )
        out = {"input_ids": masked, "attention_mask": attention_mask, "token_type_ids": token_type_ids, "labels": labels}
        if self.nsp:
            out["next_sentence_label"] = torch.tensor([x.is_next for x in chosen], dtype=torch.long)
        return out
