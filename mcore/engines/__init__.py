"""Engines run a captured (and possibly patched) role graph. Only `torch` exists here.

The boundary an engine implements is `Engine.compile_role(captured, state, slots, device)`
returning a callable over the role's inputs. A TensorRT engine would compile the same
ExportedProgram (Torch-TensorRT) and turn each slot into a plugin, without touching
capture, selection, bundles or the TUI.
"""

from __future__ import annotations

from ..errors import UserError
from .base import Engine, RoleRunner

ENGINES = ("torch",)


def get_engine(name: str) -> Engine:
    if name == "torch":
        from .torch_engine import TorchEngine

        return TorchEngine()
    if name == "tensorrt":
        raise UserError("the tensorrt engine is not available here (TensorRT cannot be installed on these machines); "
                        "use --engine torch")
    raise UserError(f"unknown engine {name!r}; use one of: {', '.join(ENGINES)}")


__all__ = ["Engine", "RoleRunner", "get_engine", "ENGINES"]
