"""Where the time goes: device time attributed to graph nodes, module paths, recipe instances and
bound slots, and the regions worth a kernel (DESIGN.md §10).

A profile times the engine the pipeline would run (`engine="auto"`: compiled on CUDA, op by op on
the CPU), or the one named:

- `compiled` (compiled.py): the role compiled as the compiled engine compiles it; each kernel
  of the step timed (in its CUDA-graph replay on CUDA), mapped to the graph nodes it computes by
  Inductor's provenance, its time shared among them by the bytes each moves; the time between
  kernels (launches, dependencies) is a row of its own, so the attributed total is the step's time.
- `torch`: the graph run op by op through an FX interpreter. On CUDA each node runs inside a profiler
  range and is charged the device time of the kernels and copies it launched (CUPTI, through
  torch.profiler): timing a node with a device sync around it would charge every small op its launch
  and sync latency, tens of times its kernel time. On the CPU (or where the profiler sees no device
  activity) each node is timed on the wall clock between synchronisations.

The time a node would take at the device's limit is the larger of its bytes moved over the measured
copy bandwidth and its matrix-product FLOPs over the peak BF16 tensor-core rate (where the device's is
known); a region's headroom (its time minus that) is the most a perfect kernel for it could save.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import fx

from .. import __version__
from ..common.errors import UserError
from ..common.progress import NO_PROGRESS, Progress
from ..ops.gemv import enabled as gemv_enabled
from ..ops.gemv import glu_enabled, norm_enabled
from .attribution import (
    CANDIDATE_BINDING,
    VIEWS,
    TrafficInterpreter,
    candidates,
    expansion,
    graph_rows,
    module_rows,
    node_rows,
    op_of,
    rates,
    recipe_rows,
    slot_rows,
)
from .contract import SCHEMA_VERSION, load_profile
from .device import device_facts
from .report import (
    BetweenKernels,
    FusedKernel,
    FusionReport,
    PartialProfile,
    ProfileBundle,
    ProfileDevice,
    ProfileEngine,
    ProfileKernel,
    ProfileNode,
    ProfileReport,
    ProfileSlot,
    ProfileVersions,
)
from .view import diff_lines, top_lines

ENGINES = ("auto", "compiled", "torch")
__all__ = [
    "profile_pipeline",
    "top_lines",
    "diff_lines",
    "load_profile",
    "CANDIDATE_BINDING",
    "SCHEMA_VERSION",
    "ProfileReport",
    "PartialProfile",
]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_RANGE = "mcore.node:"


class _TimedInterpreter(TrafficInterpreter):
    """Runs the graph node by node, adding each call_function node's time to `seconds` (wall clock
    between syncs), or, with `ranges`, marking each node as a profiler range for `profiled_seconds`."""

    def __init__(self, gm: fx.GraphModule, device: torch.device):
        super().__init__(gm)
        self.device = device
        self.ranges = False
        self.seconds: dict[str, float] = defaultdict(float)

    def call(self, n: fx.Node, args: tuple, kwargs: dict) -> Any:
        if self.ranges:
            with torch.profiler.record_function(_RANGE + n.name):
                return super().call(n, args, kwargs)
        _sync(self.device)
        t = time.perf_counter()
        out = super().call(n, args, kwargs)  # only the op itself: the interpreter's own work stays outside
        _sync(self.device)
        self.seconds[n.name] += time.perf_counter() - t
        return out


def profiled_seconds(interp: _TimedInterpreter, run: Callable[[], Any], device_time: bool) -> dict[str, float]:
    """Seconds per node from one profiled run: the device time of the kernels each node launched
    (`device_time`), else the CPU time inside its range. Empty when the profiler saw nothing."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device_time else [])
    interp.ranges = True
    try:
        with profile(activities=acts) as prof:
            run()
        _sync(interp.device)
    finally:
        interp.ranges = False
    out: dict[str, float] = defaultdict(float)
    for ev in prof.events():
        if ev.name.startswith(_RANGE):
            us = ev.device_time_total if device_time else ev.cpu_time_total
            out[ev.name[len(_RANGE) :]] += us / 1e6
    return dict(out) if any(out.values()) else {}


