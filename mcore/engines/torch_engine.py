"""Engine `torch`: runs the role graph op by op from Python, on CPU or CUDA. The reference engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..common.progress import NO_PROGRESS, Progress
from .prepared import PreparedGraph, prepare_graph
from .slots import slot_call


class TorchRoleRunner:
    def __init__(self, prepared: PreparedGraph):
        self.prepared = prepared
        _call_slots_directly(prepared)

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.prepared.run(self.prepared.gm, inputs)

    def prepare(self, *inputs: torch.Tensor, progress: Progress = NO_PROGRESS, fixed_shapes: bool = True) -> None:
        return None  # nothing to compile

    def describe(self) -> str:
        return f"{self.prepared.role}: op by op from Python"


def _call_slots_directly(p: PreparedGraph) -> None:
    """Op by op, a slot node calls its SlotCall itself: the custom-op dispatch (needed only so a
    compiler treats the slot as opaque) would add its overhead to every kernel call."""
    changed = False
    for node in p.gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.mcore.slot.default:
            inputs, key = node.args
            node.target = slot_call(key)
            node.args = tuple(inputs)
            changed = True
    if changed:
        p.gm.recompile()


class TorchEngine:
    name = "torch"

    def keeps_captures(self, device: torch.device) -> bool:
        return True  # op by op runs the graph itself: the saved program is its only cache

    def load_role(
        self, fingerprint: str, role: str, state: Any, slots: Any, device: torch.device, structure: Any = None
    ) -> None:
        return None  # op by op needs the graph: nothing is precompiled

    def compile_role(
        self, captured: Any, state: dict[str, torch.Tensor], slots: Sequence[tuple[Any, Any]], device: torch.device
    ) -> TorchRoleRunner:
        return TorchRoleRunner(prepare_graph(captured, state, slots, device))
