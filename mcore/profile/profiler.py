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
from typing import Any

import torch
from torch import fx

from .. import __version__
from ..bundle.manifest import BundleManifest
from ..common.errors import UserError
from ..common.progress import NO_PROGRESS, Progress
from ..ops.gemv import enabled as gemv_enabled
from .attribution import (
    CANDIDATE_BINDING,
    VIEWS,
    TrafficInterpreter,
    candidates,
    expansion,
    graph_rows,
    module_rows,
    op_of,
    rates,
    recipe_rows,
)
from .contract import SCHEMA_VERSION, load_profile
from .device import device_facts
from .view import diff_lines, top_lines

ENGINES = ("auto", "compiled", "torch")
__all__ = ["profile_pipeline", "top_lines", "diff_lines", "load_profile", "CANDIDATE_BINDING", "SCHEMA_VERSION"]


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


def profile_pipeline(
    pipe: Any,
    role: str,
    context: int,
    steps: int,
    prompt: str | None = None,
    progress: Progress = NO_PROGRESS,
    timing: str = "auto",
    on_partial: Callable[[dict[str, Any]], None] | None = None,
    fusion: bool = False,
    engine: str = "auto",
) -> dict[str, Any]:
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
    if engine not in ENGINES:
        raise UserError(f"--engine {engine!r} is not one of {', '.join(ENGINES)}")
    if role not in pipe.runners:
        raise UserError(f"role {role!r} is not in this bundle; use one of {', '.join(pipe.runners)}")
    if steps < 1:
        raise UserError(f"--steps {steps} must be at least 1")
    inputs = _role_inputs(pipe, role, context, prompt)
    engine = resolve_engine_name(engine, pipe.device)
    if engine == "compiled":
        report = _profile_compiled(pipe, role, inputs, steps, progress)
    else:
        report = _profile_torch(pipe, role, inputs, steps, progress, timing, on_partial, fusion)
    report["context"] = context if pipe.kind == "decoder" else None
    report["steps"] = steps
    progress.report("profiled", 1.0)
    return report


def _profile_torch(
    pipe: Any,
    role: str,
    inputs: tuple,
    steps: int,
    progress: Progress,
    timing: str,
    on_partial: Callable[[dict[str, Any]], None] | None,
    fusion: bool,
) -> dict[str, Any]:
    prepared = pipe.runners[role].prepared
    dev = pipe.device
    interp = _TimedInterpreter(prepared.gm, dev)
    timing = _resolve_timing(timing, dev)
    facts = device_facts(dev)  # measures the copy rate (once per device) before anything is timed
    expand = expansion(prepared.gm, pipe.snapshots[role])
    step_totals: list[float] = []
    per_step: list[dict[str, float]] = []
    with torch.no_grad():
        pipe.runners[role](*inputs)  # warm-up (allocator, first-call costs)
        for i in range(steps):
            progress.report(f"profiling {role}: step {i + 1}/{steps}", i / steps)
            step_totals.append(_timed_step(pipe.runners[role], inputs, dev))
            node_s, timing = _node_seconds(interp, prepared, inputs, timing)
            per_step.append(node_s)
            if on_partial is not None:
                part = _report(pipe, role, _charges(interp, _medians(per_step)), expand, facts, partial=True)
                part.update(step_seconds=statistics.median(step_totals), step=i + 1, steps=steps)
                on_partial(part)
    progress.report("attributing", 0.95)
    report = _report(pipe, role, _charges(interp, _medians(per_step)), expand, facts)
    report.update(
        engine={"name": "torch", "how": "op by op (the compiled engine fuses these nodes into fewer kernels)"},
        timing={
            "kernel": "device time of each node's kernels and copies (CUDA profiler)",
            "profiler-cpu": "CPU time inside each node's profiler range",
            "wall": "wall clock per node between device synchronisations",
        }[timing],
        step_seconds=statistics.median(step_totals),
    )
    if fusion:
        progress.report("compiling the graph once more to see what the compiled engine fuses", 0.96)
        _add_fusion(report, pipe, role, prepared, inputs)
    return report


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


def _add_fusion(report: dict[str, Any], pipe: Any, role: str, prepared: Any, inputs: tuple) -> None:
    from ..engines.kernel_map import fused_kernels

    gemv = role != "prefill" and gemv_enabled(pipe.device)
    kernels = fused_kernels(prepared, inputs, gemv=gemv)
    snap = pipe.snapshots[role]
    to_id = {n.name: n.id for n in snap.nodes}
    report["fusion"] = {
        "engine": "compiled (Inductor), this device"
        + ("; one-row products on mcore::gemv" if gemv else "")
        + "; the engine also merges sibling projections (q/k/v, gate/up)",
        "kernels": [{"kernel": k["kernel"], "nodes": [to_id.get(n, n) for n in k["nodes"]]} for k in kernels],
    }
    known = [dict(k, nodes=[n for n in k["nodes"] if n in to_id]) for k in kernels]
    _rank(report, snap, pipe.manifest, known, 0.0)