# ------------------------------------------------------------------ the entry point


MAX_STEPS = 1000  # medians settle within tens of steps; a trace of thousands of 8B steps holds millions of events


def check_bundle_request(bundle: Any, role: str | None, context: int, steps: int, engine: str = "auto") -> str:
    """The role a profile of an opened bundle times (None: decode, or an encoder's one role), with
    every value checked from the bundle's manifest: before any graph is captured or compiled."""
    from ..families import bundle_kind
    from ..families.graph_args import GraphArgs

    m = bundle.runnable()
    decoder = bundle_kind(m) == "decoder"
    role = role or ("decode" if decoder else "encoder")
    capacity = GraphArgs.from_dict(m.graph_args).cache_length if decoder else None
    check_request(list(m.roles), capacity, role, context, steps, engine)
    return role


def check_request(
    roles: list[str], capacity: int | None, role: str, context: int, steps: int, engine: str = "auto"
) -> None:
    """What a profile asks for, against the bundle's roles and (a decoder's) KV cache capacity: the
    CLI checks it from the manifest before any graph is captured, and profile_pipeline again."""
    if engine not in ENGINES:
        raise UserError(f"--engine {engine!r} is not one of {', '.join(ENGINES)}")
    if role not in roles:
        raise UserError(f"role {role!r} is not in this bundle; use one of {', '.join(roles)}")
    if not 1 <= steps <= MAX_STEPS:  # a compiled profile keeps every step's kernels in one trace, in memory
        raise UserError(f"--steps {steps} must lie in 1..{MAX_STEPS}")
    if capacity is not None and not 1 <= context < capacity:
        raise UserError(f"--context {context} must lie in 1..{capacity - 1} (the bundle's KV cache holds {capacity})")


def profile_pipeline(
    pipe: Any,
    role: str,
    context: int,
    steps: int,
    prompt: str | None = None,
    progress: Progress = NO_PROGRESS,
    timing: str = "auto",
    on_partial: Callable[[PartialProfile], None] | None = None,
    fusion: bool = False,
    engine: str = "auto",
) -> ProfileReport:
    """Profile one role of a pipeline built with the `torch` engine (which keeps the graph): `steps`
    timed runs at `context`, on `engine` ("auto": the one the pipeline would run on its device).

    `fusion` (op by op): also compile the role graph with Inductor once more and report which nodes
    the compiled engine fuses into which kernel, and per candidate region the fused kernels a slot
    there would split (a compiled profile always has them).

    `timing` (op by op): "auto" (kernel time on CUDA, wall clock on CPU), "kernel", "profiler-cpu"
    (the profiler's CPU time per node range: the kernel path's bookkeeping, testable without a GPU) or
    "wall". `on_partial` (op by op), if given, receives after each step the nodes and modules
    attributed so far (medians over the steps done; no recipes or candidates), for views that fill in live."""
    from ..engines import resolve_engine_name

    if pipe.engine_name != "torch":
        raise UserError("profiling needs the role graph: build the pipeline with engine='torch'")
    check_request(list(pipe.runners), pipe.capacity if pipe.kind == "decoder" else None, role, context, steps, engine)
    inputs = _role_inputs(pipe, role, context, prompt)
    engine = resolve_engine_name(engine, pipe.device)
    shown = context if pipe.kind == "decoder" else None  # an encoder's length is its prompt's
    if engine == "compiled":
        report = _profile_compiled(pipe, role, inputs, shown, steps, progress)
    else:
        report = _profile_torch(pipe, role, inputs, shown, steps, progress, timing, on_partial, fusion)
    progress.report("profiled", 1.0)
    return report


TIMINGS = {
    "kernel": "device time of each node's kernels and copies (CUDA profiler)",
    "profiler-cpu": "CPU time inside each node's profiler range",
    "wall": "wall clock per node between device synchronisations",
}


