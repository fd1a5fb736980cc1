"""Attribution: what each graph node moves and computes, time charged to snapshot nodes, and from
there to module paths, recipe instances, bound slots and the candidate regions worth a kernel.

Both engines end here. The op-by-op engine times each node of its graph; the compiled engine times
each kernel, whose time, bytes and FLOPs are shared among the nodes it computes by the bytes each
moves on its own (a matrix product keeps its own FLOPs). A node of the engine's graph that is not a
snapshot node passes its share on: a slot to the region it replaced, a product the engine fused
(q/k/v, gate/up) to the products it stands for, each by the bytes its tensors hold in the snapshot.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, cast

import torch
from torch import fx

from ..bundle.manifest import BundleManifest
from ..common.errors import UserError
from ..engines.gemv_pass import GEMV_OPS
from ..graph.from_export import TORCH_DTYPES
from ..graph.snapshot import Snapshot
from .report import KernelSplit, ProfileCandidate, ProfileModule, ProfileNode, ProfileRecipe, ProfileSlot, Rates

CANDIDATE_BINDING = "my.kernel@1"
MATMULS = {
    "aten.linear.default",
    "aten.mm.default",
    "aten.addmm.default",
    "aten.bmm.default",
    "aten.matmul.default",
    *(str(op) for op in GEMV_OPS),  # mcore's one-row products, with or without their fusions
}
VIEWS = {
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
}


def op_of(node: fx.Node) -> str:
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return f"{t.namespace}.{t._schema.name.split('::')[-1]}.{t._overloadname}"
    return getattr(t, "__name__", str(t))


def _nbytes(x: Any) -> int:
    return x.numel() * x.element_size() if isinstance(x, torch.Tensor) else 0


# ------------------------------------------------------------------ what a node moves


def node_traffic(n: fx.Node, env: dict[fx.Node, Any], out: Any) -> tuple[dict[str, int], int]:
    """(bytes read per input node name, bytes written) by node `n` run on its own, as the shapes say."""
    op = op_of(n)
    if op in VIEWS:
        return {}, 0  # views move nothing
    if op.startswith("aten.index_copy_"):  # writes the source rows into the cache in place
        src = n.args[-1]
        b = _nbytes(env.get(src)) if isinstance(src, fx.Node) else 0
        return ({src.name: b} if isinstance(src, fx.Node) else {}), b
    if op.startswith("mcore.decode_attention"):  # reads the active length of each cache, not its capacity
        vals: list[Any] = [env.get(a) if isinstance(a, fx.Node) else a for a in n.args[:4]]
        q, k, v, lengths = vals
        active = int(lengths.reshape(-1)[0]) if isinstance(lengths, torch.Tensor) else k.shape[2]
        half = k.shape[0] * k.shape[1] * active * k.shape[3] * k.element_size()
        names = [a.name if isinstance(a, fx.Node) else "" for a in n.args[:3]]
        return {names[0]: _nbytes(q), names[1]: half, names[2]: half}, _nbytes(q)
    inputs = [a for a in n.all_input_nodes if isinstance(env.get(a), torch.Tensor)]
    seen = {id(env[a]) for a in inputs}
    outs = out if isinstance(out, (tuple, list)) else [out]
    written = sum(_nbytes(o) for o in outs if isinstance(o, torch.Tensor) and id(o) not in seen)
    return {a.name: _nbytes(env[a]) for a in inputs}, written


def node_flops(n: fx.Node, env: dict[fx.Node, Any], out: Any) -> int:
    args = [env.get(a) if isinstance(a, fx.Node) else a for a in n.args]
    if op_of(n) in MATMULS and args and isinstance(args[0], torch.Tensor) and isinstance(out, torch.Tensor):
        return 2 * out.numel() * args[0].shape[-1]
    return 0


class TrafficInterpreter(fx.Interpreter):
    """Runs a graph node by node and records what each call_function node reads, writes and computes."""

    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm)
        self.reads: dict[str, dict[str, int]] = {}
        self.writes: dict[str, int] = {}
        self.flops: dict[str, int] = {}

    def call(self, n: fx.Node, args: tuple, kwargs: dict) -> Any:
        target = cast(Callable[..., Any], n.target)  # a call_function node's target is the callable itself
        return target(*args, **kwargs)

    def run_node(self, n: fx.Node) -> Any:
        if n.op != "call_function":
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        out = self.call(n, args, kwargs)
        if n.name not in self.writes:
            self.reads[n.name], self.writes[n.name] = node_traffic(n, self.env, out)
            self.flops[n.name] = node_flops(n, self.env, out)
        return out

    def bytes_of(self, name: str) -> int:
        return sum(self.reads.get(name, {}).values()) + self.writes.get(name, 0)


# ------------------------------------------------------------------ engine graph -> snapshot nodes


def tensor_bytes(snap: Snapshot, tid: str) -> int:
    t = snap.tensor(tid)
    n = 1
    for d in t.shape:
        n *= max(d, 1)  # a dynamic dimension counts once: only ratios use this
    dtype = TORCH_DTYPES.get(t.dtype)
    return n * (dtype.itemsize if dtype is not None else 4)


def snapshot_bytes(snap: Snapshot, name: str, by_name: dict[str, Any]) -> int:
    node = by_name[name]
    return sum(tensor_bytes(snap, t) for t in {*node.inputs, *node.outputs})


def _slot_of(n: fx.Node) -> Any:
    from ..engines.slots import SlotCall, slot_call

    if isinstance(n.target, SlotCall):  # the op-by-op engine calls a slot directly
        return n.target
    if n.target is torch.ops.mcore.slot.default:
        return slot_call(str(n.args[1]))
    return None


def expansion(gm: fx.GraphModule, snap: Snapshot) -> dict[str, tuple[str | None, list[tuple[str, float]]]]:
    """Engine-graph node name -> (the binding ID of the slot it is, or None; [(snapshot node name,
    weight)]): a snapshot node is itself; a slot stands for its region's nodes, a fused product for
    the products it replaced, shared by the bytes their tensors hold."""
    by_name = {n.name: n for n in snap.nodes}
    out: dict[str, tuple[str | None, list[tuple[str, float]]]] = {}
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        slot = _slot_of(n)
        binding = slot.binding_id if slot is not None else None
        if slot is not None:
            members = [snap.node(i).name for i in slot.slot.node_ids if snap.node(i).op != "constant"]
        else:
            folded = n.meta.get("mcore_fused_nodes", [])
            members = [m for m in ([n.name] if n.name in by_name else []) + list(folded) if m in by_name]
        sizes = [snapshot_bytes(snap, m, by_name) for m in members]
        total = sum(sizes)
        out[n.name] = (
            binding,
            [(m, s / total if total else 1 / len(members)) for m, s in zip(members, sizes, strict=True)],
        )
    return out


def graph_rows(
    snap: Snapshot, charges: Iterable[tuple[str, float, float, float]], expand: dict
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float]:
    """Charges (engine-graph node name, seconds, bytes, FLOPs) -> (what each snapshot node was
    charged, what each slot was charged by binding ID, seconds no snapshot node takes): the amounts
    node_rows and slot_rows rate once the attributed total is known."""
    by_name = {n.name: n for n in snap.nodes}
    rows: dict[str, dict[str, Any]] = {}
    slots: dict[str, dict[str, Any]] = defaultdict(lambda: {"seconds": 0.0, "bytes": 0, "flops": 0, "calls": 0})
    lost = 0.0
    for name, s, b, f in charges:
        binding, members = expand.get(name, (None, []))
        if binding is not None:
            row = slots[binding]
            row["seconds"] += s
            row["bytes"] += b
            row["flops"] += f
            row["calls"] += 1
        if not members:
            lost += s
        for m, w in members:
            sn = by_name[m]
            r = rows.setdefault(
                m,
                {"id": sn.id, "name": m, "op": sn.op, "module_path": sn.module_path, "binding_id": binding}
                | {"seconds": 0.0, "bytes": 0.0, "flops": 0.0},
            )
            r["seconds"] += s * w
            r["bytes"] += b * w
            r["flops"] += f * w
    nodes = [r | {"bytes": int(round(r["bytes"])), "flops": int(round(r["flops"]))} for r in rows.values()]
    return nodes, [dict(binding_id=k, **v) for k, v in slots.items()], lost


def node_rows(charged: list[dict[str, Any]], total: float, bw: float, peak: float | None) -> list[ProfileNode]:
    """graph_rows' node amounts as rows, in the same order."""
    return [
        ProfileNode(
            n["id"], n["name"], n["op"], n["module_path"], n["binding_id"], rates(*_amounts(n), total, bw, peak)
        )
        for n in charged
    ]


