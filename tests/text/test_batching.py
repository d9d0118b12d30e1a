"""Length-bucketed batching (mlmkit/text/batching.py), property-based (hypothesis): every index once,
within the limits, cut where padding costs more than a run."""

from __future__ import annotations

from collections.abc import Iterator

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlmkit.text.batching import bucket_batches

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


def padded_cost(batches: list[list[int]], lengths: list[int], run_tokens: int) -> int:
    return sum(run_tokens + len(b) * max(lengths[i] for i in b) for b in batches)


@SETTINGS
@given(st.lists(st.integers(1, 512), max_size=300), st.integers(1, 64),
       st.one_of(st.none(), st.integers(1, 4096)),
       st.one_of(st.none(), st.integers(0, 64)))
def test_bucket_batches_cover_every_index_once_within_limits(lengths, batch_size, max_tokens, run_tokens):
    batches = bucket_batches(lengths, batch_size, max_tokens, run_tokens)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(b and len(b) <= batch_size for b in batches)
    if max_tokens is not None:  # rows x longest within the budget, unless one row alone is over it
        assert all(len(b) == 1 or len(b) * max(lengths[i] for i in b) <= max_tokens for b in batches)
    order = [lengths[i] for b in batches for i in b]
    assert order == sorted(order, reverse=True)  # longest first: similar lengths share a batch
    # the cuts of least cost: never dearer than full batches, nor than one text a run
    if run_tokens is not None:
        cost = padded_cost(batches, lengths, run_tokens)
        assert cost <= padded_cost(bucket_batches(lengths, batch_size, max_tokens), lengths, run_tokens)
        assert cost <= padded_cost([[i] for i in range(len(lengths))], lengths, run_tokens)
        if 0 < len(lengths) <= 9:  # and the least of every way to cut the sorted order that keeps the limits
            assert cost == min(padded_cost(c, lengths, run_tokens) for c in _cuts(order_of(lengths))
                               if all(len(b) <= batch_size and (len(b) == 1 or max_tokens is None
                                                                or len(b) * lengths[b[0]] <= max_tokens)
                                      for b in c))


def order_of(lengths: list[int]) -> list[int]:
    return sorted(range(len(lengths)), key=lambda i: -lengths[i])


def _cuts(order: list[int]) -> Iterator[list[list[int]]]:
    for mask in range(2 ** (len(order) - 1)):
        out, at = [], 0
        for k in range(1, len(order)):
            if mask >> (k - 1) & 1:
                out.append(order[at:k])
                at = k
        yield [*out, order[at:]]


def test_bucket_batches_cut_where_padding_costs_more_than_a_run() -> None:
    lengths = [40, 10, 40, 10, 11]
    # full batches only: three short texts padded to 40
    assert bucket_batches(lengths, 32) == [[0, 2, 4, 1, 3]]
    assert bucket_batches(lengths, 32, run_tokens=16) == [[0, 2], [4, 1, 3]]  # 16 + 80 + 16 + 33 < 16 + 200
    assert bucket_batches(lengths, 32, run_tokens=200) == [[0, 2, 4, 1, 3]]  # a run dearer than the padding
    # equal lengths: the fewest runs the batch size allows
    assert len(bucket_batches([5] * 5, 2, run_tokens=1)) == 3
