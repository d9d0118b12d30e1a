"""The tagging task: readers and their errors, windows and their merge, character offsets, and a tiny
model that learns a regular pattern (conlleval chunks and metrics: test_tagging_schemes.py; words and
windows of them: test_tagging_words.py)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_finetune
from tagging_helpers import LABELS, ctx, plugin

from mlmkit.errors import ConfigError, DataFormatError
from mlmkit.registry import BATCH, SEQUENCE, Task
from mlmkit.text.tokenizer import train_tokenizer
from mlmkit_tasks.tagging import task

CTX = ctx()


def read(path: Path, **options):
    return task.read(path, plugin.resolve_options(options))


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def jsonl(path: Path, rows: list[tuple[list[str], list[str]]]) -> Path:
    return write(path, "".join(json.dumps({"tokens": t, "tags": g}) + "\n" for t, g in rows))


# ---- the plugin --------------------------------------------------------------------------------
def test_registered_with_its_contract():
    assert plugin.task is task
    assert isinstance(task, Task)
    assert (plugin.name, plugin.formats, plugin.metrics[0],
            plugin.label_names) == ("tagging", ("conll", "jsonl"), "f1", ("labels",))
    assert plugin.hf_architecture == "BertForTokenClassification" and plugin.command == "tag"
    assert plugin.outputs == {"probabilities": (BATCH, SEQUENCE, "label")}


def test_module_does_not_import_torch():
    code = "import sys, mlmkit_tasks.tagging; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---- readers -----------------------------------------------------------------------------------
def test_read_conll(tmp_path: Path):
    f = write(tmp_path / "d.conll", (
        "-DOCSTART- -X- -X- O\n\n"
        "Mr NNP B-NP O\nSmith NNP I-NP B-PER\nin IN B-PP O\nParis NNP B-NP B-LOC\n\n\n"
        "-DOCSTART- -X- -X- O\n"
        "Zoë\tI-PER\r\nSaldaña\tI-PER\r\n"  # tab-separated, CRLF, no final newline
    ))
    ex = read(f)
    assert [e["tokens"] for e in ex] == [["Mr", "Smith", "in", "Paris"], ["Zoë", "Saldaña"]]
    assert [e["tags"] for e in ex] == [["O", "B-PER", "O", "B-LOC"], ["I-PER", "I-PER"]]
    assert [e["line"] for e in ex] == [3, 10]
    assert task.label_list(ex) == ["B-LOC", "B-PER", "I-PER", "O"]


def test_read_jsonl_and_bioes(tmp_path: Path):
    f = jsonl(tmp_path / "d.jsonl",
              [(["New", "York", "City"], ["B-LOC", "I-LOC", "E-LOC"]), (["Bob"], ["S-PER"])])
    ex = read(f)
    assert [e["tags"] for e in ex] == [["B-LOC", "I-LOC", "E-LOC"], ["S-PER"]]
    assert task.label_list(ex) == ["B-LOC", "E-LOC", "I-LOC", "S-PER"]
    with pytest.raises(DataFormatError,
                       match=r"d\.jsonl, line 1, field 'tags': tag 'E-LOC' has a prefix that IOB2 lacks"):
        read(f, scheme="iob2")


@pytest.mark.parametrize(
    "name, text, match",
    [
        ("a.jsonl", '{"tokens": ["a"], "tags": ["O"]}\n{"tokens": ["a", "b"], "tags": ["O"]}\n',
         r"a\.jsonl, line 2, field 'tags': 1 tags for 2 tokens"),
        ("a.jsonl", '{"tokens": ["a"], "tags": ["O"]}\n\n{"tokens": ["a"], "tags": ["O"]\n',
         r"a\.jsonl, line 3: malformed JSON"),
        ("a.jsonl", '{"words": ["a"], "tags": ["O"]}\n',
         r"line 1, field 'tokens': no field 'tokens'; the record has: words, tags"),
        ("a.jsonl", '{"tokens": "a b", "tags": ["O"]}\n',
         r"line 1, field 'tokens': must be a list of strings"),
        ("a.conll", "Mr O\nSmith\n", r"a\.conll, line 2, field 'tag': one column \('Smith'\)"),
        ("a.conll", "Mr O\nSmith PER\n",
         r"a\.conll, line 2, field 'tag': tag 'PER' is not 'O' or PREFIX-TYPE"),
        ("a.conll", "", r"a\.conll: no sentences"),
        ("a.conll", "-DOCSTART- O\n\n\n", r"a\.conll: no sentences"),
        ("a.jsonl", "\n", r"a\.jsonl: no sentences"),
    ],
)
def test_read_errors_name_file_line_and_field(tmp_path: Path, name: str, text: str, match: str):
    with pytest.raises(DataFormatError, match=match):
        read(write(tmp_path / name, text))


def test_unknown_option_values_are_refused(tmp_path: Path):
    f = jsonl(tmp_path / "d.jsonl", [(["a"], ["O"])])
    with pytest.raises(ConfigError,
                       match="task option --scheme must be one of: auto, iob1, iob2, bioes, got 'iob3'"):
        read(f, scheme="iob3")
    with pytest.raises(ConfigError,
                       match="task option --aggregation must be one of: first, average, max, got 'mean'"):
        ctx(aggregation="mean")


# ---- features, windows, merge ------------------------------------------------------------------
WORDS = ("mr smith lives in paris and mrs jones works in london near the old river by the bridge "
         "zoë saldaña visits são paulo").split()


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer([" ".join(WORDS)] * 3, vocab_size=60, min_frequency=1)


def test_featurize_labels_first_subtoken(tok):
    ex = [{"tokens": ["Smithsonian", "in", "Paris"], "tags": ["B-PER", "O", "B-LOC"], "line": 1}]
    f = task.featurize(ex, tok, ctx(64), training=True)
    assert len(f) == 1
    words = f[0]["word_ids"]
    assert words[0] == words[-1] == -1 and words.count(0) > 1  # "smithsonian" is several sub-tokens here
    labels = f[0]["labels"]
    first = [t for t in range(1, len(words) - 1) if words[t] != words[t - 1]]
    assert [labels[t] for t in first] == [1, 4, 0]  # B-PER, O, B-LOC
    assert all(labels[t] == -100 for t in range(len(words)) if t not in first)
    f_all = task.featurize(ex, tok, ctx(64, label_all_tokens=True), training=True)
    assert f_all[0]["labels"][1 : 1 + words.count(0)] == [1] * words.count(0)
    assert f_all[0]["input_ids"] == f[0]["input_ids"] and len(f[0]["token_type_ids"]) == len(words)


def test_featurize_refuses_a_tag_the_model_never_saw(tok, tmp_path: Path):
    ex = read(write(tmp_path / "eval.conll", "Mr O\nSmith B-PER\n\nin O\nRome B-GPE\n"))
    with pytest.raises(DataFormatError, match=r"eval\.conll, line 5, field 'tags': tag 'B-GPE' \(token 2, "
                                              r"'Rome'\) was not in"):
        task.featurize(ex, tok, CTX, training=False)
    ex = read(jsonl(tmp_path / "eval.jsonl", [(["a"], ["O"]), (["in", "Rome"], ["O", "B-GPE"])]))
    with pytest.raises(DataFormatError, match=r"eval\.jsonl, line 2, field 'tags': tag 'B-GPE'"):
        task.compute_metrics([{"tags": ["O"]}, {"tags": ["O", "O"]}], ex, CTX)


def fake_outputs(features, gold_ids, n_labels, wrong=None):
    """A deterministic stand-in for a model: right on every word except, when ``wrong`` is given,
    words touching a cut window edge, where it is confidently wrong (label ``wrong``, with a higher
    probability than its right answers). A correct merge never reads a word from such a window
    when another window holds it away from the cuts."""
    probs = []
    for f in features:
        s, e, n = f["window"]
        words = f["word_ids"]
        p = np.full((len(words), n_labels), 0.01 / n_labels)
        for t, w in enumerate(words):
            if w < 0:
                continue
            span = [s + u - 1 for u, v in enumerate(words) if v == w]  # the word's sub-tokens, example-wide
            at_cut = (span[0] == s and s > 0) or (span[-1] == e - 1 and e < n)
            if wrong is not None and at_cut:
                p[t, wrong] += 0.99
            else:
                p[t, gold_ids[f["example"]][w]] += 0.9
        probs.append(p)
    return {"probabilities": probs}


def test_long_sentence_is_windowed_and_merged_without_truncation(tok):
    rng = random.Random(0)
    labels = LABELS
    words = [rng.choice(WORDS) for _ in range(120)]
    tags = [rng.choice(["O", "O", "B-PER", "B-LOC"]) for _ in words]
    examples = [{"tokens": words, "tags": tags}, {"tokens": ["in", "paris"], "tags": ["O", "B-LOC"]}]
    feats = task.featurize(examples, tok, ctx(32), training=False)
    long = [f for f in feats if f["example"] == 0]
    assert len(long) > 8 and all(len(f["input_ids"]) <= 32 for f in feats)
    assert {w for f in long for w in f["word_ids"]} - {-1} == set(range(120))
    assert sum(f["window"][1] - f["window"][0] for f in long) > long[0]["window"][2]  # they overlap
    gold_ids = [[labels.index(t) for t in ex["tags"]] for ex in examples]
    wrong = labels.index("I-LOC")
    outputs = fake_outputs(feats, gold_ids, len(labels), wrong)
    for agg in ("first", "average", "max"):
        preds = task.postprocess(outputs, feats, examples, ctx(32, aggregation=agg))
        assert [p["tags"] for p in preds] == [ex["tags"] for ex in examples], agg
    # the check has teeth: reading each word from its first window, or its last, meets wrong words
    for pick in (min, max):
        read = [pick(k for k, f in enumerate(feats) if w in f["word_ids"] and f["example"] == 0)
                for w in range(120)]
        got = [int(np.argmax(outputs["probabilities"][k][feats[k]["word_ids"].index(w)]))
               for w, k in enumerate(read)]
        assert wrong in got
    train_feats = task.featurize(examples, tok, ctx(32), training=True)
    assert [f["input_ids"] for f in train_feats] == [f["input_ids"] for f in feats]
    first_tokens = [sum(1 for f in train_feats if f["example"] == 0 for t, w in enumerate(f["word_ids"])
                        if w == v and f["labels"][t] != -100) for v in range(120)]
    assert min(first_tokens) >= 1  # every word is trained somewhere


def test_aggregation_first_average_max():
    feats = [{"input_ids": [2, 5, 6, 7, 3], "word_ids": [-1, 0, 0, 0, -1], "window": [0, 3, 3], "example": 0}]
    rows = np.array([[0, 0, 0], [0.50, 0.40, 0.10], [0.00, 0.90, 0.10], [0.04, 0.00, 0.96], [0, 0, 0]])
    got = {agg: task.postprocess({"probabilities": [rows]}, feats, [{"tokens": ["xyz"]}],
                                 ctx(labels=("B-A", "B-B", "B-C"), aggregation=agg))[0]
           for agg in ("first", "average", "max")}
    assert {a: (g["tags"], round(g["scores"][0], 4)) for a, g in got.items()} == {
        "first": (["B-A"], 0.5), "average": (["B-B"], round(1.3 / 3, 4)), "max": (["B-C"], 0.96)}
    assert got["max"]["entities"] == [{"type": "C", "start": 0, "end": 3, "text": "xyz", "score": 0.96}]


# ---- runtime inputs and character offsets ------------------------------------------------------
@pytest.mark.parametrize("item, entity_texts", [
    ("Mr Zoë\u00a0Saldaña  moved to São\u2009Paulo,\n\tnear cafe\u0301 Ü\u200b.",
     ["Zoë\u00a0Saldaña", "São\u2009Paulo", "cafe\u0301 Ü\u200b"]),
    ({"tokens": ["Mr", "Zoë", "Saldaña", "moved", "to", "São", "Paulo", "near", "cafe\u0301", "Ü", "\u200b",
                 "."]},
     ["Zoë Saldaña", "São Paulo", "cafe\u0301 Ü \u200b"]),
])
def test_entity_offsets_round_trip(tok, item, entity_texts):
    ex = task.from_input(item, CTX.options)
    want = {"Zoë": "B-PER", "Saldaña": "I-PER", "São": "B-LOC", "Paulo": "I-LOC", "cafe\u0301": "B-LOC",
            "Ü": "I-LOC", "\u200b": "I-LOC"}
    labels = LABELS
    gold_ids = [[labels.index(want.get(w, "O")) for w in ex["tokens"]]]
    feats = task.featurize([ex], tok, ctx(8), training=False)  # windows too
    assert len(feats) > 1
    pred = task.postprocess(fake_outputs(feats, gold_ids, len(labels)), feats, [ex], CTX)[0]
    assert [e["text"] for e in pred["entities"]] == entity_texts
    text = item if isinstance(item, str) else " ".join(item["tokens"])
    for e in pred["entities"]:
        assert text[e["start"] : e["end"]] == e["text"] and 0.9 < e["score"] <= 1.0
    assert [e["type"] for e in pred["entities"]] == ["PER", "LOC", "LOC"]


def test_from_input_records():
    assert task.from_input({"text": "in Rome"}, CTX.options)["offsets"] == [(0, 2), (3, 7)]
    with pytest.raises(DataFormatError, match="a record with 'text' or 'tokens'"):
        task.from_input({"sentence": "in Rome"}, CTX.options)


# ---- the model ---------------------------------------------------------------------------------
CITIES = "paris london berlin madrid rome vienna oslo lisbon dublin prague".split()
NAMES = "smith jones brown taylor wilson davies evans thomas".split()
FIRST, LAST = "john mary peter anna paul laura".split(), "jackson harris clark lewis young king".split()
FILLER = ("the a big small old new house river road dog cat saw met walked lived went to and with from near "
          "by was").split()


def pattern_sentence(rng: random.Random) -> tuple[list[str], list[str]]:
    """Capitalised words after "in" are LOC, after "mr" PER, "dr First Last" a two-word PER."""
    toks, tags = [], []
    for _ in range(rng.randint(2, 5) + rng.choice([0, 0, 10])):  # a third are longer than the windows
        r = rng.random()
        if r < 0.25:
            toks += ["in", rng.choice(CITIES).capitalize()]
            tags += ["O", "B-LOC"]
        elif r < 0.4:
            toks += ["mr", rng.choice(NAMES).capitalize()]
            tags += ["O", "B-PER"]
        elif r < 0.5:
            toks += ["dr", rng.choice(FIRST).capitalize(), rng.choice(LAST).capitalize()]
            tags += ["O", "B-PER", "I-PER"]
        else:
            toks.append(rng.choice(FILLER))
            tags.append("O")
    return toks, tags


def test_finetune_learns_pattern_and_loads_in_transformers(tmp_path: Path, base_model_factory):
    from mlmkit.train.finetune import evaluate_run, load_finetuned

    rng = random.Random(0)
    train, test = [pattern_sentence(rng) for _ in range(240)], [pattern_sentence(rng) for _ in range(80)]
    jsonl(tmp_path / "train.jsonl", train)
    jsonl(tmp_path / "test.jsonl", test)
    base = base_model_factory([" ".join(t) for t, _ in train], vocab_size=200)
    run = tmp_path / "run"
    run_finetune("tagging", base, tmp_path / "train.jsonl", run, epochs=6, batch_size=32, lr=3e-3,
                 max_length=24,
             progress=False, seed=0)
    assert max(len(t) for t, _ in test) > 24  # evaluation goes through windows
    metrics = evaluate_run(run, tmp_path / "test.jsonl", predictions=tmp_path / "pred.jsonl")
    assert metrics["f1"] >= 0.8, metrics
    assert set(metrics["per_type"]) == {"LOC", "PER"}
    preds = [json.loads(line) for line in (tmp_path / "pred.jsonl").read_text().splitlines()]
    assert [len(p["tags"]) for p in preds] == [len(t) for t, _ in test]

    from transformers import BertForTokenClassification

    _, net, tok, meta = load_finetuned(run)
    hf, info = BertForTokenClassification.from_pretrained(run, output_loading_info=True,
                                                          attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert hf.config.id2label == dict(enumerate(meta.labels or ()))
    hf.eval()
    ids = torch.tensor([tok.encode("mr smith went to paris").ids, tok.encode("in rome").ids + [0] * 3])
    mask = (ids != 0).long()
    ours = net(ids, attention_mask=mask)
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(ours["logits"], theirs, atol=1e-5)
    assert torch.allclose(ours["probabilities"].sum(-1), torch.ones(ids.shape))
    labels = torch.full(ids.shape, -100)
    assert net(ids, attention_mask=mask, labels=labels)["loss"].item() == 0.0  # no target: zero, not NaN