def slot_rows(charged: list[dict[str, Any]], total: float, bw: float, peak: float | None) -> list[ProfileSlot]:
    """graph_rows' slot amounts as rows, in the same order."""
    return [ProfileSlot(s["binding_id"], s["calls"], rates(*_amounts(s), total, bw, peak)) for s in charged]


def _amounts(row: dict[str, Any]) -> tuple[float, float, float]:
    return row["seconds"], row["bytes"], row["flops"]


# ------------------------------------------------------------------ rows, regions, candidates


def rates(
    seconds: float, moved: float, flops: float, total: float, bw: float, peak_flops: float | None = None
) -> Rates:
    """A row's amounts rated against the attributed total, the copy rate and the peak math rate."""
    s = seconds
    # the roofline: memory time at the copy rate, or math time at the peak, whichever is longer
    limit = max(moved / bw, flops / peak_flops if peak_flops else 0.0)
    return Rates(
        seconds=s,
        bytes=moved,
        flops=flops,
        share=s / total if total > 0 else 0.0,
        bytes_per_s=moved / s if s > 0 else 0.0,
        flops_per_s=flops / s if s > 0 else 0.0,
        limit_seconds=limit,
        ratio_to_limit=limit / s if s > 0 else 0.0,
        headroom_seconds=max(0.0, s - limit),
    )


