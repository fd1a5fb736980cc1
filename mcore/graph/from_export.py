"""Build a graph snapshot (DESIGN.md §1) from a torch.export ExportedProgram: node and tensor IDs in
topological order, lifted parameters as `constant` nodes, in-place writes as new tensor versions."""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

from .categories import category
from .snapshot import KIND, SCHEMA_VERSION, fingerprint

DTYPE_NAMES = {
    torch.float32: "FP32",
    torch.float16: "FP16",
    torch.bfloat16: "BF16",
    torch.float64: "FP64",
    torch.int32: "INT32",
    torch.int64: "INT64",
    torch.int16: "INT16",
    torch.int8: "INT8",
    torch.uint8: "UINT8",
    torch.bool: "BOOL",
}
TORCH_DTYPES = {v: k for k, v in DTYPE_NAMES.items()}

# Nodes that check or constrain but compute nothing the graph uses.
_SKIP_TARGETS = {
    "_assert_tensor_metadata",
    "_assert_scalar",
    "sym_constrain_range_for_size",
    "sym_constrain_range",
    "_assert_async",
    "_functional_assert_async",
}


def op_name(target: Any) -> str:
    """Stable name of an FX call target: 'aten.add.Tensor', 'mcore.decode_attention.default', 'operator.getitem'."""
    if isinstance(target, torch._ops.OpOverload):
        ns = target.namespace
        return f"{ns}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return f"{target._qualified_op_name.replace('::', '.')}"
    mod = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", None) or type(target).__name__
    if mod in ("_operator", "operator"):
        mod = "operator"
    return f"{mod}.{name}" if mod else name


def is_assert_node(node: fx.Node) -> bool:
    if node.op != "call_function":
        return False
    t = node.target
    base = t._schema.name.split("::")[-1] if isinstance(t, torch._ops.OpOverload) else getattr(t, "__name__", "")
    return base in _SKIP_TARGETS


def _tensor_desc(val: Any) -> dict[str, Any]:
    if isinstance(val, torch.Tensor):
        dims = []
        for d in val.shape:
            dims.append(d if isinstance(d, int) else (-1 if not _is_static(d) else int(d)))
        try:
            linear = bool(val.is_contiguous())
        except Exception:
            linear = False
        return {
            "dtype": DTYPE_NAMES.get(val.dtype, str(val.dtype).replace("torch.", "").upper()),
            "shape": dims,
            "location": "device",
            "is_shape_tensor": False,
            "format": "linear" if linear else "strided",
        }
    # SymInt / int / float produced by shape arithmetic: a host shape value.
    return {"dtype": "INT64", "shape": [], "location": "host", "is_shape_tensor": True, "format": "linear"}


def _is_static(d: Any) -> bool:
    node = getattr(d, "node", None)
    if node is None:
        return True
    try:
        return bool(node.is_constant()) or node.expr.is_number
    except Exception:
        return False