def _profile_torch(
    pipe: Any,
    role: str,
    inputs: tuple,
    context: int | None,
    steps: int,
    progress: Progress,
    timing: str,
    on_partial: Callable[[PartialProfile], None] | None,
    fusion: bool,
) -> ProfileReport:
    prepared = pipe.runners[role].prepared
    dev = pipe.device
    snap = pipe.snapshots[role]
    interp = _TimedInterpreter(prepared.gm, dev)
    timing = _resolve_timing(timing, dev)
    facts = device_facts(dev)  # measures the copy rate (once per device) before anything is timed
    expand = expansion(prepared.gm, snap)
    step_totals: list[float] = []
    per_step: list[dict[str, float]] = []
    with torch.no_grad():
        pipe.runners[role](*inputs)  # warm-up (allocator, first-call costs)
        for i in range(steps):
            progress.report(f"profiling {role}: step {i + 1}/{steps}", i / steps)
            step_totals.append(_timed_step(pipe.runners[role], inputs, dev))
            node_s, timing = _node_seconds(interp, prepared, inputs, timing)
            per_step.append(node_s)
            if on_partial is not None:  # what a live view needs; recipes and candidates come with the report
                part = _attribute(snap, _charges(interp, _medians(per_step)), expand, facts)
                head = _head(pipe, role, part, facts, part.lost)
                on_partial(PartialProfile(**head, step_seconds=statistics.median(step_totals), step=i + 1, steps=steps))
    progress.report("attributing", 0.95)
    attributed = _attribute(snap, _charges(interp, _medians(per_step)), expand, facts)
    run = _Run(
        ProfileEngine("torch", "op by op (the compiled engine fuses these nodes into fewer kernels)"),
        TIMINGS[timing],
        statistics.median(step_totals),
        context,
        steps,
    )
    if fusion:
        progress.report("compiling the graph once more to see what the compiled engine fuses", 0.96)
        run = _with_fusion(run, pipe, role, prepared, inputs)
    return _report(pipe, role, attributed, facts, run)


def _resolve_timing(timing: str, dev: torch.device) -> str:
    """ "auto" is kernel time on CUDA and the wall clock elsewhere; kernel time needs CUDA."""
    if timing == "auto":
        timing = "kernel" if dev.type == "cuda" else "wall"
    if timing not in ("kernel", "profiler-cpu", "wall"):
        raise UserError(f"timing {timing!r} is not one of auto, kernel, profiler-cpu, wall")
    if timing == "kernel" and dev.type != "cuda":
        raise UserError("kernel timing needs a CUDA device; use wall timing on CPU")
    return timing


def _timed_step(runner: Callable[..., Any], inputs: tuple, dev: torch.device) -> float:
    """Seconds of one whole run of the role, between device synchronisations."""
    _sync(dev)
    t = time.perf_counter()
    runner(*inputs)
    _sync(dev)
    return time.perf_counter() - t


def _node_seconds(interp: _TimedInterpreter, prepared: Any, inputs: tuple, timing: str) -> tuple[dict[str, float], str]:
    """Seconds per node for one interpreted run, and the timing used: where the profiler saw no activity
    (no CUPTI here) this and every later step fall back to the wall clock."""
    interp.seconds.clear()
    node_s: dict[str, float] = {}
    if timing != "wall":
        node_s = profiled_seconds(
            interp, lambda: interp.run(*prepared.state_args, *inputs), device_time=timing == "kernel"
        )
        if not node_s:
            timing = "wall"
    if timing == "wall":
        interp.run(*prepared.state_args, *inputs)
        node_s = dict(interp.seconds)
    return node_s, timing


def _charges(interp: TrafficInterpreter, seconds: dict[str, float]) -> list[tuple[str, float, float, float]]:
    return [(name, s, interp.bytes_of(name), interp.flops.get(name, 0)) for name, s in seconds.items()]


