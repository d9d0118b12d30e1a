"""Tagging schemes (mlmkit_tasks/tagging_schemes.py): conlleval chunks of IOB1, IOB2 and BIOES, the
scheme detected, and entity metrics (seqeval as the oracle)."""

from __future__ import annotations

import random
import warnings

import pytest
from tagging_helpers import LABELS, ctx

from mlmkit_tasks.tagging import chunks, detect_scheme, entity_scores, task


@pytest.mark.parametrize(
    "tags, expected",
    [
        (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 2), ("LOC", 3, 4)]),  # IOB2
        (["I-PER", "I-PER", "B-PER", "O", "I-LOC"], [("PER", 0, 2), ("PER", 2, 3), ("LOC", 4, 5)]),  # IOB1
        # BIOES
        (["B-LOC", "I-LOC", "E-LOC", "S-PER", "S-PER"], [("LOC", 0, 3), ("PER", 3, 4), ("PER", 4, 5)]),
        # ill-formed
        (["O", "I-PER", "I-LOC", "E-LOC", "I-LOC"], [("PER", 1, 2), ("LOC", 2, 4), ("LOC", 4, 5)]),
        (["B-PER", "E-LOC"], [("PER", 0, 1), ("LOC", 1, 2)]),
        ([], []),
    ],
)
def test_chunks(tags, expected):
    assert chunks(tags) == expected


def test_detect_scheme():
    assert detect_scheme([["B-PER", "I-PER", "O"], ["O", "B-LOC"]]) == "iob2"
    assert detect_scheme([["I-PER", "I-PER", "B-PER", "O"], ["I-LOC"]]) == "iob1"
    assert detect_scheme([["B-PER", "E-PER"], ["O"]]) == "bioes"
    assert detect_scheme([["I-PER", "O", "B-LOC"]]) == "iob2"  # a B- opening after O is not IOB1
    assert detect_scheme([["O"]]) == "iob2"


def test_metrics_hand_computed_with_partial_matches():
    gold = [["B-PER", "I-PER", "O", "B-LOC", "I-LOC"], ["B-ORG", "O", "B-PER"]]
    pred = [["B-PER", "O", "O", "B-LOC", "I-LOC"], ["B-LOC", "O", "B-PER"]]
    # gold: PER(0-2) LOC(3-5) | ORG(0) PER(2); pred: PER(0) LOC(3-5) | LOC(0) PER(2)
    # exact matches: LOC(3-5), PER(2) of sentence 2 -> 2 of 4 predicted, 2 of 4 gold
    m = entity_scores(gold, pred)
    assert (m["precision"], m["recall"], m["f1"]) == (0.5, 0.5, 0.5)
    assert m["per_type"]["PER"] == {"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2}
    assert m["per_type"]["LOC"] == {"precision": 0.5, "recall": 1.0, "f1": pytest.approx(2 / 3), "support": 1}
    assert m["per_type"]["ORG"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert entity_scores([["O"]], [["O"]])["f1"] == 0.0  # nothing to find: 0/0 reads as 0, as seqeval

    examples = [{"tokens": ["w"] * len(g), "tags": g} for g in gold]
    got = task.compute_metrics([{"tags": p} for p in pred], examples, ctx(labels=(*LABELS, "B-ORG")))
    assert list(got)[:3] == ["f1", "precision", "recall"] and got["f1"] == 0.5


TAGSETS = {
    "iob1": ["O", "I-PER", "I-LOC", "I-ORG", "B-PER", "B-LOC"],
    "iob2": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"],
    "bioes": ["O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "I-LOC", "E-LOC", "S-LOC"],
}


@pytest.mark.parametrize("scheme", sorted(TAGSETS))
def test_metrics_equal_seqeval_on_random_sequences(scheme: str):
    """seqeval's default mode is conlleval's lenient chunking, ill-formed sequences included."""
    from seqeval.metrics import classification_report

    rng = random.Random(scheme)
    tags = TAGSETS[scheme]
    for _ in range(200):
        gold = [[rng.choice(tags) for _ in range(rng.randint(0, 12))] for _ in range(rng.randint(1, 5))]
        pred = [[t if rng.random() < 0.6 else rng.choice(tags) for t in g] for g in gold]
        mine = entity_scores(gold, pred)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # seqeval warns on 0/0 and reads it as 0
            ref = classification_report(gold, pred, output_dict=True, zero_division=0)
        ref_types = {k: v for k, v in ref.items() if not k.endswith(" avg")}
        assert set(mine["per_type"]) == set(ref_types)
        for kind, r in ref_types.items():
            m = mine["per_type"][kind]
            assert (m["precision"], m["recall"], m["f1"], m["support"]) == pytest.approx(
                (r["precision"], r["recall"], r["f1-score"], r["support"]))
        if "micro avg" in ref:
            r = ref["micro avg"]
            assert (mine["precision"], mine["recall"],
                    mine["f1"]) == pytest.approx((r["precision"], r["recall"], r["f1-score"]))
        else:
            assert mine["f1"] == 0.0


def test_bioes_strict_mode_differs_only_on_ill_formed_chunks():
    """What the module docstring claims: seqeval's strict IOBES agrees on well-formed BIOES and drops
    ill-formed chunks that conlleval (and this task) keep."""
    from seqeval.metrics import f1_score
    from seqeval.scheme import IOBES

    well = [["B-PER", "E-PER", "O", "S-LOC"], ["S-PER", "B-LOC", "I-LOC", "E-LOC"]]
    pred = [["B-PER", "E-PER", "O", "O"], ["S-PER", "B-LOC", "E-LOC", "O"]]
    strict = f1_score(well, pred, mode="strict", scheme=IOBES)
    assert entity_scores(well, pred)["f1"] == pytest.approx(strict) == pytest.approx(f1_score(well, pred))
    ill = [["B-PER", "I-PER", "O"]]  # no E-: conlleval keeps the chunk, strict IOBES drops it
    assert entity_scores(ill, ill)["f1"] == 1.0 == f1_score(ill, ill)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert f1_score(ill, ill, mode="strict", scheme=IOBES) == 0.0
