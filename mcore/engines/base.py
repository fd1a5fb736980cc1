"""The engine boundary."""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import torch


class RoleRunner(Protocol):
    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]: ...


class Engine(Protocol):
    name: str

    def compile_role(self, captured: Any, state: dict[str, torch.Tensor], slots: Sequence[tuple[dict, Any]],
                     device: torch.device) -> RoleRunner:
        """`captured`: mcore.graph.capture.Captured; `state`: FQN -> tensor for every lifted
        parameter/buffer; `slots`: (slot record, bound SlotCall) pairs for this role."""
        ...
