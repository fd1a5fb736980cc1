"""Kernel slots inside a role graph: the engine's side of a receipt (DESIGN.md §3, §4).

A slot is one `mcore::slot` custom-op node. The op is opaque to every engine: the compiled
engine may fuse freely around it but never across or into it, so a slot-ready build keeps the
receipt's boundary exactly (the role a TensorRT plugin plays). The node carries a string key;
the op looks the bound `SlotCall` up by that key when it runs, so a compiled graph (and its
cache entry) holds no Python object and two pipelines in one process keep their own DSOs.

The slot calls the bound TVM-FFI function in ABI order: inputs, workspace, outputs, extra
args. The engine allocates the output (fresh, so it never aliases an input) and the workspace
(once per slot, when it binds, uninitialised); the kernel launches on the current stream, also
during CUDA-graph capture.
"""

from __future__ import annotations

import gc
import itertools
import operator
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from ..common.errors import UserError
from ..graph.from_export import TORCH_DTYPES
from ..graph.snapshot import Snapshot
from ..selection.receipt import SlotRecord

# Live slots by key. Weak: a key is free again once its pipeline is gone, so a pipeline loaded after
# another was dropped gets the same keys, and with them the same compiled code (no recompile).
_registry: weakref.WeakValueDictionary[str, SlotCall] = weakref.WeakValueDictionary()
_registry_lock = threading.Lock()


class SlotCall:
    """What one slot node runs. Bound once, when its pipeline is constructed."""

    def __init__(self, slot: SlotRecord):
        self.slot = slot
        self.binding_id: str = slot.binding_id
        self.out_dtype = TORCH_DTYPES[slot.outputs[0].dtype]
        self.out_shape = list(slot.outputs[0].shape)
        self.shape_input: int | None = slot.output_shape_input
        self.workspace_bytes: int = slot.workspace_bytes
        self.extras = [a.get("value") for a in slot.extra_args]
        self.fn: Callable[..., Any] | None = None
        self._workspace: torch.Tensor | None = None
        # The lowest free keys, in construction order: the first pipeline of a fresh process, or one
        # loaded after the last was dropped, gets the same keys (and compiled code) every time.
        with _registry_lock:
            self.key = next(k for k in (f"slot{n}" for n in itertools.count()) if k not in _registry)
            _registry[self.key] = self
        self.__name__ = f"slot_{self.binding_id}"

    def bind(self, fn: Callable[..., Any], device: torch.device) -> None:
        if self.fn is not None:
            raise RuntimeError(f"slot {self.binding_id} is already bound; construct a new pipeline to rebind")
        self.fn = fn
        if self.workspace_bytes:
            # uninitialised scratch: a kernel may not rely on what it holds when a call starts (the CuTe
            # attention writes every record it reads in the same call)
            self._workspace = torch.empty(self.workspace_bytes, dtype=torch.uint8, device=device)

    def output_like(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        if self.shape_input is None:
            return torch.empty(self.out_shape, dtype=self.out_dtype, device=inputs[0].device)
        return torch.empty(inputs[self.shape_input].shape, dtype=self.out_dtype, device=inputs[self.shape_input].device)

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        if self.fn is None:
            raise RuntimeError(f"slot {self.binding_id} is unbound")
        out = self.output_like(list(inputs))
        args = self.slot.call_args(
            [x if x.is_contiguous() else x.contiguous() for x in inputs], self._workspace, [out], self.extras
        )
        try:
            self.fn(*args)
        except (TypeError, ValueError, RuntimeError) as e:  # the DSO's, not ours: one line naming the slot
            raise self._failed(e) from None
        return out

    def _failed(self, e: Exception) -> UserError:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        if isinstance(e, TypeError):  # TVM-FFI: the function's parameters are not the slot's call
            ws = f"; its workspace ({self.workspace_bytes} bytes) is passed between the inputs and the output"
            return UserError(
                f"the kernel bound to slot {self.slot.label} does not take the slot's call {self.slot.call} "
                f"({first}){ws if self.workspace_bytes else ''}; build the kernel for the receipt's ABI"
            )
        return UserError(f"the kernel bound to slot {self.slot.label} failed ({type(e).__name__}: {first})")


def release_dropped() -> None:
    """Free the keys of pipelines that are gone but not yet collected (held only by reference
    cycles), before a new pipeline takes its keys."""
    if len(_registry):
        gc.collect()


def slot_call(key: str) -> SlotCall:
    call = _registry.get(key)
    if call is None:
        raise RuntimeError(f"kernel slot {key} belongs to no live pipeline")
    return call


@torch.library.custom_op("mcore::slot", mutates_args=())
def slot_op(inputs: list[torch.Tensor], key: str) -> torch.Tensor:
    return slot_call(key)(*inputs)


@slot_op.register_fake
def _slot_fake(inputs: list[torch.Tensor], key: str) -> torch.Tensor:
    return slot_call(key).output_like(list(inputs))


def apply_slot(
    gm: fx.GraphModule, snapshot: Snapshot, slot: SlotRecord, call: SlotCall, constants: dict[str, fx.Node]
) -> None:
    """Rewrite `gm` in place: the region's nodes out, one mcore::slot node over the boundary inputs in.

    `constants` maps a lifted parameter/buffer FQN (a snapshot `constant` node's name) to its placeholder.
    """
    by_name = {n.name: n for n in gm.graph.nodes}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    user_placeholders = placeholders[len(placeholders) - len(snapshot.inputs) :]

    def fx_value(tid: str) -> fx.Node:
        producer = snapshot.tensor(tid).producer
        if producer is None:
            return user_placeholders[snapshot.inputs.index(tid)]
        node = snapshot.node(producer)
        if node.op == "constant":
            return constants[node.name]
        fxn = by_name[node.name]
        if len(node.outputs) > 1:
            idx = node.outputs.index(tid)
            for u in fxn.users:
                if u.target is operator.getitem and u.args[1] == idx:
                    return u
            raise RuntimeError(f"no getitem for {tid}")
        return fxn

    ins = [fx_value(t) for t in slot.input_tensor_ids]
    out_old = fx_value(slot.output_tensor_ids[0])
    nodes = [snapshot.node(n) for n in slot.node_ids]
    region = {by_name[n.name] for n in nodes if n.op != "constant"}
    region |= {u for n in region for u in n.users if u.op == "call_function" and u.target is operator.getitem}
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    last = max(region, key=order.__getitem__)
    with gm.graph.inserting_after(last):
        new = gm.graph.call_function(torch.ops.mcore.slot.default, (ins, call.key))
    new.meta["val"] = out_old.meta.get("val")
    new.meta["mcore_binding_id"] = call.binding_id
    out_old.replace_all_uses_with(new)
    _move_descendants_after(gm, new)
    for n in sorted(region, key=order.__getitem__, reverse=True):
        outside = [u.name for u in n.users if u not in region]
        if outside:
            raise UserError(
                f"region node {n.name} still feeds {outside} after patching; the receipt does not match this graph"
            )
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
