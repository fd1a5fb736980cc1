"""Profiling the compiled engine: the role graph compiled as the engine compiles it, its kernels timed.

The pipeline is built op by op (engine `torch`, which keeps the graph); the profiled role is then
prepared exactly as the compiled engine prepares it (the same graph copy with its slots as opaque
`mcore::slot` ops, the engine's sibling-projection fusion, `mcore::gemv` for a fixed-shape role
where the engine uses it, the engine's Inductor options) and compiled once more with Inductor's
provenance tracing (engines/kernel_map.py), bypassing the compiled-code caches. A fixed-shape role on
CUDA is captured as a CUDA graph as the engine captures it and its replays are what is timed.

Timing (trace.py): on CUDA the device activities of back-to-back graph replays, aligned by
name with what the same code launched without the graph (whose launches the profiler links to
their kernel calls); where the profiler shows no kernels inside the replays, the kernels are timed
without the graph and the step's device time minus their sum is the time between kernels. On the
CPU each kernel call's profiler range (C++ kernels mark themselves) inside the compiled step.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from ..common.errors import UserError
from ..common.progress import Progress
from ..engines.compiled import CompiledEngine, CompiledRoleRunner, compile_options, fuse_projections, rewrite
from ..engines.fusion import fuse_sibling_projections
from ..engines.kernel_map import provenance_trace, read_provenance
from ..engines.prepared import PreparedGraph
from ..engines.slots import SlotCall
from .trace import (
    STEP_RANGE,
    StepTimes,
    device_events,
    device_step,
    host_events,
    host_step,
    launch_sequence,
    median_index,
    median_step,
    replay_steps,
)

HOW = {
    "replay": "device time of each kernel in the step's CUDA-graph replays (CUDA profiler); "
    "between kernels: the time no kernel covers, up to the next step's first kernel",
    "no-graph": "device time of each kernel run without the CUDA graph (the profiler showed no kernels "
    "inside the graph's replays); between kernels: the graph step's device time minus those kernels",
    "eager": "device time of each kernel (CUDA profiler), the role run compiled without a CUDA graph; "
    "between kernels: the time no kernel covers",
    "cpu": "CPU time of each kernel call's profiler range inside the compiled step (the step's wall time "
    "from the same profiled steps); between kernels: the rest of the step (the compiled wrapper's own work)",
}
SHARED = "; a kernel's time is shared among the graph nodes it computes by the bytes each moves on its own"


@dataclass
class CompiledStep:
    """A role compiled as the engine compiles it, with its kernel calls (provenance, call order)."""

    runner: CompiledRoleRunner
    prepared: PreparedGraph
    kernels: list[dict[str, Any]]  # {"kernel", "order", "nodes": [names of prepared.gm's nodes]}
    fixed_shapes: bool

    @property
    def names(self) -> list[str]:
        return [k["kernel"] for k in self.kernels]


def engine_graph(src: PreparedGraph) -> PreparedGraph:
    """The torch engine's prepared graph as the compiled engine has it: a copy whose slots are the
    opaque `mcore::slot` op again (the op-by-op engine calls them directly), with sibling projections
    fused as CompiledEngine.compile_role fuses them. The op-by-op graph's lifted tensors follow the
    fusion (views into the concatenated weights), so no weight is held twice."""
    p = dataclasses.replace(
        src,
        gm=copy.deepcopy(src.gm),
        state_args=list(src.state_args),
        state_sources=list(src.state_sources),
        fused_groups=[],
    )
    for n in p.gm.graph.nodes:
        if n.op == "call_function" and isinstance(n.target, SlotCall):
            n.args = (list(n.args), n.target.key)
            n.target = torch.ops.mcore.slot.default
    p.gm.recompile()
    if fuse_projections():
        fuse_sibling_projections(p)
        for group in p.fused_groups:
            for i in group:
                src.state_args[i] = p.state_args[i]
    # Nodes the rewrite made get names of their own: Dynamo keeps a graph's node names where they
    # are free, and names like `linear_default_1` are what it gives its own nodes (the provenance
    # map would then name the wrong node).
    old = {n.name for n in src.gm.graph.nodes}
    for n in list(p.gm.graph.nodes):
        if n.name not in old:
            n._rename(f"mcore_engine_{n.name}")
    p.gm.recompile()
    return p


def compile_traced(
    src: PreparedGraph, device: torch.device, inputs: Sequence[torch.Tensor], fixed_shapes: bool, progress: Progress
) -> CompiledStep:
    """Compile the role as the engine does, with provenance: the kernels and the runner that runs them."""
    CompiledEngine()  # the engine's compile settings (its Inductor cache folder)
    p = engine_graph(src)
    rewrite(p, inputs, device, fixed_shapes)
    if not fixed_shapes:
        for i, dims in p.dynamic_dims.items():
            for dim in dims:
                torch._dynamo.mark_dynamic(inputs[i], dim)
    runner = CompiledRoleRunner(p, device, key="profile")
    progress.report(f"compiling {p.role} as the compiled engine does, with Inductor's provenance", 0.1)
    with tempfile.TemporaryDirectory(prefix="mcore-profile-") as d:
        with provenance_trace(d):
            runner.fn = torch.compile(p.gm, fullgraph=True, options=compile_options(device, fixed_shapes) or None)
            runner._warm(inputs, 1)  # compiles (Inductor compiles at the first call)
        kernels = read_provenance(d, p.gm)
    return CompiledStep(runner, p, kernels, fixed_shapes)


# ------------------------------------------------------------------ timing


def time_cpu(step: CompiledStep, inputs: Sequence[torch.Tensor], steps: int) -> tuple[StepTimes, float, str]:
    """(the median profiled step's kernel times, that step's wall time, how). Both come from the same
    step: on a shared CPU the load swings from one step to the next, and the profiler's own cost per
    kernel range is then in the step as in its kernels."""
    from torch.profiler import ProfilerActivity, profile, record_function

    run = step.runner
    for _ in range(2):
        run(*inputs)
    walls = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps + 1):  # the first profiled step carries the profiler's start-up
            t = time.perf_counter()
            with record_function(STEP_RANGE):
                run(*inputs)
            walls.append(time.perf_counter() - t)
    ranges, _ = host_events(prof)
    times = [host_step(r, step.names) for r in ranges[1:]]
    k = median_index(times)
    return times[k], walls[1:][k], "cpu"


def _profiled(fn: Callable[[], Any], device: torch.device, host: bool = True) -> Any:
    from torch.profiler import ProfilerActivity, profile

    acts = ([ProfilerActivity.CPU] if host else []) + [ProfilerActivity.CUDA]
    with profile(activities=acts) as prof:
        fn()
        torch.cuda.synchronize(device)
    return prof


def launches(step: CompiledStep, inputs: Sequence[torch.Tensor], device: torch.device) -> tuple[list, list]:
    """The compiled code run without a CUDA graph under the profiler, twice: the second run's device
    activities with their kernel calls (start order), and each run's StepTimes."""
    from torch.profiler import record_function

    def two() -> None:
        for _ in range(2):
            with record_function(STEP_RANGE):
                step.runner._run(inputs)

    prof = _profiled(two, device)
    ranges, by_id = host_events(prof)
    dev = device_events(prof)
    seqs = [launch_sequence(r, step.names, dev, by_id) for r in ranges]
    times = [device_step([d for d, _ in s], [c for _, c in s], len(step.names), None) for s in seqs if s]
    return (seqs[-1] if seqs else []), times


