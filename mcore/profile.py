"""Where the time goes: device time attributed to graph nodes, module paths, recipe instances and
bound slots, and the regions worth a kernel (DESIGN.md §10).

Attribution runs the role graph op by op (the `torch` engine's graph, slots included) through an
FX interpreter. On CUDA each node runs inside a profiler range and is charged the device time of
the kernels and copies it launched (CUPTI, through torch.profiler): timing a node with a device
sync around it would charge every small op its launch and sync latency, tens of times its kernel
time. On CPU (or where the profiler sees no device activity) each node is timed on the wall clock
between synchronisations. The time a node would take at the device's limit is the larger of its bytes
moved (tensor arguments read, results written, as the shapes say) over the measured copy bandwidth
and its matrix-product FLOPs over the peak BF16 tensor-core rate (where the device's is known); a
region's headroom (its time minus that) is the most a perfect kernel for it could save.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from typing import Any, Callable, Optional, Sequence, cast

import torch
from torch import fx

from . import __version__
from .device import device_facts
from .errors import UserError
from .gemv import enabled as gemv_enabled
from .graph.snapshot import Snapshot
from .progress import NO_PROGRESS, Progress

SCHEMA_VERSION = 1
CANDIDATE_BINDING = "my.kernel@1"
_MATMULS = {"aten.linear.default", "aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.matmul.default"}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------------------------------ timing


def _nbytes(x: Any) -> int:
    return x.numel() * x.element_size() if isinstance(x, torch.Tensor) else 0


def _op(node: fx.Node) -> str:
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return f"{t.namespace}.{t._schema.name.split('::')[-1]}.{t._overloadname}"
    return getattr(t, "__name__", str(t))


_RANGE = "mcore.node:"


class _TimedInterpreter(fx.Interpreter):
    """Runs the graph node by node, adding each call_function node's time to `seconds` (wall clock
    between syncs), or, with `ranges`, marking each node as a profiler range for `profiled_seconds`."""

    def __init__(self, gm: fx.GraphModule, device: torch.device):
        super().__init__(gm)
        self.device = device
        self.ranges = False
        self.seconds: dict[str, float] = defaultdict(float)
        self.bytes: dict[str, int] = {}
        self.flops: dict[str, int] = {}

    def run_node(self, n: fx.Node) -> Any:
        if n.op != "call_function":
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        target = cast(Callable[..., Any], n.target)  # a call_function node's target is the callable itself
        if self.ranges:
            with torch.profiler.record_function(_RANGE + n.name):
                out = target(*args, **kwargs)
        else:
            _sync(self.device)
            t = time.perf_counter()
            out = target(*args, **kwargs)  # only the op itself: the interpreter's own work stays outside
            _sync(self.device)
            self.seconds[n.name] += time.perf_counter() - t
        if n.name not in self.bytes:
            inputs = [self.env[a] for a in n.all_input_nodes if a in self.env]
            self.bytes[n.name] = _node_bytes(n, inputs, out)
            self.flops[n.name] = _node_flops(n, inputs, out)
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


def _node_bytes(n: fx.Node, args: list[Any], out: Any) -> int:
    op = _op(n)
    if op.startswith("aten.index_copy_"):  # writes the source rows into the cache in place
        return 2 * _nbytes(args[-1]) if args else 0
    if op.startswith("mcore.decode_attention"):  # reads the active length of each cache, not its capacity
        q, k, v, lengths = args[:4]
        active = int(lengths.reshape(-1)[0]) if isinstance(lengths, torch.Tensor) else k.shape[2]
        kv = 2 * k.shape[0] * k.shape[1] * active * k.shape[3] * k.element_size()
        return 2 * _nbytes(q) + kv
    if op in (
        "aten.view.default",
        "aten.reshape.default",
        "aten.transpose.int",
        "aten.slice.Tensor",
        "aten.select.int",
        "aten.unsqueeze.default",
        "aten.expand.default",
        "aten.sym_size.int",
        "operator.getitem",
        "getitem",
    ):
        return 0  # views move nothing
    outs = out if isinstance(out, (tuple, list)) else [out]
    seen: set[int] = set()
    total = 0
    for x in [*args, *outs]:
        if isinstance(x, torch.Tensor) and id(x) not in seen:
            seen.add(id(x))
            total += _nbytes(x)
    return total


def _node_flops(n: fx.Node, args: list[Any], out: Any) -> int:
    if _op(n) in _MATMULS and args and isinstance(out, torch.Tensor):
        return 2 * out.numel() * args[0].shape[-1]
    return 0


# ------------------------------------------------------------------------------------ profile


def profile_pipeline(
    pipe: Any,
    role: str,
    context: int,
    steps: int,
    prompt: Optional[str] = None,
    progress: Progress = NO_PROGRESS,
    timing: str = "auto",
    on_partial: Optional[Callable[[dict[str, Any]], None]] = None,
    fusion: bool = False,
) -> dict[str, Any]:
    """Profile one role of a pipeline built with the `torch` engine: `steps` timed runs at `context`.

    `fusion`: also compile the role graph with Inductor once more and report which nodes the
    compiled engine fuses into which kernel, and per candidate region the fused kernels a slot
    there would split (engines/kernel_map.py).

    `timing`: "auto" (kernel time on CUDA, wall clock on CPU), "kernel", "profiler-cpu" (the
    profiler's CPU time per node range: the kernel path's bookkeeping, testable without a GPU) or "wall".
    `on_partial`, if given, receives after each step the nodes and modules attributed so far
    (medians over the steps done; no recipes or candidates), for views that fill in live."""
    if pipe.engine_name != "torch":
        raise UserError("profiling attributes time node by node: build the pipeline with engine='torch'")
    if role not in pipe.runners:
        raise UserError(f"role {role!r} is not in this bundle; use one of {', '.join(pipe.runners)}")
    if steps < 1:
        raise UserError(f"--steps {steps} must be at least 1")
    inputs = _role_inputs(pipe, role, context, prompt)
    prepared = pipe.runners[role].prepared
    dev = pipe.device
    interp = _TimedInterpreter(prepared.gm, dev)
    if timing == "auto":
        timing = "kernel" if dev.type == "cuda" else "wall"
    if timing not in ("kernel", "profiler-cpu", "wall"):
        raise UserError(f"timing {timing!r} is not one of auto, kernel, profiler-cpu, wall")
    if timing == "kernel" and dev.type != "cuda":
        raise UserError("kernel timing needs a CUDA device; use wall timing on CPU")
    facts = device_facts(dev)  # measures the copy rate (once per device) before anything is timed
    step_totals: list[float] = []
    per_step: list[dict[str, float]] = []
    with torch.no_grad():
        pipe.runners[role](*inputs)  # warm-up (allocator, first-call costs)
        for i in range(steps):
            progress.report(f"profiling {role}: step {i + 1}/{steps}", i / steps)
            _sync(dev)
            t = time.perf_counter()
            pipe.runners[role](*inputs)
            _sync(dev)
            step_totals.append(time.perf_counter() - t)
            interp.seconds.clear()
            node_s: dict[str, float] = {}
            if timing != "wall":
                node_s = profiled_seconds(
                    interp, lambda: interp.run(*prepared.state_args, *inputs), device_time=timing == "kernel"
                )
                if not node_s:  # no profiler activity (no CUPTI here): fall back to the wall clock
                    timing = "wall"
            if timing == "wall":
                interp.run(*prepared.state_args, *inputs)
                node_s = dict(interp.seconds)
            per_step.append(node_s)
            if on_partial is not None:
                part = _attribute(
                    pipe,
                    role,
                    prepared.gm,
                    _medians(per_step),
                    interp.bytes,
                    interp.flops,
                    statistics.median(step_totals),
                    facts,
                    partial=True,
                )
                part.update(step=i + 1, steps=steps)
                on_partial(part)
    progress.report("attributing", 0.95)
    report = _attribute(
        pipe, role, prepared.gm, _medians(per_step), interp.bytes, interp.flops, statistics.median(step_totals), facts
    )
    report["timing"] = {
        "kernel": "device time of each node's kernels and copies (CUDA profiler)",
        "profiler-cpu": "CPU time inside each node's profiler range",
        "wall": "wall clock per node between device synchronisations",
    }[timing]
    report["context"] = context if pipe.kind == "decoder" else None
    report["steps"] = steps
    if fusion:
        progress.report("compiling the graph once more to see what the compiled engine fuses", 0.96)
        _add_fusion(report, pipe.snapshots[role], prepared, inputs, gemv=role != "prefill" and gemv_enabled(dev))
    progress.report("profiled", 1.0)
    return report


def _add_fusion(report: dict[str, Any], snap: Snapshot, prepared: Any, inputs: tuple, gemv: bool) -> None:
    from .engines.kernel_map import fused_kernels, split_by

    kernels = fused_kernels(prepared, inputs, gemv=gemv)
    to_id = {n.name: n.id for n in snap.nodes}
    to_name = {i: name for name, i in to_id.items()}
    report["fusion"] = {
        "engine": "compiled (Inductor), this device"
        + ("; one-row products on mcore::gemv" if gemv else "")
        + "; the engine also merges sibling projections (q/k/v, gate/up)",
        "kernels": [{"kernel": k["kernel"], "nodes": [to_id.get(n, n) for n in k["nodes"]]} for k in kernels],
    }
    for c in report["candidates"]:
        c["splits"] = split_by(kernels, {to_name[i] for i in c["node_ids"] if i in to_name})


def _role_inputs(pipe: Any, role: str, context: int, prompt: Optional[str]) -> tuple:
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


def _attribute(
    pipe: Any,
    role: str,
    gm: fx.GraphModule,
    node_s: dict[str, float],
    node_bytes: dict[str, int],
    node_flops: dict[str, int],
    step_s: float,
    facts: dict[str, Any],
    partial: bool = False,
) -> dict[str, Any]:
    snap = pipe.snapshots[role]
    by_name = {n.name: n for n in snap.nodes}
    bw = facts["copy_bytes_per_s"]
    peak = facts.get("peak_bf16_flops_per_s")  # None where the chip's math peak is not known
    fx_nodes = {n.name: n for n in gm.graph.nodes}
    nodes: list[dict[str, Any]] = []
    for name, s in node_s.items():
        sn = by_name.get(name)
        fxn = fx_nodes.get(name)
        binding = fxn.meta.get("mcore_binding_id") if fxn is not None else None
        nodes.append(
            {
                "id": sn.id if sn else None,
                "name": name,
                "op": sn.op if sn else (_op(fxn) if fxn else name),
                "module_path": sn.module_path if sn else "",
                "binding_id": binding,
                "seconds": s,
                "bytes": node_bytes.get(name, 0),
                "flops": node_flops.get(name, 0),
            }
        )
    total = sum(n["seconds"] for n in nodes) or 1e-12
    for n in nodes:
        _rates(n, total, bw, peak)
    modules: dict[str, dict[str, Any]] = defaultdict(lambda: {"seconds": 0.0, "bytes": 0, "flops": 0, "calls": 0})
    for n in nodes:
        parts = n["module_path"].split(".") if n["module_path"] else []
        for depth in range(len(parts) + 1):
            row = modules[".".join(parts[:depth]) or "<root>"]
            row["seconds"] += n["seconds"]
            row["bytes"] += n["bytes"]
            row["flops"] += n["flops"]
            row["calls"] += 1
    module_rows = [dict(path=p, **r) for p, r in modules.items()]
    for r in module_rows:
        _rates(r, total, bw, peak)
    m = pipe.manifest
    head = {
        "schema_version": SCHEMA_VERSION,
        "kind": "mcore-profile",
        "role": role,
        "bundle": {
            "model": m["model"]["spec"],
            "fingerprint": m["roles"][role]["fingerprint"],
            "build_args": m["build_args"],
        },
        "device": facts,
    }
    if partial:  # what a live view needs; recipes and candidates come with the whole report
        return {
            **head,
            "partial": True,
            "step_seconds": step_s,
            "attributed_seconds": total,
            "nodes": sorted(nodes, key=lambda n: -n["seconds"]),
            "modules": sorted(module_rows, key=lambda r: -r["seconds"]),
        }
    by_id = {n["id"]: n for n in nodes if n["id"]}
    recipes = []
    for r in snap.recipe_rows:
        members = [by_id[i] for i in r.node_ids if i in by_id]
        row = {
            "recipe": r.id,
            "instance": r.instance,
            "node_ids": list(r.node_ids),
            "seconds": sum(m["seconds"] for m in members),
            "bytes": sum(m["bytes"] for m in members),
            "flops": sum(m["flops"] for m in members),
            "calls": len(members),
        }
        row["output_shape_input"] = r.output_shape_input
        recipes.append(_rates(row, total, bw, peak))
    slots: dict[str, dict[str, Any]] = defaultdict(lambda: {"seconds": 0.0, "bytes": 0, "flops": 0, "calls": 0})
    for n in nodes:
        if n["binding_id"]:
            slot = slots[n["binding_id"]]
            slot["seconds"] += n["seconds"]
            slot["bytes"] += n["bytes"]
            slot["calls"] += 1
    slot_rows = [_rates(dict(binding_id=b, **r), total, bw, peak) for b, r in slots.items()]
    return {
        **head,
        "versions": {
            "mcore": __version__,
            "torch": torch.__version__,
            "cuda": torch.version.cuda if pipe.device.type == "cuda" else None,
        },
        "engine": "torch (op by op; the compiled engine fuses these nodes into fewer kernels)",
        "step_seconds": step_s,
        "attributed_seconds": total,
        "nodes": sorted(nodes, key=lambda n: -n["seconds"]),
        "modules": sorted(module_rows, key=lambda r: -r["seconds"]),
        "recipes": sorted(recipes, key=lambda r: -r["seconds"]),
        "slots": slot_rows,
        "candidates": candidates(snap, nodes, recipes, total, bw, m, peak),
    }


def _rates(row: dict[str, Any], total: float, bw: float, peak_flops: Optional[float] = None) -> dict[str, Any]:
    s = row["seconds"]
    row["share"] = s / total
    row["bytes_per_s"] = row["bytes"] / s if s > 0 else 0.0
    row["flops_per_s"] = row["flops"] / s if s > 0 else 0.0
    # the roofline: memory time at the copy rate, or math time at the peak, whichever is longer
    row["limit_seconds"] = max(row["bytes"] / bw, row["flops"] / peak_flops if peak_flops else 0.0)
    row["ratio_to_limit"] = row["limit_seconds"] / s if s > 0 else 0.0
    row["headroom_seconds"] = max(0.0, s - row["limit_seconds"])
    return row


def candidates(
    snap: Snapshot,
    nodes: list[dict],
    recipes: list[dict],
    total: float,
    bw: float,
    manifest: dict[str, Any],
    peak_flops: Optional[float] = None,
) -> list[dict[str, Any]]:
    """Recipe instances and module subtrees whose nodes select_region() accepts, ranked by headroom
    together (a recipe first where they tie: its command is ready to build). One ranking, because on
    a large model dozens of small recipe instances would otherwise bury the regions worth a kernel."""
    from .selection import select_region

    args = " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in manifest["build_args"].items() if v is not None and k != "model"
    )
    model = manifest["build_args"]["model"]
    out = []
    covered = set()
    for r in recipes:
        out.append(
            {
                "kind": "recipe",
                "recipe": r["recipe"],
                "instance": r["instance"],
                "node_ids": r["node_ids"],
                "output_shape_input": r["output_shape_input"],
                "seconds": r["seconds"],
                "share": r["share"],
                "headroom_seconds": r["headroom_seconds"],
                "command": f"mcore build {model} {args} --recipe {r['recipe']} {r['instance']} -o slot.bundle",
            }
        )
        covered.add(tuple(r["node_ids"]))
    by_module: dict[str, list[dict]] = defaultdict(list)
    for n in nodes:  # each module subtree: a module's own nodes and those of every module below it
        if n["id"] and n["module_path"]:
            parts = n["module_path"].split(".")
            for k in range(2, len(parts) + 1):  # not the whole model ("decoder")
                by_module[".".join(parts[:k])].append(n)
    for path, members in by_module.items():
        ids = sorted((m["id"] for m in members), key=lambda i: int(i.split(":")[1]))
        if tuple(ids) in covered or not any(m["seconds"] for m in members):
            continue
        receipt = None
        for shape_input in (None, 0):
            try:
                receipt = select_region(snap, ids, CANDIDATE_BINDING, 0, (), shape_input)
                break
            except UserError:
                continue
        if receipt is None:
            continue
        row = _rates(
            {
                "seconds": sum(m["seconds"] for m in members),
                "bytes": sum(m["bytes"] for m in members),
                "flops": sum(m["flops"] for m in members),
            },
            total,
            bw,
            peak_flops,
        )
        flag = "" if receipt.output_shape_input is None else f" --output-shape-like-input {receipt.output_shape_input}"
        out.append(
            {
                "kind": "region",
                "module_path": path,
                "node_ids": ids,
                "output_shape_input": receipt.output_shape_input,
                "seconds": row["seconds"],
                "share": row["share"],
                "headroom_seconds": row["headroom_seconds"],
                "command": f"mcore graph select SNAPSHOT --nodes {' '.join(ids)} --binding-id {CANDIDATE_BINDING} "
                f"--workspace-bytes 0{flag} -o selection.json",
            }
        )
    return sorted(out, key=lambda c: (-c["headroom_seconds"], c["kind"] != "recipe"))


def top_lines(report: dict[str, Any], top: int) -> list[str]:
    """The printed view: step time, the hottest modules and the ranked candidate regions."""
    dev = report["device"]
    ctx = f", context {report['context']}" if report.get("context") else ""
    lines = [
        f"profile {report['role']} on {dev['name']} ({dev['type']}){ctx}: step "
        f"{report['step_seconds'] * 1e3:.3f} ms, attributed {report['attributed_seconds'] * 1e3:.3f} ms over "
        f"{len(report['nodes'])} nodes; limit: copy {dev['copy_bytes_per_s'] / 1e9:.1f} GB/s"
        + (f" (peak {dev['theoretical_bytes_per_s'] / 1e9:.0f} GB/s)" if dev.get("theoretical_bytes_per_s") else "")
        + (
            f"; math: bf16 {dev['peak_bf16_flops_per_s'] / 1e12:.0f} TFLOP/s peak"
            if dev.get("peak_bf16_flops_per_s")
            else ""
        )
    ]
    if report.get("timing"):
        lines.append(f"timing: {report['timing']}")
    lines.append(
        "modules (time per step, share, bytes moved, achieved GB/s, achieved GFLOP/s, time at the limit / time):"
    )
    for r in [r for r in report["modules"] if r["path"] != "<root>"][:top]:
        lines.append(
            f"  {r['path']:<48} {r['seconds'] * 1e3:9.3f} ms {r['share']:6.1%} {r['bytes'] / 1e6:9.2f} MB "
            f"{r['bytes_per_s'] / 1e9:7.2f} GB/s {r['flops_per_s'] / 1e9:8.1f} GFLOP/s {r['ratio_to_limit']:6.1%}"
        )
    for s in report["slots"]:
        lines.append(f"slot {s['binding_id']}: {s['seconds'] * 1e3:.3f} ms {s['share']:.1%} over {s['calls']} call(s)")
    lines.append(
        f"top {top} candidate regions (headroom = time minus time at the limit: the most a kernel could save):"
    )
    for i, c in enumerate(report["candidates"][:top], 1):
        what = f"{c['recipe']} {c['instance']}" if c["kind"] == "recipe" else f"region {c['module_path']}"
        lines.append(
            f"  {i:2}. {what}: {c['seconds'] * 1e3:.3f} ms {c['share']:.1%}, headroom "
            f"{c['headroom_seconds'] * 1e3:.3f} ms"
        )
        lines.append(f"      {c['command']}")
        if c.get("splits"):
            parts = [f"{k['kernel']} ({k['inside']} inside, {k['outside']} outside)" for k in c["splits"]]
            lines.append(f"      a slot here splits {len(parts)} fused kernel(s): {', '.join(parts)}")
    fusion = report.get("fusion")
    if fusion:
        ks = fusion["kernels"]
        fused = [k for k in ks if len(k["nodes"]) > 1]
        lines.append(
            f"fusion ({fusion['engine']}): {len(ks)} kernels for "
            f"{sum(len(k['nodes']) for k in ks)} nodes, {len(fused)} of them fusing several nodes"
        )
    return lines


def diff_lines(a: dict[str, Any], b: dict[str, Any], labels: Sequence[str] = ("a", "b")) -> list[str]:
    """Two profiles (say native and with a kernel bound), per recipe instance and module, b minus a."""
    for p, label in zip((a, b), labels):
        if p.get("kind") != "mcore-profile" or p.get("schema_version") != SCHEMA_VERSION:
            raise UserError(
                f"{label}: not an mcore profile (schema_version {SCHEMA_VERSION}); make one with "
                "`mcore profile BUNDLE -o FILE`"
            )
    lines = [
        f"step: {labels[0]} {a['step_seconds'] * 1e3:.3f} ms, {labels[1]} {b['step_seconds'] * 1e3:.3f} ms "
        f"({(b['step_seconds'] - a['step_seconds']) * 1e3:+.3f} ms)"
    ]

    def rows(p: dict, key: Callable[[dict], str], field: str) -> dict[str, float]:
        return {key(r): r["seconds"] for r in p[field]}

    for field, key in (("recipes", lambda r: f"{r['recipe']} {r['instance']}"), ("modules", lambda r: r["path"])):
        ra, rb = rows(a, key, field), rows(b, key, field)
        changed = sorted(set(ra) | set(rb), key=lambda k: -abs(rb.get(k, 0.0) - ra.get(k, 0.0)))
        for k in changed[:10]:
            d = rb.get(k, 0.0) - ra.get(k, 0.0)
            lines.append(
                f"  {field[:-1]} {k}: {ra.get(k, 0.0) * 1e3:.3f} -> {rb.get(k, 0.0) * 1e3:.3f} ms ({d * 1e3:+.3f})"
            )
    return lines
