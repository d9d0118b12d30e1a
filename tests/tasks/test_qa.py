"""The qa task: windowing, character offsets, postprocessing, null-threshold calibration, learning,
and parity with transformers (the readers: test_qa_data.py; SQuAD metrics: test_qa_metrics.py)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from conftest import run_finetune
from qa_helpers import ctx, jsonl, read

from mlmkit.errors import ConfigError, MlmkitError
from mlmkit.registry import BATCH, SEQUENCE, Task, get_task
from mlmkit.text.batching import pad_features
from mlmkit.text.tokenizer import train_tokenizer
from mlmkit.train.finetune import evaluate_run, load_finetuned
from mlmkit_tasks.qa import task


def example(context: str, answer: str | None, question: str = "where is it ?", qid: str = "q",
            at: int | None = None) -> dict:
    if answer is None:
        return {"id": qid, "question": question, "context": context, "answers": [], "is_impossible": True}
    start = context.index(answer) if at is None else at
    return {"id": qid, "question": question, "context": context,
            "answers": [{"text": answer, "answer_start": start}],
            "is_impossible": False}


def fake_outputs(features: list[dict], spans: dict[int, tuple[int, int]], rng: np.random.Generator,
                 high: float = 10.0) -> dict[str, list[np.ndarray]]:
    """Per-feature logits: small noise, ``high`` on the start and end token of ``spans[feature]``."""
    out: dict[str, list[np.ndarray]] = {"start_logits": [], "end_logits": []}
    for i, f in enumerate(features):
        st, en = (rng.normal(0, 0.1, len(f["input_ids"])).astype(np.float32) for _ in range(2))
        if i in spans:
            st[spans[i][0]] += high
            en[spans[i][1]] += high
        out["start_logits"].append(st)
        out["end_logits"].append(en)
    return out


# ---- registry ----------------------------------------------------------------------------------
def test_registered_with_reference_defaults():
    t = get_task("qa")
    assert t.task is task and isinstance(task, Task) and t.command == "qa"
    assert t.metrics[0] == "f1" and set(t.metrics) == {"f1", "exact_match"}
    assert t.resolve_options() == {"doc_stride": 128, "max_question_length": 64, "n_best": 20,
                                   "max_answer_length": 30}
    assert t.outputs == {"start_logits": (BATCH, SEQUENCE), "end_logits": (BATCH, SEQUENCE)}
    assert t.default_max_length == 384 and t.hf_architecture == "BertForQuestionAnswering"
    assert t.label_names == ("start_positions", "end_positions")


# ---- runtime inputs ----------------------------------------------------------------------------
def test_from_input():
    assert task.from_input({"question": "who?", "context": "rex.", "id": 3}, {}) == {
        "id": "3", "question": "who?", "context": "rex.", "answers": [], "is_impossible": False}
    with pytest.raises(MlmkitError, match="qa needs a question and a context"):
        task.from_input("who is rex?", {})
    with pytest.raises(MlmkitError, match="lacks 'context'"):
        task.from_input({"question": "who?"}, {})


# ---- windows and offsets -----------------------------------------------------------------------
WORDS = [f"{a}{b}" for a in ("bla", "cro", "dum", "fen", "gol", "hix", "jup")
         for b in ("ak", "ex", "ip", "or", "un", "ya")]


@pytest.fixture(scope="module")
def word_tok():
    texts = [" ".join(WORDS), "where is the treasure ?", "who wrote the letter ?"] * 3
    return train_tokenizer(texts, vocab_size=300, min_frequency=1)


WINDOW_CTX = ctx(48, doc_stride=16, max_question_length=16)


def context_features(tok, context: str, answer_start: int, answer_end: int) -> tuple[dict, list[dict]]:
    ex = {"id": "w", "question": "where is the treasure ?", "context": context,
          "answers": [{"text": context[answer_start:answer_end], "answer_start": answer_start}],
          "is_impossible": False}
    return ex, task.featurize([ex], tok, WINDOW_CTX, training=True)


def check_windows(features: list[dict], max_length: int, stride: int) -> None:
    ctx = [[o for o in f["offsets"] if o is not None] for f in features]
    assert all(len(f["input_ids"]) <= max_length for f in features)
    for a, b in zip(ctx, ctx[1:]):
        assert a[-stride:] == b[:stride]  # consecutive windows overlap by exactly doc_stride tokens


def test_windowing_recovers_answer_straddling_a_window_boundary(word_tok):
    rng = random.Random(1)
    context = " ".join(rng.choice(WORDS) for _ in range(120))
    _, feats = context_features(word_tok, context, 0, 5)
    assert len(feats) >= 4
    check_windows(feats, 48, 16)
    first = [o for o in feats[0]["offsets"] if o is not None]
    second = [o for o in feats[1]["offsets"] if o is not None]
    # an answer of 5 tokens: the last 2 context tokens of window 0 and 3 more, wholly inside window 1
    nxt = second.index(first[-1])
    s_char, e_char = first[-2][0], second[nxt + 3][1]
    ex, feats = context_features(word_tok, context, s_char, e_char)
    assert (feats[0]["start_positions"], feats[0]["end_positions"]) == (0, 0)  # cut by the boundary: [CLS]
    f1 = feats[1]
    s, e = f1["start_positions"], f1["end_positions"]
    assert e - s == 4 and f1["offsets"][s][0] == s_char and f1["offsets"][e][1] == e_char
    assert all((f["start_positions"], f["end_positions"]) == (0, 0) for f in feats[2:])
    # a decoy in window 0 (the part of the answer it holds) scores lower than the full span in window 1
    out = fake_outputs(feats, {1: (s, e)}, np.random.default_rng(0))
    cut = feats[0]["offsets"].index(first[-2])
    out["start_logits"][0][cut] += 6.0
    out["end_logits"][0][len(feats[0]["input_ids"]) - 2] += 6.0
    (pred,) = task.postprocess(out, feats, [ex], WINDOW_CTX)
    assert pred["answer"] == context[s_char:e_char] and (pred["start"], pred["end"]) == (s_char, e_char)
    assert pred["id"] == "w" and pred["score"] > 19
    # and the decoy wins when it scores higher: the search really spans all windows
    out["start_logits"][0][cut] += 10.0
    out["end_logits"][0][len(feats[0]["input_ids"]) - 2] += 10.0
    (pred,) = task.postprocess(out, feats, [ex], WINDOW_CTX)
    assert (pred["start"], pred["end"]) == (s_char, first[-1][1])


def test_windowing_recovers_answer_in_the_last_window(word_tok):
    rng = random.Random(2)
    context = " ".join(rng.choice(WORDS) for _ in range(101)) + " the end "
    s_char = context.index("the end")
    ex, feats = context_features(word_tok, context, s_char, s_char + len("the end"))
    assert len(feats) >= 4
    last = feats[-1]
    assert (last["offsets"][last["start_positions"]][0] == s_char and last["end_positions"]
            > last["start_positions"])
    assert all(f["start_positions"] == 0 for f in feats[:-2])
    out = fake_outputs(feats, {len(feats) - 1: (last["start_positions"], last["end_positions"])},
                       np.random.default_rng(1))
    (pred,) = task.postprocess(out, feats, [ex], WINDOW_CTX)
    assert pred["answer"] == "the end" and pred["start"] == s_char


def test_max_answer_length_and_context_only(word_tok):
    context = " ".join(WORDS[:20])
    ex = example(context, WORDS[3])
    feats = task.featurize([ex], word_tok, ctx(), training=True)
    (f,) = feats
    q_tokens = [i for i, o in enumerate(f["offsets"]) if o is None]
    out = fake_outputs(feats, {0: (f["start_positions"], f["end_positions"])}, np.random.default_rng(0),
                       high=2.0)
    out["start_logits"][0][q_tokens] += 50.0  # the question and [CLS]/[SEP] are never part of an answer
    last = len(f["input_ids"]) - 2
    out["end_logits"][0][last] += 3.0  # a long span scoring higher ...
    first_ctx = next(i for i, o in enumerate(f["offsets"]) if o is not None)
    out["start_logits"][0][first_ctx] += 3.0
    (p,) = task.postprocess(out, feats, [ex], ctx())
    assert p["answer"] == context  # 20 tokens: within the default 30
    (p,) = task.postprocess(out, feats, [ex], ctx(max_answer_length=3))
    assert p["answer"] == WORDS[3]  # ... and every span starting at the first word is too long for 3 tokens


ODD_CONTEXT = ("Le café\u00a0crème  est servi\tà Zürich — naïve 🙂 Ünïcödé\u2003text,\u3000ça\u200bva ; "
               "l'élève\n\nrésumé   déjà-vu «\u202fsüß\u202f» ÅNGSTRÖM fin.")
ODD_ANSWERS = ["café\u00a0crème", "servi\tà Zürich", "naïve 🙂 Ünïcödé\u2003text", "ça\u200bva",
               "l'élève\n\nrésumé",
               "déjà-vu", "süß", "ÅNGSTRÖM fin", "Le"]


@pytest.mark.parametrize("cased", [False, True])
@pytest.mark.parametrize("max_length", [384, 24])
def test_character_offsets_round_trip_exactly(cased, max_length):
    tok = train_tokenizer([ODD_CONTEXT, "où est le café ?"] * 3, vocab_size=300, min_frequency=1, cased=cased)
    exs = [example(ODD_CONTEXT, a, question="où est le café ?", qid=str(i))
           for i, a in enumerate(ODD_ANSWERS)]
    c = ctx(max_length, doc_stride=4, max_question_length=8)
    feats = task.featurize(exs, tok, c, training=True)
    assert tok.truncation is None and tok.padding is None  # the caller's tokenizer is left as it was
    for f in feats:  # every context token maps onto exactly its characters, no whitespace included
        for o in f["offsets"]:
            if o is not None:
                piece = ODD_CONTEXT[o[0]:o[1]]
                assert piece and piece == piece.strip()
    spans = {}
    for i, f in enumerate(feats):
        if f["start_positions"] and f["example"] not in {feats[j]["example"] for j in spans}:
            spans[i] = (f["start_positions"], f["end_positions"])
    assert sorted(feats[j]["example"] for j in spans) == list(range(len(exs)))  # each answer in some window
    preds = task.postprocess(fake_outputs(feats, spans, np.random.default_rng(0)), feats, exs, c)
    for ex, p in zip(exs, preds):
        a = ex["answers"][0]
        assert p["answer"] == a["text"]
        assert (p["start"], p["end"]) == (a["answer_start"], a["answer_start"] + len(a["text"]))
        assert ODD_CONTEXT[p["start"]:p["end"]] == p["answer"]


def test_long_question_is_cut_and_stride_checked(word_tok):
    question = " ".join(WORDS[:30]) + " ?"
    ex = example(" ".join(WORDS[30:]), WORDS[35], question=question)
    (f, *_) = task.featurize([ex], word_tok, ctx(40, max_question_length=10, doc_stride=8), training=True)
    assert f["token_type_ids"].count(0) == 10 + 2  # [CLS] + 10 question tokens + [SEP]
    assert f["offsets"][f["start_positions"]] is not None
    long = example(" ".join(WORDS * 3), WORDS[35], question=question, qid="long")
    with pytest.raises(ConfigError,
                       match=r"--doc-stride 128 must be smaller than the context window of question 'long': "
                       r"max length 128 - 31 question tokens - 3 special tokens = 94 tokens"):
        task.featurize([ex, long], word_tok, ctx(128), training=False)
    assert len(task.featurize([ex], word_tok, ctx(128), training=False)) == 1  # no windows


# ---- null threshold (SQuAD 2.0) ----------------------------------------------------------------
def test_null_threshold_calibration_improves_f1(word_tok):
    context = " ".join(WORDS[:12])
    # (answer, gold start token, null - best span score): with the default threshold 0, A is
    # wrongly unanswered; D is rightly unanswered only while the threshold stays below 1.5
    cases = [("A", WORDS[2], 1.0), ("B", WORDS[5], -2.0), ("C", None, 3.0), ("D", None, 1.5)]
    exs = [example(context, a, qid=q) for q, a, _ in cases]
    feats = task.featurize(exs, word_tok, ctx(), training=True)
    assert len(feats) == 4
    out = fake_outputs(feats, {}, np.random.default_rng(0), high=0)
    first_ctx = next(i for i, o in enumerate(feats[0]["offsets"]) if o is not None)
    for i, (f, (_, a, diff)) in enumerate(zip(feats, cases)):
        # D's decoy: WORDS[1]
        s, e = (f["start_positions"], f["end_positions"]) if a else (first_ctx + 1, first_ctx + 1)
        out["start_logits"][i][s] = out["end_logits"][i][e] = 5.0  # best span: 10
        out["start_logits"][i][0] = out["end_logits"][i][0] = (10.0 + diff) / 2  # [CLS]
    v2 = ctx(state=task.fit_state(exs))
    assert v2.state == {"version_2_with_negative": True}
    before = task.compute_metrics(task.postprocess(out, feats, exs, v2), exs, v2)
    assert before["f1"] == pytest.approx(75.0)
    update = task.calibrate(out, feats, exs, v2)
    assert update == {"null_score_threshold": pytest.approx(1.0, abs=1e-4)}
    preds = task.postprocess(out, feats, exs, v2.with_state(update))
    assert [p["answer"] for p in preds] == [WORDS[2], WORDS[5], "", ""]
    assert [(p["start"], p["end"]) for p in preds][2:] == [(-1, -1), (-1, -1)]
    assert task.compute_metrics(preds, exs, v2)["f1"] == pytest.approx(100.0)
    assert task.calibrate(out, feats[:2], exs[:2], v2) == {}  # SQuAD 1.1 data: nothing to tune
    v1 = task.postprocess(out, feats, exs, ctx(state=task.fit_state(exs[:2])))  # a v1 model never answers ""
    assert all(p["answer"] for p in v1)


# ---- learning and parity -----------------------------------------------------------------------
FACTS = {
    ("color", "car"): ["red", "blue", "green", "yellow", "dark grey", "light pink"],
    ("name", "dog"): ["rex", "max", "buddy", "fido", "spot"],
    ("size", "house"): ["big", "small", "tiny", "huge"],
    ("city", "town"): ["paris", "london", "rome", "oslo", "new york", "los angeles"],
}


def qa_rows(n: int, seed: int, facts: int = 4) -> list[dict]:
    """Contexts stating ``facts`` random facts; the question asks for one of them."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        keys = rng.sample(list(FACTS), facts)
        values = {k: rng.choice(FACTS[k]) for k in keys}
        context, starts = "", {}
        for attr, thing in keys:
            prefix = f"the {thing} is "  # the question's attribute word is not in the context
            starts[(attr, thing)] = len(context) + len(prefix)
            context += f"{prefix}{values[(attr, thing)]} . "
        ask = rng.choice(keys)
        rows.append({"id": f"{seed}-{i}", "question": f"what is the {ask[0]} of the {ask[1]} ?",
                     "context": context.strip(),
                     "answers": [{"text": values[ask], "answer_start": starts[ask]}]})
    return rows


