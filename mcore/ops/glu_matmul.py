"""`mcore::matmul_glu(x, weight) -> silu(x @ gate_w.T) * (x @ up_w.T)`, weight = cat(gate_w, up_w):
the MLP's fused gate/up product over many rows (the prefill) with its gating in the epilogue.

The unfused prefill writes the [s, 2I] product (400 MB at 8k tokens on an 8B model) and reads it
back for the gating; here each program keeps the gate and up accumulators of one tile and writes
only silu(g) * u. On CUDA with Triton the kernel in glu_matmul_kernel.py (the TMA form on Hopper),
elsewhere the library product and the gating apart, each half rounded to x's dtype first as the
unfused step stores it (mcore.ops.gemv.silu_mul). The compiled engine puts it in the prefill where
MCORE_PREFILL_GLU=1 (mcore/engines/prefill_pass.py).
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

from .gemv import _has_triton, silu_mul

# (BM, BN, BK, GROUP_M, warps, stages): a tile of BM rows x BN gate and BN up columns
DEFAULT_CONFIG = (128, 128, 64, 8, 8, 3)


def enabled() -> bool:
    """MCORE_PREFILL_GLU=1: the prefill's gate/up product with its gating as mcore::matmul_glu."""
    return os.environ.get("MCORE_PREFILL_GLU", "0") == "1"


@functools.cache
def _tma() -> bool:
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    return True


def glu_matmul_triton(
    x: torch.Tensor, weight: torch.Tensor, config: tuple[int, ...] | None = None, tma: bool | None = None
) -> torch.Tensor:
    """x [..., K], weight [2N, K] (gate rows, then up rows), same 16-bit dtype; y [..., N]."""
    two_n, k = weight.shape
    if x.shape[-1] != k or x.dtype != weight.dtype or two_n % 2:
        raise ValueError(
            f"matmul_glu: x {tuple(x.shape)} {x.dtype} does not fit weight {tuple(weight.shape)} {weight.dtype}"
        )
    n = two_n // 2
    bm, bn, bk, group, warps, stages = config or DEFAULT_CONFIG
    if k % bk:
        raise ValueError(f"matmul_glu: {k} columns are not a multiple of the tile's {bk}")
    x2 = x.reshape(-1, k).contiguous()
    w = weight.contiguous()
    m = x2.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    grid = (-(-m // bm) * -(-n // bn),)
    use_tma = (
        (tma if tma is not None else _tma())
        and x.device.type == "cuda"
        and torch.cuda.get_device_capability(x.device)[0] >= 9
    )
    from . import glu_matmul_kernel as kern

    if use_tma:
        import triton.language as tl
        from triton.tools.tensor_descriptor import TensorDescriptor

        kern.glu_matmul_tma_kernel[grid](
            TensorDescriptor.from_tensor(x2, [bm, bk]),
            TensorDescriptor.from_tensor(w, [bn, bk]),
            TensorDescriptor.from_tensor(y, [bm, bn]),
            m,
            n,
            K=k,
            BM=bm,
            BN=bn,
            BK=bk,
            GROUP_M=group,
            DTYPE=tl.bfloat16 if x.dtype == torch.bfloat16 else tl.float16,
            num_warps=warps,
            num_stages=stages,
        )
    else:
        kern.glu_matmul_kernel[grid](
            x2, w, y, m, n, K=k, BM=bm, BN=bn, BK=bk, GROUP_M=group, num_warps=warps, num_stages=stages
        )
    return y.reshape(*x.shape[:-1], n)


def _on_triton(x: torch.Tensor) -> bool:
    return x.device.type == "cuda" and x.dtype in (torch.bfloat16, torch.float16) and _has_triton()


@torch.library.custom_op("mcore::matmul_glu", mutates_args=())
def matmul_glu(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`silu(F.linear(x, gate_w)) * F.linear(x, up_w)`, weight = cat(gate_w, up_w), for any number of rows."""
    if _on_triton(x):
        return glu_matmul_triton(x, weight)
    gate, up = F.linear(x, weight).chunk(2, dim=-1)
    return silu_mul(gate, up)


@matmul_glu.register_fake
def _matmul_glu_fake(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0] // 2))
