"""train/timing.py: seconds by phase add up across a run, and the line names each phase that took any."""

from __future__ import annotations

import time

import pytest

from mlmkit.train.timing import PHASES, Timings


def test_phases_add_up_and_the_total_holds_them() -> None:
    t = Timings()
    for _ in range(3):
        with t.phase("forward"):
            time.sleep(0.01)
    with pytest.raises(KeyError), t.phase("backward"):  # a phase that fails still counts its time
        time.sleep(0.01)
        raise KeyError("x")
    got = t.as_json()
    assert set(got) == {"forward", "backward", "total"} and set(got) - {"total"} <= set(PHASES)
    assert got["forward"] >= 0.03 and got["backward"] >= 0.01
    assert got["forward"] + got["backward"] <= got["total"]
    line = t.line()
    assert line.startswith("where the time went: forward 0.") and "backward" in line and "load" not in line
