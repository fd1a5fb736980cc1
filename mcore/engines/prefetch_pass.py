"""Each one-row product asks L2 for the next product's weight (MCORE_GEMV_PREFETCH=<MB>).

Between two products of a decode step run kernels that read almost nothing from memory (an add +
RMSNorm; the q/k norms, rotary embedding, cache writes and the attention at short contexts): the
memory system idles under them while the weights, the step's bytes, wait. With this pass a product's
last programs prefetch the first bytes of the next product's weight into L2 (fire and forget), so
those bytes stream in under the small kernels and the next product starts from L2.

Only pairs in the same decoder layer: a regional compile (regions.py) compiles one region's code
for every layer, so a product may not name a weight of another region. A product that reads the
one before it directly (down after gate/up) has nothing running between them: no prefetch.
"""

from __future__ import annotations

import re
from itertools import pairwise

import torch
from torch import fx

from ..ops.gemv import prefetch_bytes
from .prepared import PreparedGraph

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")

# each product op and the position of its weight argument
_WEIGHT_ARG = {
    torch.ops.mcore.gemv.default: 1,
    torch.ops.mcore.gemv_glu.default: 1,
    torch.ops.mcore.gemv_add.default: 1,
    torch.ops.mcore.rms_gemv.default: 3,
}
_ARGS = {  # how many positional arguments each op has before its prefetch arguments
    torch.ops.mcore.gemv.default: 2,
    torch.ops.mcore.gemv_glu.default: 2,
    torch.ops.mcore.gemv_add.default: 3,
    torch.ops.mcore.rms_gemv.default: 5,
}


def _glu(node: fx.Node) -> bool:
    """The product reads a gate/up weight (gate rows, then up rows): its programs start at both halves."""
    if node.target is torch.ops.mcore.gemv_glu.default:
        return True
    return node.target is torch.ops.mcore.rms_gemv.default and bool(node.args[4])


def _layer_names(p: PreparedGraph) -> dict[fx.Node, str]:
    """Each weight placeholder's module name (a fused weight: its first member's)."""
    placeholders = [n for n in p.gm.graph.nodes if n.op == "placeholder"]
    n_lifted = len(p.state_names)
    names = {placeholders[i]: p.state_names[i] for i in range(n_lifted)}
    for j, group in enumerate(p.fused_groups):
        names[placeholders[n_lifted + j]] = p.state_names[group[0]]
    return names


def layer_of(name: str) -> int | None:
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


def plan_prefetch(p: PreparedGraph, state: dict[fx.Node, torch.Tensor], size: int | None = None) -> int:
    """Give each product whose next product (graph order) is in the same layer and does not read it
    directly that product's weight to prefetch, up to `size` bytes (prefetch_bytes()). Returns how
    many products prefetch."""
    size = prefetch_bytes() if size is None else size
    if size <= 0:
        return 0
    names = _layer_names(p)
    products = [n for n in p.gm.graph.nodes if n.op == "call_function" and n.target in _WEIGHT_ARG]
    done = 0
    for a, b in pairwise(products):
        wa, wb = a.args[_WEIGHT_ARG[a.target]], b.args[_WEIGHT_ARG[b.target]]
        if b.args[0] is a or len(a.args) != _ARGS[a.target] or wb not in state:
            continue
        la, lb = layer_of(names.get(wa, "")), layer_of(names.get(wb, ""))
        if la is None or la != lb:
            continue
        weight = state[wb]
        a.args = (*a.args, wb, min(size, weight.numel() * weight.element_size()), 2 if _glu(b) else 1)
        done += 1
    return done


__all__ = ["plan_prefetch", "layer_of"]
