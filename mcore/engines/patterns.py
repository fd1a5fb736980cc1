"""Matching the decoder's small computations in a role graph: the helpers the engine's rewrites
(gemv_pass.py, rope_pass.py) share, so that each pattern has one definition."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx


def only_user(node: object, user: fx.Node) -> bool:
    return isinstance(node, fx.Node) and list(node.users) == [user]


def call(node: object, *targets: Any) -> fx.Node | None:
    """`node` if it is a call of one of `targets` without keyword arguments."""
    if isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets and not node.kwargs:
        return node
    return None


def cast(node: object, dtype: object) -> fx.Node | None:
    """`node` if it is `aten.to(x, dtype)` (its input is args[0])."""
    n = call(node, torch.ops.aten.to.dtype)
    return n if n is not None and len(n.args) == 2 and n.args[1] == dtype else None


def split(node: fx.Node | None, pick: Any) -> tuple[fx.Node, object] | None:
    """(the argument of the two-argument `node` for which `pick` holds, the other one)."""
    if node is None or len(node.args) != 2:
        return None
    a, b = node.args
    for one, other in ((a, b), (b, a)):
        if isinstance(one, fx.Node) and pick(one) and not pick(other):
            return one, other
    return None


def rms_norm_of(x: object, state: dict[fx.Node, torch.Tensor]) -> tuple[fx.Node, fx.Node, float, list[fx.Node]] | None:
    """(h, norm weight, eps, the norm's nodes) if `x` is the decoders' RMSNorm of h as their modules
    compute it, w * to(h32 * rsqrt(mean(h32 ** 2, -1, keepdim) + eps), h.dtype) with h32 = to(h,
    float32) and w a [K] weight of h's dtype, and nothing outside the norm reads its intermediates.
    Otherwise None."""
    scale = split(call(x, torch.ops.aten.mul.Tensor), lambda a: isinstance(a, fx.Node) and a in state)
    if scale is None or not isinstance(x, fx.Node):
        return None
    weight, rounded = scale
    dtype = state[weight].dtype
    to_dtype = cast(rounded, dtype)
    normed = call(to_dtype.args[0], torch.ops.aten.mul.Tensor) if to_dtype is not None else None
    parts = split(normed, lambda a: call(a, torch.ops.aten.rsqrt.default) is not None)
    if parts is None or to_dtype is None or normed is None:
        return None
    rsqrt, other = parts
    h32 = cast(other, torch.float32)
    add = call(rsqrt.args[0], torch.ops.aten.add.Tensor)
    mean = call(add.args[0], torch.ops.aten.mean.dim) if add is not None else None
    square = call(mean.args[0], torch.ops.aten.pow.Tensor_Scalar) if mean is not None else None
    if h32 is None or add is None or mean is None or square is None or not isinstance(add.args[1], float):
        return None
    if square.args != (h32, 2) or list(mean.args[1:]) != [[-1], True]:
        return None
    h = h32.args[0]
    val = h.meta.get("val") if isinstance(h, fx.Node) else None
    if not isinstance(h, fx.Node) or val is None or val.dtype != dtype or state[weight].shape != (val.shape[-1],):
        return None
    chain = [x, to_dtype, normed, rsqrt, add, mean, square]
    if not all(only_user(node, reader) for node, reader in zip(chain[1:], chain[:-1], strict=True)):
        return None
    if set(h32.users) != {square, normed}:
        return None
    return h, weight, float(add.args[1]), [*chain, h32]


__all__ = ["only_user", "call", "cast", "split", "rms_norm_of"]