def _sum(members: Sequence[ProfileNode]) -> tuple[float, float, float]:
    """The members' seconds, bytes and FLOPs, summed."""
    return (
        sum(m.rates.seconds for m in members),
        sum(m.rates.bytes for m in members),
        sum(m.rates.flops for m in members),
    )


def module_rows(nodes: Sequence[ProfileNode], total: float, bw: float, peak: float | None) -> list[ProfileModule]:
    """Each module subtree (and <root>): the nodes under it, summed."""
    members: dict[str, list[ProfileNode]] = defaultdict(list)
    for n in nodes:
        parts = n.module_path.split(".") if n.module_path else []
        for depth in range(len(parts) + 1):
            members[".".join(parts[:depth]) or "<root>"].append(n)
    rows = [ProfileModule(p, len(ms), rates(*_sum(ms), total, bw, peak)) for p, ms in members.items()]
    return sorted(rows, key=lambda r: -r.rates.seconds)


def recipe_rows(
    snap: Snapshot, nodes: Sequence[ProfileNode], total: float, bw: float, peak: float | None
) -> list[ProfileRecipe]:
    by_id = {n.id: n for n in nodes}
    rows = []
    for r in snap.recipe_rows:
        ms = [by_id[i] for i in r.node_ids if i in by_id]
        rated = rates(*_sum(ms), total, bw, peak)
        rows.append(ProfileRecipe(r.id, r.instance, tuple(r.node_ids), len(ms), r.output_shape_input, rated))
    return sorted(rows, key=lambda r: -r.rates.seconds)


def split_costs(kernels: list[dict], region: set[str], snap: Snapshot, bw: float, gap: float) -> list[KernelSplit]:
    """The kernels (snapshot node names in "nodes") that a slot over `region` would split, each with
    what the split costs at least: the tensors that cross the new boundary inside the kernel written
    out and read back at the copy rate, and one more launch (`gap`: the step's mean time between
    kernels). The nodes outside the slot then run unfused from the region."""
    by_name = {n.name: n for n in snap.nodes}
    out = []
    for k in kernels:
        inside = [n for n in k["nodes"] if n in region]
        if not inside or len(inside) == len(k["nodes"]):
            continue
        members = set(k["nodes"])
        crossing = set()
        for name in members:
            for t in by_name[name].outputs:
                readers = {snap.node(c).name for c in snap.tensor(t).consumers} & members
                if readers and any((r in region) != (name in region) for r in readers):
                    crossing.add(t)
        moved = sum(tensor_bytes(snap, t) for t in crossing)
        out.append(
            KernelSplit(
                kernel=k["kernel"],
                order=k.get("order"),
                inside=len(inside),
                outside=len(members) - len(inside),
                seconds=k.get("seconds"),
                cost_seconds=2 * moved / bw + gap,
            )
        )
    return out


