"""The fill-mask task's evaluation rows checked against the model's tokenizer, before any model runs.

A [MASK] predicts one token, so each labelled row must have at least one [MASK], one answer per
[MASK] (in the order of the text, then the pair's), and answers that some single token of the
tokenizer reads as (the way evaluation compares them: as the token decodes, "##" pieces without it,
case aside). A row that breaks one of these could only ever be scored as a miss: it is refused in one
line naming its file, line and field. No torch: the runtime's tokenizer checks bundles' data the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from mlmkit.taskkit import MASK, DataFormatError, Example, tokenizer_settings

ONE_ANSWER = 'e.g. {"text": "The capital of France is [MASK].", "answer": "paris"}'


def mask_count(text: str | None, mask: str) -> int:
    """The [MASK]s of ``text``: "[MASK]" and the model's own mask token (RoBERTa's <mask>) alike."""
    if not text:
        return 0
    return text.count(mask) + (text.count(MASK) if mask != MASK else 0)


def answer_slots(example: Example, mask: str) -> tuple[int, int]:
    """How many answers belong to the text's [MASK]s and how many to the pair's."""
    return mask_count(example["text"], mask), mask_count(example.get("text_pair"), mask)


def normal(token: str) -> str:
    """A token or answer as evaluation compares it (compute_metrics): "##" dropped, lower case."""
    return token.strip().removeprefix("##").lower()


def _quoted(answer: str, most: int = 40) -> str:
    """An answer for a one-line message: cut to ``most`` characters, quoted, newlines escaped."""
    return repr(answer if len(answer) <= most else answer[:most] + "...")


class _Tokens:
    """Whether answers can be a [MASK]'s candidate: what one token of ``tokenizer`` decodes to."""

    def __init__(self, tokenizer: Any, answers: Iterable[str]) -> None:
        self.tokenizer = tokenizer
        distinct = sorted(set(answers))
        # as words of running text (a byte-level BPE's leading space), without [CLS] / [SEP]
        with tokenizer_settings(tokenizer, words=True) as tok:
            encs = tok.encode_batch([[a] for a in distinct], is_pretokenized=True,
                                    add_special_tokens=False) if distinct else []
        self.ids = {a: list(e.ids) for a, e in zip(distinct, encs)}
        self._vocabulary: set[str] | None = None

    def _decoded(self, ids: Sequence[int]) -> list[str]:
        return [normal(t) for t in self.tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)]

    def vocabulary(self) -> set[str]:
        """Every token of the tokenizer as evaluation compares it (decoded once, on first need)."""
        if self._vocabulary is None:
            size = self.tokenizer.get_vocab_size(with_added_tokens=True)
            self._vocabulary = set(self._decoded(range(size)))
        return self._vocabulary

    def problem(self, answer: str) -> tuple[str, str] | None:
        """None for an answer one token can be; else what is wrong with it and how to fix it."""
        ids = self.ids[answer]
        if len(ids) == 1 and self._decoded(ids)[0] == normal(answer):
            return None
        if normal(answer) in self.vocabulary():  # a word piece, or a case the tokenizer writes otherwise
            return None
        drop = "or drop the row"
        if len(ids) > 1:
            return (f"answer {_quoted(answer)} is {len(ids)} tokens for the tokenizer, and a [MASK] predicts "
                    "one token", f"use a one-token answer, {drop}")
        read = self.tokenizer.decode(ids, skip_special_tokens=False).strip() if ids else ""
        return (f"answer {_quoted(answer)} is no token of the tokenizer (it reads it as {_quoted(read)}), so "
                "no candidate can match it", f"write the answer as the tokenizer does, {drop}")


def check_answers(examples: Sequence[Example], tokenizer: Any, mask: str) -> None:
    """Refuse the first labelled example (one with an "answer") that could only be scored as a miss:
    no [MASK], as many answers as [MASK]s, every answer one token (DataFormatError: file, line, field)."""
    labelled = [ex for ex in examples if ex.get("answer") is not None]
    if not labelled:
        return
    tokens = _Tokens(tokenizer, (a for ex in labelled for a in ex["answer"]))
    for ex in labelled:
        def fail(message: str, field: str, hint: str, ex: Example = ex) -> DataFormatError:
            return DataFormatError(ex.get("source", "<input>"), message, line=ex.get("line"), field=field,
                                   hint=hint, unit=ex.get("unit", "line"))

        masks, answers = sum(answer_slots(ex, mask)), ex["answer"]
        where = "the text and its pair" if ex.get("text_pair") is not None else "the text"
        if not masks:
            raise fail(f"no [MASK] in {where}, so there is nothing to score its answer on", "text",
                       f"write [MASK] where the answer goes, or drop the row; {ONE_ANSWER}")
        if masks != len(answers):
            raise fail(f"{len(answers)} answer{'s' * (len(answers) != 1)} for {masks} [MASK]"
                       f"{'s' * (masks != 1)} in {where}", "answer",
                       "give one answer per [MASK], in the order of the text: a list for several")
        for n, a in enumerate(answers):
            why = tokens.problem(a)
            if why is not None:
                which = f"answer {n + 1} of {len(answers)}: " if len(answers) > 1 else ""
                raise fail(which + why[0], "answer", why[1])
