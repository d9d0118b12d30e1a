"""fill-mask: the most likely tokens for every [MASK] of a text, from a masked LM's own head.

What a pretraining run, a BertForMaskedLM / BertForPreTraining checkpoint (of any family), or any
masked LM no other task claims is exported and served as (``masked_lm``): `mlmkit export RUN` of a
pretraining run makes a fill-mask bundle, `mlmkit fill-mask` and `mlmkit predict` run it. The task is
not fine-tuned (``trainable`` is False): the model is the masked LM as pretraining left it.

The graph (heads/fill_mask.py) finds the [MASK] positions itself (input_ids == the mask id, on real
tokens), runs the MLM head at those rows only and picks the top ``candidates`` inside the graph, so no
batch x length x vocabulary tensor is ever built. Its outputs are per token, like a tagger's:

    indices  (batch, sequence, k)  the k most likely token ids at a [MASK], best first; -1 elsewhere
    values   (batch, sequence, k)  their softmax probabilities over the vocabulary; 0 elsewhere

A result, one per input: {"text", "masks": [{"position", "start", "end", "candidates": [{"token",
"id", "score"}, ...]}, ...], "sequence"}: ``position`` is the token index, ``start`` / ``end`` the
characters of the [MASK] in the text, ``sequence`` the text with every [MASK] replaced by its best
candidate; a pair ({"text", "text_pair"}) adds "sequence_pair" and each mask's "segment". A text with
no [MASK] within the max length gets "masks": [] and an "error" saying so (it is run as one token).
"[MASK]" is understood whatever the model's own mask token is (RoBERTa's <mask>).

Evaluation (`mlmkit evaluate BUNDLE --data FILE`): a JSONL / CSV file of {"text": "... [MASK] ...",
"answer": "paris"} records ("answer" a list for several [MASK]s, in order): the share of [MASK]s whose
best candidate is the answer (``accuracy``) and whose candidates hold it (``top_k_accuracy``), over
``masks`` [MASK]s. A row without a [MASK], with more or fewer answers than [MASK]s, or with an answer
no single token of the tokenizer reads as is refused before the model runs (fill_mask_data.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mlmkit.taskkit import (
    BATCH,
    EXAMPLE,
    FORMATS,
    MASK,
    MAX_RECORD_BYTES,
    SEQUENCE,
    TRUNCATED,
    ConfigError,
    DataFormatError,
    Example,
    Feature,
    Input,
    Metrics,
    Prediction,
    Record,
    TaskContext,
    TaskOption,
    clip_text,
    data_format,
    iter_jsonl,
    iter_records,
    mask_token,
    tokenizer_settings,
)
from mlmkit_tasks.fill_mask_data import ONE_ANSWER, answer_slots, check_answers, normal

if TYPE_CHECKING:  # the config type is torch's side (models/); a task imports torch in build_model only
    from mlmkit.model import ModelConfig


def _alias(text: str, mask: str) -> tuple[str, Any]:
    """``text`` with each "[MASK]" written as the model's own mask token (RoBERTa's <mask>, EuroBERT's
    <|mask|>), and the function that maps a character offset in it back to ``text``: an offset after k
    replaced masks moves by k times the difference in length."""
    if mask == MASK or MASK not in text:
        return text, lambda o: o
    parts = text.split(MASK)
    ends, at = [], 0
    for part in parts[:-1]:
        at += len(part) + len(mask)
        ends.append(at)  # where each replaced mask ends in the new text
    grow = len(mask) - len(MASK)
    return mask.join(parts), lambda o: o - grow * sum(1 for e in ends if e <= o)


class FillMaskTask:
    name = "fill-mask"
    description = ("The most likely tokens for every [MASK] of a text, from a masked LM's head (top-k in the "
                   "graph).")
    outputs = {"indices": (BATCH, SEQUENCE, "k"), "values": (BATCH, SEQUENCE, "k")}
    metrics = ("accuracy", "top_k_accuracy")
    options = (
        TaskOption("candidates", 5, "Candidates per [MASK] computed in the graph (`mlmkit export --top-k`).",
                   minimum=1,
                   fixed=True),
        TaskOption("top_k", 0,
                   "Candidates per [MASK] in each result, at most the bundle's (its export's --top-k); "
                   "0: all of them.", minimum=0, saved=False, flags=("--top-k",)),
    )
    formats = ("jsonl", "csv", "tsv")
    top_k_option = "candidates"
    masked_lm = True
    trainable = False
    command = "fill-mask"
    hf_architecture = "BertForMaskedLM"
    pipeline_tag = "fill-mask"
    default_max_length = 512

    # ---- inputs ----------------------------------------------------------------------------------
    def from_input(self, item: Input, options: Mapping[str, Any]) -> Example:
        """A text, or a record with "text" (and "text_pair")."""
        _check_top_k(options)
        return _example(Record("<input>", None, item))

    def read(self, path: Path, options: Mapping[str, Any], *,
             max_bytes: int | None = MAX_RECORD_BYTES) -> list[Example]:
        """Examples with answers: {"text", ["text_pair"], "answer": [one token per [MASK]]}."""
        fmt = data_format(path, FORMATS)
        records = (iter_jsonl(path, max_bytes=max_bytes) if fmt == "jsonl"
                   else iter_records(path, fmt, max_bytes=max_bytes))
        examples = []
        for rec in records:
            ex = _example(rec)
            answer = rec.fields().get("answer")
            answers = [answer] if isinstance(answer, str) else answer
            if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a.strip()
                                                                       for a in answers):
                raise rec.error("must be a token, or a list of one token per [MASK]", field="answer",
                                hint=ONE_ANSWER)
            examples.append({**ex, "answer": [a.strip() for a in answers], "line": rec.line,
                             "source": rec.source, "unit": rec.unit})
        if not examples:
            raise DataFormatError(path, "no examples",
                                  hint='one {"text": "... [MASK] ...", "answer": "..."} record per line')
        return examples

    def featurize(self, examples: list[Example], tokenizer: Any, ctx: TaskContext, *,
                  training: bool) -> list[Feature]:
        """The tokens of each text (or pair), cut to the max length; a text without a [MASK] in them is
        one token, since its result needs no model. Labelled examples (evaluation's) are checked first,
        before any model runs: a row that could only be scored as a miss is refused (fill_mask_data)."""
        mask = mask_token(tokenizer)
        check_answers(examples, tokenizer, mask)
        mask_id = tokenizer.token_to_id(mask)
        aliased = [[_alias(t, mask) for t in (ex["text"], ex.get("text_pair")) if t is not None]
                   for ex in examples]
        clip = lambda t: clip_text(t, tokenizer, ctx.max_length)  # noqa: E731
        with tokenizer_settings(tokenizer, max_length=ctx.max_length) as tok:
            encs = tok.encode_batch([tuple(clip(t) for t, _ in texts) if len(texts) > 1 else clip(texts[0][0])
                                     for texts in aliased])
        features = []
        for i, enc in enumerate(encs):
            masks = [p for p, t in enumerate(enc.ids) if t == mask_id]
            keep = len(enc.ids) if masks else 1
            segments = [int(enc.sequence_ids[p] or 0) for p in masks]
            back = [aliased[i][s][1] for s in segments]  # each mask's offsets in the text as given
            features.append({"input_ids": enc.ids[:keep], "token_type_ids": enc.type_ids[:keep], EXAMPLE: i,
                             TRUNCATED: bool(enc.overflowing), "masks": masks, "segments": segments,
                             "offsets": [(b(enc.offsets[p][0]), b(enc.offsets[p][1]))
                                         for p, b in zip(masks, back)]})
        return features

    # ---- outputs ---------------------------------------------------------------------------------
    def postprocess(self, outputs: dict[str, list[np.ndarray]], features: list[Feature],
                    examples: list[Example],
                    ctx: TaskContext) -> list[Prediction]:
        k = _check_top_k(ctx.options)
        decode = _Decoder(ctx.tokenizer)
        preds = []
        for f, ex, ids, probs in zip(features, examples, outputs["indices"], outputs["values"]):
            pair = "text_pair" in ex
            r: Prediction = {"text": ex["text"], **({"text_pair": ex["text_pair"]} if pair else {}),
                             "masks": []}
            for p, (start, end), seg in zip(f["masks"], f["offsets"], f["segments"]):
                row = [(int(t), float(s))
                       for t, s in zip(np.asarray(ids[p])[: k or None], np.asarray(probs[p])[: k or None])
                       if t >= 0]
                r["masks"].append({"position": p, **({"segment": seg} if pair else {}), "start": int(start),
                                   "end": int(end),
                                   "candidates": [{"token": decode(t), "id": t, "score": s} for t, s in row]})
            if r["masks"]:
                r["sequence"] = _fill(ex["text"], [m for m in r["masks"] if m.get("segment", 0) == 0])
                if pair:
                    r["sequence_pair"] = _fill(ex["text_pair"], [m for m in r["masks"] if m["segment"] == 1])
            else:
                had = any(m in t for t in (ex["text"], ex.get("text_pair") or "")
                          for m in {MASK, decode.mask})
                r["error"] = (f"no [MASK] within the first {ctx.max_length} tokens" if had
                              else "no [MASK] token in the text")
            preds.append(r)
        return preds

    def compute_metrics(self, predictions: list[Prediction], examples: list[Example],
                        ctx: TaskContext) -> Metrics:
        """Over the [MASK]s of the examples: the share whose best candidate is the answer, and whose
        candidates hold it (tokens compared as the tokenizer decodes them, "##" pieces without it).
        ``masks``: the [MASK]s scored, one per answer; a [MASK] past the max length is a miss. Each
        predicted [MASK] is matched to its own answer (a pair's: after the text's), so a [MASK] cut
        from the text does not shift the pair's answers."""
        mask = mask_token(ctx.tokenizer) if ctx.tokenizer is not None else MASK
        best = anywhere = total = 0
        for p, ex in zip(predictions, examples):
            answers, slots = ex["answer"], answer_slots(ex, mask)
            first = (0, slots[0])  # the text's answers, then the pair's
            seen = [0, 0]
            for m in p["masks"]:
                s = int(m.get("segment", 0))
                i, seen[s] = first[s] + seen[s], seen[s] + 1
                if i >= len(answers):  # more [MASK]s than answers: featurize refuses it
                    continue
                tokens = [normal(c["token"]) for c in m["candidates"]]
                best += bool(tokens) and tokens[0] == normal(answers[i])
                anywhere += normal(answers[i]) in tokens
            total += sum(slots)
        return {"accuracy": best / total if total else 0.0,
                "top_k_accuracy": anywhere / total if total else 0.0,
                "masks": total}

    def summary(self, prediction: Prediction) -> dict[str, str]:
        if not prediction["masks"]:
            return {"candidates": f"({prediction.get('error', 'no [MASK]')})"}
        return {"candidates": " | ".join(", ".join(f"{c['token']} {c['score']:.3f}" for c in m["candidates"])
                                         for m in prediction["masks"])}

    # ---- the model -------------------------------------------------------------------------------
    def build_model(self, config: ModelConfig, ctx: TaskContext) -> Any:
        from mlmkit_tasks.heads.fill_mask import FillMask

        if ctx.tokenizer is None:
            raise ConfigError("the fill-mask model needs the tokenizer (its [MASK] id) in the task context")
        k = int(ctx.options["candidates"])
        if k > config.vocab_size:
            raise ConfigError(f"--top-k must be between 1 and the vocabulary size {config.vocab_size}, got "
                              f"{k}")
        return FillMask(config, ctx.tokenizer.token_to_id(mask_token(ctx.tokenizer)), k)


def _example(rec: Record) -> Example:
    if isinstance(rec.data, str):
        return {"text": rec.data}
    fields = rec.fields()
    if not isinstance(fields.get("text"), str):
        have = ", ".join(fields) or "no fields"
        raise rec.error(f"expected a text or a record with a 'text' field, got: {have}", field="text")
    pair = fields.get("text_pair")
    if pair is not None and not isinstance(pair, str):  # read as no pair, it would be dropped without a word
        raise rec.error(f"must be a text, got {type(pair).__name__}", field="text_pair")
    return {"text": fields["text"], **({"text_pair": pair} if pair is not None else {})}


def _check_top_k(options: Mapping[str, Any]) -> int:
    """The candidates a result shows (``top_k``, 0: all), refused when over what the graph computes."""
    k, most = int(options.get("top_k") or 0), int(options["candidates"])
    if k > most:
        raise ConfigError(f"--top-k {k}: this bundle was exported with --top-k {most}",
                          f"ask for 1 to {most}, or export again with a larger --top-k")
    return k


class _Decoder:
    """Token ids as text, each decoded once."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.mask = tokenizer, mask_token(tokenizer)
        self.seen: dict[int, str] = {}

    def __call__(self, i: int) -> str:
        if i not in self.seen:
            self.seen[i] = self.tokenizer.decode([i], skip_special_tokens=False).strip()
        return self.seen[i]


def _fill(text: str, masks: Sequence[Mapping[str, Any]]) -> str:
    """``text`` with each [MASK] span replaced by its best candidate (word pieces glued on)."""
    out, last = [], 0
    for m in sorted(masks, key=lambda m: m["start"]):
        best = m["candidates"][0]["token"] if m["candidates"] else ""
        out.append(text[last : m["start"]])
        if best.startswith("##"):
            out[-1] = out[-1].rstrip()
            best = best[2:]
        out.append(best)
        last = m["end"]
    return "".join(out) + text[last:]


task = FillMaskTask()
