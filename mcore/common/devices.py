"""The one rule for a device name (cpu, cuda, cuda:N or auto), read where it is given: `mcore build
--device` records one for the bundle's runs, and every pipeline resolves one (runtime.pipeline)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import UserError

if TYPE_CHECKING:
    import torch


def parse_device(name: Any) -> torch.device | None:
    """The torch.device that `name` names (None for auto), by its form only: whether this machine has
    it is the run's to check (a bundle may be built on a machine without the GPU it runs on)."""
    import torch

    if name in (None, "auto"):
        return None
    if not isinstance(name, str):
        raise UserError(f"--device {name!r} is not a device; use cpu, cuda or cuda:N")
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        raise UserError(f"--device {name!r} is not a device; use cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):  # meta, mps, xpu...: the engines run on CPU and CUDA only
        raise UserError(f"--device {name!r}: the engines run on cpu or cuda; use cpu, cuda or cuda:N")
    return dev
