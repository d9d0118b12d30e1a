"""Extractive question answering: a start/end head over the context (SQuAD v1.1 / v2.0).

Examples are dicts {"id", "question", "context", "answers": [{"text", "answer_start"}], "is_impossible"}.
A question and its context become one or more windows of ``[CLS] question [SEP] context [SEP]``:
contexts longer than the max length are split into windows overlapping by ``doc_stride`` tokens,
and each window keeps the character offsets of its context tokens. For training, an answer that
is not wholly inside a window (or a question without an answer) points at [CLS], position 0.

Postprocessing (shared by evaluation and the ONNX runtime, so numpy only, never torch) searches
the n-best start and end positions of every window of an example, keeps spans of context tokens
no longer than ``max_answer_length``, and cuts the best one out of the original context by
character offsets, so the answer is exactly the user's text (accents, tabs and odd spaces kept).
For SQuAD 2.0 the no-answer score is the [CLS] start+end logit, minimum over windows (as the
reference recipe); "" is predicted when it beats the best span by more than
``null_score_threshold``, which ``calibrate`` tunes on the evaluation data to maximise F1 (the
official evaluation script's best_f1_thresh) and which is saved with the model.

Defaults are the reference recipe's: max length 384, stride 128, question 64 tokens, n-best 20,
answers of at most 30 tokens. EM and F1 follow the official SQuAD script (0-100).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mlmkit.taskkit import (
    BATCH,
    EXAMPLE,
    MAX_RECORD_BYTES,
    SEQUENCE,
    CheckpointInfo,
    ConfigError,
    DataFormatError,
    Example,
    Feature,
    Input,
    MlmkitError,
    Prediction,
    TaskContext,
    TaskOption,
    TaskState,
    is_table,
    iter_jsonl,
    parse_json,
    read_text,
    tokenizer_settings,
)
from mlmkit_tasks.qa_data import read_records, read_squad
from mlmkit_tasks.qa_metrics import exact_match, f1_score, gold_answers
from mlmkit_tasks.qa_spans import Offsets, search_spans, trimmed

if TYPE_CHECKING:  # the config type is torch's side (models/); a task imports torch in build_model only
    from mlmkit.model import ModelConfig


# ---------------------------------------------------------------- the task


class QATask:
    name = "qa"
    description = "extractive question answering: a start/end span of the context (SQuAD v1.1 / v2.0)"
    formats = ("squad-json", "jsonl")
    metrics = ("f1", "exact_match")
    outputs = {"start_logits": (BATCH, SEQUENCE), "end_logits": (BATCH, SEQUENCE)}
    options = (
        TaskOption("doc_stride", 128, "Overlap of context windows, in tokens.", minimum=0,
                   flags=("--doc-stride",)),
        TaskOption("max_question_length", 64, "Longest question, in tokens (longer ones are cut).",
                   minimum=1),
        TaskOption("n_best", 20, "Start and end positions searched per window.", minimum=1),
        TaskOption("max_answer_length", 30, "Longest answer, in tokens.", minimum=1,
                   flags=("--max-answer-length",)),
    )
    label_names = ("start_positions", "end_positions")
    hf_architecture = "BertForQuestionAnswering"
    pipeline_tag = "question-answering"
    default_max_length = 384
    command = "qa"

    # -------------------------------------------------------- data

    def read(self, path: Path, options: Mapping[str, Any], *,
             max_bytes: int | None = MAX_RECORD_BYTES) -> list[Example]:
        """SQuAD v1.1 / v2.0 JSON (.json) or JSON lines {"id", "question", "context", "answers"}."""
        p = Path(path)
        # Parquet / datasets: the JSON-lines fields as columns
        if p.suffix.lower() == ".jsonl" or is_table(p):
            return read_records(iter_jsonl(p, max_bytes=max_bytes))
        text = read_text(p)
        try:
            doc = parse_json(text)
        except json.JSONDecodeError as e:
            if e.msg == "Extra data" or p.suffix.lower() != ".json":  # several JSON values: JSON lines
                return read_records(iter_jsonl(p, max_bytes=max_bytes))
            raise DataFormatError(p, f"malformed JSON: {e.msg} (column {e.colno})", line=e.lineno,
                                  hint="fix the JSON") from None
        # a JSON-lines file of one record
        if isinstance(doc, dict) and "data" not in doc and "question" in doc:
            return read_records(iter_jsonl(p, max_bytes=max_bytes))
        return read_squad(p, doc)

    def from_input(self, item: Input, options: Mapping[str, Any]) -> Example:
        """An example from a runtime record with "question" and "context" (and optionally "id")."""
        hint = ('give records with "question" and "context" fields (JSON lines, or CSV/TSV columns of those '
                'names)')
        if not isinstance(item, dict):
            raise DataFormatError("<input>", "qa needs a question and a context, not a plain text", hint=hint)
        missing = [k for k in ("question", "context") if not isinstance(item.get(k), str)]
        if missing:
            has = ", ".join(map(repr, item)) or "nothing"
            raise DataFormatError("<input>",
                                  f"qa input lacks {' and '.join(map(repr, missing))} (it has {has})",
                                  field=missing[0], hint=hint)
        qid = item.get("id")
        return {
            "id": "" if qid is None else str(qid), "question": item["question"], "context": item["context"],
            "answers": [], "is_impossible": False,
        }

    def from_hf(self, config: ModelConfig, directory: Path) -> CheckpointInfo | None:
        """transformers' BertForQuestionAnswering."""
        return {} if "BertForQuestionAnswering" in (config.architectures or []) else None

    def fit_state(self, examples: list[Example]) -> TaskState:
        """SQuAD 2.0 training data (some questions unanswerable): postprocess may answer ""."""
        return {"version_2_with_negative": any(ex.get("is_impossible") for ex in examples)}

    # -------------------------------------------------------- features

    def featurize(self, examples: list[Example], tokenizer: Any, ctx: TaskContext, *,
                  training: bool) -> list[Feature]:
        """Windows of [CLS] question [SEP] context [SEP] with the context's character offsets.

        Each feature: input_ids, token_type_ids, example, offsets (per token, (start, end) in
        the context or None for the question and special tokens), and when ``training`` the
        start/end token positions (0, the [CLS], when the answer is not wholly in the window)."""
        stride, q_max, max_length = (ctx.options["doc_stride"], ctx.options["max_question_length"],
                                     ctx.max_length)
        with tokenizer_settings(tokenizer) as tok:
            questions, q_lens = self._cut_questions(tok, [ex["question"] for ex in examples], q_max)
            contexts = [ex["context"] for ex in examples]
            unique = list(dict.fromkeys(contexts))  # SQuAD asks several questions about each paragraph
            n_tokens = dict(zip(unique,
                                (len(e.ids) for e in tok.encode_batch(unique, add_special_tokens=False))))
            c_lens = [n_tokens[c] for c in contexts]
            windowed = False
            # [CLS] q [SEP] c [SEP]: 3; RoBERTa's <s> q </s></s> c </s>: 4
            n_special = tok.num_special_tokens_to_add(True)
            for ex, q, c in zip(examples, q_lens, c_lens):
                window = max_length - n_special - q  # context tokens per window
                windowed = windowed or q + c + n_special > max_length
                if q + c + n_special > max_length and stride >= window:  # tokenizers would panic
                    raise ConfigError(
                        f"--doc-stride {stride} must be smaller than the context window of question "
                        f"'{ex['id']}': max length {max_length} - {q} question tokens - {n_special} special "
                        f"tokens = {window} tokens",
                        "lower --doc-stride or --max-question-length, or raise --max-length",
                    )
        # the stride only matters (and is only checked by tokenizers) when some context needs windows
        with tokenizer_settings(tokenizer, max_length=max_length, stride=stride if windowed else 0,
                                strategy="only_second") as tok:
            encodings = tok.encode_batch(list(zip(questions, contexts)))
        features = []
        for i, (ex, enc) in enumerate(zip(examples, encodings)):
            for e in [enc, *enc.overflowing]:  # the first window, then the rest in context order
                offsets: Offsets = [tuple(o) if s == 1 else None for o, s in zip(e.offsets, e.sequence_ids)]
                f = {"input_ids": list(e.ids), "token_type_ids": list(e.type_ids), EXAMPLE: i,
                     "offsets": offsets}
                if training:
                    f["start_positions"], f["end_positions"] = self._positions(offsets, ex)
                features.append(f)
        return features

    @staticmethod
    def _cut_questions(tokenizer: Any, questions: list[str], q_max: int) -> tuple[list[str], list[int]]:
        """Questions cut to at most ``q_max`` tokens, at a word end when possible (so re-tokenizing
        gives the same tokens), and their lengths in tokens."""
        out, lengths = list(questions), []
        for i, enc in enumerate(tokenizer.encode_batch(questions, add_special_tokens=False)):
            n = len(enc.ids)
            if n > q_max:
                words = enc.word_ids
                ends = [k for k in range(q_max, 0, -1) if words[k] != words[k - 1] or words[k] is None]
                out[i], n = "", 0
                for k in ends or range(q_max, 0, -1):
                    cut = questions[i][: enc.offsets[k - 1][1]]
                    m = len(tokenizer.encode(cut, add_special_tokens=False).ids)
                    if m <= q_max:
                        out[i], n = cut, m
                        break
            lengths.append(n)
        return out, lengths

    @staticmethod
    def _positions(offsets: Offsets, ex: Example) -> tuple[int, int]:
        """Token positions of the first answer in this window, or (0, 0) for [CLS]."""
        if ex.get("is_impossible") or not ex.get("answers"):
            return 0, 0
        a = ex["answers"][0]
        text = a["text"]
        s_char = a["answer_start"] + len(text) - len(text.lstrip())  # whitespace round an answer is no token
        e_char = a["answer_start"] + len(text.rstrip())
        ctx = [(i, o) for i, o in enumerate(offsets) if o is not None]  # the context's tokens and their spans
        if not ctx or ctx[0][1][0] > s_char or ctx[-1][1][1] < e_char:
            return 0, 0  # not (wholly) inside this window
        start = next((i for i, o in ctx if o[1] > s_char), None)  # first token overlapping the answer
        end = next((i for i, o in reversed(ctx) if o[0] < e_char), None)  # last one
        if start is None or end is None or end < start:
            return 0, 0
        return start, end

    # -------------------------------------------------------- model

    def build_model(self, config: ModelConfig, ctx: TaskContext) -> Any:
        from mlmkit_tasks.heads.qa import BertForQuestionAnswering

        return BertForQuestionAnswering(config)

    # -------------------------------------------------------- predictions

    @staticmethod
    def _with_null(ctx: TaskContext) -> bool:
        return (bool(ctx.state.get("version_2_with_negative"))
                or ctx.state.get("null_score_threshold") is not None)

    def postprocess(
        self, outputs: dict[str, list[np.ndarray]], features: list[Feature], examples: list[Example],
        ctx: TaskContext
    ) -> list[Prediction]:
        """One {"id", "answer", "score", "start", "end"} per example; start/end are character
        offsets in the context (-1 and "" for no answer)."""
        found = search_spans(outputs, features, len(examples), ctx.options)
        with_null = self._with_null(ctx)
        threshold = float(ctx.state.get("null_score_threshold") or 0.0)
        preds = []
        for ex, r in zip(examples, found):
            no_span = r["score"] is None
            if no_span or (with_null and r["null"] - r["score"] > threshold):
                score = r["null"] if r["null"] is not None else 0.0
                preds.append({"id": ex["id"], "answer": "", "score": float(score), "start": -1, "end": -1})
            else:
                start, end = trimmed(ex["context"], r["start"], r["end"])
                preds.append({"id": ex["id"], "answer": ex["context"][start:end], "score": float(r["score"]),
                              "start": start, "end": end})
        return preds

    def calibrate(
        self, outputs: dict[str, list[np.ndarray]], features: list[Feature], examples: list[Example],
        ctx: TaskContext
    ) -> TaskState:
        """SQuAD 2.0: the null-score threshold that maximises F1 on these examples (as the official
        script's best_f1_thresh); {} when no question here is impossible."""
        if not any(ex.get("is_impossible") for ex in examples):
            return {}
        found = search_spans(outputs, features, len(examples), ctx.options)
        total = 0.0  # F1 summed over examples, everything predicted "" to begin with
        candidates = []  # (null - best span, F1 gained by answering instead)
        for ex, r in zip(examples, found):
            golds = gold_answers(ex)
            null_f1 = max(f1_score(g, "") for g in golds)
            total += null_f1
            if r["score"] is not None:
                span_f1 = max(f1_score(g, ex["context"][r["start"] : r["end"]]) for g in golds)
                candidates.append((r["null"] - r["score"], span_f1 - null_f1))
        if not candidates:
            return {"null_score_threshold": 0.0}
        candidates.sort()
        best, threshold = total, candidates[0][0] - 1.0  # below every difference: always ""
        k = 0
        while k < len(candidates):  # answer every example with a difference <= the threshold
            diff = candidates[k][0]
            while k < len(candidates) and candidates[k][0] == diff:
                total += candidates[k][1]
                k += 1
            if total > best:
                best, threshold = total, diff
        return {"null_score_threshold": float(threshold)}

    def compute_metrics(self, predictions: list[Prediction], examples: list[Example],
                        ctx: TaskContext) -> dict[str, float]:
        """exact_match and f1 (0-100), each the max over the gold answers, averaged over questions."""
        if len(predictions) != len(examples):
            raise MlmkitError(f"{len(predictions)} predictions for {len(examples)} questions")
        if not examples:
            return {"f1": 0.0, "exact_match": 0.0}
        em = f1 = 0.0
        for p, ex in zip(predictions, examples):
            golds = gold_answers(ex)
            em += max(exact_match(g, p["answer"]) for g in golds)
            f1 += max(f1_score(g, p["answer"]) for g in golds)
        return {"f1": 100.0 * f1 / len(examples), "exact_match": 100.0 * em / len(examples)}

    def summary(self, prediction: Prediction) -> dict[str, str]:
        span = f"{prediction['start']}:{prediction['end']}" if prediction["start"] >= 0 else "-"
        return {"answer": prediction["answer"] or "(no answer)", "score": f"{prediction['score']:.3f}",
                "span": span}


task = QATask()
