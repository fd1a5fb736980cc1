"""A coarse layer category per ATen op, for display and `--match` filtering.

The category uses TensorRT's layer-type words (so the tutorial's filters such as
'*ElementWiseOperation.SUM*' read naturally); the engine is still PyTorch and the
`op` field stays the exact ATen target.
"""

from __future__ import annotations

_ELEMENTWISE = {
    "add": "SUM",
    "sub": "SUB",
    "mul": "PROD",
    "div": "DIV",
    "pow": "POW",
    "maximum": "MAX",
    "minimum": "MIN",
    "eq": "EQUAL",
    "lt": "LESS",
    "gt": "GREATER",
    "le": "LESS",
    "ge": "GREATER",
    "where": "SELECT",
    "bitwise_and": "AND",
}
_UNARY = {"rsqrt", "sqrt", "exp", "log", "neg", "abs", "sin", "cos", "reciprocal", "tanh", "erf"}
_ACTIVATION = {"silu", "gelu", "relu", "sigmoid", "softplus"}
_SHUFFLE = {
    "view",
    "reshape",
    "transpose",
    "permute",
    "unsqueeze",
    "squeeze",
    "expand",
    "contiguous",
    "flatten",
    "unflatten",
    "t",
    "clone",
    "alias",
}
_SLICE = {"slice", "select", "narrow", "split", "chunk"}
_GATHER = {"index_select", "embedding", "gather", "index"}
_SCATTER = {"index_copy_", "index_copy", "index_put_", "index_put", "scatter", "copy_"}
_MATMUL = {"mm", "bmm", "matmul", "linear", "addmm", "baddbmm"}
_REDUCE = {"mean", "sum", "amax", "max", "min", "prod", "var"}
_NORM = {"layer_norm", "rms_norm", "group_norm"}
_FILL = {"arange", "zeros", "ones", "full", "empty", "zeros_like", "ones_like", "full_like", "empty_like"}


def category(op: str) -> str:  # noqa: C901 - flat dispatch, one branch per op group
    """Map 'aten.add.Tensor' -> 'LayerType.ELEMENTWISE/ElementWiseOperation.SUM' etc."""
    if op == "constant":
        return "LayerType.CONSTANT"
    if op.startswith("mcore.slot"):
        return "LayerType.PLUGIN_V3"
    parts = op.split(".")
    base = parts[1] if len(parts) > 1 else parts[0]
    if parts[0] == "mcore":
        return (
            "LayerType.PLUGIN_V3"
            if base == "slot"
            else "LayerType.ATTENTION"
            if "attention" in base
            else "LayerType.PLUGIN_V3"
        )
    b = base.rstrip("_") if base not in _SCATTER else base
    if base in ("_to_copy", "to", "type_as"):
        return "LayerType.CAST"
    if b in _ELEMENTWISE:
        return f"LayerType.ELEMENTWISE/ElementWiseOperation.{_ELEMENTWISE[b]}"
    if b in _UNARY:
        return f"LayerType.UNARY/UnaryOperation.{b.upper()}"
    if b in _ACTIVATION:
        return f"LayerType.ACTIVATION/ActivationType.{b.upper()}"
    if base in _SCATTER:
        return "LayerType.SCATTER"
    if b in _SHUFFLE:
        return "LayerType.SHUFFLE"
    if b in _SLICE:
        return "LayerType.SLICE"
    if b in _GATHER:
        return "LayerType.GATHER"
    if b in _MATMUL:
        return "LayerType.MATRIX_MULTIPLY"
    if b in _REDUCE:
        return f"LayerType.REDUCE/ReduceOperation.{b.upper()}"
    if b in _NORM:
        return "LayerType.NORMALIZATION"
    if b in ("softmax", "_softmax", "scaled_dot_product_attention"):
        return "LayerType.SOFTMAX" if "softmax" in b else "LayerType.ATTENTION"
    if b in _FILL:
        return "LayerType.FILL"
    if b == "cat":
        return "LayerType.CONCATENATION"
    if b.startswith("sym_") or parts[0] in ("operator", "_operator"):
        return "LayerType.SHAPE"
    if b in ("cond", "while_loop", "map"):
        return "LayerType.CONDITIONAL"
    return "LayerType.OTHER"
