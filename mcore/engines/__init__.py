"""Engines run a captured (and possibly patched) role graph.

- `torch`: op by op from Python, any device; the reference, and the CPU default.
- `compiled`: Inductor-compiled graphs, fixed-shape roles replayed as CUDA graphs; the CUDA default.
- `auto` (the default): `compiled` on CUDA, `torch` elsewhere.

The boundary an engine implements is `Engine.compile_role(captured, state, slots, device)`
returning a RoleRunner. A TensorRT engine would compile the same ExportedProgram
(Torch-TensorRT) and turn each slot into a plugin, without touching capture, selection,
bundles or the TUI.
"""

from __future__ import annotations

import torch

from ..common.errors import UserError
from .base import Engine, RoleRunner

ENGINES = ("auto", "torch", "compiled")


def resolve_engine_name(name: str, device: torch.device) -> str:
    if name == "auto":
        return "compiled" if device.type == "cuda" else "torch"
    if name == "tensorrt":
        raise UserError(
            "the tensorrt engine is not available here (TensorRT cannot be installed on these machines); "
            "use --engine compiled (CUDA) or --engine torch"
        )
    if name not in ENGINES:
        raise UserError(f"unknown engine {name!r}; use one of: {', '.join(ENGINES)}")
    return name


def get_engine(name: str, device: torch.device = torch.device("cpu")) -> Engine:
    name = resolve_engine_name(name, device)
    if name == "compiled":
        from .compiled import CompiledEngine

        return CompiledEngine()
    from .torch_engine import TorchEngine

    return TorchEngine()


__all__ = ["Engine", "RoleRunner", "get_engine", "resolve_engine_name", "ENGINES"]
