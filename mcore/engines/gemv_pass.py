"""The compiled engine's one-row linears as `mcore::gemv` (fixed-shape roles; on CUDA unless MCORE_GEMV=0).

A decode step's matrix products have one row: what the hardware allows is reading each weight once
at the memory bandwidth. `mcore.gemv` is written for that shape; Inductor otherwise hands the
product to the GEMM library. The rewrite runs after the sibling-projection fusion (so a fused
q/k/v or gate/up product becomes one GEMV) and never touches a slot. The MLP's gating then moves into
the gate/up product's epilogue (`mcore.gemv_glu`; MCORE_GEMV_GLU=0 keeps it a kernel of its own), and
each add + RMSNorm between two products into them: the residual add into the epilogue of the product
before it (`mcore.gemv_add`), the norm into the prologue of the one after (`mcore.rms_gemv`), where
MCORE_GEMV_NORM=1 asks for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from ..ops import rope_attention
from ..ops.gemv import glu_enabled, norm_enabled  # importing mcore.gemv registers the mcore::gemv ops
from .patterns import call, only_user, rms_norm_of, split
from .prepared import PreparedGraph
from .rope_pass import fuse_rope_attention

# the ops a one-row product becomes: plain, with the gating, with the residual add, with the norm
GEMV_OPS = (
    torch.ops.mcore.gemv.default,
    torch.ops.mcore.gemv_glu.default,
    torch.ops.mcore.gemv_add.default,
    torch.ops.mcore.rms_gemv.default,
)


def _sizes(user: list[fx.Node], inputs: Sequence[torch.Tensor]) -> dict[Any, int]:
    """Each size symbol of the graph's inputs (a dynamic token count) bound to the size it has in
    `inputs`, the buffers a fixed-shape role runs on for its whole life."""
    bound: dict[Any, int] = {}
    for ph, x in zip(user, inputs, strict=False):
        val = ph.meta.get("val")
        for d, size in zip(getattr(val, "shape", ()), x.shape, strict=False):
            if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol:
                bound[d.node.expr] = int(size)
    return bound


def one_row(node: object, bound: dict[Any, int]) -> bool:
    """`node` is a graph value whose leading dimensions multiply to 1 once its size symbols take
    the values in `bound`."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    shape = getattr(val, "shape", None)
    if shape is None or len(shape) < 1:
        return False
    rows = 1
    for d in shape[:-1]:
        if isinstance(d, torch.SymInt):
            e = d.node.expr.subs(bound)
            if not e.is_Integer:
                return False
            d = int(e)
        rows *= int(d)
    return rows == 1


def use_gemv(p: PreparedGraph, inputs: Sequence[torch.Tensor]) -> int:
    """Replace each `aten.linear(x, W)` whose input is one row when the role runs on `inputs` (its
    fixed buffers) and whose weight is lifted 16-bit state by `mcore.gemv(x, W)`. Returns how many."""
    gm = p.gm
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    state = {placeholders[i]: p.state_args[i] for i in range(len(p.state_args))}
    bound = _sizes(placeholders[len(p.state_args) :], inputs)
    done = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target is not torch.ops.aten.linear.default or n.kwargs:
            continue
        if len(n.args) == 3 and n.args[2] is not None:
            continue
        x, w = n.args[0], n.args[1]
        weight = state.get(w) if isinstance(w, fx.Node) else None
        if weight is None or weight.dim() != 2 or weight.dtype not in (torch.bfloat16, torch.float16):
            continue
        if not one_row(x, bound) or x.meta["val"].dtype != weight.dtype:
            continue
        n.target = torch.ops.mcore.gemv.default
        n.args = (x, w)
        done += 1
    if done and glu_enabled():
        fuse_gating(gm, state)
    if done and norm_enabled():
        fuse_norms(gm, state)
        fuse_residuals(gm)
    if done and rope_attention.enabled():
        fuse_rope_attention(gm, state)
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


def _half(node: object, product: fx.Node, rows: int, first: bool) -> bool:
    """`node` is `product[..., :rows]` (first) or `product[..., rows:2 * rows]` and feeds one node."""
    if not isinstance(node, fx.Node) or node.target is not torch.ops.aten.slice.Tensor or node.kwargs:
        return False
    args = list(node.args) + [None] * (4 - len(node.args))
    src, dim, start, end = args[:4]
    lo, hi = (0, rows) if first else (rows, 2 * rows)
    val = node.meta.get("val")
    last = -1 if val is None else len(val.shape) - 1  # the fused product's node carries no value itself
    return bool(src is product and dim in (-1, last) and start == lo and end == hi and len(node.users) == 1)


