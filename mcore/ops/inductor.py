"""Inductor settings the compiled engine turns on beyond its own options, for its decode step.

On a CUDA device by default: `combo_kernels` (independent small kernels of a step, such as the
q and k norms, combined into one launch) and, on Hopper and later, `triton.enable_pdl`
(programmatic dependent launch: a kernel starts while the one before it drains and waits before
it reads; mcore's own Triton kernels launch the same way, see mcore/ops/pdl.py). Together they took
the 8B-sized decode step on the H200 from 4.91 to 4.46 ms (471 to 404 kernels a token,
docs/gpu-results.md); prefill compiles without them (see compile_options). MCORE_INDUCTOR=name,...
replaces the defaults with boolean settings of torch._inductor.config (experiments, benchmark
variants); MCORE_INDUCTOR=none turns them all off.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from ..common.errors import UserError

CUDA_DEFAULTS = ("combo_kernels",)
HOPPER_DEFAULTS = ("triton.enable_pdl",)  # needs sm_90 or later


@functools.cache  # asked on every launch of mcore's own kernels (mcore/ops/pdl.py)
def _is_bool_setting(name: str) -> bool:
    # imported here: torch._inductor imports Dynamo (about 1.5 s), which a command that never
    # compiles (help, a graph listing, a one-line input error) should not pay for
    import torch._inductor.config

    owner: Any = torch._inductor.config
    *path, leaf = name.split(".")
    for part in path:
        owner = getattr(owner, part, None)
    return isinstance(getattr(owner, leaf, None), bool)


def settings(device: torch.device) -> list[str]:
    """The settings turned on for compiles on `device`, sorted (they enter the cache key)."""
    raw = os.environ.get("MCORE_INDUCTOR")
    if raw is None:
        names = list(CUDA_DEFAULTS) if device.type == "cuda" else []
        if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9:
            names += HOPPER_DEFAULTS
        # a torch without one of them compiles without it
        return sorted(n for n in names if _is_bool_setting(n))
    names = [n.strip() for n in raw.split(",") if n.strip() and n.strip() != "none"]
    for name in names:
        if not _is_bool_setting(name):
            raise UserError(
                f"MCORE_INDUCTOR: {name!r} is not a boolean Inductor setting of torch {torch.__version__}; "
                "name settings of torch._inductor.config, comma-separated, or 'none'"
            )
    return sorted(names)
