"""Long documents cut into chunks of the model's own tokens (`mlmkit index --chunk-tokens N
--chunk-overlap M`, `mlmkit embed --chunk-tokens N`). No torch.

A document's text (its title before it, as an index embeds it) is tokenized by the bundle's own
tokenizer (no special tokens, no truncation) and cut into windows of at most N tokens that start and
end at word boundaries (a word of more than N tokens is the one thing cut inside), each window
starting M tokens before the last one ended (moved back to the start of a word). A chunk is the text
from its first token's first character to its last token's last, and keeps its document, its number
from 0 and that span. A document of N tokens or fewer is one chunk: its whole text. With
--chunk-sentences a window ends at the last sentence end (".", "!" or "?" closing a word) in its second
half where there is one, and the overlap starts at the first sentence start in it where there is one.

In an index (retrieval/index/) each chunk is a row whose id is its document's and its number, ``ID#K``
(SEPARATOR); a search ranks the documents by their best chunk and names it and its span. `mlmkit embed`
gives each text its chunks, each with its span and vector (the embedding task's chunk_tokens option).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from mlmkit.errors import ConfigError
from mlmkit.files import JSONObject

SEPARATOR = "#"
"""Between a document's id and its chunk's number in an index row's id: the last one in it."""


@dataclass(frozen=True)
class Chunking:
    """--chunk-tokens, --chunk-overlap and --chunk-sentences, checked: the manifest's ``chunks``."""

    tokens: int
    overlap: int
    sentences: bool = False

    @classmethod
    def of(cls, tokens: int | None, overlap: int | None, sentences: bool = False) -> Chunking | None:
        if tokens is None:
            if overlap is not None or sentences:
                raise ConfigError(f"{'--chunk-overlap' if overlap is not None else '--chunk-sentences'} goes "
                                  "with --chunk-tokens",
                                  "add --chunk-tokens N, or leave it out")
            return None
        overlap = tokens // 8 if overlap is None else overlap
        if tokens < 1:
            raise ConfigError(f"--chunk-tokens must be at least 1, got {tokens}")
        if not 0 <= overlap < tokens:
            raise ConfigError(f"--chunk-overlap {overlap} with --chunk-tokens {tokens}: the overlap must be "
                              "0 or more and "
                              "less than the chunk", f"e.g. --chunk-overlap {tokens // 8}")
        return cls(tokens, overlap, sentences)

    @classmethod
    def read(cls, field: Any) -> Chunking | None:
        """A manifest's ``chunks`` ({"tokens", "overlap"}, and "sentences" where true), or None."""
        return cls(int(field["tokens"]), int(field["overlap"]),
                   bool(field.get("sentences", False))) if field else None

    def manifest(self) -> JSONObject:
        return {"tokens": self.tokens, "overlap": self.overlap,
                **({"sentences": True} if self.sentences else {})}

    def describe(self) -> str:
        return (f"chunked at {self.tokens} tokens, {self.overlap} "
                f"overlapping{', at sentence ends' if self.sentences else ''}")


class Chunker:
    """``Chunking`` with a model's tokenizer (a ``tokenizers.Tokenizer``): a text's chunks as character
    spans. A chunk may have at most the model's ``max_length`` tokens less its special tokens and the
    ``prompt`` put before each text; ``model`` names it in that error."""

    def __init__(self, tokenizer: Any, max_length: int, chunking: Chunking, prompt: str = "",
                 model: str = "the model") -> None:
        self.chunking = chunking
        self.tokenizer = type(tokenizer).from_str(tokenizer.to_str())  # its own: settings changed freely
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        extra = len(self.tokenizer.encode("", add_special_tokens=True).ids)
        extra += len(self.tokenizer.encode(prompt, add_special_tokens=False).ids) if prompt else 0
        room = int(max_length) - extra
        if chunking.tokens > room:
            raise ConfigError(f"--chunk-tokens {chunking.tokens} is past what {model} reads of a text: "
                              f"{max_length} "
                              f"tokens, {extra} of them its special tokens{' and prompt' if prompt else ''}",
                              f"give --chunk-tokens {room} or less")

    def spans(self, text: str) -> list[tuple[int, int]]:
        """The chunks of ``text`` as (start, end) character offsets, in order."""
        n, m = self.chunking.tokens, self.chunking.overlap
        enc = self.tokenizer.encode(text, add_special_tokens=False)
        offsets, words = enc.offsets, enc.word_ids
        if len(offsets) <= n:
            return [(0, len(text))]

        def ends_sentence(b: int) -> bool:  # token b - 1 ends a sentence, and token b starts a word
            return text[offsets[b - 1][1] - 1] in ".!?" and (b >= len(words) or words[b] is None or words[b]
                                                             != words[b - 1])

        out, s = [], 0
        while True:
            e = min(s + n, len(offsets))
            if e < len(offsets):
                b = e
                while b > s and words[e] is not None and words[b - 1] == words[e]:
                    b -= 1  # back to the start of the word token e is in
                e = b if b > s + m else e  # a chunk keeps more than its overlap: else cut inside the word
                if self.chunking.sentences:  # the last sentence end in the window's second half, if any
                    e = next((b for b in range(e, s + max(1, (e - s) // 2), -1) if ends_sentence(b)), e)
            out.append((offsets[s][0], offsets[e - 1][1]))
            if e >= len(offsets):
                return out
            start = max(e - m, s + 1)
            if self.chunking.sentences and m:  # the overlap from the first sentence start in it, if any
                start = next((j for j in range(start, e) if ends_sentence(j)), start)
            b = start  # back to the start of the word the overlap begins in, if that word starts after s
            while b > s and words[b] is not None and words[b - 1] == words[b]:
                b -= 1
            s = b if b > s else start  # a word longer than a chunk is cut inside: chunks go on by n - m


def chunk_records(items: Iterable[Any], chunker: Chunker) -> Iterator[Any]:
    """Corpus records ({"id", "text"}, building.corpus_records) as their chunks' records: id ``ID#K``, the
    chunk's text."""
    for rec in items:
        data = rec.data if hasattr(rec, "data") else rec
        for k, (a, b) in enumerate(chunker.spans(data["text"])):
            chunk = {"id": f"{data['id']}{SEPARATOR}{k}", "text": data["text"][a:b]}
            yield replace(rec, data=chunk) if hasattr(rec, "data") else chunk


def document_id(row_id: str) -> str:
    """A chunk row's document id (``ID#K`` -> ``ID``)."""
    return row_id.rpartition(SEPARATOR)[0]
