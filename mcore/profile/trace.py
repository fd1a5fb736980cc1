"""Kernel times of a compiled step from a profiler trace (torch.profiler, CUPTI on CUDA).

Inductor's provenance map lists the kernel calls of a compiled graph in call order (generated
C++/Triton kernels by name, extern calls such as `extern_kernels.mm` or `torch.ops.mcore.gemv.default`).
Each call is found in the trace as the profiler sees it:

- on the host, a generated kernel is a range named after it (Triton launches record one when a
  profiler runs; C++ kernels with `cpp.enable_kernel_profile`, prefixed `graph_N_`), an extern
  call is its dispatcher op (`aten::mm`, `mcore::gemv`). The calls are the children of the
  compiled graph's own range, matched in order; anything else there (allocation, the wrapper's
  bookkeeping) is host work between kernels.
- on CUDA, each device activity (kernel, copy, fill) is linked by the profiler's correlation to the
  host op that launched it, and so to the call whose range holds that op. Replaying a CUDA graph
  launches no host op per kernel, so each replayed step's activities are aligned by name with the
  sequence the same compiled code launched without the graph (the same kernels in the same order on
  one stream; a library may pick another kernel when captured, which then takes its call's place).

Time on the device: kernels may overlap (programmatic dependent launch starts the next kernel while
one drains), so each activity is charged only the part of its interval no earlier one covers, and
what no activity covers — before the step's next kernel, the next step's first included — is the
time between kernels (launch latency, dependencies). Charges and gaps add up to the step's span.

These functions take plain event records (`HostEvent`, `DeviceEvent`) so the bookkeeping is testable
without a GPU; `host_events`/`device_events` read them from a torch.profiler run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

STEP_RANGE = "mcore.profile.step"
_WRAPPER = "## Call CompiledFxGraph"  # the range Inductor's compiled module records around its calls


@dataclass
class HostEvent:
    name: str
    start: float  # seconds
    end: float
    id: int = 0  # the profiler's correlation id (device activities link to it)
    parent: HostEvent | None = field(default=None, repr=False)
    children: list[HostEvent] = field(default_factory=list, repr=False)


@dataclass
class DeviceEvent:
    name: str
    start: float  # seconds
    end: float
    link: int = 0  # correlation id of the host op that launched it (0: none known)


@dataclass
class StepTimes:
    """One step: seconds per call (index into the call list), the time no kernel covers, the device
    time of activities no call claims, and each call's device activity names (CUDA)."""

    calls: list[float]
    between: float
    unmapped: float = 0.0
    device_names: list[list[str]] = field(default_factory=list)
    gaps: int = 0  # how many stretches of idle time the step had

    @property
    def span(self) -> float:
        return sum(self.calls) + self.between + self.unmapped


# ------------------------------------------------------------------ matching calls to host events


def host_name(kernel: str) -> tuple[str, bool]:
    """The host-side name of a provenance kernel call and whether it is generated code (matched by
    name on the device too) rather than an extern call."""
    if kernel.startswith("extern_kernels."):
        return "aten::" + kernel.split(".", 1)[1], False
    parts = kernel.split(".")
    if kernel.startswith("torch.ops.") and len(parts) >= 4:
        return f"{parts[2]}::{parts[3]}", False
    if kernel.startswith("aten.") and len(parts) >= 2:
        return f"aten::{parts[1]}", False
    return kernel, True


def _matches(kernel: str, event_name: str) -> bool:
    name, generated = host_name(kernel)
    if event_name == name:
        return True
    return generated and re.fullmatch(r"graph_\d+_" + re.escape(name), event_name) is not None


def step_calls(step: HostEvent) -> list[HostEvent]:
    """The host events a step's compiled code made, in order: the children of the innermost range
    Inductor's compiled module records (all of them where a step ran several compiled graphs), or
    of the step's own range when there is none."""
    wrappers: list[HostEvent] = []
    todo = [step]
    while todo:
        ev = todo.pop()
        if ev.name.startswith(_WRAPPER):
            wrappers.append(ev)
        else:
            todo.extend(ev.children)
    if not wrappers:
        return sorted(step.children, key=lambda e: e.start)
    return sorted((c for w in wrappers for c in w.children), key=lambda e: e.start)


