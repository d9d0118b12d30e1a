"""Pretraining end to end on a generated language with real structure: the model must learn it.

The language: two topics with disjoint vocabularies; a document keeps one topic. A sentence is
"DET COLOUR NOUN VERB DET COLOUR NOUN END" with the topic's words (each colour has its own noun).
Which DET, END, VERB... fill a masked slot depends on the topic, which only the context tells: a
model that ignores the context cannot beat the majority baseline (~13%), one that reads it gets
~45% within 200 steps. A random B for NSP comes from another document, which has the other topic
half the time: NSP accuracy can reach ~75%, and the lengths of A and B carry no signal (test_instances).
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from conftest import run_pretrain

from mlmkit.files import read_json
from mlmkit.models.config import ModelConfig
from mlmkit.models.core import BertForPreTraining
from mlmkit.rundir.checkpoint import load_state_dict, load_weights
from mlmkit.rundir.config import load_config, save_config
from mlmkit.text.tokenizer import load_tokenizer, save_tokenizer, train_tokenizer
from mlmkit.train.pretrain import split_heldout

N_COLOURS = 4


def make_words(n: int, rng: random.Random) -> list[str]:
    """Pronounceable made-up words (two consonant-vowel syllables) the tokenizer keeps whole."""
    out: set[str] = set()
    while len(out) < n:
        out.add("".join(rng.choice("bdfgklmnprstvz") + rng.choice("aeiou") for _ in range(2)))
    words = sorted(out)
    rng.shuffle(words)
    return words


def language(n_topics: int = 2, seed: int = 0) -> list[dict[str, list[str]]]:
    size = 2 * N_COLOURS + 5
    w = make_words(n_topics * size, random.Random(seed))
    topics = []
    for t in range(n_topics):
        v = w[t * size : (t + 1) * size]
        topics.append({"det": v[0], "colours": v[1 : 1 + N_COLOURS],
                       "nouns": v[1 + N_COLOURS : 1 + 2 * N_COLOURS],
                       "verbs": v[1 + 2 * N_COLOURS : 4 + 2 * N_COLOURS], "end": v[-1]})
    return topics


def sentence(topic: dict[str, list[str]], rng: random.Random) -> str:
    c1, c2 = rng.randrange(N_COLOURS), rng.randrange(N_COLOURS)
    return " ".join([topic["det"], topic["colours"][c1], topic["nouns"][c1], rng.choice(topic["verbs"]),
                     topic["det"], topic["colours"][c2], topic["nouns"][c2], topic["end"]])


def write_corpus(path: Path, topics, n_docs: int, seed: int) -> Path:
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        topic = rng.choice(topics)
        docs.append("\n".join(sentence(topic, rng) for _ in range(rng.randint(4, 10))))
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def tiny_config(path: Path, vocab_size: int, dropout: float = 0.0) -> Path:
    save_config(ModelConfig(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=256, max_position_embeddings=128, hidden_dropout_prob=dropout,
                            attention_probs_dropout_prob=dropout), path)
    return path


@pytest.fixture(autouse=True)
def _no_curves(monkeypatch):
    """No test here reads a run's curves.png: each run ends as where matplotlib is not installed (drawing
    them costs about half a second a run; tests/train/test_plots.py checks a pretraining run's)."""
    from mlmkit.errors import ConfigError
    from mlmkit.train import plots

    def not_installed():
        raise ConfigError("plotting needs matplotlib", "pip install 'mlmkit[plots]'")

    monkeypatch.setattr(plots, "_pyplot", not_installed)


@pytest.fixture(scope="module")
def lang_dir(tmp_path_factory) -> tuple[Path, list]:
    d = tmp_path_factory.mktemp("lang")
    topics = language()
    train = write_corpus(d / "train.txt", topics, 600, seed=1)
    write_corpus(d / "eval.txt", topics, 300, seed=2)
    tok = train_tokenizer(train.read_text().splitlines(), vocab_size=200, min_frequency=1)
    save_tokenizer(tok, d / "tok")
    tiny_config(d / "config.json", tok.get_vocab_size())
    return d, topics


