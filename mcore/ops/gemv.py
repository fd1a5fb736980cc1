"""Matrix-vector products for the decode step (one token): `mcore::gemv(x, weight) -> y`.

A decode step at batch 1 multiplies one row by every weight matrix of the model, so it is bound by
reading the weights: the step can be no faster than the weight bytes over the memory bandwidth.
This kernel streams each weight row once with wide loads, many rows per program and every SM busy,
and accumulates in fp32. Deterministic: each output element is one program's fixed-order sum (no
split-K, no atomics), so a step computes the same bits on every call and every compile.

y[..., n] = sum_k x[..., k] * weight[n, k]   (x has one row: its leading dimensions multiply to 1)

The compiled engine puts it in place of `aten.linear` for one-row inputs of fixed-shape roles on
CUDA (mcore/engines/gemv_pass.py; MCORE_GEMV=0 turns that off). On CPU the op is
`torch.nn.functional.linear`; the Triton kernel runs there only under Triton's interpreter (tests).
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os

import torch
import torch.nn.functional as F

from .pdl import launch_options

__all__ = [
    "gemv",
    "gemv_glu",
    "gemv_add",
    "rms_gemv",
    "gemv_triton",
    "gemv_config",
    "enabled",
    "glu_enabled",
    "norm_enabled",
    "silu_mul",
    "rms_norm",
]


def enabled(device: torch.device) -> bool:
    """The compiled engine's one-row linears use this kernel: on CUDA by default (an 8B-sized decode
    step's projections on the H200: 3.97 ms against cuBLAS's 4.22); MCORE_GEMV=0 turns it off, =1
    rewrites on any device (on CPU the op is F.linear: the tests check the rewrite there)."""
    flag = os.environ.get("MCORE_GEMV", "")
    return flag == "1" if flag in ("0", "1") else device.type == "cuda"


def glu_enabled() -> bool:
    """With the rewrite to mcore::gemv, the MLP's fused gate/up product and its silu(gate) * up become
    one kernel (`mcore::gemv_glu`): the gating in the product's epilogue, one launch a layer less and
    no gate/up row written. On by default; MCORE_GEMV_GLU=0 keeps the gating a kernel of its own."""
    return os.environ.get("MCORE_GEMV_GLU", "1") != "0"


def norm_enabled() -> bool:
    """MCORE_GEMV_NORM=1: with the rewrite to mcore::gemv, the decoder's add + RMSNorm kernels fold
    into the products around them: the residual add into the epilogue of the product before it
    (`mcore::gemv_add`, the same bits) and the norm into the prologue of the product it feeds
    (`mcore::rms_gemv`, the normalised row never rounded: within a bf16 rounding of the unfused
    step). Two launches a layer less. Off: slower than the defaults on an H100 (5.83 against 5.74 ms
    at 1k); with the norm's weight folded into the products' columns, so that no program reads it,
    5.80 (twenty-fifth session, docs/gpu-results.md): the weight reads are not most of its cost.
    On top of the rotary prologue: 219 kernels a step against 291 and the same time (thirty-eighth)."""
    return os.environ.get("MCORE_GEMV_NORM", "0") == "1"


def gemv_config(n: int, k: int, sms: int = 132) -> tuple[int, int, int, int]:
    """(BLOCK_N rows per program, BLOCK_K columns per iteration, warps, pipeline stages) for an
    N x K weight. Rows of at most 4096 columns are read 2 KB of bf16 at a time by 8 warps, 2 rows
    per program up to 8192 rows, 4 beyond; longer rows 1 KB at a time by 4 warps, 8 rows per
    program; rows per program halved until there are at least four programs per SM. From the
    H200 sweep of bench/gemv_gpu.py (docs/gpu-results.md): within 2% of the best configuration
    measured at each 8B decode shape, 0.09 ms a step faster than 1 KB at a time everywhere."""
    width = max(16, 1 << math.ceil(math.log2(max(k, 1))))
    if width <= 4096:
        block_n, block_k = (2 if n <= 8192 else 4), min(1024, width)
    else:
        block_n, block_k = 8, 512
    warps = 8 if block_k == 1024 else 4
    while block_n > 1 and -(-n // block_n) < 4 * sms:
        block_n //= 2
    return block_n, block_k, warps, 3


@functools.cache
def _kernel():
    """The Triton kernel, imported on first use (importing triton is not free, and CPU runs never need it)."""
    from .gemv_kernel import gemv_kernel

    return gemv_kernel


@functools.cache
def _has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def gemv_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    config: tuple[int, int, int, int] | None = None,
    glu: bool = False,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """The Triton kernel: x [..., K] with one row, weight [N, K] contiguous, same dtype; y [..., N].
    With `glu`: weight is [2M, K] (gate rows, then up rows) and y [..., M] = silu(gate) * up, each
    half rounded to x's dtype first as the unfused step stores it. `config` is the concatenated
    weight's (gemv_config): a GLU program takes half as many output rows, the same weight bytes.
    With `norm_weight` [K]: x RMS-normalised first (rms_norm, unrounded). With `residual` (y's
    shape): y = residual + the product rounded to y's dtype."""
    if not _has_triton():
        raise RuntimeError("mcore.gemv needs triton (pip install triton)")
    n, k = weight.shape
    if x.shape[-1] != k or x.numel() != k or x.dtype != weight.dtype:
        raise ValueError(
            f"gemv: x {tuple(x.shape)} {x.dtype} is not one row for weight {tuple(weight.shape)} {weight.dtype}"
        )
    if glu and n % 2:
        raise ValueError(f"gemv_glu: weight {tuple(weight.shape)} has an odd row count: not gate and up rows")
    out = n // 2 if glu else n
    if norm_weight is not None and norm_weight.numel() != k:
        raise ValueError(f"rms_gemv: norm weight {tuple(norm_weight.shape)} does not match x's {k} columns")
    if residual is not None and (residual.numel() != out or residual.dtype != x.dtype):
        raise ValueError(f"gemv_add: residual {tuple(residual.shape)} {residual.dtype} is not one row of {out}")
    xs = x.reshape(k).contiguous()
    w = weight.contiguous()
    y = torch.empty(out, dtype=x.dtype, device=x.device)
    sms = _sm_count(x.device.index or 0) if x.device.type == "cuda" else 4  # 4: the interpreter
    block_n, block_k, warps, stages = config or gemv_config(n, k, sms)
    if glu:
        block_n = max(1, block_n // 2)
    if norm_weight is not None and config is None:
        # each program reads the norm's weight beside x: twice the rows a program, half those reads
        # (H100, Qwen3-8B-sized step: 5.97 -> 5.83 ms at 1k; docs/gpu-results.md, nineteenth session)
        block_n *= 2
    pdl = launch_options(x.device)  # programmatic dependent launch, where asked for (mcore/ops/pdl.py)
    _kernel()[(-(-out // block_n),)](
        xs,
        w,
        y,
        xs if norm_weight is None else norm_weight.reshape(k).contiguous(),  # unread without NORM
        y if residual is None else residual.reshape(out).contiguous(),  # unread without RESIDUAL
        out,
        float(eps),
        K=k,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        PDL=bool(pdl),
        GLU=glu,
        NORM=norm_weight is not None,
        RESIDUAL=residual is not None,
        num_warps=warps,
        num_stages=stages,
        **pdl,
    )
    return y.reshape(*x.shape[:-1], out)


def _on_triton(x: torch.Tensor) -> bool:
    return x.device.type == "cuda" and x.dtype in (torch.bfloat16, torch.float16) and _has_triton()


@torch.library.custom_op("mcore::gemv", mutates_args=())
def gemv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., K] (one row) times weight [N, K] transposed, as `F.linear(x, weight)`."""
    if _on_triton(x):
        return gemv_triton(x, weight)
    return F.linear(x, weight)


@gemv.register_fake
def _gemv_fake(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in fp32, rounded once to gate's dtype: what the compiled step's fused gating
    computes from the stored halves (the kernel's epilogue does the same)."""
    return (F.silu(gate.float()) * up.float()).to(gate.dtype)


@torch.library.custom_op("mcore::gemv_glu", mutates_args=())
def gemv_glu(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`silu(F.linear(x, gate_w)) * F.linear(x, up_w)` for one row, weight = cat(gate_w, up_w): the MLP's
    fused gate/up product with its gating in the kernel's epilogue (on unless MCORE_GEMV_GLU=0)."""
    if _on_triton(x):
        return gemv_triton(x, weight, glu=True)
    gate, up = F.linear(x, weight).chunk(2, dim=-1)
    return silu_mul(gate, up)


@gemv_glu.register_fake
def _gemv_glu_fake(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0] // 2))


@torch.library.custom_op("mcore::gemv_add", mutates_args=())
def gemv_add(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """`residual + F.linear(x, weight)` for one row: the decoder's residual add in the product's epilogue,
    the product rounded to x's dtype first as the unfused step stores it (the same bits)."""
    if _on_triton(x):
        return gemv_triton(x, weight, residual=residual)
    return residual + F.linear(x, weight)


@gemv_add.register_fake
def _gemv_add_fake(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def rms_norm(x: torch.Tensor, norm_weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The decoders' RMSNorm (mcore.families.decoder.RMSNorm's forward), with transformers' numerics:
    normalised in fp32, rounded to x's dtype, then scaled by the weight in x's dtype. The graph pass
    (mcore/engines/patterns.py rms_norm_of) matches exactly these ops."""
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return norm_weight * h.to(x.dtype)


@torch.library.custom_op("mcore::rms_gemv", mutates_args=())
def rms_gemv(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor, glu: bool) -> torch.Tensor:
    """`F.linear(rms_norm(x, norm_weight, eps), weight)` for one row (`glu`: then silu(gate) * up as
    mcore::gemv_glu): the norm in the product's prologue. The kernel sums x^2 in the pass that reads x
    for the products and scales the sums once, so the normalised row is never rounded: within one
    rounding of the unfused step, not bit-equal to it (CPU computes the unfused step)."""
    if _on_triton(x):
        return gemv_triton(x, weight, glu=glu, norm_weight=norm_weight, eps=eps)
    h = rms_norm(x, norm_weight, eps)
    return gemv_glu(h, weight) if glu else F.linear(h, weight)


@rms_gemv.register_fake
def _rms_gemv_fake(
    x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor, glu: bool
) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0] // 2 if glu else weight.shape[0]))
