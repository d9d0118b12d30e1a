"""A task whose loss spans an example's features (multiple choice: one sequence per choice, softmax
over the choices): ``group_features`` keeps an example's features in one training batch and hands
the model each feature's example, so the loss can be written."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from conftest import make_base_model, run_finetune

from mlmkit import registry
from mlmkit.errors import TaskError
from mlmkit.taskkit import BATCH, EXAMPLE, iter_jsonl, tokenizer_settings
from mlmkit.text.batching import shuffled_groups

ANIMALS = "cat dog cow hen fox owl bee ant".split()
PETS = ("cat", "dog")
SEEN: list[list[int]] = []  # the example numbers of each training batch the model saw


class MultipleChoice:
    name = "multiple-choice-test"
    description = "pick the one right choice of several"
    metrics = ("accuracy",)
    outputs = {"score": (BATCH,)}
    group_features = True

    def read(self, path, options):
        return [{"question": r.text("question"), "choices": r.fields()["choices"],
                 "answer": int(r.fields()["answer"])}
                for r in iter_jsonl(path)]

    def featurize(self, examples, tokenizer, ctx, *, training):
        feats = []
        with tokenizer_settings(tokenizer, max_length=ctx.max_length) as tok:
            for i, ex in enumerate(examples):
                for j, enc in enumerate(tok.encode_batch([(ex["question"], c) for c in ex["choices"]])):
                    feats.append({"input_ids": enc.ids, "token_type_ids": enc.type_ids, EXAMPLE: i,
                                  **({"labels": int(j == ex["answer"])} if training else {})})
        return feats

    def build_model(self, config, ctx):
        from torch import nn

        from mlmkit.model import BertModel, init_weights

        class Chooser(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.bert = BertModel(config, add_pooling_layer=True)
                self.scorer = nn.Linear(config.hidden_size, 1)
                init_weights(self, config.initializer_range)

            def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, example=None):
                _, pooled = self.bert(input_ids, attention_mask, token_type_ids)
                out = {"score": self.scorer(pooled).squeeze(-1)}
                if labels is not None:  # softmax over each example's choices: needs them all in this batch
                    SEEN.append(example.tolist())
                    loss = 0.0
                    groups = int(example.max()) + 1
                    for g in range(groups):
                        scores, gold = out["score"][example == g], labels[example == g]
                        loss = loss + nn.functional.cross_entropy(scores[None], gold.argmax()[None])
                    out["loss"] = loss / groups
                return out

        return Chooser()

    def postprocess(self, outputs, features, examples, ctx):
        scores: dict[int, list[float]] = {}
        for f, s in zip(features, outputs["score"]):
            scores.setdefault(f[EXAMPLE], []).append(float(s))
        return [{"choice": int(np.argmax(scores[i]))} for i in range(len(examples))]

    def compute_metrics(self, predictions, examples, ctx):
        return {"accuracy": float(np.mean([p["choice"] == e["answer"]
                                           for p, e in zip(predictions, examples)]))}


@pytest.fixture
def task():
    registry.reset()
    plugin = registry.register(MultipleChoice())
    yield plugin
    registry.reset()


def rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):  # the right choice is always a pet, the others never are
        pet = rng.choice(PETS)
        choices = rng.sample([a for a in ANIMALS if a not in PETS], rng.choice([2, 3, 4]))
        answer = rng.randrange(len(choices) + 1)
        choices.insert(answer, pet)
        out.append({"question": "which one is a pet ?", "choices": choices, "answer": answer})
    return out


def test_batches_hold_whole_examples_and_the_listwise_loss_learns(task, tmp_path: Path) -> None:
    train, dev = tmp_path / "train.jsonl", tmp_path / "dev.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows(96, 0)))
    dev.write_text("".join(json.dumps(r) + "\n" for r in rows(32, 1)))
    base = make_base_model(tmp_path / "base", [f"which one is a pet ? {a}" for a in ANIMALS] * 8)
    SEEN.clear()
    result = run_finetune(task.name, base, train, tmp_path / "run", eval_file=dev, steps=80, eval_every=40,
                          batch_size=10,
                          lr=2e-3, warmup_ratio=0.0)
    sizes = {i: len(r["choices"]) for i, r in enumerate(rows(96, 0))}
    assert SEEN
    for batch in SEEN:  # every example's choices are all there, numbered 0.. in the batch
        counts = np.bincount(batch)
        assert list(np.unique(batch)) == list(range(len(counts)))
        assert all(c in (3, 4, 5) for c in counts) and sum(counts) <= 10
    assert set(sizes.values()) == {3, 4, 5} and result["eval_accuracy"] >= 0.9, result


def test_shuffled_groups_packs_whole_groups() -> None:
    groups = [[0, 1, 2], [3], [4, 5, 6, 7, 8, 9, 10, 11], [12, 13]]
    lengths = list(range(14))
    batches = shuffled_groups(groups, lengths, 4, random.Random(0))
    assert sorted(i for b in batches for i in b) == list(range(14))
    for b in batches:
        held = [g for g in groups if set(g) & set(b)]
        assert all(set(g) <= set(b) for g in held)  # no group is split
        assert len(b) <= 4 or len(held) == 1  # a larger group is a batch of its own


def test_no_batch_holds_a_key_twice_and_the_moved_groups_are_counted() -> None:
    """Groups of two features whose texts repeat (a query with several positives): every group in
    exactly one batch, no key twice in a batch, the batches full but for the end, and the groups that
    waited are the ones counted."""
    rng = random.Random(1)
    groups = [[2 * i, 2 * i + 1] for i in range(600)]
    # 150 queries, 4 positives each
    keys = [frozenset({f"q{rng.randrange(150)}", f"d{i}"}) for i in range(600)]
    lengths = [rng.randrange(5, 60) for _ in range(1200)]
    moved: set[int] = set()
    batches = shuffled_groups(groups, lengths, 32, random.Random(0), window=4, keys=keys, moved=moved)
    assert sorted(i for b in batches for i in b) == list(range(1200))
    for b in batches:
        held = [gi for gi, g in enumerate(groups) if g[0] in b]
        seen = [k for gi in held for k in keys[gi]]
        assert len(seen) == len(set(seen)), b
    assert sum(len(b) < 32 for b in batches) <= 3
    assert 0 < len(moved) < 600
    # without keys: other batches
    assert shuffled_groups(groups, lengths, 32, random.Random(0), window=4) != batches


@pytest.mark.parametrize("mangle, match", [
    (lambda feats: [{k: v for k, v in f.items() if k != EXAMPLE} for f in feats],
     "feature 0 has no valid 'example' index \\(None\\)"),
    (lambda feats: [{**f, EXAMPLE: str(f[EXAMPLE])} for f in feats],
     "feature 0 has no valid 'example' index \\('0'\\)"),
    (lambda feats: [{**f, EXAMPLE: f[EXAMPLE] + 10_000} for f in feats],
     "has no valid 'example' index \\(10000\\)"),
    # one of example 0's moved last
    (lambda feats: feats[1:] + feats[:1], "the features of example 0 are not together"),
    # two examples' features under one index (i // 2): the second half of the examples got none
    (lambda feats: [{**f, EXAMPLE: f[EXAMPLE] // 2} for f in feats],
     "4 of 8 examples got no feature \\(the first: example 4\\)"),
    (lambda feats: [f for f in feats if f[EXAMPLE] % 2 == 0],
     "4 of 8 examples got no feature \\(the first: example 1\\)"),
])
def test_a_grouped_plugin_that_mangles_example_is_one_line_naming_it(task, tmp_path: Path, monkeypatch,
                                                                     mangle, match) -> None:
    """A plugin's mistake with "example" is one line naming the task and its package, never a
    traceback or examples silently merged into one."""
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows(8, 0)))
    base = make_base_model(tmp_path / "base", [f"which one is a pet ? {a}" for a in ANIMALS])
    featurize = task.featurize
    monkeypatch.setattr(task, "featurize", lambda *a, **kw: mangle(featurize(*a, **kw)))
    with pytest.raises(TaskError, match=f"task 'multiple-choice-test' \\(<runtime>\\): .*{match}"):
        run_finetune(task.name, base, train, tmp_path / "run", steps=1, batch_size=10)
