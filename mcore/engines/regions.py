"""Regional compilation: a role graph cut into regions, each distinct region compiled once.

A decoder's role graph repeats one layer 36 times; Inductor compiling the whole graph lowers,
schedules and generates code for every copy (most of a cold start). Cut at the right places, the
regions between cuts are the same graph over other weights and caches: compiled once, their code
runs for every copy.

The cuts must not change a single bit of what the whole-graph compile computes. Inductor keeps
float intermediates of a fused kernel in registers (a bf16 value computed and used in the same
kernel is never rounded), so every value that crosses a cut must be one the whole-graph compile
stores to memory and reads back anyway. A cut sits just before an extern op E (a matrix product,
an mcore op) such that
  - every node before the cut is an ancestor of E and every node after it a descendant: the
    schedule passes through E, so no kernel can be fused, reordered or combined across it;
  - every value crossing the cut is stored in the whole-graph compile: an extern op's input or
    output, a reduction, or a pointwise value Inductor materializes (one with several users whose
    inlined expression reads more than `config.realize_reads_threshold` buffers, or more than
    `realize_acc_reads_threshold`; `_materialized` follows the rule Inductor's lowering applies).
    In a pre-norm decoder the residual stream qualifies every other layer (its chain of adds
    reaches 5 reads every 4 adds), so the regions span two layers.
Values that derive from the graph's inputs alone (sizes, positions, rotary tables) are computed
again inside each region that reads them, as the whole-graph compile inlines them into each user
(one it stores, such as decode's kv lengths read by every attention call, is computed once and
passed on, as there).
Where no cut qualifies, the caller compiles the whole graph.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import torch
from torch import fx

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")
_EXTERN_ATEN = {
    torch.ops.aten.linear.default,
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten.matmul.default,
    torch.ops.aten.baddbmm.default,
}
_REDUCTIONS = {
    torch.ops.aten.mean.dim,
    torch.ops.aten.sum.dim_IntList,
    torch.ops.aten.amax.default,
    torch.ops.aten.amin.default,
    torch.ops.aten.var_mean.correction,
    torch.ops.aten.var.correction,
    torch.ops.aten._softmax.default,
    torch.ops.aten._log_softmax.default,
    torch.ops.aten.softmax.int,
    torch.ops.aten.layer_norm.default,
    torch.ops.aten.native_layer_norm.default,
}


def _is_extern(n: fx.Node) -> bool:
    t = n.target
    if t in _EXTERN_ATEN:
        return True
    return isinstance(t, torch._ops.OpOverload) and t.namespace not in ("aten", "prims")


def _mutates(n: fx.Node) -> bool:
    schema = getattr(n.target, "_schema", None)
    return schema is not None and any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def _inputs(n: fx.Node) -> list[fx.Node]:
    return list(n.all_input_nodes)


def _pure_aten(n: fx.Node) -> bool:
    t = n.target
    if isinstance(t, torch._ops.OpOverload):
        if torch.Tag.nondeterministic_seeded in t.tags:
            return False  # computed twice, a random op would draw twice
        return t.namespace in ("aten", "prims") and not _mutates(n) and not _is_extern(n)
    return getattr(t, "__module__", "") in ("_operator", "operator")  # getitem, sym arithmetic


@dataclass
class RegionPlan:
    """The role as a sequence of region calls over one list of values (the graph's placeholders
    first, then each region's outputs as they come)."""

    modules: list[fx.GraphModule]  # per region, placeholders in its canonical order
    args: list[list[int]]  # per region: the values it reads
    outputs: list[int]  # the graph's outputs, in order
    signatures: list[str]  # per region: its graph's structure (equal = the same compiled code)
    out_dims: list[list[tuple[int, ...]]] = field(default_factory=list)  # per region output: its symbolic dims
    layers: list[str] = field(default_factory=list)  # per region, for messages: "layers 1-3"


def plan_regions(gm: fx.GraphModule, min_regions: int = 3) -> RegionPlan | None:
    """Cut `gm` where no bit can change (see the module doc); None where fewer than `min_regions`
    regions result or a region repeats no other (nothing to gain over the whole graph)."""
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    out = next(n for n in nodes if n.op == "output")
    if any(n.op not in ("placeholder", "output", "call_function") for n in nodes):
        return None  # get_attr / call_module: not a graph this planner knows
    outs = out.args[0]
    if not isinstance(outs, (tuple, list)) or not all(isinstance(o, fx.Node) for o in outs):
        return None
    stored = _materialized([n for n in nodes if n.op == "call_function"])
    # inlined where used, so computed again per region; one the whole graph stores (an extern op's
    # input, such as decode's kv lengths) is computed once and passed on, as there
    dup = _derived_from_inputs(nodes, stored)
    order = [n for n in nodes if n.op == "call_function" and n not in dup]
    cuts = _cuts(order, out, stored)
    if len(cuts) + 1 < min_regions:
        return None
    bounds = [0, *cuts, len(order)]
    regions = [order[a:b] for a, b in pairwise(bounds)]
    plan = _build(gm, placeholders, out, regions, dup)
    if len(set(plan.signatures)) == len(plan.signatures):
        return None
    return plan


def _derived_from_inputs(nodes: list[fx.Node], stored: set[fx.Node]) -> set[fx.Node]:
    """Pure nodes computed from the graph's inputs alone and never stored: each region computes its own copy."""
    dup: set[fx.Node] = set()
    for n in nodes:
        if n.op != "call_function" or n in stored or not _pure_aten(n):
            continue
        if all(a.op == "placeholder" or a in dup for a in _inputs(n)):
            dup.add(n)
    return dup


def _layer(n: fx.Node, memo: dict[fx.Node, int | None]) -> int | None:
    """The decoder layer a node belongs to (its module path), else that of its nearest user."""
    if n in memo:
        return memo[n]
    memo[n] = None
    stack = n.meta.get("nn_module_stack") or {}
    paths = [v[0] for v in stack.values() if isinstance(v, tuple) and v and isinstance(v[0], str)]
    found = None
    for p in reversed(paths):
        m = _LAYER.search(p)
        if m:
            found = int(m.group(1))
            break
    if found is None and not paths:
        for u in n.users:
            found = _layer(u, memo)
            if found is not None:
                break
    memo[n] = found
    return found


def _cuts(order: list[fx.Node], out: fx.Node, materialized: set[fx.Node]) -> list[int]:
    """Positions in `order` (a cut just before order[i]) that change no bit: the first such
    position of each layer."""
    pos = {n: i for i, n in enumerate(order)}
    memo: dict[fx.Node, int | None] = {}
    cuts: list[int] = []
    taken: set[int | None] = set()
    # ancestors of each node (as positions) grow left to right: a bitset per node
    anc: list[int] = []
    for n in order:
        bits = 0
        for a in _inputs(n):
            if a in pos:
                bits |= anc[pos[a]] | (1 << pos[a])
        anc.append(bits)
    # writes nothing reads (prefill's cache updates): a kernel of their own wherever they run
    sinks = sum(1 << i for i, n in enumerate(order) if _mutates(n) and not n.users)
    for i, e in enumerate(order):
        if i == 0 or not _is_extern(e):
            continue
        layer = _layer(e, memo)
        if layer is None or layer in taken:
            continue
        if (anc[i] | sinks) & ((1 << i) - 1) != (1 << i) - 1:
            continue  # something before the cut is no ancestor of E
        if not all(anc[j] >> i & 1 for j in range(i + 1, len(order))):
            continue  # something after the cut does not follow from E
        crossing = [order[j] for j in range(i) if any(pos.get(u, -1) >= i or u is out for u in order[j].users)]
        if all(c in materialized and not _mutates(c) for c in crossing):
            cuts.append(i)
            taken.add(layer)
    return cuts


def _materialized(order: list[fx.Node]) -> set[fx.Node]:
    """Values the whole-graph compile stores to memory: extern ops' inputs and outputs, reductions,
    and pointwise values Inductor's lowering realizes (GraphLowering.run_node: several users and an
    inlined expression reading more than realize_reads_threshold buffers, or more than
    realize_acc_reads_threshold whatever the users). Reads are tracked as the buffers an inlined
    expression loads (graph inputs, stored values)."""
    import torch._inductor.config as ic

    per_use = int(ic.realize_reads_threshold)
    acc_set = ic.realize_acc_reads_threshold
    acc = acc_set if isinstance(acc_set, int) else int(getattr(ic, "_realize_acc_reads_threshold_default", 8))
    stored: set[fx.Node] = set()
    reads: dict[fx.Node, frozenset] = {}
    for n in order:
        if _is_extern(n):
            stored.add(n)
            stored.update(a for a in _inputs(n) if a in reads)  # an extern op reads its inputs from memory
            reads[n] = frozenset([n])
            continue
        if n.target in _REDUCTIONS or _mutates(n):
            stored.add(n)
            reads[n] = frozenset([n])
            continue
        if not isinstance(n.meta.get("val"), torch.Tensor):
            reads[n] = frozenset()  # a size or other scalar: no buffer read
            continue
        r: frozenset = frozenset()
        for a in _inputs(n):
            r |= reads.get(a, frozenset([a]))  # a graph input is one buffer
        users = len(n.users)
        if (users > 1 and len(r) > per_use) or len(r) > acc:
            stored.add(n)
            r = frozenset([n])
        reads[n] = r
    return stored


def _build(
    gm: fx.GraphModule,
    placeholders: list[fx.Node],
    out: fx.Node,
    regions: list[list[fx.Node]],
    dup: set[fx.Node],
) -> RegionPlan:
    index: dict[fx.Node, int] = {p: i for i, p in enumerate(placeholders)}
    owner: dict[fx.Node, int] = {n: r for r, nodes in enumerate(regions) for n in nodes}
    later_users: dict[fx.Node, bool] = {}
    for r, nodes in enumerate(regions):
        for n in nodes:
            later_users[n] = any(u is out or owner.get(u, r) > r for u in n.users)
    plan = RegionPlan([], [], [], [])
    memo: dict[fx.Node, int | None] = {}
    for nodes in regions:
        module, reads, writes, sig = _region_module(gm, nodes, dup, later_users)
        plan.modules.append(module)
        plan.args.append([index[n] for n in reads])
        for n in writes:
            index[n] = len(index)
        plan.signatures.append(sig)
        plan.out_dims.append([_symbolic_dims(n) for n in writes])
        ls = sorted({x for x in (_layer(n, memo) for n in nodes) if x is not None})
        plan.layers.append(f"layers {ls[0]}-{ls[-1]}" if ls else "no layer")
    outs = out.args[0]
    assert isinstance(outs, (tuple, list))
    plan.outputs = [index[n] for n in outs if isinstance(n, fx.Node)]
    return plan


def _region_module(
    gm: fx.GraphModule, nodes: list[fx.Node], dup: set[fx.Node], exported: dict[fx.Node, bool]
) -> tuple[fx.GraphModule, list[fx.Node], list[fx.Node], str]:
    """The region as its own graph: (module, the outer values it reads in its placeholder order,
    the values it returns, its structural signature)."""
    mine = set(nodes)
    needed: list[fx.Node] = []
    seen: set[fx.Node] = set()

    def need_dup(n: fx.Node) -> None:
        for a in _inputs(n):
            if a in dup and a not in seen:
                seen.add(a)
                need_dup(a)
                needed.append(a)

    for n in nodes:
        need_dup(n)
    body = sorted(needed, key=_position(gm)) + nodes
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    reads: list[fx.Node] = []
    for n in body:
        for a in _inputs(n):
            if a not in env and a not in mine and a not in seen:
                ph = g.placeholder(f"in{len(reads)}")
                ph.meta = {k: v for k, v in a.meta.items() if k in ("val", "tensor_meta")}
                env[a] = ph
                reads.append(a)
    for n in body:
        env[n] = g.node_copy(n, lambda a: env[a])
    writes = [n for n in nodes if exported.get(n, False)]
    g.output(tuple(env[n] for n in writes))
    module = fx.GraphModule(gm, g)
    return module, reads, writes, _signature(body, reads, writes)


def _position(gm: fx.GraphModule) -> Callable[[fx.Node], int]:
    pos = {n: i for i, n in enumerate(gm.graph.nodes)}
    return lambda n: pos[n]


def _signature(body: list[fx.Node], reads: list[fx.Node], writes: list[fx.Node]) -> str:
    """The region's structure with names replaced by positions: ops, constants, shapes, dtypes."""
    local = {n: f"in{i}" for i, n in enumerate(reads)}
    local.update({n: f"v{i}" for i, n in enumerate(body)})

    def arg(a: Any) -> Any:
        if isinstance(a, fx.Node):
            return local[a]
        if isinstance(a, (list, tuple)):
            return [arg(x) for x in a]
        if isinstance(a, dict):
            return {str(k): arg(v) for k, v in a.items()}
        return repr(a)

    rows: list[Any] = [[local[n], _meta(n)] for n in reads]
    for n in body:
        rows.append([local[n], str(n.target), arg(n.args), arg(n.kwargs), _meta(n)])
    rows.append([local[n] for n in writes])
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def _symbolic_dims(n: fx.Node) -> tuple[int, ...]:
    v = n.meta.get("val")
    shape = getattr(v, "shape", ())
    return tuple(d for d, s in enumerate(shape) if isinstance(s, torch.SymInt) and not s.node.is_constant())


def _meta(n: fx.Node) -> Any:
    v = n.meta.get("val")
    if isinstance(v, torch.Tensor):
        return [str(v.dtype), [str(s) for s in v.shape], [str(s) for s in v.stride()]]
    return repr(v) if v is not None else None


class RegionalProgram:
    """Runs a RegionPlan's compiled regions in order; each value is dropped after its last reader."""

    def __init__(self, fns: Sequence[Callable[..., Any]], args: list[list[int]], outputs: list[int], n_in: int):
        self.fns = list(fns)
        self.args = args
        self.outputs = outputs
        self.n_in = n_in
        last: dict[int, int] = {}
        for r, idx in enumerate(args):
            for i in idx:
                last[i] = r
        keep = set(outputs)
        self.drop = [[i for i, r2 in last.items() if r2 == r and i not in keep and i >= n_in] for r in range(len(args))]

    def __call__(self, *flat: Any) -> tuple:
        env: list[Any] = list(flat)
        for r, (fn, idx) in enumerate(zip(self.fns, self.args, strict=False)):
            outs = fn(*[env[i] for i in idx])
            env.extend(outs if isinstance(outs, (tuple, list)) else (outs,))
            for i in self.drop[r]:
                env[i] = None
        return tuple(env[i] for i in self.outputs)


def unique_regions(signatures: Iterable[str]) -> list[int]:
    """Per region, the index of the first region with its signature (the one compiled)."""
    first: dict[str, int] = {}
    return [first.setdefault(s, i) for i, s in enumerate(signatures)]


__all__ = ["RegionPlan", "RegionalProgram", "plan_regions", "unique_regions"]
