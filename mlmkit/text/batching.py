"""Length-bucketed batching and padding shared by training, evaluation and the ONNX runtime.

No torch here: the runtime imports this module. Batches are padded to their longest member only;
callers put results back in input order with the indices each batch carries (evaluation.run_features).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def bucket_batches(lengths: Sequence[int], batch_size: int, max_tokens: int | None = None,
                   run_tokens: int | None = None) -> list[list[int]]:
    """Indices grouped into batches of similar length (sorted, longest first): inference order.

    ``max_tokens``: a batch also ends before its padded size (rows x its longest) would pass this
    many tokens (a batch always has at least one row). On the CPU, batches whose activations stay
    in cache run faster than larger ones (see pipeline.CPU_BATCH_ACTIVATIONS).

    ``run_tokens``: what one more batch costs, in padded tokens; given, the cuts are the ones of
    least total cost (batches x run_tokens + padded tokens, within the limits above), found
    exactly (dynamic programming over the sorted lengths). Without it a batch is cut only when it
    is full, which pads a short text to a long one's length wherever they share a batch: on the
    CPU a run costs a fixed time (the weights are read once per run) plus a time per padded token,
    and a few more, shorter batches cost less than padding (see pipeline.CPU_RUN_TOKENS)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    if run_tokens is not None:
        return _least_cost(order, [lengths[i] for i in order], batch_size, max_tokens, run_tokens)
    if max_tokens is None:
        return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    batches: list[list[int]] = []
    for i in order:
        if not batches or len(batches[-1]) >= batch_size or (len(batches[-1])
                                                             + 1) * lengths[batches[-1][0]] > max_tokens:
            batches.append([])
        batches[-1].append(i)
    return batches


def _least_cost(order: list[int], longest_first: list[int], batch_size: int, max_tokens: int | None,
                run_tokens: int) -> list[list[int]]:
    """``order`` cut into contiguous batches of least total cost: each batch ``run_tokens`` plus its
    rows x its first (longest) length. best[i]: the least cost of the first i; O(n x batch_size)."""
    n = len(order)
    best = [0] + [-1] * n
    start = [0] * (n + 1)
    for j in range(n):
        longest = longest_first[j]
        rows = min(n - j, batch_size)
        if max_tokens is not None:
            rows = min(rows, max(1, max_tokens // max(1, longest)))
        base = best[j] + run_tokens
        for i in range(j + 1, j + rows + 1):
            cost = base + (i - j) * longest
            if best[i] < 0 or cost < best[i]:
                best[i], start[i] = cost, j
    cuts, i = [], n
    while i > 0:
        cuts.append((start[i], i))
        i = start[i]
    return [order[a:b] for a, b in reversed(cuts)]


def shuffled_buckets(lengths: Sequence[int], batch_size: int, rng: random.Random,
                     window: int = 50) -> list[list[int]]:
    """Training order: shuffle, sort within windows of ``window`` batches by length, cut batches,
    then shuffle the batches. Most padding goes away while every epoch still sees a new order."""
    idx = list(range(len(lengths)))
    rng.shuffle(idx)
    span = batch_size * window
    batches: list[list[int]] = []
    for s in range(0, len(idx), span):
        chunk = sorted(idx[s : s + span], key=lambda i: lengths[i])
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    return batches


def shuffled_groups(groups: Sequence[Sequence[int]], lengths: Sequence[int], batch_size: int,
                    rng: random.Random,
                    window: int = 50, keys: Sequence[frozenset[Any]] | None = None,
                    moved: set[int] | None = None) -> list[list[int]]:
    """Training order for features that must stay with their example's: whole ``groups`` (feature
    indices of one example) shuffled, sorted by their longest feature within windows, packed into
    batches of at most ``batch_size`` features (a larger group alone), the batches shuffled.

    ``keys``: each group's values that no other group of its batch may share (its texts); a group
    that would bring one in a second time waits for a later batch (still in length order, across
    windows too) and is added to ``moved``. No batch holds a value twice across its groups; a value in
    more groups than there are batches around them leaves smaller batches at the end."""
    order = list(range(len(groups)))
    rng.shuffle(order)
    longest = [max(lengths[i] for i in g) for g in groups]
    batches: list[list[int]] = []
    span = window * max(1, batch_size // max(1, max(len(g) for g in groups)))
    waiting: list[int] = []
    for s in range(0, len(order), span):
        todo = sorted(waiting + order[s : s + span], key=lambda g: longest[g])
        last, waiting = s + span >= len(order), []
        while todo:
            current: list[int] = []
            seen: set[Any] = set()
            later: list[int] = []
            full = False
            for n, gi in enumerate(todo):
                if current and len(current) + len(groups[gi]) > batch_size:
                    later.extend(todo[n:])
                    full = True
                    break
                if keys is not None and not seen.isdisjoint(keys[gi]):
                    later.append(gi)
                    if moved is not None:
                        moved.add(gi)
                    continue
                current.extend(groups[gi])
                if keys is not None:
                    seen |= keys[gi]
            if later and not full and not last:
                waiting = todo  # the rest cannot fill a batch without a copy: they join the next window's
                break
            batches.append(current)
            todo = later
    rng.shuffle(batches)
    return batches


def pad_features(
    features: Sequence[Mapping[str, Any]], pad_id: int, extra: Sequence[str] = (), label_pad: int = -100
) -> dict[str, np.ndarray]:
    """Stack ``features`` into int64 arrays padded to the longest input_ids of the batch.

    input_ids pad with ``pad_id``, attention_mask / token_type_ids with 0 (an absent
    token_type_ids is all zeros); ``extra`` keys pad with ``label_pad`` when they are per-token
    lists, and are stacked when they are scalars or numpy arrays (fixed-size targets, such as the
    multi-hot labels of multi-label classification)."""
    T = max(len(f["input_ids"]) for f in features)
    B = len(features)
    out = {
        "input_ids": np.full((B, T), pad_id, dtype=np.int64),
        "attention_mask": np.zeros((B, T), dtype=np.int64),
        "token_type_ids": np.zeros((B, T), dtype=np.int64),
    }
    for r, f in enumerate(features):
        n = len(f["input_ids"])
        out["input_ids"][r, :n] = f["input_ids"]
        out["attention_mask"][r, :n] = 1
        if f.get("token_type_ids") is not None:
            out["token_type_ids"][r, :n] = f["token_type_ids"]
    for k in extra:
        v0 = features[0][k]
        if isinstance(v0, np.ndarray):
            arr = np.stack([f[k] for f in features])
        elif isinstance(v0, (list, tuple)):
            arr = np.full((B, T), label_pad, dtype=np.int64)
            for r, f in enumerate(features):
                arr[r, : len(f[k])] = f[k]
        else:
            arr = np.asarray([f[k] for f in features])
            arr = arr.astype(np.float32) if arr.dtype.kind == "f" else arr.astype(np.int64)
        out[k] = arr
    return out