def test_learns_to_answer_and_loads_in_transformers(tmp_path, base_model_factory, monkeypatch):
    from transformers import BertForQuestionAnswering

    from mlmkit.train import plots

    def not_installed():  # the run's curves.png, which no assertion reads, is not drawn (half a second)
        raise ConfigError("plotting needs matplotlib", "pip install 'mlmkit[plots]'")

    monkeypatch.setattr(plots, "_pyplot", not_installed)

    train, dev = qa_rows(500, 0), qa_rows(100, 1)
    base = base_model_factory([r["context"] for r in train] + [r["question"] for r in train], vocab_size=200)
    jsonl(tmp_path / "train.jsonl", train)
    jsonl(tmp_path / "dev.jsonl", dev)
    out = tmp_path / "run"
    options = {"doc_stride": 16, "max_question_length": 16}
    # 500 steps: 10 of 10 seeds (base and fine-tuning) reached EM >= 98, at 400 steps 7 of 8 (one 75: the
    # question is read after ~150-400 steps; chance is 25). Batches of 24, a quarter less to compute than 32:
    # seeds 0-20 reached EM >= 93 but one (77), as many as at 32 (seeds 0-3 and 11-20: one 60); at 16, 2 of 11
    # were under 80
    run_finetune("qa", base, tmp_path / "train.jsonl", out, steps=500, batch_size=24, lr=2e-3,
                 warmup_ratio=0.1,
             max_length=64, progress=False, options=options)
    metrics = evaluate_run(out, tmp_path / "dev.jsonl", predictions=tmp_path / "pred.jsonl")
    assert metrics["exact_match"] >= 80.0 and metrics["f1"] >= metrics["exact_match"]
    preds = [json.loads(line) for line in (tmp_path / "pred.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [p["id"] for p in preds] == [r["id"] for r in dev]
    assert all(r["context"][p["start"]:p["end"]] == p["answer"] for p, r in zip(preds, dev) if p["start"]
               >= 0)

    # the run directory is a transformers BertForQuestionAnswering with the same logits
    hf, info = BertForQuestionAnswering.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    t, net, tok, meta = load_finetuned(out)
    exs = read(tmp_path / "dev.jsonl")[:8]
    feats = t.featurize(exs, tok, meta.context(t.resolve_options(saved=meta.options)), training=False)
    batch = {k: torch.from_numpy(v) for k, v in pad_features(feats, 0).items()}
    assert len({len(f["input_ids"]) for f in feats}) > 1  # padding inside the batch
    hf.eval()
    with torch.no_grad():
        ours, theirs = net(**batch), hf(**batch)
    torch.testing.assert_close(ours["start_logits"], theirs.start_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours["end_logits"], theirs.end_logits, atol=1e-5, rtol=0)


@pytest.mark.slow  # 18 s; test_learns_to_answer_and_loads_in_transformers is the fast learning test
def test_learns_squad2_no_answer_and_saves_the_calibrated_threshold(tmp_path, base_model_factory):
    def rows(n: int, seed: int) -> list[dict]:
        out, rng = qa_rows(n, seed, facts=3), random.Random(seed)
        for r in out:
            if rng.random() < 0.3:  # ask about the fact the context does not state
                attr, thing = next(k for k in FACTS if f"the {k[1]} is " not in r["context"])
                r.update(question=f"what is the {attr} of the {thing} ?", answers=[], is_impossible=True)
        return out

    train, dev = rows(600, 0), rows(100, 1)
    base = base_model_factory([r["context"] for r in train] + [r["question"] for r in train], vocab_size=200)
    jsonl(tmp_path / "train.jsonl", train)
    jsonl(tmp_path / "dev.jsonl", dev)
    out = tmp_path / "run"
    run_finetune("qa", base, tmp_path / "train.jsonl", out, eval_file=tmp_path / "dev.jsonl", steps=600,
                 batch_size=32,
             lr=2e-3, warmup_ratio=0.1, max_length=64, progress=False,
                 options={"doc_stride": 16, "max_question_length": 16})
    meta = json.loads((out / "mlmkit.json").read_text(encoding="utf-8"))
    state = meta["task_state"]
    assert state["version_2_with_negative"] is True and isinstance(state["null_score_threshold"], float)
    metrics = evaluate_run(out, tmp_path / "dev.jsonl", predictions=tmp_path / "pred.jsonl")
    assert metrics["exact_match"] >= 80.0  # 30% impossible: answering everything would score at most 70
    preds = [json.loads(line) for line in (tmp_path / "pred.jsonl").read_text(encoding="utf-8").splitlines()]
    said_none = [p["answer"] == "" for p in preds]
    assert sum(a == b.get("is_impossible", False) for a, b in zip(said_none, dev)) >= 80


def test_model_loss_matches_transformers_definition():
    from mlmkit.models.config import ModelConfig

    cfg = ModelConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=32)
    net = task.build_model(cfg, ctx())
    assert set(net.state_dict()) >= {"qa_outputs.weight", "qa_outputs.bias"}
    assert not any(k.startswith("bert.pooler") for k in net.state_dict())
    ids = torch.randint(5, 50, (3, 7))
    sp, ep = torch.tensor([0, 2, 9]), torch.tensor([0, 4, 3])  # 9 lies outside: ignored, as transformers
    out = net(ids, start_positions=sp, end_positions=ep)
    assert out["start_logits"].shape == out["end_logits"].shape == (3, 7)
    ce = torch.nn.CrossEntropyLoss(ignore_index=7)
    want = (ce(out["start_logits"], sp.clamp(0, 7)) + ce(out["end_logits"], ep.clamp(0, 7))) / 2
    torch.testing.assert_close(out["loss"], want)
    assert set(task.outputs) == {"start_logits", "end_logits"} and "loss" not in net(ids)


def test_inference_path_does_not_import_torch():
    """The ONNX runtime reads, featurizes and postprocesses with this module and must not pay for torch."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from mlmkit_tasks.qa import task\n"
        "from mlmkit.text.tokenizer import train_tokenizer\n"
        "tok = train_tokenizer(['the dog is rex . who is the dog ?'] * 3, vocab_size=100, min_frequency=1)\n"
        "from mlmkit.registry import TaskContext, get_task\n"
        "c = TaskContext(max_length=32, options=get_task('qa').resolve_options())\n"
        "ex = task.from_input({'question': 'who is the dog ?', 'context': 'the dog is rex .'}, c.options)\n"
        "fs = task.featurize([ex], tok, c, training=False)\n"
        "out = {k: [np.zeros(len(f['input_ids'])) for f in fs] for k in ('start_logits', 'end_logits')}\n"
        "task.postprocess(out, fs, [ex], c)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
