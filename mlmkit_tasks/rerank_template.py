"""The rerank task's pairs written as one text (``template``) and its answer tokens (``answer_tokens``):
a causal LM that judges a pair by answering yes or no, scored as a one-label cross-encoder. Why it is
built so, and what it reads of a checkpoint, is mlmkit_tasks/rerank.py's module docstring. No torch.

- ``parse_template``: the ``template`` option checked ({query} and {document} once each,
  {instruction} any number of times, ``{{`` and ``}}`` for braces);
- ``write_pairs``: each (query, document) written into the template and tokenized as one text (the
  tokenizer's own special tokens around it), cut to the max length: the document's last tokens go
  first, then what stands between the template's fixed prefix and the document, then what follows the
  document up to the fixed suffix; the fixed prefix (the text before the first placeholder) and the
  fixed suffix (the text after the last) are kept whole;
- ``answer_ids``: the ids of the ``answer_tokens`` (TRUE,FALSE) in the model's tokenizer;
- ``judge_reading``: what ``from_hf`` reads off a causal-LM checkpoint whose tokenizer has the tokens
  "yes" and "no": those answer tokens, and the chat-format judge template (``JUDGE_TEMPLATE``) where it
  has the chat tokens too.
"""

from __future__ import annotations

import functools
import string
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from mlmkit.taskkit import (
    CheckpointInfo,
    ConfigError,
    MlmkitError,
    Options,
    clip_text,
    load_tokenizer,
    tokenizer_settings,
)

if TYPE_CHECKING:  # the config type is torch's side (models/)
    from mlmkit.model import ModelConfig

FIELDS = ("query", "document", "instruction")
TEMPLATE_HINT = ("write the pair with {query}, {document} and optionally {instruction}; double a brace ({{ "
                 "}}) to write one")
JUDGE_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    "Instruct provided. "
    'Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
    "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
"""The chat-format yes/no judge's template (the prompt Qwen3-Reranker was trained on): the system
message, the user turn with the instruction, query and document, and an empty thinking block before
the answer; braces escaped for ``str.format``."""
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
JUDGE_ANSWERS = ("yes", "no")
CHAT_TOKENS = ("<|im_start|>", "<|im_end|>")


# ---- the template ------------------------------------------------------------------------------
@functools.lru_cache(maxsize=32)
def parse_template(text: str) -> tuple[tuple[str, str | None], ...]:
    """``text`` as (literal, placeholder) pairs (the last placeholder None where text follows the last
    one), or ConfigError for a template that is not one of a pair."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as e:
        raise ConfigError(f"task option template is not a template: {e}", TEMPLATE_HINT) from None
    for _, name, spec, conversion in parsed:
        if name is not None and (name not in FIELDS or spec or conversion):
            shown = "{" + name + ("!" + conversion if conversion else "") + (":" + spec if spec else "") + "}"
            raise ConfigError(f"task option template has {shown}; its placeholders are {{query}}, "
                              f"{{document}} and "
                              "{instruction}", TEMPLATE_HINT)
    names = [name for _, name, _, _ in parsed]
    for needed in ("query", "document"):
        if names.count(needed) != 1:
            raise ConfigError(f"task option template must hold {{{needed}}} once, it holds it "
                              f"{names.count(needed)} times",
                              TEMPLATE_HINT)
    return tuple((literal, name) for literal, name, _, _ in parsed)


class Written(NamedTuple):
    """A pair written into the template: the text, where its fixed prefix ends (``prefix``), where the
    document ends (``document_end``) and where the fixed suffix starts (``suffix``), in characters."""

    text: str
    prefix: int
    document_end: int
    suffix: int


def write(parts: tuple[tuple[str, str | None], ...], values: Mapping[str, str]) -> Written:
    """The template's ``parts`` (parse_template) with ``values`` put in."""
    text, document_end = "", 0
    for literal, name in parts:
        text += literal
        if name is not None:
            text += values[name]
            if name == "document":
                document_end = len(text)
    prefix = len(parts[0][0])
    tail = parts[-1][0] if parts[-1][1] is None else ""
    return Written(text, prefix, document_end, len(text) - len(tail))


class Encoded(NamedTuple):
    """One pair's model input: its token ids and type ids, and whether it was cut to the max length."""

    ids: list[int]
    type_ids: list[int]
    truncated: bool


