"""Engine `torch`: runs the role graph op by op from Python, on CPU or CUDA. The reference engine."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..progress import NO_PROGRESS, Progress
from .prepared import PreparedGraph, prepare_graph


class TorchRoleRunner:
    def __init__(self, prepared: PreparedGraph):
        self.prepared = prepared

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        p = self.prepared
        with torch.no_grad():
            outs = p.gm(*p.state_args, *inputs)
        if not isinstance(outs, (tuple, list)):
            outs = (outs,)
        return tuple(outs[i] for i in p.output_index)

    def prepare(self, *inputs: torch.Tensor, progress: Progress = NO_PROGRESS, fixed_shapes: bool = True) -> None:
        return None  # nothing to compile

    def describe(self) -> str:
        return f"{self.prepared.role}: op by op from Python"


class TorchEngine:
    name = "torch"

    def compile_role(self, captured: Any, state: dict[str, torch.Tensor], slots: Sequence[tuple[dict, Any]],
                     device: torch.device) -> TorchRoleRunner:
        return TorchRoleRunner(prepare_graph(captured, state, slots, device))