def _with_fusion(run: _Run, pipe: Any, role: str, prepared: Any, inputs: tuple) -> _Run:
    """`run` with what the compiled engine fuses, and those kernels for the candidates' splits."""
    from ..engines.kernel_map import fused_kernels

    gemv = role != "prefill" and gemv_enabled(pipe.device)
    kernels = fused_kernels(prepared, inputs, gemv=gemv)
    to_id = {n.name: n.id for n in pipe.snapshots[role].nodes}
    fusion = FusionReport(
        engine="compiled (Inductor), this device"
        + ("; one-row products on mcore::gemv" if gemv else "")
        + "; the engine also merges sibling projections (q/k/v, gate/up)"
        + ("; and computes the gating in the gate/up product's kernel" if gemv and glu_enabled() else "")
        + ("; each add + RMSNorm inside the products around it" if gemv and norm_enabled() else ""),
        kernels=tuple(FusedKernel(k["kernel"], tuple(to_id.get(n, n) for n in k["nodes"])) for k in kernels),
    )
    known = [dict(k, nodes=[n for n in k["nodes"] if n in to_id]) for k in kernels]
    return replace(run, fusion=fusion, split_kernels=known, gap=0.0)


# ------------------------------------------------------------------ the compiled engine


def _profile_compiled(
    pipe: Any, role: str, inputs: tuple, context: int | None, steps: int, progress: Progress
) -> ProfileReport:
    from .compiled import HOW, SHARED, time_step

    dev = pipe.device
    facts = device_facts(dev)
    step = _compiled_step(pipe, role, inputs, progress)
    progress.report(f"timing {role}'s kernels over {steps} step(s)", 0.6)
    with torch.no_grad():
        times, step_s, how = time_step(step, inputs, steps)
        progress.report("attributing kernels to graph nodes", 0.9)
        traffic = TrafficInterpreter(step.prepared.gm)
        traffic.run(*step.prepared.state_args, *inputs)
    calls, charges = _kernel_rows(step, times, traffic)
    snap = pipe.snapshots[role]
    expand = expansion(step.prepared.gm, snap)
    attributed = _attribute(snap, charges, expand, facts, extra=times.between + times.unmapped)
    total = attributed.total
    kernels, split_input = _kernels(calls, attributed, expand, {n.name: n.id for n in snap.nodes})
    between = BetweenKernels(
        seconds=times.between,
        share=times.between / total if total > 0 else 0.0,
        gaps=times.gaps,
        what="no kernel running: launch latency and dependencies between kernels (and steps)",
    )
    run = _Run(
        ProfileEngine("compiled", _describe(step)),
        HOW[how] + SHARED,
        step_s,
        context,
        steps,
        kernel_seconds=sum(times.calls) + times.unmapped,
        between=between,
        kernels=tuple(kernels),
        unmapped=times.unmapped,
        split_kernels=split_input,
        gap=times.between / max(1, len(kernels)),
    )
    return _report(pipe, role, attributed, facts, run)


def _kernels(
    calls: list[dict], attributed: _Attribution, expand: dict, to_id: dict[str, str]
) -> tuple[list[ProfileKernel], list[dict]]:
    """The kernel rows (the snapshot node IDs each computes, rated against the attributed total) and
    each kernel with the snapshot node names it computes, as candidates' splits read them."""
    a = attributed
    rows, split_input = [], []
    for k in calls:
        members = sorted({m for n in k["graph_nodes"] for m, _ in expand.get(n, (None, []))[1]})
        ids = sorted((to_id[m] for m in members), key=lambda i: int(i.split(":")[1]))
        rated = rates(k["seconds"], k["bytes"], k["flops"], a.total, a.bw, a.peak)
        device = k.get("device_kernels")
        rows.append(
            ProfileKernel(k["kernel"], k["order"], tuple(ids), rated, None if device is None else tuple(device))
        )
        split_input.append({"kernel": k["kernel"], "order": k["order"], "seconds": k["seconds"], "nodes": members})
    return rows, split_input