def align(kernels: Sequence[str], events: Sequence[HostEvent]) -> list[HostEvent | None]:
    """Each kernel call (in call order) matched to the first unclaimed host event after the
    previous match that has its name; None where the trace has none (its time is then unknown)."""
    out: list[HostEvent | None] = []
    pos = 0
    for k in kernels:
        j = next((j for j in range(pos, len(events)) if _matches(k, events[j].name)), None)
        out.append(None if j is None else events[j])
        if j is not None:
            pos = j + 1
    return out


def host_step(step: HostEvent, kernels: Sequence[str]) -> StepTimes:
    """CPU: each call's time is its range's; the rest of the step's range is host work between them."""
    matched = align(kernels, step_calls(step))
    calls = [ev.end - ev.start if ev is not None else 0.0 for ev in matched]
    gaps, covered = 0, step.start
    for ev in sorted((e for e in matched if e is not None), key=lambda e: e.start):
        gaps += ev.start > covered
        covered = max(covered, ev.end)
    gaps += step.end > covered
    return StepTimes(calls=calls, between=max(0.0, (step.end - step.start) - sum(calls)), gaps=gaps)


# ------------------------------------------------------------------ device activities


def launch_sequence(
    step: HostEvent, kernels: Sequence[str], device: Sequence[DeviceEvent], by_id: dict[int, HostEvent]
) -> list[tuple[DeviceEvent, int | None]]:
    """The device activities one step launched (linked to a host op inside `step`), in start order,
    each with the index of the kernel call whose host event holds its launch (None: launched by
    host work outside any call, such as the wrapper zeroing a buffer)."""
    matched = align(kernels, step_calls(step))
    call_of = {id(ev): i for i, ev in enumerate(matched) if ev is not None}
    out = []
    for d in sorted(device, key=lambda d: d.start):
        host = by_id.get(d.link)
        index: int | None = None
        inside = False
        while host is not None:
            if index is None and id(host) in call_of:
                index = call_of[id(host)]
            if host is step:
                inside = True
                break
            host = host.parent
        if inside:
            out.append((d, index))
    return out


def _head(names: Sequence[str]) -> list[str]:
    """The shortest start of a step's activity names that occurs once in it: where a step begins."""
    for k in range(1, min(len(names), 8) + 1):
        head = list(names[:k])
        if sum(list(names[i : i + k]) == head for i in range(len(names) - k + 1)) == 1:
            return head
    return list(names[: min(len(names), 8)])


def windows(sequence: Sequence[tuple[str, int | None]], device: Sequence[DeviceEvent]) -> list[list[DeviceEvent]]:
    """The steps in a trace of back-to-back replays (activities sorted by start): each from one
    occurrence of the step's first activities (`sequence`: (name, call index) per activity of the
    step as launched without the graph) to the next. A step cut short at its start is not one; the
    last holds the trace's tail and is left out (where its next step would start is unknown)."""
    acts = sorted(device, key=lambda d: d.start)
    head = _head([name for name, _ in sequence])
    if not head:
        return []
    names = [a.name for a in acts]
    starts = [i for i in range(len(acts) - len(head) + 1) if names[i : i + len(head)] == head]
    return [acts[a:b] for a, b in pairwise(starts)]


