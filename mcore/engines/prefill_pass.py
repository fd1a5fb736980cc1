"""The compiled engine's rewrite of the prefill (its role with a dynamic token count): the attention
context straight into the output projection (on unless MCORE_PREFILL_ROWS=0).

The decoder (mcore/families/decoder.py) writes `ctx = mcore.prefill_attention(q, k, v, scale)`, a
contiguous [1, H, s, D], then `ctx.transpose(1, 2).reshape(1, s, H*D)` for o_proj: two copies of the
context a layer (the op's and the one Inductor makes to transpose it back), though the attention
kernels write it tokens-major in the first place. This pass puts one `mcore.prefill_attention_rows`
in place of the three nodes, whose output is that reshape's value, a view of the kernel's output.
The captured graph (the bundle's, whose hash a load checks) keeps the op it was exported with.

On the H200 this took the 8B-sized prefill from 219.3 to 216.2 ms at 8k tokens and from 1295 to
1279 ms at 32k, the same bits (docs/gpu-results.md, twentieth session). The gating moved into the
gate/up product as a Triton GEMM was measured there too and not kept: level with the library GEMM
and the gating apart.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import fx

from .patterns import call, only_user
from .prepared import PreparedGraph

aten = torch.ops.aten


def rows_enabled() -> bool:
    """MCORE_PREFILL_ROWS=0 keeps prefill_attention and the copies around it (a comparison's baseline)."""
    return os.environ.get("MCORE_PREFILL_ROWS", "1") != "0"


def rewrite_prefill(p: PreparedGraph) -> None:
    if rows_enabled():
        context_as_rows(p)


def context_as_rows(p: PreparedGraph) -> int:
    """Rewrite every prefill_attention -> transpose(1, 2) -> reshape(1, s, H*D) chain whose
    intermediates have no other reader. Returns how many."""
    gm = p.gm
    done = 0
    for n in list(gm.graph.nodes):
        att = call(n, torch.ops.mcore.prefill_attention.default)
        users = list(att.users) if att is not None else []
        t = call(users[0], aten.transpose.int) if len(users) == 1 else None
        r_users = list(t.users) if t is not None else []
        r = call(r_users[0], aten.reshape.default, aten.view.default) if len(r_users) == 1 else None
        if att is None or t is None or r is None or not only_user(att, t) or not only_user(t, r):
            continue
        if sorted(d % 4 for d in t.args[1:] if isinstance(d, int)) != [1, 2] or not _rows_of(att, r):
            continue
        with gm.graph.inserting_before(att):
            rows = gm.graph.call_function(torch.ops.mcore.prefill_attention_rows.default, att.args)
        rows.meta.update(r.meta)
        rows.meta["mcore_fused_nodes"] = [att.name, t.name, r.name]  # a profile charges them its kernel
        r.replace_all_uses_with(rows)
        for dead in (r, t, att):
            gm.graph.erase_node(dead)
        done += 1
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


def _rows_of(att: fx.Node, r: fx.Node) -> bool:
    """The reshape's value is [b, s, H*D] for the attention's [b, H, s, D] (checked on the graph's
    values, size symbols included)."""
    a, out = att.meta.get("val"), r.meta.get("val")
    if a is None or out is None or a.dim() != 4 or out.dim() != 3:
        return False
    b, h, s, d = (_expr(x) for x in a.shape)
    return [_expr(x) for x in out.shape] == [b, s, h * d]


def _expr(size: Any) -> Any:
    # a size symbol's expression (comparing SymInts themselves would add guards to the graph's shape env)
    return size.node.expr if isinstance(size, torch.SymInt) else int(size)