def test_learns_the_generated_language(lang_dir, tmp_path, one_thread):
    d, topics = lang_dir
    run = tmp_path / "run"
    m = run_pretrain([d / "train.txt"], run, tokenizer=d / "tok" / "tokenizer.json", config=d / "config.json",
                 steps=200, batch_size=32, seq_len=64, lr=3e-3, eval_file=d / "eval.txt", eval_every=200,
                 save_every=1000, progress=False)
    # held-out MLM accuracy well above always guessing the most frequent masked token (200 steps, seeds 0-3:
    # accuracy 0.45-0.47 against 0.37-0.39 needed, NSP 0.73-0.76, loss ratio 0.36-0.39, 20 of 20 topic words)
    assert m["eval_mlm_majority_baseline"] < 0.2
    assert m["eval_mlm_accuracy"] > m["eval_mlm_majority_baseline"] + 0.25, m
    assert m["eval_mlm_loss"] < 0.5 * math.log(m["eval_mlm_uniform_baseline"] ** -1)
    assert m["eval_perplexity"] == pytest.approx(math.exp(m["eval_mlm_loss"]))
    assert m["eval_nsp_accuracy"] > 0.6, m  # chance is 0.5; the topic cue gives up to ~0.75

    # training loss fell clearly (metrics.jsonl: one record per 10 steps, evaluations besides)
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in recs if "loss" in r]
    assert len(losses) == 20 and losses[-1] < 0.5 * losses[0]
    assert all(r["tokens_per_s"] > 0 for r in recs if "loss" in r)

    # the context is used: a masked DET or END is the one of the surrounding text's topic
    tok = load_tokenizer(run)
    model = BertForPreTraining(load_config(run)).eval()
    load_weights(model, load_state_dict(run))
    rng = random.Random(5)
    hits, n = 0, 0
    for topic in topics:
        for slot in ("det", "end"):
            for _ in range(5):
                words = [sentence(topic, rng) for _ in range(3)]
                middle = words[1].split()
                middle[0 if slot == "det" else -1] = "[MASK]"
                enc = tok.encode(" ".join([words[0], " ".join(middle), words[2]]))
                with torch.no_grad():
                    logits = model(torch.tensor([enc.ids]))["prediction_logits"][0]
                guess = int(logits[enc.ids.index(tok.token_to_id("[MASK]"))].argmax())
                hits += guess == tok.token_to_id(topic[slot])
                n += 1
    assert hits / n >= 0.9, f"{hits}/{n} topic words filled in"


def test_run_directory_contents(lang_dir, tmp_path, one_thread):
    d, _ = lang_dir
    run = tmp_path / "run"
    run_pretrain([d / "train.txt"], run, tokenizer=d / "tok" / "tokenizer.json", config=d / "config.json",
             steps=4, batch_size=8, seq_len=32, eval_every=2, save_every=1000, keep_last=1, progress=False)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "tokenizer_config.json",
                 "mlmkit.json", "metrics.jsonl"):
        assert (run / name).is_file(), name
    cfg = read_json(run / "config.json")
    assert cfg["model_type"] == "bert" and cfg["architectures"] == ["BertForPreTraining"]
    meta = read_json(run / "mlmkit.json")
    assert meta["task"] == "pretraining" and meta["max_length"] == 32 and meta["nsp"] is True
    assert meta["final_metrics"]["step"] == 4 and "eval_nsp_accuracy" in meta["final_metrics"]
    assert meta["train_args"]["steps"] == 4
    # no held-out file and < 10 documents would mean no evaluation; here the corpus is split
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in evals if "eval_mlm_accuracy" in r] == [2, 4]
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-0000004"]  # keep_last=1


def test_no_nsp_and_whole_word(lang_dir, tmp_path, one_thread):
    d, _ = lang_dir
    run = tmp_path / "run"
    m = run_pretrain([d / "train.txt"], run, tokenizer=d / "tok" / "tokenizer.json", config=d / "config.json",
                 steps=3, batch_size=8, seq_len=32, nsp=False, whole_word=True, eval_file=d / "eval.txt",
                 progress=False)
    assert "eval_mlm_accuracy" in m and "eval_nsp_accuracy" not in m and "nsp_loss" not in m
    meta = read_json(run / "mlmkit.json")
    assert meta["nsp"] is False and meta["whole_word"] is True


def test_tokenizer_is_trained_on_the_corpus_when_not_given(lang_dir, tmp_path, one_thread):
    d, topics = lang_dir
    run = tmp_path / "run"
    run_pretrain([d / "train.txt"], run, vocab_size=120, steps=2, batch_size=4, seq_len=32, progress=False)
    tok = load_tokenizer(run)
    assert tok.get_vocab_size() <= 120
    assert tok.token_to_id(topics[0]["det"]) is not None  # a frequent word of the corpus is one token
    assert read_json(run / "config.json")["vocab_size"] == tok.get_vocab_size()
    assert read_json(run / "config.json")["hidden_size"] == 128  # the tiny preset