def assign(sequence: Sequence[tuple[str, int | None]], run: Sequence[DeviceEvent]) -> list[int | None]:
    """The kernel call of each activity of a replayed step: aligned by name with the same step's
    launches without the graph (difflib). Where a library picked other kernels under capture, the
    replaced run is the call's when the launches it replaces were all one call's; anything else
    (an activity the eager run lacks) is charged to no call."""
    import difflib

    ref = [name for name, _ in sequence]
    calls = [c for _, c in sequence]
    out: list[int | None] = [None] * len(run)
    matcher = difflib.SequenceMatcher(None, ref, [a.name for a in run], autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            out[j1:j2] = calls[i1:i2]
        elif op == "replace" and len(set(calls[i1:i2])) == 1:
            out[j1:j2] = [calls[i1]] * (j2 - j1)
    return out


def device_step(
    run: Sequence[DeviceEvent], calls: Sequence[int | None], n_calls: int, next_start: float | None
) -> StepTimes:
    """One step's activities (start order) charged to calls: each the part of its interval that no
    earlier activity covers; the uncovered time, up to the next step's first activity where the
    steps ran back to back (`next_start`), is between kernels."""
    out = StepTimes(calls=[0.0] * n_calls, between=0.0, device_names=[[] for _ in range(n_calls)])
    covered = run[0].start
    for d, c in zip(run, calls, strict=False):
        if d.start > covered:
            out.between += d.start - covered
            out.gaps += 1
        charge = max(0.0, d.end - max(d.start, covered))
        covered = max(covered, d.end)
        if c is None:
            out.unmapped += charge
        else:
            out.calls[c] += charge
            out.device_names[c].append(d.name)
    if next_start is not None and next_start > covered:
        out.between += next_start - covered
        out.gaps += 1
    return out


def replay_steps(
    sequence: Sequence[tuple[str, int | None]], device: Sequence[DeviceEvent], n_calls: int
) -> list[StepTimes]:
    """The steps of back-to-back replays, each charged up to the next one's first activity; empty
    where fewer than nine in ten of a step's activities align with its launches without the graph."""
    acts = sorted(device, key=lambda d: d.start)
    position = {id(a): i for i, a in enumerate(acts)}
    out = []
    for run in windows(sequence, acts):
        calls = assign(sequence, run)
        if sum(c is not None for c in calls) < 0.9 * sum(c is not None for _, c in sequence):
            return []
        nxt = acts[position[id(run[-1])] + 1]
        out.append(device_step(run, calls, n_calls, nxt.start))
    return out


def median_index(steps: Sequence[StepTimes]) -> int:
    """The step whose span is the median (the lower one of an even count)."""
    order = sorted(range(len(steps)), key=lambda i: steps[i].span)
    return order[(len(order) - 1) // 2]


def median_step(steps: Sequence[StepTimes]) -> StepTimes:
    """The step whose span is the median, whole: its kernels and the time between them add up to its
    span, where medians taken part by part need not (a loaded CPU swings several times between steps)."""
    return steps[median_index(steps)]


# ------------------------------------------------------------------ reading torch.profiler


def host_events(prof: Any) -> tuple[list[HostEvent], dict[int, HostEvent]]:
    """The host (CPU) events of a torch.profiler run as a tree: (the step ranges in order, every host
    event by correlation id)."""
    from torch.autograd import DeviceType

    mine: dict[int, HostEvent] = {}  # keyed by id() of torch's event
    by_id: dict[int, HostEvent] = {}
    events = [e for e in prof.events() if e.device_type == DeviceType.CPU]
    for e in events:
        ev = HostEvent(e.name, e.time_range.start / 1e6, e.time_range.end / 1e6, int(e.id))
        mine[id(e)] = ev
        by_id[ev.id] = ev
    for e in events:
        parent = getattr(e, "cpu_parent", None)
        if parent is not None and id(parent) in mine:
            child = mine[id(e)]
            child.parent = mine[id(parent)]
            child.parent.children.append(child)
    steps = sorted((ev for ev in mine.values() if ev.name == STEP_RANGE), key=lambda e: e.start)
    return steps, by_id


def device_events(prof: Any) -> list[DeviceEvent]:
    """The device activities (kernels, copies, fills) of a torch.profiler run, with their links."""
    from torch.autograd import DeviceType

    out = []
    for e in prof.profiler.kineto_results.events():
        if e.device_type() != DeviceType.CUDA:
            continue
        start = e.start_ns() / 1e9
        out.append(DeviceEvent(e.name(), start, start + e.duration_ns() / 1e9, int(e.linked_correlation_id())))
    return sorted(out, key=lambda d: d.start)
