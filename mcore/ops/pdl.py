"""Programmatic dependent launch (Hopper and later) for mcore's own Triton kernels.

With Inductor's PDL on (by default on Hopper, see mcore/ops/inductor.py), a kernel may be launched
while the one before it drains, and waits (`gdc_wait`) before it reads what that kernel wrote.
mcore's kernels (`mcore::gemv`, the split-KV decode attention) then launch the same way, so the
chain of waits is unbroken: a kernel lets the next one launch (`gdc_launch_dependents`) only
after its own wait, so no kernel runs ahead of an unfinished producer.
"""

from __future__ import annotations

from typing import Any

import torch

from . import inductor


def requested(device: torch.device) -> bool:
    """Inductor's programmatic dependent launch is asked for and `device` can do it."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 9:
        return False
    return "triton.enable_pdl" in inductor.settings(device)


def launch_options(device: torch.device) -> dict[str, Any]:
    """Keyword arguments of a Triton launch: `launch_pdl` where PDL is requested, else none."""
    return {"launch_pdl": True} if requested(device) else {}