def _writes(node: fx.Node) -> list[int]:
    """Indices of positional arguments this op mutates (schema alias_info.is_write)."""
    t = node.target
    if not isinstance(t, torch._ops.OpOverload):
        return []
    out = []
    for i, a in enumerate(t._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write and not a.kwarg_only:
            out.append(i)
    return out


def snapshot_from_exported(  # noqa: C901 - one FX-to-snapshot pass; split in issue 29's long-function pass
    ep: torch.export.ExportedProgram, metadata: dict[str, Any], input_names: list[str], output_names: list[str]
) -> dict[str, Any]:
    """Turn an ExportedProgram into the snapshot dict (IDs in topological order).

    Lifted parameters/buffers/constants become `constant` nodes placed just before their
    first consumer. An in-place op produces a new version of the tensor it writes; later
    readers of the old FX value read that new version, so region rules stay sound.
    """
    gm = ep.graph_module
    sig = ep.graph_signature
    const_targets: dict[str, str] = {}
    const_targets.update(sig.inputs_to_parameters)
    const_targets.update(sig.inputs_to_buffers)
    const_targets.update(getattr(sig, "inputs_to_lifted_tensor_constants", {}) or {})
    user_inputs = list(sig.user_inputs)
    if len(user_inputs) != len(input_names):
        raise RuntimeError(f"role declares {len(input_names)} inputs but the graph has {len(user_inputs)}")

    nodes: list[dict[str, Any]] = []
    tensors: dict[str, dict[str, Any]] = {}
    current: dict[fx.Node, list[str]] = {}  # FX value -> tensor id(s) it currently denotes
    n_tensor = 0
    fx_by_name = {n.name: n for n in gm.graph.nodes}

    def new_tensor(val: Any, producer: str | None, name: str) -> str:
        nonlocal n_tensor
        tid = f"tensor:{n_tensor}"
        n_tensor += 1
        tensors[tid] = {"id": tid, "name": name, **_tensor_desc(val), "producer": producer, "consumers": []}
        return tid

    # Graph inputs first, in call order.
    input_ids = []
    for fx_name, name in zip(user_inputs, input_names, strict=False):
        node = fx_by_name[fx_name]
        tid = new_tensor(node.meta.get("val"), None, name)
        current[node] = [tid]
        input_ids.append(tid)

    const_node_of: dict[fx.Node, str] = {}

    def module_path(node: fx.Node) -> str:
        stack = node.meta.get("nn_module_stack") or {}
        paths = [v[0] for v in stack.values() if isinstance(v, tuple) and v and isinstance(v[0], str)]
        paths = [p for p in paths if p and not p.startswith("_empty_nn_module_stack")]
        return paths[-1] if paths else ""

    def emit_constant(ph: fx.Node) -> None:
        target = const_targets[ph.name]
        nid = f"node:{len(nodes)}"
        tid = new_tensor(ph.meta.get("val"), nid, target)
        owner = target.rsplit(".", 1)[0] if "." in target else ""
        nodes.append(
            {
                "id": nid,
                "op": "constant",
                "category": category("constant"),
                "name": target,
                "module_path": owner,
                "inputs": [],
                "outputs": [tid],
            }
        )
        current[ph] = [tid]
        const_node_of[ph] = nid

    def tensor_args(node: fx.Node) -> list[fx.Node]:
        seen: list[fx.Node] = []
        for a in node.all_input_nodes:
            if a not in seen:
                seen.append(a)
        return seen

    for node in gm.graph.nodes:
        if node.op != "call_function" or is_assert_node(node):
            continue
        if node.target is operator.getitem:
            src, idx = node.args
            if src in current and isinstance(idx, int) and idx < len(current[src]):
                current[node] = [current[src][idx]]
                continue
        # constants this node reads, placed just before it
        for a in tensor_args(node):
            if a.op == "placeholder" and a.name in const_targets and a not in current:
                emit_constant(a)
        nid = f"node:{len(nodes)}"
        ins: list[str] = []
        for a in tensor_args(node):
            for tid in current.get(a, []):
                if tid not in ins:
                    ins.append(tid)
                    tensors[tid]["consumers"].append(nid)
        val = node.meta.get("val")
        outs: list[str] = []
        if isinstance(val, (list, tuple)):
            for i, v in enumerate(val):
                if v is not None:
                    outs.append(new_tensor(v, nid, f"{node.name}.{i}"))
        elif val is not None:
            outs.append(new_tensor(val, nid, node.name))
        nodes.append(
            {
                "id": nid,
                "op": op_name(node.target),
                "category": category(op_name(node.target)),
                "name": node.name,
                "module_path": module_path(node),
                "inputs": ins,
                "outputs": outs,
            }
        )
        current[node] = outs
        # An in-place write makes a new version of the written value for every later reader.
        for i in _writes(node):
            if i < len(node.args) and isinstance(node.args[i], fx.Node) and outs:
                current[node.args[i]] = [outs[0]]
                nodes[-1]["mutates"] = list(current.get(node.args[i], []))

    # Outputs: user outputs, then final versions of mutated graph inputs (state the graph writes).
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    out_vals = out_node.args[0]
    user_out_names = list(sig.user_outputs)
    output_ids: list[str] = []
    out_by_name = {}
    for v in out_vals:
        if isinstance(v, fx.Node):
            out_by_name[v.name] = v
    for fx_name, name in zip(user_out_names, output_names, strict=False):
        v = out_by_name.get(fx_name)
        if v is None or v not in current:
            raise RuntimeError(f"graph output {name} is not a tensor")
        tid = current[v][0]
        output_ids.append(tid)
        tensors[tid].setdefault("output_name", name)
    for tid_in, fx_name in zip(input_ids, user_inputs, strict=False):
        final = current[fx_by_name[fx_name]][0]
        if final != tid_in:
            output_ids.append(final)
            tensors[final]["output_name"] = tensors[tid_in]["name"]
    for tid in output_ids:
        tensors[tid]["is_network_output"] = True

    # Shape arithmetic carries no module stack: it belongs where its first reader is.
    by_id = {n["id"]: n for n in nodes}
    for n in reversed(nodes):
        if not n["module_path"]:
            for t in n["outputs"]:
                readers = [by_id[c]["module_path"] for c in tensors[t]["consumers"] if by_id[c]["module_path"]]
                if readers:
                    n["module_path"] = readers[0]
                    break

    snap = {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "nodes": nodes,
        "tensors": [tensors[f"tensor:{i}"] for i in range(n_tensor)],
        "inputs": input_ids,
        "outputs": output_ids,
    }
    snap["fingerprint"] = fingerprint(snap)
    return snap
