"""A batch job's input cut into windows (mlmkit/jobs/windows.py)."""

from __future__ import annotations

from mlmkit.jobs.batch import windows


def test_windows_cover_the_input_in_order_and_resume_past_finished_ones() -> None:
    ws = list(windows(range(10), 4))
    assert [(w.index, w.first, w.items) for w in ws] == [(0, 1, [0, 1, 2, 3]), (1, 5, [4, 5, 6, 7]),
                                                         (2, 9, [8, 9])]
    assert [w.index for w in windows(range(10), 4, skip=2)] == [2]