def fuse_gating(gm: fx.GraphModule, state: dict[fx.Node, torch.Tensor]) -> int:
    """Each `mcore.gemv(x, cat(gate_w, up_w))` read only as `silu(y[..., :M]) * y[..., M:]` (the fused
    gate/up product and its gating) becomes `mcore.gemv_glu(x, W)`: the gating in the product's
    epilogue. A slot on the gating (its nodes are gone) or any other reader of the product keeps the
    pattern from matching. Returns how many."""
    done = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target is not torch.ops.mcore.gemv.default:
            continue
        weight = state.get(n.args[1])
        users = list(n.users)
        if weight is None or weight.shape[0] % 2 or len(users) != 2:
            continue
        m = weight.shape[0] // 2
        gate = next((u for u in users if _half(u, n, m, first=True)), None)
        up = next((u for u in users if _half(u, n, m, first=False)), None)
        if gate is None or up is None:
            continue
        silu = next(iter(gate.users))
        if silu.target is not torch.ops.aten.silu.default or len(silu.users) != 1:
            continue
        mul = next(iter(silu.users))
        if mul.target is not torch.ops.aten.mul.Tensor or mul.kwargs or set(mul.args) != {silu, up}:
            continue
        if not only_user(up, mul):
            continue
        n.target = torch.ops.mcore.gemv_glu.default
        n.meta["val"] = mul.meta["val"]
        # the fusion report charges this kernel the gating's nodes too
        n.meta["mcore_fused_nodes"] = [*n.meta.get("mcore_fused_nodes", []), silu.name, mul.name]
        mul.replace_all_uses_with(n)
        for dead in (mul, silu, gate, up):
            gm.graph.erase_node(dead)
        done += 1
    return done


def fuse_norms(gm: fx.GraphModule, state: dict[fx.Node, torch.Tensor]) -> int:
    """Each `mcore.gemv(rms_norm(h), W)` or `mcore.gemv_glu(...)` whose normalised row nothing else
    reads becomes `mcore.rms_gemv(h, norm_weight, eps, W, glu)`: the norm in the product's prologue.
    Returns how many."""
    done = 0
    for n in list(gm.graph.nodes):
        glu = n.target is torch.ops.mcore.gemv_glu.default
        if n.op != "call_function" or not (glu or n.target is torch.ops.mcore.gemv.default):
            continue
        found = rms_norm_of(n.args[0], state)
        if found is None or not only_user(n.args[0], n):
            continue
        h, weight, eps, chain = found
        n.target = torch.ops.mcore.rms_gemv.default
        n.args = (h, weight, eps, n.args[1], glu)
        n.meta["mcore_fused_nodes"] = [*n.meta.get("mcore_fused_nodes", []), *(c.name for c in chain)]
        for dead in chain:
            gm.graph.erase_node(dead)
        done += 1
    return done


def fuse_residuals(gm: fx.GraphModule) -> int:
    """Each `r + mcore.gemv(x, W)` (either order) where the add is the product's only reader, r and
    the product have the sum's shape and dtype, and r comes before the product becomes
    `mcore.gemv_add(x, W, r)`: the residual add in the product's epilogue, the same bits. Returns
    how many."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    done = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target is not torch.ops.mcore.gemv.default or len(n.users) != 1:
            continue
        add = call(next(iter(n.users)), torch.ops.aten.add.Tensor)
        parts = split(add, lambda a, product=n: a is product)
        if add is None or parts is None or not isinstance(parts[1], fx.Node):
            continue
        r = parts[1]
        val, rv = add.meta.get("val"), r.meta.get("val")
        if val is None or rv is None or order[r] > order[n]:
            continue
        pv = n.meta["val"]
        if not tuple(rv.shape) == tuple(pv.shape) == tuple(val.shape) or not rv.dtype == pv.dtype == val.dtype:
            continue  # a broadcast or a type promotion
        n.target = torch.ops.mcore.gemv_add.default
        n.args = (*n.args, r)
        n.meta["val"] = val
        n.meta["mcore_fused_nodes"] = [*n.meta.get("mcore_fused_nodes", []), add.name]
        add.replace_all_uses_with(n)
        gm.graph.erase_node(add)
        done += 1
    return done


__all__ = ["GEMV_OPS", "use_gemv", "one_row", "fuse_gating", "fuse_norms", "fuse_residuals"]
