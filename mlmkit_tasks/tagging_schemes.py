"""Tag schemes and the one chunk decoder that the tagging task's predictions and metrics share.

Tags are "O" or PREFIX-TYPE with the prefixes of IOB1, IOB2 or BIOES (``PREFIXES``: those each
``scheme`` option allows). ``chunks`` follows conlleval (the CoNLL-2000 evaluation script) as
seqeval's default mode extends it to BIOES: a chunk ends after E-/S-, before B-/S-/O, or at a type
change; it starts at B-/S-, at I-/E- after O/E-/S-, or at a type change. These rules read IOB1, IOB2
and BIOES alike (an I- after O opens a chunk, as IOB1 needs and as conlleval does for ill-formed
IOB2), so the ``scheme`` option does not change decoding: an explicit scheme only refuses data whose
prefixes it lacks (E-/S- in IOB1/IOB2). ``detect_scheme`` names the scheme of tag sequences: BIOES
when any tag is E-/S-; IOB1 when some chunk opens with I- and every B- follows a tag of its own type
(B- only separates adjacent chunks); IOB2 otherwise. seqeval's strict IOBES mode differs from
conlleval only on ill-formed sequences (it drops a chunk without its E-/S-); conlleval's lenient
reading is kept. ``entity_scores``: entity-level precision, recall and F1 over those chunks.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from mlmkit.taskkit import Metrics

SCHEMES = ("auto", "iob1", "iob2", "bioes")
PREFIXES = {"auto": "BIES", "iob1": "BI", "iob2": "BI", "bioes": "BIES"}


def split_tag(tag: str) -> tuple[str, str]:
    """"B-PER" -> ("B", "PER"); "O" -> ("O", ""). The type is everything after the first hyphen."""
    if tag == "O":
        return "O", ""
    prefix, _, kind = tag.partition("-")
    return prefix, kind


def _chunk_ends(prev: str, tag: str, prev_kind: str, kind: str) -> bool:
    if prev in ("E", "S"):
        return True
    if prev in ("B", "I") and tag in ("B", "S", "O"):
        return True
    return prev != "O" and prev_kind != kind


def _chunk_starts(prev: str, tag: str, prev_kind: str, kind: str) -> bool:
    if tag in ("B", "S"):
        return True
    if tag in ("I", "E") and prev in ("O", "E", "S"):
        return True
    return tag != "O" and prev_kind != kind


def chunks(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """(type, start, end) of each chunk, ``end`` exclusive, with conlleval's rules (module docstring)."""
    found: list[tuple[str, int, int]] = []
    prev, prev_kind, begin = "O", "", 0
    for i, tag in enumerate([*tags, "O"]):  # the sentinel O closes a chunk open at the end
        p, kind = split_tag(tag)
        if _chunk_ends(prev, p, prev_kind, kind):
            found.append((prev_kind, begin, i))
        if _chunk_starts(prev, p, prev_kind, kind):
            begin = i
        prev, prev_kind = p, kind
    return found


def detect_scheme(tag_seqs: Sequence[Sequence[str]]) -> str:
    """"bioes", "iob1" or "iob2" by the rule of the module docstring."""
    i_opens, b_opens = False, False
    for tags in tag_seqs:
        prev, prev_kind = "O", ""
        for tag in tags:
            p, kind = split_tag(tag)
            if p in ("E", "S"):
                return "bioes"
            opens = prev == "O" or prev_kind != kind
            i_opens |= p == "I" and opens
            b_opens |= p == "B" and opens
            prev, prev_kind = p, kind
    return "iob1" if i_opens and not b_opens else "iob2"


def entity_scores(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> Metrics:
    """Entity-level micro precision / recall / F1 (0-1) and the same per type with its gold support.

    A predicted entity counts only when its type, start and end all equal a gold one; 0/0 is 0."""
    gold_sets: dict[str, set[tuple[int, int, int]]] = defaultdict(set)
    pred_sets: dict[str, set[tuple[int, int, int]]] = defaultdict(set)
    for n, (g, pr) in enumerate(zip(gold, pred)):
        for kind, a, b in chunks(g):
            gold_sets[kind].add((n, a, b))
        for kind, a, b in chunks(pr):
            pred_sets[kind].add((n, a, b))

    def prf(correct: int, n_pred: int, n_gold: int) -> tuple[float, float, float]:
        precision = correct / n_pred if n_pred else 0.0
        recall = correct / n_gold if n_gold else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return precision, recall, f1

    per_type: dict[str, dict[str, float]] = {}
    totals = [0, 0, 0]  # correct, predicted, gold
    for kind in sorted(set(gold_sets) | set(pred_sets)):
        counts = (len(gold_sets[kind] & pred_sets[kind]), len(pred_sets[kind]), len(gold_sets[kind]))
        totals = [t + c for t, c in zip(totals, counts)]
        p, r, f = prf(*counts)
        per_type[kind] = {"precision": p, "recall": r, "f1": f, "support": counts[2]}
    p, r, f = prf(*totals)
    return {"f1": f, "precision": p, "recall": r, "per_type": per_type}
