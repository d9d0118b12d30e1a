"""Token tagging (named entities, chunks): a linear head on every token, entity-level metrics.

Data: CoNLL (one token per line, the tag in the last column, a blank line between sentences,
-DOCSTART- lines skipped) or JSONL {"tokens": [...], "tags": [...]}; tags are "O" or PREFIX-TYPE
with the prefixes of IOB1, IOB2 or BIOES.

Words become sub-tokens through the tokenizer's pre-tokenized encoding. The first sub-token of a
word carries its label, the rest -100 (option label_all_tokens: every sub-token carries the
word's label, so average / max aggregation see trained positions). A sentence longer than the max
length is cut into overlapping windows on word boundaries and merged back: each word is read
from the window where it sits farthest from a cut edge. Nothing is truncated.

Entities come from one chunk decoder, ``chunks``, shared by the predictions and the metrics:
conlleval's rules (the CoNLL-2000 evaluation script) as seqeval's default mode extends them to
BIOES, which read IOB1, IOB2 and BIOES alike, so an explicit ``scheme`` only refuses data whose
prefixes it lacks (tagging_schemes.py says how, and how ``detect_scheme`` names a scheme).

This module holds the task itself and its readers (CoNLL, JSONL); the tag schemes, chunk decoder
and entity scores are tagging_schemes.py's, the words, windows and sub-tokens tagging_words.py's.
Their public names are importable from here too.

The model is transformers' BertForTokenClassification under the same parameter names (bert.*
without pooler, classifier.*). No torch at module level: the ONNX runtime imports this file.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mlmkit.taskkit import (
    BATCH,
    EXAMPLE,
    LABEL,
    MAX_RECORD_BYTES,
    SEQUENCE,
    CheckpointInfo,
    ConfigError,
    DataFormatError,
    Example,
    Feature,
    Input,
    Metrics,
    Prediction,
    TaskContext,
    TaskOption,
    is_table,
    iter_jsonl,
    iter_lines,
    special_ids,
    tokenizer_settings,
)
from mlmkit_tasks.tagging_schemes import PREFIXES, SCHEMES, chunks, detect_scheme, entity_scores, split_tag
from mlmkit_tasks.tagging_words import (
    SPACE_PIECES,
    joined_offsets,
    split_words,
    windows,
    word_distributions,
    word_pieces,
)

if TYPE_CHECKING:  # the config type is torch's side (models/); a task imports torch in build_model only
    from mlmkit.model import ModelConfig

__all__ = [  # the schemes' and words' public names are importable from here too, as before
    "AGGREGATIONS", "IGNORE", "JSONL_SUFFIXES", "PREFIXES", "SCHEMES", "SPACE_PIECES", "TaggingTask",
    "chunks",
    "detect_scheme", "entity_scores", "joined_offsets", "split_tag", "split_words", "task", "windows",
]

AGGREGATIONS = ("first", "average", "max")
JSONL_SUFFIXES = (".jsonl", ".json")
IGNORE = -100  # label of positions without a target (cross-entropy's ignore_index)


# ---- reading -----------------------------------------------------------------------------------
def _check_tag(tag: Any, scheme: str, path: Path, line: int | None, field: str, unit: str = "line") -> str:
    """``tag``, checked against ``scheme``; a bad one is an error naming its ``line`` (a table's row:
    ``unit``)."""
    if not isinstance(tag, str):
        raise DataFormatError(path, f"a tag must be a string, not {type(tag).__name__}", line=line,
                              field=field, unit=unit)
    prefix, kind = split_tag(tag)
    allowed = PREFIXES[scheme]
    if tag != "O" and (len(prefix) != 1 or prefix not in "BIES" or not kind):
        raise DataFormatError(
            path, f"tag '{tag}' is not 'O' or PREFIX-TYPE", line=line, field=field, unit=unit,
            hint="use IOB1, IOB2 or BIOES tags such as B-PER, I-PER, O",
        )
    if tag != "O" and prefix not in allowed:
        raise DataFormatError(
            path,
            f"tag '{tag}' has a prefix that {scheme.upper()} lacks (it uses {', '.join(allowed)} and O)",
            line=line, field=field, unit=unit, hint="pass --scheme bioes, or leave the scheme on auto",
        )
    return tag


def _read_conll(path: Path, scheme: str, max_bytes: int | None) -> list[Example]:
    examples: list[Example] = []
    tokens: list[str] = []
    tags: list[str] = []
    first = 0

    def flush() -> None:
        if tokens:
            examples.append({"tokens": list(tokens), "tags": list(tags), "line": first, "source": str(path),
                             "format": "conll"})
            tokens.clear()
            tags.clear()

    for n, raw in iter_lines(path, max_bytes):
        cols = [c for c in re.split(r"[ \t]+", raw) if c]  # columns: spaces or tabs, not other whitespace
        if not cols or cols[0] == "-DOCSTART-":
            flush()
            continue
        if len(cols) == 1:
            raise DataFormatError(
                path, f"one column ('{cols[0]}'): expected a token and its tag", line=n, field="tag",
                hint="write 'token tag' on each line (the tag in the last column), a blank line between "
                     "sentences",
            )
        if not tokens:
            first = n
        tokens.append(cols[0])
        tags.append(_check_tag(cols[-1], scheme, path, n, "tag"))
    flush()
    return examples


def _string_list(rec: Any, key: str) -> list[str]:
    value = rec.fields().get(key)
    if value is None:
        raise rec.error(f"no field '{key}'; the record has: {', '.join(rec.data) or 'nothing'}", key,
                        'each line must be {"tokens": [...], "tags": [...]}')
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise rec.error("must be a list of strings", key)
    return value


def _read_jsonl(path: Path, scheme: str, max_bytes: int | None) -> list[Example]:
    examples: list[Example] = []
    for rec in iter_jsonl(path, max_bytes=max_bytes):
        n = rec.line
        tokens = _string_list(rec, "tokens")
        tags = _string_list(rec, "tags")
        if len(tokens) != len(tags):
            raise rec.error(f"{len(tags)} tags for {len(tokens)} tokens", "tags",
                            "give exactly one tag per token")
        for k, t in enumerate(tokens):
            if not t.strip():
                raise rec.error(f"token {k + 1} is empty or only whitespace", "tokens")
        examples.append({
            "tokens": tokens, "tags": [_check_tag(t, scheme, path, n, "tags", rec.unit) for t in tags],
            "line": n, "source": str(path), "format": "jsonl",
        })
    return examples


def _is_jsonl(path: Path) -> bool:
    if path.suffix.lower() in JSONL_SUFFIXES or is_table(path):  # Parquet / datasets: rows of tokens and tags
        return True
    if path.suffix.lower() in (".conll", ".conllu", ".txt", ".iob", ".bio", ".bioes", ".tsv"):
        return False
    first = next((line for _, line in iter_lines(path) if line.strip()), "")  # unknown suffix: sniff
    return first.lstrip().startswith("{")


# ---- options and labels ------------------------------------------------------------------------
def _label_ids(examples: Sequence[Example], ctx: TaskContext) -> dict[str, int]:
    """tag -> id of the run; a gold tag the model never saw is a data error naming file and line."""
    labels = list(ctx.labels or ())
    if not labels:
        raise ConfigError("the run has no label list (mlmkit.json 'labels')",
                          "fine-tune it with the tagging task")
    ids = {lab: i for i, lab in enumerate(labels)}
    for ex in examples:
        if ex.get("tags") is not None and len(ex["tags"]) != len(ex["tokens"]):
            raise DataFormatError(
                ex.get("source", "<input>"), f"{len(ex['tags'])} tags for {len(ex['tokens'])} tokens",
                line=ex.get("line"), field="tags", hint="give exactly one tag per token",
            )
        for k, tag in enumerate(ex.get("tags") or ()):
            if tag not in ids:
                shown = ", ".join(labels[:20]) + (f", ... ({len(labels)} in all)" if len(labels) > 20 else "")
                line = ex.get("line")
                if line is not None and ex.get("format") == "conll":
                    line += k  # CoNLL: one token per line, none blank inside a sentence
                raise DataFormatError(
                    ex.get("source", "<input>"),
                    f"tag '{tag}' (token {k + 1}, '{ex['tokens'][k]}') was not in the training data; the "
                    f"model knows: {shown}",
                    line=line, field="tags",
                    hint="evaluate on data with the training tags, or fine-tune with this tag",
                )
    return ids


# ---- the task ----------------------------------------------------------------------------------
class TaggingTask:
    name = "tagging"
    description = "Token tagging (NER, chunking): CoNLL/JSONL, IOB1/IOB2/BIOES, entity-level P/R/F1."
    formats = ("conll", "jsonl")
    metrics = ("f1", "precision", "recall")
    outputs = {"probabilities": (BATCH, SEQUENCE, LABEL)}
    options = (
        TaskOption("label_all_tokens", False, "Train on every sub-token of a word, not only its first.",
                   flags=("--label-all-tokens/--label-first-token",)),
        TaskOption("aggregation", "first", "A word's prediction from its sub-tokens: first, average or max.",
                   choices=AGGREGATIONS, flags=("--aggregation",)),
        TaskOption("scheme", "auto", "Tag scheme of the data: auto, iob1, iob2 or bioes.", choices=SCHEMES,
                   flags=("--scheme",)),
    )
    hf_architecture = "BertForTokenClassification"
    pipeline_tag = "token-classification"
    command = "tag"

    def read(self, path: Path, options: Mapping[str, Any], *,
             max_bytes: int | None = MAX_RECORD_BYTES) -> list[Example]:
        """Examples {"tokens", "tags", "line", "source", "format"} of a CoNLL or JSONL file (by suffix:
        .jsonl/.json are JSONL; an unknown suffix is sniffed)."""
        path = Path(path)
        scheme = options["scheme"]
        examples = _read_jsonl(path, scheme, max_bytes) if _is_jsonl(path) else _read_conll(path, scheme,
                                                                                            max_bytes)
        if not examples:
            raise DataFormatError(
                path, "no sentences",
                hint="CoNLL: 'token tag' per line; JSONL: {\"tokens\": [...], \"tags\": [...]} per line"
            )
        return examples

    def from_input(self, item: Input, options: Mapping[str, Any]) -> Example:
        """A text (split into words and punctuation with character offsets), or a record with
        "text" or pre-tokenized "tokens" (offsets then refer to " ".join(tokens))."""
        if isinstance(item, dict) and isinstance(item.get("text"), str):
            item = item["text"]
        if isinstance(item, str):
            spans = split_words(item)
            return {"text": item, "tokens": [item[a:b] for a, b in spans], "offsets": spans}
        tokens = item.get("tokens") if isinstance(item, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            have = ", ".join(item) if isinstance(item, dict) else type(item).__name__
            raise DataFormatError(
                "<input>",
                f"expected a text, or a record with 'text' or 'tokens' (a list of strings); got: {have}",
                field="text", hint='pass {"text": "..."} or {"tokens": ["...", ...]}',
            )
        text, offsets = joined_offsets(tokens)
        return {"text": text, "tokens": list(tokens), "offsets": offsets}

    def label_list(self, examples: list[Example]) -> list[str]:
        return sorted({t for ex in examples for t in ex["tags"]})

    def from_hf(self, config: ModelConfig, directory: Path) -> CheckpointInfo | None:
        """transformers' BertForTokenClassification: tags from id2label; BIOES when they have E-/S-."""
        if "BertForTokenClassification" not in (config.architectures or []):
            return None
        id2label = config.id2label or {}
        labels = [id2label[i] for i in sorted(id2label)]
        bioes = any(split_tag(t)[0] in ("E", "S") for t in labels)
        return {"labels": labels, "options": {"scheme": "bioes" if bioes else "auto"}}

    def featurize(self, examples: list[Example], tokenizer: Any, ctx: TaskContext, *,
                  training: bool) -> list[Feature]:
        """Windows of [CLS] sub-tokens [SEP] per example (the tokenizer's cls and sep, where it has
        them), with "word_ids" (word index per token, -1 on [CLS]/[SEP]) and "window" [start, end,
        total] in the example's sub-tokens. Consecutive windows of one example share about a quarter
        of a window."""
        if ctx.max_length < 3:
            raise ConfigError(f"--max-length {ctx.max_length} leaves no room for words", "use at least 8")
        if training and any(ex.get("tags") is None for ex in examples):
            ex = next(ex for ex in examples if ex.get("tags") is None)
            raise DataFormatError(ex.get("source", "<input>"), "no tags", line=ex.get("line"), field="tags")
        ids = _label_ids(examples, ctx) if training or any(ex.get("tags") for ex in examples) else {}
        sp = special_ids(tokenizer)
        head, tail = [i for i in (sp.cls,) if i is not None], [i for i in (sp.sep,) if i is not None]
        # for a word the normaliser erases (byte-level BPE erases none)
        unk = sp.unk if sp.unk is not None else sp.pad
        budget = ctx.max_length - len(head) - len(tail)
        overlap = budget // 4
        with tokenizer_settings(tokenizer, words=True) as tok:
            encodings = tok.encode_batch([ex["tokens"] for ex in examples], is_pretokenized=True,
                                         add_special_tokens=False) if examples else []
        features: list[Feature] = []
        for i, (ex, enc) in enumerate(zip(examples, encodings)):
            sub_ids, word_of = word_pieces(enc.ids, enc.word_ids, len(ex["tokens"]), unk, enc.tokens)
            if training:
                gold = [ids[t] for t in ex["tags"]]
                sub_labels = [
                    gold[w] if ctx.options["label_all_tokens"] or p == 0 or word_of[p - 1] != w else IGNORE
                    for p, w in enumerate(word_of)
                ]
            for s, e in windows(word_of, budget, overlap):
                n_tok = e - s + len(head) + len(tail)
                f: Feature = {
                    "input_ids": [*head, *sub_ids[s:e], *tail],
                    "token_type_ids": [0] * n_tok,
                    EXAMPLE: i,
                    "word_ids": [-1] * len(head) + word_of[s:e] + [-1] * len(tail),
                    "window": [s, e, len(sub_ids)],
                }
                if training:
                    f["labels"] = [IGNORE] * len(head) + sub_labels[s:e] + [IGNORE] * len(tail)
                features.append(f)
        return features

    def build_model(self, config: ModelConfig, ctx: TaskContext) -> Any:
        """transformers' *ForTokenClassification of the config's family, on mlmkit's encoder."""
        from mlmkit.model import BertForLabels

        if config.num_labels < 1:
            raise ConfigError("the config has no labels (id2label)", "fine-tune with tagged training data")
        return BertForLabels(config, per_token=True)

    def postprocess(
        self, outputs: dict[str, list[np.ndarray]], features: list[Feature], examples: list[Example],
        ctx: TaskContext
    ) -> list[Prediction]:
        """{"tokens", "tags", "scores", "entities"} per example. A word's label distribution comes
        from its sub-tokens (aggregation first / average / max) in the window where the word has
        the most context on both sides; entities carry character offsets into the text."""
        labels = list(ctx.labels or ())
        agg = ctx.options["aggregation"]
        probs = outputs["probabilities"]
        # best[i][w] = (context, feature index, token positions) of word w of example i
        best: list[dict[int, tuple[float, int, list[int]]]] = [{} for _ in examples]
        for k, f in enumerate(features):
            s, e, n = f["window"]
            positions: dict[int, list[int]] = defaultdict(list)
            for t, w in enumerate(f["word_ids"]):
                if w >= 0:
                    positions[w].append(t)
            seen = best[f[EXAMPLE]]
            for w, ts in positions.items():
                first, last = s + ts[0] - 1, s + ts[-1] - 1  # sub-token indices in the whole example
                left = first - s if s > 0 else math.inf  # the example's own ends are not cuts
                right = e - 1 - last if e < n else math.inf
                context = min(left, right)
                if w not in seen or context > seen[w][0]:
                    seen[w] = (context, k, ts)
        # each window's words at once: their distributions, then label and score
        tags: list[list[str]] = [[""] * len(ex["tokens"]) for ex in examples]
        scores: list[list[float]] = [[0.0] * len(ex["tokens"]) for ex in examples]
        # k -> (example, word, positions)
        by_feature: dict[int, list[tuple[int, int, list[int]]]] = defaultdict(list)
        for i, seen in enumerate(best):
            if len(seen) != len(examples[i]["tokens"]):
                raise ConfigError(f"no model output for some words of example {i}", "a bug: please report it")
            for w, (_, k, ts) in seen.items():
                by_feature[k].append((i, w, ts))
        for k, words in by_feature.items():
            dist = word_distributions(probs[k], [ts for _, _, ts in words], agg)  # (words, L)
            best_label = dist.argmax(axis=1)
            best_score = dist[np.arange(len(words)), best_label]
            for (i, w, _), j, p in zip(words, best_label.tolist(), best_score.tolist()):
                tags[i][w], scores[i][w] = labels[j], p
        preds = []
        for i, ex in enumerate(examples):
            if "offsets" in ex:
                text, offsets = ex["text"], ex["offsets"]
            else:
                text, offsets = joined_offsets(ex["tokens"])
            entities = []
            for kind, a, b in chunks(tags[i]):
                start, end = offsets[a][0], offsets[b - 1][1]
                entities.append({"type": kind, "start": start, "end": end, "text": text[start:end],
                                 "score": sum(scores[i][a:b]) / (b - a)})
            preds.append({"tokens": list(ex["tokens"]), "tags": tags[i], "scores": scores[i],
                          "entities": entities})
        return preds

    def compute_metrics(self, predictions: list[Prediction], examples: list[Example],
                        ctx: TaskContext) -> Metrics:
        """Entity-level f1 (the main metric), precision, recall (0-1, conlleval), and per_type
        {type: {precision, recall, f1, support}}."""
        _label_ids(examples, ctx)
        if not examples:
            raise ConfigError("no examples to score", "check the evaluation data")
        gold = [ex["tags"] for ex in examples]
        pred = [p["tags"] for p in predictions]
        if len(pred) != len(gold) or any(len(g) != len(p) for g, p in zip(gold, pred)):
            raise ConfigError("predictions do not match the examples word for word",
                              "a bug: please report it")
        return entity_scores(gold, pred)

    def summary(self, prediction: Prediction) -> dict[str, str]:
        ents = [f"{e['text']} {e['type']} {e['score']:.2f} {e['start']}:{e['end']}"
                for e in prediction["entities"]]
        return {"entities": "; ".join(ents) or "none"}


task = TaggingTask()
