"""Graph rewrites the compiled engine makes before Inductor sees a role graph (TensorRT does the same
kind at build time). They never touch a slot: a slot is one opaque node, and its region is gone."""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import fx

from .prepared import PreparedGraph, RoleProgram


def fuse_sibling_projections(p: PreparedGraph) -> int:
    """Linear layers that read the same input (q/k/v, gate/up) become one matrix product over their
    concatenated weights, sliced after: one pass over the input, one launch, a larger GEMV.

    The module's parameters become views into the concatenated weight, so no memory is added.
    Returns the number of groups fused."""
    gm = p.gm
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    n_state = len(p.state_args)
    state_index = {placeholders[i]: i for i in range(n_state)}
    groups: dict[fx.Node, list[fx.Node]] = defaultdict(list)
    for n in gm.graph.nodes:
        if (
            n.op == "call_function"
            and n.target is torch.ops.aten.linear.default
            and not n.kwargs
            and (len(n.args) == 2 or n.args[2] is None)
            and n.args[1] in state_index
        ):
            groups[n.args[0]].append(n)
    last_state = placeholders[n_state - 1] if n_state else None
    fused = 0
    for x, lins in groups.items():
        idx = [state_index[lin.args[1]] for lin in lins]
        ws = [p.state_args[i] for i in idx]
        if len(lins) < 2 or len(set(idx)) < len(idx) or last_state is None:
            continue
        if any(
            w.dim() != 2 or w.dtype != ws[0].dtype or w.device != ws[0].device or w.shape[1] != ws[0].shape[1]
            for w in ws
        ):
            continue
        _, bounds = fuse_weights(p, idx)
        with gm.graph.inserting_after(last_state):
            ph = gm.graph.placeholder(f"mcore_fused_weight_{fused}")
        last_state = ph
        first = min(lins, key=lambda n: list(gm.graph.nodes).index(n))
        with gm.graph.inserting_before(first):
            y = gm.graph.call_function(torch.ops.aten.linear.default, (x, ph))
            y.meta["mcore_fused_nodes"] = [lin.name for lin in lins]  # a profile charges them its kernel
            for lin, (a, b) in zip(lins, bounds, strict=True):
                part = gm.graph.call_function(torch.ops.aten.slice.Tensor, (y, -1, a, b))
                if "val" in lin.meta:  # the same value as the product it stands for (later passes read it)
                    part.meta["val"] = lin.meta["val"]
                lin.replace_all_uses_with(part)
        for lin in lins:
            gm.graph.erase_node(lin)
        fused += 1
    if fused:
        gm.graph.lint()
        gm.recompile()
    return fused


def fuse_weights(p: RoleProgram, idx: list[int]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Concatenate the weights at state indexes `idx` into one state argument appended after the
    lifted state (and after earlier fused ones); the lifted tensors and the module's parameters
    become views into it. Recorded in p.fused_groups, so a precompiled role replays the same
    concatenations without its graph. Returns the weight and each member's row range."""
    n_state = len(p.state_names)
    ws = [p.state_args[i] for i in idx]
    weight = _adjacent(ws)  # another role of this pipeline fused the same weights already
    if weight is None:
        weight = torch.cat(ws, 0)
    bounds = []
    start = 0
    for i, w in zip(idx, ws, strict=True):
        view = weight[start : start + w.shape[0]]
        bounds.append((start, start + w.shape[0]))
        src = p.state_sources[i]
        if isinstance(src, torch.nn.Parameter):
            src.data = view  # the module shares the fused storage: the old one is freed
        p.state_args[i] = view
        start += w.shape[0]
    p.state_args.insert(n_state + len(p.fused_groups), weight)
    p.state_sources.insert(n_state + len(p.fused_groups), weight)
    p.fused_groups.append(list(idx))
    return weight, bounds


def _adjacent(ws: list[torch.Tensor]) -> torch.Tensor | None:
    """One tensor over `ws` if they already lie back to back in one storage (row-major), else None."""
    first = ws[0]
    storage = first.untyped_storage().data_ptr()
    offset = first.storage_offset()
    for w in ws:
        if not w.is_contiguous() or w.untyped_storage().data_ptr() != storage or w.storage_offset() != offset:
            return None
        offset += w.numel()
    rows = sum(w.shape[0] for w in ws)
    return torch.as_strided(first, (rows, first.shape[1]), (first.shape[1], 1), first.storage_offset())
