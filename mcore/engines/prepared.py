"""The role graph an engine runs: the captured ATen graph with real devices, slots patched in.

Shared by every engine so that the op-by-op reference and the compiled engine run exactly the
same graph (same slots, same boundaries); they differ only in how they execute it.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from ..graph.from_export import is_assert_node
from ..selection.receipt import SlotRecord
from .slots import SlotCall, apply_slot


@dataclass
class RoleProgram:
    """What running a compiled role needs besides its code: the lifted state in graph order and
    which outputs and inputs are the role's. A precompiled role is loaded as this alone (no graph)."""

    role: str
    state_args: list[torch.Tensor]  # lifted parameters/buffers, detached (no autograd anywhere)
    state_sources: list[torch.Tensor]  # the module's own tensors behind state_args (same storage)
    state_names: list[str]  # the module's name of each lifted tensor, in graph order
    fused_groups: list[list[int]]  # state indexes whose weights the engine concatenated (fusion.py)
    output_index: list[int]  # which graph outputs are the role's user outputs
    mutated_inputs: frozenset[int]  # user inputs the graph writes in place (KV caches)
    dynamic_dims: dict[int, tuple[int, ...]]  # user input -> its dynamic dimensions (-1 in the snapshot)
    slot_keys: tuple[str, ...]

    def run(self, fn: Any, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Call `fn` (the graph module, or a compiled form of it) and keep the role's user outputs."""
        with torch.no_grad():
            outs = fn(*self.state_args, *inputs)
        if not isinstance(outs, (tuple, list)):
            outs = (outs,)
        return tuple(outs[i] for i in self.output_index)


@dataclass
class PreparedGraph(RoleProgram):
    gm: fx.GraphModule


def prepare_graph(
    captured: Any, state: dict[str, torch.Tensor], slots: Sequence[tuple[SlotRecord, SlotCall]], device: torch.device
) -> PreparedGraph:
    ep: torch.export.ExportedProgram = captured.exported
    gm = copy.deepcopy(ep.graph_module)  # the graph only: parameters are meta, values come from `state`
    sig = ep.graph_signature
    targets: dict[str, str] = {}
    targets.update(sig.inputs_to_parameters)
    targets.update(sig.inputs_to_buffers)
    targets.update(getattr(sig, "inputs_to_lifted_tensor_constants", {}) or {})
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    n_user = len(sig.user_inputs)
    lifted = placeholders[: len(placeholders) - n_user]
    user = placeholders[len(placeholders) - n_user :]
    missing = [targets[p.name] for p in lifted if targets[p.name] not in state]
    if missing:
        raise RuntimeError(f"no value for lifted tensors {missing[:4]}")
    sources = [state[targets[p.name]] for p in lifted]
    state_args = [t.detach() for t in sources]
    # Capture ran on the meta device: point device arguments at the real device, drop meta asserts.
    for node in list(gm.graph.nodes):
        if is_assert_node(node) and not node.users:
            gm.graph.erase_node(node)
            continue
        if node.op == "call_function" and isinstance(node.kwargs.get("device"), torch.device):
            node.update_kwarg("device", device)
    constants = {targets[p.name]: p for p in lifted}
    for slot, call in slots:
        apply_slot(gm, captured.snapshot, slot, call, constants)
    gm.recompile()
    out_specs = list(sig.output_specs)
    user_index = [i for i, s in enumerate(out_specs) if s.kind == torch.export.graph_signature.OutputKind.USER_OUTPUT]
    snap = captured.snapshot
    shapes = {t.id: list(t.shape) for t in snap.tensors}
    dynamic = {
        i: tuple(d for d, n in enumerate(shapes[tid]) if n == -1)
        for i, tid in enumerate(snap.inputs)
        if -1 in shapes[tid]
    }
    return PreparedGraph(
        role=captured.role,
        state_args=state_args,
        state_sources=sources,
        state_names=[targets[p.name] for p in lifted],
        fused_groups=[],
        output_index=user_index,
        mutated_inputs=_mutated(gm, user),
        dynamic_dims=dynamic,
        slot_keys=tuple(c.key for _, c in slots),
        gm=gm,
    )


def _mutated(gm: fx.GraphModule, user: list[fx.Node]) -> frozenset[int]:
    """User inputs written in place: arguments an op's schema marks as mutable (index_copy_ on a cache)."""
    written: set[fx.Node] = set()
    for node in gm.graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is None:
            continue
        for i, arg in enumerate(schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
                if isinstance(value, fx.Node):
                    written.add(value)
    return frozenset(i for i, p in enumerate(user) if p in written)