def _compiled_step(pipe: Any, role: str, inputs: tuple, progress: Progress) -> Any:
    """The role compiled for profiling, once per pipeline and input shapes: a decode step reads its
    context from a device tensor, so profiles at several contexts share one compile (and CUDA graph)."""
    from ..engines.compiled import _signature
    from .compiled import compile_traced

    cache = pipe.__dict__.setdefault("_profiled_roles", {})
    key = (role, _signature(inputs))
    if key not in cache:
        cache[key] = compile_traced(
            pipe.runners[role].prepared, pipe.device, inputs, role != "prefill", progress.part(0.0, 0.6)
        )
    return cache[key]


def _describe(step: Any) -> str:
    from ..engines.compiled import compile_options

    opts = compile_options(step.runner.device, step.fixed_shapes)
    how = "compiled (Inductor" + "".join(f", {k}" for k, v in sorted(opts.items()) if v is True) + ")"
    if step.runner.graphs:
        how += ", replayed as a CUDA graph"
    return how + f", {len(step.kernels)} kernel calls" + _regions_note(step)


def _regions_note(step: Any) -> str:
    """Where the pipeline compiles this role by regions, the profile says that it compiled it whole:
    Inductor's provenance covers one graph. The cuts are placed so that no kernel spans one (regions.py),
    and on the CPU both compiles make the same kernel calls; that they run equally fast on CUDA is not
    measured yet (docs/gpu-results.md, thirteenth session), so the profile claims no more than it timed."""
    from ..engines.compiled import precompiled
    from ..engines.regions import plan_regions
    from ..engines.standalone import regional

    if not (precompiled(step.runner.device) and regional()):
        return ""
    plan = plan_regions(step.prepared.gm)
    if plan is None:
        return ""
    return (
        f"; profiled as one graph (Inductor's provenance covers one), where the pipeline compiles this role "
        f"in {len(plan.modules)} regions ({len(set(plan.signatures))} distinct; MCORE_REGIONAL=0 runs it whole)"
    )


def _kernel_rows(step: Any, times: Any, traffic: TrafficInterpreter) -> tuple[list[dict], list[tuple]]:
    """One row per kernel call (time, what it moves and computes) and the charges of its nodes: the
    kernel's time and bytes shared by the bytes each node moves on its own, its FLOPs by node."""
    from .compiled import kernel_bytes

    gm = step.prepared.gm
    views = {n.name for n in gm.graph.nodes if n.op == "call_function" and op_of(n) in VIEWS}
    rows, charges = [], []
    for i, k in enumerate(step.kernels):
        nodes = set(k["nodes"])
        moved = kernel_bytes(nodes, traffic.reads, traffic.writes, gm, views)
        flops = sum(traffic.flops.get(n, 0) for n in nodes)
        s = times.calls[i]
        rows.append(
            {"kernel": k["kernel"], "order": k["order"], "graph_nodes": sorted(nodes), "seconds": s}
            | {"bytes": moved, "flops": flops}
            | ({"device_kernels": times.device_names[i]} if times.device_names else {})
        )
        own = {n: traffic.bytes_of(n) for n in nodes}
        total = sum(own.values())
        for n in nodes:
            w = own[n] / total if total else 1 / len(nodes)
            charges.append((n, s * w, moved * w, traffic.flops.get(n, 0)))
        if not nodes:
            charges.append(("", s, moved, flops))  # a kernel no graph node claims
    return rows, charges


# ------------------------------------------------------------------ the report


@dataclass(frozen=True)
class _Attribution:
    """One step's charges rated: the node rows in charge order (module, recipe and candidate sums
    follow it), the slot rows, the attributed total and what no snapshot node took, and the rates
    they were held to (the copy rate; the peak math rate, None where unknown)."""

    snap: Any
    nodes: list[ProfileNode]
    slots: list[ProfileSlot]
    total: float
    lost: float
    bw: float
    peak: float | None

    @property
    def hottest(self) -> tuple[ProfileNode, ...]:
        return tuple(sorted(self.nodes, key=lambda n: -n.rates.seconds))