# ------------------------------------------------------------------ the compiled engine


def _profile_compiled(pipe: Any, role: str, inputs: tuple, steps: int, progress: Progress) -> dict[str, Any]:
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
    kernels, charges = _kernel_rows(step, times, traffic)
    snap = pipe.snapshots[role]
    expand = expansion(step.prepared.gm, snap)
    report = _report(pipe, role, charges, expand, facts, extra=times.between + times.unmapped)
    total = report["attributed_seconds"]
    to_id = {n.name: n.id for n in snap.nodes}
    split_input = []  # each kernel with the snapshot nodes it computes, as candidates' splits read them
    for k in kernels:
        members = sorted({m for n in k.pop("graph_nodes") for m, _ in expand.get(n, (None, []))[1]})
        k["node_ids"] = sorted((to_id[m] for m in members), key=lambda i: int(i.split(":")[1]))
        rates(k, total, facts["copy_bytes_per_s"], facts.get("peak_bf16_flops_per_s"))
        split_input.append({"kernel": k["kernel"], "order": k["order"], "seconds": k["seconds"], "nodes": members})
    report.update(
        engine={"name": "compiled", "how": _describe(step)},
        timing=HOW[how] + SHARED,
        step_seconds=step_s,
        kernel_seconds=sum(times.calls) + times.unmapped,
        between_kernels={
            "seconds": times.between,
            "share": times.between / total if total > 0 else 0.0,
            "gaps": times.gaps,
            "what": "no kernel running: launch latency and dependencies between kernels (and steps)",
        },
        unattributed_seconds=report["unattributed_seconds"] + times.unmapped,
        kernels=kernels,
    )
    _rank(report, snap, pipe.manifest, split_input, times.between / max(1, len(kernels)))
    return report


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
    return how + f", {len(step.kernels)} kernel calls"


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


def _report(
    pipe: Any,
    role: str,
    charges: list[tuple[str, float, float, float]],
    expand: dict,
    facts: dict[str, Any],
    partial: bool = False,
    extra: float = 0.0,
) -> dict[str, Any]:
    """The report's head and its node, module, recipe, slot and candidate rows. `extra`: time that
    belongs to the step but to no node (between kernels), counted in the attributed total."""
    snap = pipe.snapshots[role]
    bw, peak = facts["copy_bytes_per_s"], facts.get("peak_bf16_flops_per_s")  # peak: None where unknown
    nodes, slots, lost = graph_rows(snap, charges, expand)
    total = sum(n["seconds"] for n in nodes) + lost + extra
    for n in nodes:
        rates(n, total, bw, peak)
    m = pipe.manifest
    head = {
        "schema_version": SCHEMA_VERSION,
        "kind": "mcore-profile",
        "role": role,
        "bundle": {
            "model": m.model.spec,
            "fingerprint": m.roles[role].fingerprint,
            "build_args": dict(m.build_args),
        },
        "device": facts,
        "attributed_seconds": total,
        "unattributed_seconds": lost,
        "nodes": sorted(nodes, key=lambda n: -n["seconds"]),
        "modules": module_rows(nodes, total, bw, peak),
    }
    if partial:  # what a live view needs; recipes and candidates come with the whole report
        return {**head, "partial": True}
    recipes = recipe_rows(snap, nodes, total, bw, peak)
    return {
        **head,
        "versions": {
            "mcore": __version__,
            "torch": torch.__version__,
            "cuda": torch.version.cuda if pipe.device.type == "cuda" else None,
        },
        "kernel_seconds": None,
        "between_kernels": None,
        "kernels": None,
        "recipes": recipes,
        "slots": [rates(s, total, bw, peak) for s in slots],
        "candidates": candidates(snap, nodes, recipes, total, bw, m, peak),
    }


def _rank(report: dict, snap: Any, manifest: BundleManifest, kernels: list[dict], gap: float) -> None:
    """Candidates again, now with the kernels a slot over each would split and what that costs."""
    dev = report["device"]
    report["candidates"] = candidates(
        snap,
        report["nodes"],
        report["recipes"],
        report["attributed_seconds"],
        dev["copy_bytes_per_s"],
        manifest,
        dev.get("peak_bf16_flops_per_s"),
        kernels=kernels,
        gap=gap,
    )


def _role_inputs(pipe: Any, role: str, context: int, prompt: str | None) -> tuple:
    dev = pipe.device
    g = torch.Generator(device=dev).manual_seed(0)
    if pipe.kind == "encoder":
        ids, mask, _ = pipe.inputs(prompt or "the quick brown fox")
        return ids, mask
    if not 1 <= context < pipe.capacity:
        raise UserError(
            f"--context {context} must lie in 1..{pipe.capacity - 1} (the bundle's KV cache holds {pipe.capacity})"
        )
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
