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


def snapshot_from_exported(
    ep: torch.export.ExportedProgram, metadata: dict[str, Any], input_names: list[str], output_names: list[str]
) -> dict[str, Any]:
    """Turn an ExportedProgram into the snapshot dict (IDs in topological order).

    Lifted parameters/buffers/constants become `constant` nodes placed just before their
    first consumer. An in-place op produces a new version of the tensor it writes; later
    readers of the old FX value read that new version, so region rules stay sound.
    """
    sig = ep.graph_signature
    const_targets: dict[str, str] = {}
    const_targets.update(sig.inputs_to_parameters)
    const_targets.update(sig.inputs_to_buffers)
    const_targets.update(getattr(sig, "inputs_to_lifted_tensor_constants", {}) or {})
    user_inputs = list(sig.user_inputs)
    if len(user_inputs) != len(input_names):
        raise RuntimeError(f"role declares {len(input_names)} inputs but the graph has {len(user_inputs)}")
    b = _SnapshotBuilder(ep.graph_module, const_targets)
    input_ids = b.add_inputs(user_inputs, input_names)
    for node in ep.graph_module.graph.nodes:
        if node.op == "call_function" and not is_assert_node(node):
            b.add_call(node)
    output_ids = b.outputs(list(sig.user_outputs), output_names, input_ids, user_inputs)
    b.place_shape_arithmetic()
    snap = {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "nodes": b.nodes,
        "tensors": list(b.tensors.values()),  # tensor:0, tensor:1, ... in creation order
        "inputs": input_ids,
        "outputs": output_ids,
    }
    snap["fingerprint"] = fingerprint(snap)
    return snap


def _module_path(node: fx.Node) -> str:
    """The innermost module the FX node ran in ('' for nodes without a module stack)."""
    stack = node.meta.get("nn_module_stack") or {}
    paths = [v[0] for v in stack.values() if isinstance(v, tuple) and v and isinstance(v[0], str)]
    paths = [p for p in paths if p and not p.startswith("_empty_nn_module_stack")]
    return paths[-1] if paths else ""


def _tensor_args(node: fx.Node) -> list[fx.Node]:
    """The node's FX inputs, each once, in first-use order."""
    seen: list[fx.Node] = []
    for a in node.all_input_nodes:
        if a not in seen:
            seen.append(a)
    return seen


class _SnapshotBuilder:
    """The snapshot's nodes and tensors as they are numbered, and which tensor each FX value denotes now."""

    def __init__(self, gm: fx.GraphModule, const_targets: dict[str, str]):
        self.gm = gm
        self.const_targets = const_targets
        self.fx_by_name = {n.name: n for n in gm.graph.nodes}
        self.nodes: list[dict[str, Any]] = []
        self.tensors: dict[str, dict[str, Any]] = {}
        self.current: dict[fx.Node, list[str]] = {}  # FX value -> tensor id(s) it currently denotes

    def new_tensor(self, val: Any, producer: str | None, name: str) -> str:
        tid = f"tensor:{len(self.tensors)}"
        self.tensors[tid] = {"id": tid, "name": name, **_tensor_desc(val), "producer": producer, "consumers": []}
        return tid

    def add_inputs(self, user_inputs: list[str], input_names: list[str]) -> list[str]:
        """Graph inputs first, in call order."""
        input_ids = []
        for fx_name, name in zip(user_inputs, input_names, strict=False):
            node = self.fx_by_name[fx_name]
            tid = self.new_tensor(node.meta.get("val"), None, name)
            self.current[node] = [tid]
            input_ids.append(tid)
        return input_ids

    def add_call(self, node: fx.Node) -> None:
        """One call_function: a getitem of a known tuple is an alias, anything else a node
        (preceded by the constants it reads first)."""
        if node.target is operator.getitem:
            src, idx = node.args
            if (
                isinstance(src, fx.Node)
                and src in self.current
                and isinstance(idx, int)
                and idx < len(self.current[src])
            ):
                self.current[node] = [self.current[src][idx]]
                return
        for a in _tensor_args(node):
            if a.op == "placeholder" and a.name in self.const_targets and a not in self.current:
                self._emit_constant(a)
        nid = f"node:{len(self.nodes)}"
        ins = self._read_inputs(node, nid)
        outs = self._new_outputs(node, nid)
        self.nodes.append(
            {
                "id": nid,
                "op": op_name(node.target),
                "category": category(op_name(node.target)),
                "name": node.name,
                "module_path": _module_path(node),
                "inputs": ins,
                "outputs": outs,
            }
        )
        self.current[node] = outs
        # An in-place write makes a new version of the written value for every later reader.
        for i in _writes(node):
            written = node.args[i] if i < len(node.args) else None
            if isinstance(written, fx.Node) and outs:
                self.current[written] = [outs[0]]
                self.nodes[-1]["mutates"] = list(self.current.get(written, []))

    def _emit_constant(self, ph: fx.Node) -> None:
        target = self.const_targets[ph.name]
        nid = f"node:{len(self.nodes)}"
        tid = self.new_tensor(ph.meta.get("val"), nid, target)
        owner = target.rsplit(".", 1)[0] if "." in target else ""
        self.nodes.append(
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
        self.current[ph] = [tid]

    def _read_inputs(self, node: fx.Node, nid: str) -> list[str]:
        """The tensors the node reads (each once), recording it as their consumer."""
        ins: list[str] = []
        for a in _tensor_args(node):
            for tid in self.current.get(a, []):
                if tid not in ins:
                    ins.append(tid)
                    self.tensors[tid]["consumers"].append(nid)
        return ins

    def _new_outputs(self, node: fx.Node, nid: str) -> list[str]:
        """A tensor for the node's value, or one per non-None element of a tuple value."""
        val = node.meta.get("val")
        outs: list[str] = []
        if isinstance(val, (list, tuple)):
            for i, v in enumerate(val):
                if v is not None:
                    outs.append(self.new_tensor(v, nid, f"{node.name}.{i}"))
        elif val is not None:
            outs.append(self.new_tensor(val, nid, node.name))
        return outs

    def outputs(
        self, user_out_names: list[str], output_names: list[str], input_ids: list[str], user_inputs: list[str]
    ) -> list[str]:
        """User outputs, then final versions of mutated graph inputs (state the graph writes)."""
        out_node = next(n for n in self.gm.graph.nodes if n.op == "output")
        out_by_name = {v.name: v for v in out_node.args[0] if isinstance(v, fx.Node)}
        output_ids: list[str] = []
        for fx_name, name in zip(user_out_names, output_names, strict=False):
            v = out_by_name.get(fx_name)
            if v is None or v not in self.current:
                raise RuntimeError(f"graph output {name} is not a tensor")
            tid = self.current[v][0]
            output_ids.append(tid)
            self.tensors[tid].setdefault("output_name", name)
        for tid_in, fx_name in zip(input_ids, user_inputs, strict=False):
            final = self.current[self.fx_by_name[fx_name]][0]
            if final != tid_in:
                output_ids.append(final)
                self.tensors[final]["output_name"] = self.tensors[tid_in]["name"]
        for tid in output_ids:
            self.tensors[tid]["is_network_output"] = True
        return output_ids

    def place_shape_arithmetic(self) -> None:
        """Shape arithmetic carries no module stack: it belongs where its first reader is."""
        by_id = {n["id"]: n for n in self.nodes}
        for n in reversed(self.nodes):
            if not n["module_path"]:
                for t in n["outputs"]:
                    readers = [by_id[c]["module_path"] for c in self.tensors[t]["consumers"] if by_id[c]["module_path"]]
                    if readers:
                        n["module_path"] = readers[0]
                        break
