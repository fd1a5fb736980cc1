"""The decode step's q/k norms, rotary embedding and cache writes into its attention's kernel
(on by default, MCORE_ATTN_ROPE=0 turns it off; mcore/ops/rope_attention.py has the op and its numerics).

Between the fused q/k/v product and `mcore.decode_attention` the decoder (mcore/families/decoder.py)
slices the product into q, k and v heads, normalises q and k per head (where the family has q/k
norms), rotates them, writes k and v into the caches with index_copy_ and scales q. This pass finds
exactly that chain, each intermediate read only inside it, and puts one `mcore.rope_decode_attention`
in its place. Where a slot is bound in the attention's place (tutorial step 5) the chain becomes one
`mcore.rope_decode_inputs` that writes the caches and hands the slot its scaled query: the slot keeps
its boundary, and its step runs one small kernel a layer here instead of the two or three Inductor
makes of the chain (the native step runs none, which put a bound step 5.5% behind on the demo). A slot
anywhere inside the chain leaves it alone: its node is not one of the ops matched here.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from .patterns import call, cast, only_user, rms_norm_of

aten = torch.ops.aten
_MAX = 9223372036854775807  # a slice to the end, as torch.export writes it


def _shape(node: object) -> tuple | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return tuple(val.shape) if val is not None else None


def _columns(product: Any, state: dict[Any, torch.Tensor]) -> int | None:
    """The width of a one-row product's output: from its value where it has one, else (the engine's
    fused q/k/v product carries none) the rows of its weight."""
    shape = _shape(product)
    if shape is not None:
        return shape[-1]
    plain = product.target in (aten.linear.default, torch.ops.mcore.gemv.default)
    if plain or (product.target is torch.ops.mcore.rms_gemv.default and product.args[4] is False):
        weight = state.get(product.args[1 if plain else 3])
        return None if weight is None else int(weight.shape[0])
    return None


def _rope_of(x: object) -> tuple[Any, Any, Any, list[Any]] | None:
    """(src, cos, sin, the rope's nodes) if `x` is `src * cos + cat(-src[..., D/2:], src[..., :D/2]) * sin`
    (mcore.ops.rope_attention.rotate) and its intermediates are read only inside it."""
    add: Any = call(x, aten.add.Tensor)
    if add is None or len(add.args) != 2:
        return None
    direct: Any
    rotated: Any
    direct, rotated = (call(a, aten.mul.Tensor) for a in add.args)
    cat: Any = call(rotated.args[0], aten.cat.default) if rotated is not None else None
    if direct is None or rotated is None or cat is None or len(cat.args) != 2 or cat.args[1] not in (-1, 3):
        return None
    parts = cat.args[0]
    neg: Any = call(parts[0], aten.neg.default) if len(parts) == 2 else None
    high: Any = call(neg.args[0], aten.slice.Tensor) if neg is not None else None
    low: Any = call(parts[1], aten.slice.Tensor) if len(parts) == 2 else None
    if high is None or low is None:
        return None
    src = low.args[0]
    shape = _shape(src)
    if shape is None or high.args[0] is not src or direct.args[0] is not src or len(direct.args) != 2:
        return None
    half = shape[-1] // 2
    if list(high.args[1:]) not in ([3, half, _MAX], [-1, half, _MAX]) or list(low.args[1:]) not in (
        [3, 0, half],
        [-1, 0, half],
    ):
        return None
    cos, sin = direct.args[1], rotated.args[1]
    inner = [direct, rotated, cat, neg, high, low]
    if not all(
        only_user(n, r) for n, r in ((direct, add), (rotated, add), (cat, rotated), (neg, cat), (high, neg), (low, cat))
    ):
        return None
    if not isinstance(src, fx.Node) or set(src.users) != {direct, high, low}:
        return None
    return src, cos, sin, [add, *inner]


def _heads(
    t: object, state: dict[fx.Node, torch.Tensor]
) -> tuple[fx.Node, int, int, tuple | None, list[fx.Node]] | None:
    """(qkv, first column, heads, the norm (rms_norm_of) or None, nodes) if `t` is
    `transpose(norm?(view(qkv[..., a:b], [1, s, heads, D])), 1, 2)`, each step read only by the next."""
    tr: Any = call(t, aten.transpose.int)
    if tr is None or list(tr.args[1:]) != [1, 2] or not only_user(tr.args[0], tr):
        return None
    nodes: list[Any] = [tr]
    x, reader = tr.args[0], tr
    norm = None
    if call(x, aten.view.default) is None:
        norm = rms_norm_of(x, state)
        if norm is None:
            return None
        nodes += norm[3]
        x, reader = norm[0], norm[3][-1]  # the norm's first node reads the heads
    view: Any = call(x, aten.view.default)
    sl: Any = call(view.args[0], aten.slice.Tensor) if view is not None else None
    if view is None or sl is None or not only_user(view, reader) or not only_user(sl, view):
        return None
    src, dim, lo, hi = (list(sl.args) + [None] * 4)[:4]
    shape = _shape(view)
    if dim not in (-1, 2) or shape is None or len(shape) != 4 or not isinstance(lo, int) or not isinstance(hi, int):
        return None
    heads, d = shape[2], shape[3]
    if not isinstance(src, fx.Node) or not isinstance(heads, int) or not isinstance(d, int) or hi - lo != heads * d:
        return None
    return src, lo, heads, norm, [*nodes, view, sl]


def _positions(positions: object, lengths: object) -> Any:
    """L if `positions` is `to(L, int64) + arange(n)` and `lengths` is `to(L + n, int32)` for the same
    L and n: the new tokens sit at L .. L + n - 1, where the kernel writes them."""
    add: Any = call(positions, aten.add.Tensor)
    total = cast(lengths, torch.int32)
    inner: Any = call(total.args[0], aten.add.Tensor) if total is not None else None
    if add is None or inner is None or len(add.args) != 2 or len(inner.args) != 2:
        return None
    wide: Any = cast(add.args[0], torch.int64)
    ar: Any = add.args[1]
    if wide is None or not isinstance(ar, fx.Node) or ar.target is not aten.arange.default or len(ar.args) != 1:
        return None  # (arange's keyword arguments name its dtype and device)
    cached = wide.args[0]
    if cached is not inner.args[0] or ar.args[0] is not inner.args[1] or _shape(cached) != (1,):
        return None
    return cached


def _table_rows(rows: object, positions: object, dtype: object, state: dict[Any, torch.Tensor]) -> Any:
    """T if `rows` is `to(index_select(T, 0, positions), dtype)` with T a FP32 [C, D] buffer of the model."""
    c: Any = cast(rows, dtype)
    sel: Any = call(c.args[0], aten.index_select.default) if c is not None else None
    if sel is None or list(sel.args[1:]) != [0, positions] or not isinstance(sel.args[0], fx.Node):
        return None
    table = state.get(sel.args[0])
    return sel.args[0] if table is not None and table.dim() == 2 and table.dtype == torch.float32 else None


def _match(reader: fx.Node, inputs: Sequence[Any], state: dict[Any, torch.Tensor]) -> tuple[tuple, list[Any]] | None:
    """(the fused op's arguments, the chain's nodes it replaces) where `reader` (a decode attention or
    a slot) reads its query, caches and length (`inputs`) from the chain alone."""
    q_in, k_write, v_write, lengths = inputs
    contig: Any = call(q_in, aten.contiguous.default)
    scaled: Any = call(contig.args[0], aten.mul.Tensor) if contig is not None else None
    if scaled is None or not isinstance(scaled.args[1], float) or not only_user(contig, reader):
        return None
    if not only_user(scaled, contig) or not only_user(scaled.args[0], scaled):
        return None
    writes: list[Any] = [call(w, aten.index_copy_.default) for w in (k_write, v_write)]
    if any(w is None or not only_user(w, reader) or len(w.args) != 4 or w.args[1] != 2 for w in writes):
        return None
    kw, vw = writes
    cached = _positions(kw.args[2], lengths) if kw.args[2] is vw.args[2] else None
    if cached is None:
        return None
    if any(not isinstance(w.args[0], fx.Node) or list(w.args[0].users) != [w] for w in writes):
        return None  # a cache read or written anywhere else: leave the order of things alone
    q_rope, k_rope = _rope_of(scaled.args[0]), _rope_of(kw.args[3])
    if q_rope is None or k_rope is None or q_rope[1:3] != k_rope[1:3] or not only_user(kw.args[3], kw):
        return None
    q: Any
    k: Any
    v: Any
    q, k, v = _heads(q_rope[0], state), _heads(k_rope[0], state), _heads(vw.args[3], state)
    if q is None or k is None or v is None or not q[0] is k[0] is v[0] or not only_user(vw.args[3], vw):
        return None
    query = contig.meta.get("val")  # [1, H, s, D] in the model's dtype
    if query is None or query.dim() != 4 or "val" not in kw.args[0].meta:
        return None
    qkv, d, kv_heads = q[0], query.shape[-1], kw.args[0].meta["val"].shape[1]
    if (q[1], k[1], v[1]) != (0, q[2] * d, (q[2] + kv_heads) * d) or not k[2] == v[2] == kv_heads:
        return None
    if _columns(qkv, state) != (q[2] + 2 * kv_heads) * d or len(qkv.users) != 3:
        return None
    qn, kn = q[3], k[3]
    if (qn is None) != (kn is None) or (qn is not None and qn[2] != kn[2]):
        return None
    cos, sin = (_table_rows(t, kw.args[2], query.dtype, state) for t in q_rope[1:3])
    if cos is None or sin is None or state[cos].shape[1] != d:
        return None
    args = (qkv, qn[1] if qn else None, kn[1] if kn else None, qn[2] if qn else 0.0, cos, sin) + (
        kw.args[0],
        vw.args[0],
        cached,
        float(scaled.args[1]),
    )
    dead = [contig, scaled, kw, vw, *q_rope[3], *k_rope[3], *q[4], *k[4], *v[4]]
    return args, dead


def _replace(gm: fx.GraphModule, reader: fx.Node, target: Any, args: tuple, chain: list[Any]) -> fx.Node:
    """One `target(*args)` node before `reader`, charged with the chain's nodes (the profile's names)."""
    with gm.graph.inserting_before(reader):
        fused = gm.graph.call_function(target, args)
    fused.meta["mcore_fused_nodes"] = sorted({n.name for n in chain})
    return fused


def _erase(gm: fx.GraphModule, nodes: list[Any], order: dict[Any, int]) -> None:
    for n in sorted(set(nodes), key=lambda n: order[n], reverse=True):  # readers before what they read
        gm.graph.erase_node(n)


def fuse_rope_attention(gm: fx.GraphModule, state: dict[fx.Node, torch.Tensor]) -> int:
    """Each decode attention whose query, keys and values come from one q/k/v product through the
    decoder's norms, rotation and cache writes becomes `mcore.rope_decode_attention`; a slot bound in
    its place (tutorial step 5's region, whose first four inputs are the attention's) gets them from
    one `mcore.rope_decode_inputs` instead, the slot itself untouched. Returns how many."""
    from ..ops import rope_attention  # noqa: F401  (registers the two ops)

    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    done = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.kwargs:
            continue
        if node.target is torch.ops.mcore.decode_attention.default and len(node.args) == 4:
            found = _match(node, node.args, state)
            if found is None:
                continue
            args, chain = found
            fused = _replace(gm, node, torch.ops.mcore.rope_decode_attention.default, args, [node, *chain])
            fused.meta.update({k: v for k, v in node.meta.items() if k != "mcore_fused_nodes"})
            node.replace_all_uses_with(fused)
            _erase(gm, [node, *chain], order)
            done += 1
        elif node.target is torch.ops.mcore.slot.default and len(node.args[0]) >= 4:
            inputs = list(node.args[0])
            found = _match(node, inputs[:4], state)
            if found is None:
                continue
            args, chain = found
            fused = _replace(gm, node, torch.ops.mcore.rope_decode_inputs.default, args, chain)
            with gm.graph.inserting_before(node):
                query, length = (gm.graph.call_function(operator.getitem, (fused, i)) for i in (0, 1))
            query.meta["val"], length.meta["val"] = inputs[0].meta["val"], inputs[3].meta.get("val")
            fused.meta["val"] = (query.meta["val"], length.meta["val"])
            # the caches it wrote, and the length it wrote (no kernel of its own for the slot's length)
            node.args = ([query, args[6], args[7], length, *inputs[4:]], *node.args[1:])
            _erase(gm, chain, order)
            done += 1
    return done


__all__ = ["fuse_rope_attention"]