def _queue_ahead(device: torch.device, enqueue_s: float) -> None:
    """A GPU spin that outlasts the host's enqueueing (as pipeline.device_seconds queues its rounds),
    so back-to-back replays run back to back on the device."""
    torch.cuda._sleep(int((2 * enqueue_s + 1e-3) * 2e9))


def time_cuda(step: CompiledStep, inputs: Sequence[torch.Tensor], steps: int) -> tuple[StepTimes, float, str]:
    """(the median step's kernel times, the step's device time, how) on CUDA."""
    from ..engines.compiled import _Replay, _signature
    from ..runtime.pipeline import device_seconds

    device, run = step.runner.device, step.runner
    _profiled(lambda: None, device)  # CUPTI starts before any graph is captured (a later start can break replays)
    seq, eager = launches(step, inputs, device)
    if not eager:
        raise UserError(
            "the CUDA profiler recorded no kernels of the compiled step (is CUPTI available?); "
            "profile op by op with --engine torch"
        )
    if not step.fixed_shapes:
        walls = []
        for _ in range(steps):
            torch.cuda.synchronize(device)
            t = time.perf_counter()
            run(*inputs)
            torch.cuda.synchronize(device)
            walls.append(time.perf_counter() - t)
        return median_step(eager), statistics.median(walls), "eager"
    if _signature(inputs) not in run.graphs:  # as CompiledRoleRunner.prepare captures
        run._warm(inputs, 2)
        run.graphs[_signature(inputs)] = _Replay.capture(run, inputs)
    step_s = device_seconds(lambda: run(*inputs), device)
    assert step_s is not None
    replays_n = steps + 2  # each step runs to the next one's start; the first may lose its head
    t = time.perf_counter()
    for _ in range(replays_n):
        run(*inputs)
    enqueue_s = time.perf_counter() - t
    torch.cuda.synchronize(device)

    def replays() -> None:
        _queue_ahead(device, enqueue_s)
        for _ in range(replays_n):
            run(*inputs)

    sequence = [(d.name, c) for d, c in seq]
    replayed = replay_steps(sequence, device_events(_profiled(replays, device, host=False)), len(step.names))
    if replayed:
        return median_step(replayed), step_s, "replay"
    m = median_step(eager)
    m.between = max(0.0, step_s - sum(m.calls) - m.unmapped)
    return m, step_s, "no-graph"