def candidates(
    snap: Snapshot,
    nodes: Sequence[ProfileNode],
    recipes: Sequence[ProfileRecipe],
    total: float,
    bw: float,
    manifest: BundleManifest,
    peak_flops: float | None = None,
    kernels: list[dict] | None = None,
    gap: float = 0.0,
) -> list[ProfileCandidate]:
    """Recipe instances and module subtrees whose nodes select_region() accepts, ranked together by
    net headroom (headroom minus what splitting the compiled engine's kernels there costs; a recipe
    first where they tie: its command is ready to build). One ranking, because on a large model
    dozens of small recipe instances would otherwise bury the regions worth a kernel. Without
    `kernels` (op by op, no --fusion) nothing is known to split: the net headroom is the headroom."""
    args = " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in manifest.build_args.items() if v is not None and k != "model"
    )
    model = manifest.build_args["model"]
    out = [
        ProfileCandidate(
            kind="recipe",
            recipe=r.recipe,
            instance=r.instance,
            node_ids=r.node_ids,
            output_shape_input=r.output_shape_input,
            seconds=r.rates.seconds,
            share=r.rates.share,
            headroom_seconds=r.rates.headroom_seconds,
            command=f"mcore build {model} {args} --recipe {r.recipe} {r.instance} -o slot.bundle",
            split_cost_seconds=0,
            net_headroom_seconds=r.rates.headroom_seconds,
        )
        for r in recipes
    ]
    out += _module_candidates(snap, nodes, {r.node_ids for r in recipes}, total, bw, peak_flops)
    if kernels is not None:
        names = {n.id: n.name for n in snap.nodes}
        out = [
            _priced(c, split_costs(kernels, {names[i] for i in c.node_ids if i in names}, snap, bw, gap)) for c in out
        ]
    return sorted(out, key=lambda c: (-c.net_headroom_seconds, c.kind != "recipe"))


def _priced(c: ProfileCandidate, splits: list[KernelSplit]) -> ProfileCandidate:
    """A candidate with the fused kernels a slot there would split, their cost and the net headroom."""
    cost = sum(s.cost_seconds for s in splits)
    net = max(0.0, c.headroom_seconds - cost)
    return replace(c, splits=tuple(splits), split_cost_seconds=cost, net_headroom_seconds=net)


def _module_candidates(
    snap: Snapshot, nodes: Sequence[ProfileNode], covered: set[tuple], total: float, bw: float, peak: float | None
) -> list[ProfileCandidate]:
    from ..selection.region import select_region

    by_module: dict[str, list[ProfileNode]] = defaultdict(list)
    for n in nodes:  # each module subtree: a module's own nodes and those of every module below it
        if n.id and n.module_path:
            parts = n.module_path.split(".")
            for k in range(2, len(parts) + 1):  # not the whole model ("decoder")
                by_module[".".join(parts[:k])].append(n)
    out = []
    for path, members in by_module.items():
        ids = sorted((m.id for m in members), key=lambda i: int(i.split(":")[1]))
        if tuple(ids) in covered or not any(m.rates.seconds for m in members):
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
        row = rates(*_sum(members), total, bw, peak)
        flag = "" if receipt.output_shape_input is None else f" --output-shape-like-input {receipt.output_shape_input}"
        out.append(
            ProfileCandidate(
                kind="region",
                module_path=path,
                node_ids=tuple(ids),
                output_shape_input=receipt.output_shape_input,
                seconds=row.seconds,
                share=row.share,
                headroom_seconds=row.headroom_seconds,
                command=f"mcore graph select SNAPSHOT --nodes {' '.join(ids)} --binding-id {CANDIDATE_BINDING} "
                f"--workspace-bytes 0{flag} -o selection.json",
                split_cost_seconds=0,
                net_headroom_seconds=row.headroom_seconds,
            )
        )
    return out
