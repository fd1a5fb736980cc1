"""Where a call's time goes: the device timeline of a CUDA graph of repeated calls, kernel by kernel.

`bench/attention_gpu.py --parts timeline` replays its graph of 36 attention calls (one a layer) under
torch.profiler (CUPTI records the kernels a graph replays) and summarises the kernels' intervals:

- per kernel: how many ran and their median duration. Under programmatic dependent launch a kernel's
  interval starts when its blocks are placed, which may be long before its predecessor has finished
  (they wait in `griddepcontrol.wait`), so a duration is residence, not work;
- per consecutive pair A -> B: the median of B's start minus A's end (negative: B was resident while
  A ran) and of B's end minus A's end (how long B ran on after A finished: its own work after the wait);
- the period: the median start-to-start time of the first kernel of a call (the time a call takes in
  the chain).

`summarize` takes plain `mcore.profile.trace.DeviceEvent` records, so it is tested on the CPU.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from itertools import pairwise
from typing import Any


def short(name: str, width: int = 48) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def summarize(events: Sequence[Any]) -> dict:
    """{"kernels": {name: {"count", "median_us"}}, "pairs": {"A -> B": {"count", "start_after_end_us",
    "end_after_end_us"}}, "period_us": median start-to-start of the first kernel's name, "first": that name}."""
    ev = sorted(events, key=lambda e: e.start)
    if not ev:
        return {"kernels": {}, "pairs": {}, "period_us": None, "first": None}
    durations: dict[str, list[float]] = defaultdict(list)
    for e in ev:
        durations[e.name].append((e.end - e.start) * 1e6)
    pairs: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for a, b in pairwise(ev):
        pairs[f"{short(a.name)} -> {short(b.name)}"].append(((b.start - a.end) * 1e6, (b.end - a.end) * 1e6))
    first = ev[0].name
    starts = [e.start for e in ev if e.name == first]
    return {
        "kernels": {short(n): {"count": len(d), "median_us": statistics.median(d)} for n, d in durations.items()},
        "pairs": {
            k: {
                "count": len(v),
                "start_after_end_us": statistics.median(x for x, _ in v),
                "end_after_end_us": statistics.median(y for _, y in v),
            }
            for k, v in pairs.items()
        },
        "period_us": statistics.median((b - a) * 1e6 for a, b in pairwise(starts)) if len(starts) > 1 else None,
        "first": short(first),
    }


def profile_graph(g: Any, replays: int = 3) -> list:
    """A captured CUDA graph (bench/flash_decode_sweep.capture_graph) replayed `replays` times under the
    profiler: the device events of those replays."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from mcore.profile.trace import device_events

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            g.replay()
        torch.cuda.synchronize()
    return device_events(prof)


def table(name: str, summary: dict) -> list[str]:
    """Printable lines for one variant's summary."""
    period = summary["period_us"]
    lines = [f"-- {name}: a call every {period:.2f} us" if period else f"-- {name}"]
    for k, v in summary["kernels"].items():
        lines.append(f"   kernel {k}: {v['count']} ran, median {v['median_us']:.2f} us resident")
    for k, v in summary["pairs"].items():
        lines.append(
            f"   {k}: starts {v['start_after_end_us']:+.2f} us after the first ends, "
            f"ends {v['end_after_end_us']:+.2f} us after it ({v['count']})"
        )
    return lines