@dataclass(frozen=True)
class _Run:
    """What the engine adds to the attribution: its record, how it timed, the step's own time, the
    context and steps, a compiled step's timeline (kernels, the time between them, device time no
    call claims), op by op the fusion report, and the kernels candidates' splits read (None: none
    known) with the cost of one more launch."""

    engine: ProfileEngine
    timing: str
    step_seconds: float
    context: int | None
    steps: int
    kernel_seconds: float | None = None
    between: BetweenKernels | None = None
    kernels: tuple[ProfileKernel, ...] | None = None
    unmapped: float = 0.0
    fusion: FusionReport | None = None
    split_kernels: list[dict] | None = None
    gap: float = 0.0


def _attribute(
    snap: Any, charges: list[tuple[str, float, float, float]], expand: dict, facts: dict[str, Any], extra: float = 0.0
) -> _Attribution:
    """The node and slot rows of `charges`. `extra`: time that belongs to the step but to no node
    (between kernels), counted in the attributed total."""
    bw, peak = facts["copy_bytes_per_s"], facts.get("peak_bf16_flops_per_s")  # peak: None where unknown
    charged, slots, lost = graph_rows(snap, charges, expand)
    total = sum(n["seconds"] for n in charged) + lost + extra
    return _Attribution(
        snap, node_rows(charged, total, bw, peak), slot_rows(slots, total, bw, peak), total, lost, bw, peak
    )


def _head(pipe: Any, role: str, a: _Attribution, facts: dict[str, Any], unattributed: float) -> dict[str, Any]:
    """What a report and a live view share, as their fields."""
    m = pipe.manifest
    return {
        "role": role,
        "bundle": ProfileBundle(m.model.spec, m.roles[role].fingerprint, dict(m.build_args)),
        "device": ProfileDevice.from_dict(facts),
        "attributed_seconds": a.total,
        "unattributed_seconds": unattributed,
        "nodes": a.hottest,
        "modules": tuple(module_rows(a.nodes, a.total, a.bw, a.peak)),
    }


def _report(pipe: Any, role: str, a: _Attribution, facts: dict[str, Any], run: _Run) -> ProfileReport:
    """The report: the head, recipe and slot rows, and the candidates ranked."""
    recipes = recipe_rows(a.snap, a.nodes, a.total, a.bw, a.peak)
    # with kernels to split, candidates come from the rows hottest first, else in charge order (as
    # before the report was typed: the order decides ties and the last bits of sums)
    nodes = a.nodes if run.split_kernels is None else a.hottest
    ranked = candidates(
        a.snap, nodes, recipes, a.total, a.bw, pipe.manifest, a.peak, kernels=run.split_kernels, gap=run.gap
    )
    return ProfileReport(
        **_head(pipe, role, a, facts, a.lost + run.unmapped),
        versions=ProfileVersions(
            __version__, torch.__version__, torch.version.cuda if pipe.device.type == "cuda" else None
        ),
        kernel_seconds=run.kernel_seconds,
        between_kernels=run.between,
        kernels=run.kernels,
        recipes=tuple(recipes),
        slots=tuple(a.slots),
        candidates=tuple(ranked),
        engine=run.engine,
        timing=run.timing,
        step_seconds=run.step_seconds,
        context=run.context,
        steps=run.steps,
        fusion=run.fusion,
    )


def _role_inputs(pipe: Any, role: str, context: int, prompt: str | None) -> tuple:
    dev = pipe.device
    g = torch.Generator(device=dev).manual_seed(0)
    if pipe.kind == "encoder":
        ids, mask, _ = pipe.inputs(prompt or "the quick brown fox")
        return ids, mask
    caches = [pipe.caches[n] for n in pipe.cache_names]
    for c in caches:  # never time on zeros
        c.normal_(generator=g)
    if role == "prefill":
        ids = torch.randint(
            0, int(pipe.config.get("vocab_size", 2)), (1, context), dtype=torch.int32, device=dev, generator=g
        )
        return (ids, *caches)
    pipe.cache_length.fill_(context)
    pipe.step_ids.fill_(0)
    return (pipe.step_ids, pipe.cache_length, *caches)


def _medians(per_step: list[dict[str, float]]) -> dict[str, float]:
    names = {name for s in per_step for name in s}
    return {name: statistics.median(s.get(name, 0.0) for s in per_step) for name in names}
