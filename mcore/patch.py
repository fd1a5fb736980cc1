"""Replace a selected region of a role's FX graph by one kernel slot (DESIGN.md §3, §4).

The slot node calls the bound TVM-FFI function in ABI order: inputs, workspace, outputs,
extra args. Outputs and the workspace are allocated by the engine, not the kernel.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Optional

import torch
from torch import fx

from .errors import UserError
from .graph.snapshot import TORCH_DTYPES, SnapshotIndex
from .selection import check_receipt, select_region


class SlotCall:
    """The callable an FX slot node invokes. Bound once, when its pipeline is constructed."""

    def __init__(self, slot: dict[str, Any]):
        self.slot = slot
        self.binding_id: str = slot["binding_id"]
        abi = slot["abi"]
        self.out_dtype = TORCH_DTYPES[abi["outputs"][0]["dtype"]]
        self.out_shape = list(abi["outputs"][0]["shape"])
        self.shape_input: Optional[int] = slot["output_shape_input"]
        self.workspace_bytes: int = slot["workspace_bytes"]
        self.extras = [a.get("value") for a in slot["extra_args"]]
        self.fn: Optional[Callable[..., Any]] = None
        self._out: Optional[torch.Tensor] = None
        self._workspace: Optional[torch.Tensor] = None
        self.__name__ = f"slot_{self.binding_id}"

    def bind(self, fn: Callable[..., Any], device: torch.device) -> None:
        if self.fn is not None:
            raise RuntimeError(f"slot {self.binding_id} is already bound; construct a new pipeline to rebind")
        self.fn = fn
        if self.workspace_bytes:
            self._workspace = torch.empty(self.workspace_bytes, dtype=torch.uint8, device=device)
        if self.shape_input is None:  # fixed shape: one output buffer per pipeline
            self._out = torch.empty(self.out_shape, dtype=self.out_dtype, device=device)

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        if self.fn is None:
            raise RuntimeError(f"slot {self.binding_id} is unbound")
        if self._out is not None:
            out = self._out
        else:
            src = inputs[self.shape_input]
            out = torch.empty(src.shape, dtype=self.out_dtype, device=src.device)
        args: list[Any] = [x if x.is_contiguous() else x.contiguous() for x in inputs]
        if self._workspace is not None:
            args.append(self._workspace)
        args.append(out)
        args.extend(self.extras)
        self.fn(*args)
        return out


def check_receipt_against(receipt: dict[str, Any], snapshot: dict[str, Any], where: str) -> dict[str, Any]:
    """A receipt applies only to the graph it was made from: same role, fingerprint, boundary, ABI.

    Re-validates the node set on the live snapshot with the same select_region()."""
    check_receipt(receipt, where)
    role = snapshot["metadata"]["engine_role"]
    if receipt["engine_role"] != role:
        raise UserError(f"{where}: receipt is for engine role {receipt['engine_role']!r}, not {role!r}")
    if receipt["graph_fingerprint"] != snapshot["fingerprint"]:
        raise UserError(
            f"{where}: graph fingerprint {receipt['graph_fingerprint'][:12]}… does not match the graph these build args "
            f"produce ({snapshot['fingerprint'][:12]}…); recapture with `mcore graph inspect` using the same BUILD_ARGS "
            "and select again")
    live = select_region(snapshot, receipt["node_ids"], receipt["binding_id"], receipt["workspace_bytes"],
                         receipt["extra_args"], receipt["output_shape_input"], receipt.get("recipe"))
    for field in ("input_tensor_ids", "output_tensor_ids", "abi_sha256"):
        if live[field] != receipt[field]:
            raise UserError(f"{where}: {field} differs from the live graph; recapture and select again")
    return live


def slot_record(receipt: dict[str, Any]) -> dict[str, Any]:
    """What a bundle records per kernel slot."""
    keys = ("binding_id", "abi_sha256", "engine_role", "graph_fingerprint", "node_ids", "input_tensor_ids",
            "output_tensor_ids", "output_shape_input", "workspace_bytes", "extra_args", "abi", "recipe")
    return {k: receipt[k] for k in keys}


def apply_slot(gm: fx.GraphModule, snapshot: dict[str, Any], slot: dict[str, Any], call: SlotCall,
               constants: dict[str, fx.Node]) -> None:
    """Rewrite `gm` in place: the region's nodes out, one call_function(call, boundary inputs) in.

    `constants` maps a lifted parameter/buffer FQN (a snapshot `constant` node's name) to its placeholder.
    """
    ix = SnapshotIndex(snapshot)
    by_name = {n.name: n for n in gm.graph.nodes}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    user_placeholders = placeholders[len(placeholders) - len(snapshot["inputs"]):]

    def fx_value(tid: str) -> fx.Node:
        producer = ix.tensors[tid]["producer"]
        if producer is None:
            return user_placeholders[snapshot["inputs"].index(tid)]
        node = ix.nodes[producer]
        if node["op"] == "constant":
            return constants[node["name"]]
        fxn = by_name[node["name"]]
        if len(node["outputs"]) > 1:
            idx = node["outputs"].index(tid)
            for u in fxn.users:
                if u.target is operator.getitem and u.args[1] == idx:
                    return u
            raise RuntimeError(f"no getitem for {tid}")
        return fxn

    ins = [fx_value(t) for t in slot["input_tensor_ids"]]
    out_old = fx_value(slot["output_tensor_ids"][0])
    region = {by_name[ix.nodes[n]["name"]] for n in slot["node_ids"] if ix.nodes[n]["op"] != "constant"}
    region |= {u for n in region for u in n.users if u.op == "call_function" and u.target is operator.getitem}
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    last = max(region, key=order.__getitem__)
    with gm.graph.inserting_after(last):
        new = gm.graph.call_function(call, tuple(ins))
    new.meta["val"] = out_old.meta.get("val")
    out_old.replace_all_uses_with(new)
    _move_descendants_after(gm, new)
    for n in sorted(region, key=order.__getitem__, reverse=True):
        outside = [u.name for u in n.users if u not in region]
        if outside:
            raise UserError(f"region node {n.name} still feeds {outside} after patching; the receipt does not match this graph")
        gm.graph.erase_node(n)
    gm.graph.lint()
    gm.recompile()


def _move_descendants_after(gm: fx.GraphModule, slot: fx.Node) -> None:
    """Outside readers of the slot output that sit before it move after it, in their order."""
    order = list(gm.graph.nodes)
    pos = order.index(slot)
    early: list[fx.Node] = []
    for n in order[:pos]:
        if any(a is slot or a in early for a in n.all_input_nodes):
            early.append(n)
    anchor = slot
    for n in early:
        anchor.append(n)
        anchor = n