def test_vocabulary_mismatch_is_refused_before_training(lang_dir, tmp_path):
    from mlmkit.errors import ConfigError

    d, _ = lang_dir
    bad = tiny_config(tmp_path / "config.json", vocab_size=999)
    with pytest.raises(ConfigError, match="vocab_size 999"):
        run_pretrain([d / "train.txt"], tmp_path / "run", tokenizer=d / "tok" / "tokenizer.json", config=bad,
                 steps=2, progress=False)
    assert not (tmp_path / "run").exists()


def test_heldout_split_keeps_documents_whole(lang_dir):
    from mlmkit.train.corpus.shards import tokenize_corpus

    d, _ = lang_dir
    tok = load_tokenizer(d / "tok" / "tokenizer.json")
    full = tokenize_corpus([d / "train.txt"], tok, d / "cache")
    train, held = split_heldout(full)
    assert held is not None and held.num_docs == 30 and train.num_docs == full.num_docs - 30
    assert len(train.tokens) + len(held.tokens) == len(full.tokens)
    assert [s.tolist() for s in held.document(0)] == [s.tolist() for s in full.document(full.num_docs - 30)]


# ---- a seed reproduces a run -------------------------------------------------------------------------------
_TRAIN_TOKENIZERS = """
import hashlib, json, sys
from mlmkit.text.tokenizer import train_tokenizer
texts = json.load(open(sys.argv[1]))
for kind in ("wordpiece", "bpe"):
    tok = train_tokenizer(texts, vocab_size=1500, min_frequency=1, kind=kind)
    print(kind, hashlib.sha256(tok.to_str().encode()).hexdigest())
"""


@pytest.fixture(scope="module")
def docstrings(tmp_path_factory) -> list[str]:
    """Standard-library docstrings: natural text with many words of equal count, the ties a tokenizer
    trainer must break the same way in every process."""
    from mlmkit.quickstart.retrieval_set import write_retrieval_set

    d = tmp_path_factory.mktemp("docstrings")
    write_retrieval_set(d / "set", max_documents=400)
    return [json.loads(line)["text"] for f in ("corpus.jsonl", "queries.jsonl")
            for line in open(d / "set" / f)]


def test_tokenizer_training_is_the_same_in_every_process(docstrings, tmp_path):
    import hashlib
    import subprocess
    import sys

    (tmp_path / "texts.json").write_text(json.dumps(docstrings))
    here = {k: hashlib.sha256(train_tokenizer(docstrings, vocab_size=1500, min_frequency=1,
                                              kind=k).to_str().encode()).hexdigest()
            for k in ("wordpiece", "bpe")}
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _TRAIN_TOKENIZERS, str(tmp_path / "texts.json")],
                             capture_output=True,
                             text=True, check=True).stdout
        # (progress bars print blank lines)
        assert dict(line.split() for line in out.splitlines() if line.strip()) == here
    tok = train_tokenizer(docstrings, vocab_size=1500, min_frequency=1)
    assert tok.encode("Return the number of items.").tokens == ["[CLS]", "return", "the", "number", "of",
                                                                "items", ".", "[SEP]"]
    assert tok.token_to_id("##s") is not None and tok.token_to_id("[MASK]") == 4
    # x and o may start a word too, as in BERT's
    small = train_tokenizer(["lox lox lox"], vocab_size=40, min_frequency=1)
    assert small.encode("xo").tokens == ["[CLS]", "x", "##o", "[SEP]"]


def test_a_seed_reproduces_a_pretraining_run_in_another_process(docstrings, tmp_path, one_thread):
    import subprocess
    import sys

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(docstrings) + "\n")
    run_pretrain([corpus], tmp_path / "a", vocab_size=1200, steps=3, batch_size=4, seq_len=32, seed=1,
                 progress=False)
    subprocess.run([sys.executable, "-m", "mlmkit", "pretrain", str(corpus), "--out", str(tmp_path / "b"),
                    "--vocab-size",
                    "1200", "--steps", "3", "--batch-size", "4", "--seq-len", "32", "--seed", "1"],
                   # the suite's OMP_NUM_THREADS=1: one thread, as this process
                   check=True, capture_output=True)
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (
        tmp_path / "b" / "tokenizer.json").read_bytes()
    a, b = load_state_dict(tmp_path / "a"), load_state_dict(tmp_path / "b")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