def write_pairs(pairs: list[tuple[str, str]], tokenizer: Any, template: str, instruction: str,
                max_length: int) -> list[Encoded]:
    """Each (query, document) written into ``template`` and tokenized as one text with the tokenizer's
    special tokens, cut to ``max_length`` tokens as the module docstring says."""
    parts = parse_template(template)
    written = [write(parts, {"query": clip_text(q, tokenizer, max_length),
                             "document": clip_text(d, tokenizer, max_length),
                             "instruction": instruction}) for q, d in pairs]
    with tokenizer_settings(tokenizer) as tok:
        encodings = tok.encode_batch([w.text for w in written]) if written else []
    out = []
    for w, enc in zip(written, encodings):
        over = len(enc.ids) - max_length
        if over <= 0:
            out.append(Encoded(list(enc.ids), list(enc.type_ids), False))
            continue
        drop = _cut(enc.offsets, enc.special_tokens_mask, w, over, max_length)
        keep = [i for i in range(len(enc.ids)) if i not in drop]
        out.append(Encoded([enc.ids[i] for i in keep], [enc.type_ids[i] for i in keep], True))
    return out


def _cut(offsets: list[tuple[int, int]], special: list[int], w: Written, over: int,
         max_length: int) -> set[int]:
    """The indices of the ``over`` tokens a written pair loses: of the tokens between the fixed prefix
    and the fixed suffix (none the tokenizer added), the last ones up to the document's end, then the
    last ones after it; ConfigError where they are too few (the template's fixed text fills the max
    length)."""
    free = [i for i, ((a, b), s) in enumerate(zip(offsets, special)) if not s and a >= w.prefix and b
            <= w.suffix]
    before = [i for i in free if offsets[i][1] <= w.document_end]
    after = [i for i in free if offsets[i][1] > w.document_end]
    drop = before[len(before) - min(over, len(before)):]
    rest = over - len(drop)
    drop += after[len(after) - min(rest, len(after)):]
    if len(drop) < over:
        raise ConfigError("the rerank template's fixed text and instruction take more than the max length "
                          f"of {max_length} "
                          "tokens, with no room for a query or document",
                          "give a larger --max-length, or a shorter template or instruction")
    return set(drop)


# ---- the answer tokens -------------------------------------------------------------------------
def answer_tokens(options: Mapping[str, Any]) -> tuple[str, str] | None:
    """The ``answer_tokens`` option as (TRUE, FALSE), None where it is empty; ConfigError for a value
    that is not two different tokens."""
    value = str(options.get("answer_tokens") or "")
    if not value:
        return None
    names = value.split(",")
    if len(names) != 2 or not all(names) or names[0] == names[1]:
        raise ConfigError("task option answer_tokens must be two different tokens, TRUE,FALSE, got "
                          f"{value!r}",
                          "for example --option answer_tokens=yes,no (as the tokenizer's vocabulary spells "
                          "them)")
    return names[0], names[1]


def answer_ids(options: Mapping[str, Any], tokenizer: Any) -> tuple[int, int] | None:
    """The ids of the answer tokens in ``tokenizer`` (None without answer tokens, or without a tokenizer
    to read them from); ConfigError for one its vocabulary does not have."""
    names = answer_tokens(options)
    if names is None or tokenizer is None:
        return None
    ids = [tokenizer.token_to_id(t) for t in names]
    for name, i in zip(names, ids):
        if i is None:
            raise ConfigError(f"task option answer_tokens: {name!r} is not a token of the model's tokenizer",
                              "name two single tokens as its vocabulary (tokenizer.json) spells them")
    return ids[0], ids[1]


def judge_reading(config: ModelConfig, directory: Path) -> CheckpointInfo | None:
    """A causal LM (architectures *ForCausalLM, not a sentence-transformers directory) of a family whose
    sequence head reads the last token, whose tokenizer has the single tokens "yes" and "no": a yes/no
    judge, read as a reranker (the chat-format judge template where the tokenizer has the chat tokens);
    None for any other checkpoint."""
    causal = any(isinstance(a, str) and a.endswith("ForCausalLM") for a in config.architectures or [])
    if not causal or (directory / "modules.json").is_file() or config.family.sequence_pool(config) != "last":
        return None
    try:
        tok = load_tokenizer(directory)
    except MlmkitError:
        return None
    if any(tok.token_to_id(t) is None for t in JUDGE_ANSWERS):
        return None
    options: Options = {"answer_tokens": ",".join(JUDGE_ANSWERS)}
    if all(tok.token_to_id(t) is not None for t in CHAT_TOKENS):
        options["template"] = JUDGE_TEMPLATE
    return {"labels": ["score"], "options": options}
