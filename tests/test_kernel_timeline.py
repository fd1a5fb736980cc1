"""bench/kernel_timeline.py: the summary of a replayed graph's device timeline, on synthetic events."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mcore.profile.trace import DeviceEvent

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import kernel_timeline  # noqa: E402

US = 1e-6


def calls(n: int, period: float, walk: float, merge_start: float, merge_end: float) -> list[DeviceEvent]:
    """n calls of (walk, merge) every `period` us: the walk resident for `walk` us, the merge placed
    `merge_start` us after the walk's start and ending `merge_end` us after it."""
    out = []
    for i in range(n):
        t = i * period
        out.append(DeviceEvent("walk", t * US, (t + walk) * US))
        out.append(DeviceEvent("merge", (t + merge_start) * US, (t + merge_end) * US))
    return out


def test_a_chain_of_early_launched_pairs_is_summarised_per_kernel_and_per_pair():
    # the merge placed 1 us into the walk (early launch), ending 2 us after the walk; a call every 7 us
    ev = calls(36, period=7.0, walk=5.0, merge_start=1.0, merge_end=7.0)
    s = kernel_timeline.summarize(list(reversed(ev)))  # any order: sorted by start
    assert s["first"] == "walk" and s["period_us"] == pytest.approx(7.0)
    assert s["kernels"]["walk"] == {"count": 36, "median_us": pytest.approx(5.0)}
    assert s["kernels"]["merge"]["median_us"] == pytest.approx(6.0)
    wm, mw = s["pairs"]["walk -> merge"], s["pairs"]["merge -> walk"]
    assert wm["count"] == 36 and mw["count"] == 35
    assert wm["start_after_end_us"] == pytest.approx(-4.0)  # resident 4 us before the walk ended
    assert wm["end_after_end_us"] == pytest.approx(2.0)  # its own work after the walk
    assert mw["start_after_end_us"] == pytest.approx(0.0) and mw["end_after_end_us"] == pytest.approx(5.0)
    lines = kernel_timeline.table("1024 native", s)
    assert lines[0] == "-- 1024 native: a call every 7.00 us"
    assert any("walk -> merge: starts -4.00 us after the first ends, ends +2.00 us after it (36)" in x for x in lines)


def test_long_names_are_shortened_and_nothing_recorded_says_so():
    name = "kernel_cutlass_attention_kernel_" + "x" * 80
    s = kernel_timeline.summarize([DeviceEvent(name, 0.0, 1e-6)])
    (short,) = s["kernels"]
    assert len(short) == 48 and short.endswith("...") and s["period_us"] is None and s["pairs"] == {}
    empty = kernel_timeline.summarize([])
    assert empty == {"kernels": {}, "pairs": {}, "period_us": None, "first": None}
    assert kernel_timeline.table("x", empty) == ["-- x"]