def time_step(step: CompiledStep, inputs: Sequence[torch.Tensor], steps: int) -> tuple[StepTimes, float, str]:
    if step.runner.device.type == "cuda":
        return time_cuda(step, inputs, steps)
    return time_cpu(step, inputs, steps)


# ------------------------------------------------------------------ what each kernel moves


def kernel_bytes(
    nodes: set[str], reads: dict[str, dict[str, int]], writes: dict[str, int], gm: fx.GraphModule, views: set[str]
) -> int:
    """What a kernel computing `nodes` (names in `gm`) moves: each value it reads from outside (by the
    value under its views, the largest read of it) and each value it writes that something outside
    reads (or that the graph returns, or an in-place write to state)."""
    by_name = {n.name: n for n in gm.graph.nodes}

    def root(name: str) -> str:
        n = by_name.get(name)
        while n is not None and n.name in views and n.args and isinstance(n.args[0], fx.Node):
            n = n.args[0]
        return n.name if n is not None else name

    def escapes(n: fx.Node) -> bool:
        for u in n.users:
            if u.op == "output" or (u.name in views and escapes(u)) or (u.name not in views and u.name not in nodes):
                return True
        return False

    outside: dict[str, int] = {}
    for name in nodes:
        for src, b in reads.get(name, {}).items():
            r = root(src)
            if r not in nodes:
                outside[r] = max(outside.get(r, 0), b)
    written = sum(
        writes.get(name, 0)
        for name in nodes
        if name in by_name and (_in_place(by_name[name]) or escapes(by_name[name]))
    )
    return sum(outside.values()) + written


def _in_place(n: fx.Node) -> bool:
    schema = getattr(n.target, "_schema", None)
    return schema is not None and any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
