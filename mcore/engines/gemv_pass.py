"""The compiled engine's one-row linears as `mcore::gemv` (fixed-shape roles; on CUDA unless MCORE_GEMV=0).

A decode step's matrix products have one row: what the hardware allows is reading each weight once
at the memory bandwidth. `mcore.gemv` is written for that shape; Inductor otherwise hands the
product to the GEMM library. The rewrite runs after the sibling-projection fusion (so a fused
q/k/v or gate/up product becomes one GEMV) and never touches a slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from ..ops.gemv import glu_enabled  # importing mcore.gemv registers mcore::gemv and mcore::gemv_silu_mul
from .prepared import PreparedGraph


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
        fuse_gating(gm)
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


def _only_user(node: object, user: fx.Node) -> bool:
    return isinstance(node, fx.Node) and list(node.users) == [user]


def fuse_gating(gm: fx.GraphModule) -> int:
    """Each `mcore.gemv(mul(silu(gate), up), W)` whose gating feeds nothing else becomes
    `mcore.gemv_silu_mul(gate, up, W)` (MCORE_GEMV_GLU=1): the gating is computed in the kernel
    that reads it. A slot between them (a kernel bound to the gating) keeps the pattern from
    matching. Returns how many."""
    done = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target is not torch.ops.mcore.gemv.default:
            continue
        mul, w = n.args
        if not _only_user(mul, n) or mul.target is not torch.ops.aten.mul.Tensor or mul.kwargs:
            continue
        a, b = mul.args
        silu, up = (a, b) if getattr(a, "target", None) is torch.ops.aten.silu.default else (b, a)
        if getattr(silu, "target", None) is not torch.ops.aten.silu.default or not _only_user(silu, mul):
            continue
        gate = silu.args[0]
        g, u = (getattr(t, "meta", {}).get("val") for t in (gate, up))
        if g is None or u is None or g.shape != u.shape or g.dtype != u.dtype:
            continue  # no broadcasting: both halves are one row of the same size
        n.target = torch.ops.mcore.gemv_silu_mul.default
        n.args = (gate, up, w)
        n.meta["mcore_fused_nodes"] = [silu.name, mul.name]  # the fusion report still names them
        gm.graph.erase_node(mul)
        gm.graph.erase_node(silu)
        done += 1
    return done


__all__ = ["use_gemv", "one_row", "fuse_gating"]
