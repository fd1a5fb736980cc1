"""The engine boundary.

An engine turns a captured role graph (a torch.export ExportedProgram), the values of its
lifted parameters/buffers and the role's bound kernel slots into a `RoleRunner`. Capture,
selection, bundles and the TUI never see more than this.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from ..common.progress import NO_PROGRESS, Progress


class RoleRunner(Protocol):
    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Run the role. Outputs may be buffers the runner reuses: read them before the next call."""
        ...

    def prepare(self, *inputs: torch.Tensor, progress: Progress = NO_PROGRESS, fixed_shapes: bool = True) -> None:
        """Get ready to run on these long-lived input buffers (compile; with fixed_shapes, capture a
        replayable graph). May run the role once on them."""
        ...

    def describe(self) -> str:
        """One line: how this role runs."""
        ...


class Engine(Protocol):
    name: str

    def compile_role(
        self, captured: Any, state: dict[str, torch.Tensor], slots: Sequence[tuple[Any, Any]], device: torch.device
    ) -> RoleRunner:
        """`captured`: mcore.graph.capture.Captured; `state`: FQN -> tensor for every lifted
        parameter/buffer; `slots`: (slot record, bound SlotCall) pairs for this role."""
        ...

    def keeps_captures(self, device: torch.device) -> bool:
        """Whether a captured role graph is worth saving for the next load (graph_capture.capture_cached):
        not where the engine keeps its compiled roles in a form that needs no graph."""
        ...

    def load_role(
        self,
        fingerprint: str,
        role: str,
        state: dict[str, torch.Tensor],
        slots: Sequence[tuple[Any, Any]],
        device: torch.device,
        structure: Any = None,
    ) -> tuple[RoleRunner, Any] | None:
        """(runner, the role's graph snapshot) ready-made from an earlier load, without capture; or
        None: then the caller captures the graph and calls compile_role. `fingerprint`: the role
        graph's, from the bundle (the snapshot returned has it); `structure`: the role's
        engines.structure.RoleStructure (what compiled code of another model of the same
        architecture and shapes may serve it)."""
        ...
