"""The embedding task's chunks: an input's text cut at word boundaries into features of the model's
length (``chunk_tokens``), each with its span."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mlmkit.taskkit import (
    EXAMPLE,
    Chunker,
    Chunking,
    Example,
    Feature,
    TaskContext,
    TaskError,
    tokenizer_settings,
)
from mlmkit_tasks.embedding_data import prompt_for

CHUNK = "chunk_span"
"""A feature of a chunk (chunk_tokens): its (start, end) characters in its input's text."""


def chunking_of(options: Mapping[str, Any]) -> Chunking | None:
    """The chunk_* options, checked (a subclass's options may lack them: no chunks)."""
    tokens, overlap = int(options.get("chunk_tokens", 0) or 0), int(options.get("chunk_overlap", -1))
    return Chunking.of(tokens or None, None if overlap < 0 else overlap,
                       bool(options.get("chunk_sentences", False)))


def chunk_features(examples: list[Example], tokenizer: Any, ctx: TaskContext) -> list[Feature]:
    """A feature per chunk of each input's text (text.chunks: at word boundaries, within the model's
    length with its special tokens and the input's prompt), with its span."""
    chunking = chunking_of(ctx.options)
    assert chunking is not None
    chunkers: dict[str, Chunker] = {}
    texts: list[tuple[int, tuple[int, int], str]] = []
    for i, ex in enumerate(examples):
        if ex.get("text_pair") is not None or "anchor" in ex or "kind" in ex:
            raise TaskError("chunk_tokens chunks the inputs of embed and predict, not pairs, training rows "
                            "or evaluation data", "evaluate chunked retrieval through an index: mlmkit index "
                            "BUNDLE --corpus C --out IX --chunk-tokens N, then mlmkit evaluate IX --data D")
        prompt = prompt_for(ex, 0, ctx.options)
        if prompt not in chunkers:
            chunkers[prompt] = Chunker(tokenizer, ctx.max_length, chunking, prompt)
        text = ex["text"]
        texts += [(i, (a, b), prompt + text[a:b]) for a, b in chunkers[prompt].spans(text)]
    with tokenizer_settings(tokenizer, max_length=ctx.max_length) as tok:
        encodings = tok.encode_batch([t for _, _, t in texts]) if texts else []
    return [{"input_ids": enc.ids, "token_type_ids": enc.type_ids, EXAMPLE: i, "part": 0, CHUNK: span}
            for (i, span, _), enc in zip(texts, encodings)]
