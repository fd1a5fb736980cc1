"""Split-KV decode attention (flash-decoding) in Triton: the CUDA implementation of mcore::decode_attention.

Cost follows the active length, not the cache capacity, without a host sync: the length is read
from the INT32[1] device tensor inside the kernels. The grid is fixed for a given cache (KV heads
x NSPLIT programs), so the launch is the same on every call and safe inside a CUDA graph; each
program takes an equal, block-aligned share of [0, length) and programs past the end do nothing.

Deterministic: the split schedule depends only on the length, and the splits' partial results are
merged in a fixed order by a second kernel. (A merge folded into the split kernel's last arrival per
KV head was built and measured in the eighteenth and nineteenth sessions: slower alone on the H100,
6.00 against 5.75 ms a step at 1k, and its arrival counters raced at three rows a head; removed,
docs/gpu-results.md.)

Numerics (the mcore::decode_attention contract): scores accumulate in fp32 (16-bit products are
exact), the softmax is fp32, the probabilities are rounded to the cache dtype for the product with
V (as fused attention kernels do; fp32 accumulation), and the result is cast to the cache dtype.
With fp32 caches both products run as 3xTF32, fp32-accurate.

One program handles one KV head and all G = H/KV query heads that share it, for all s new tokens
(rows r = g*s + i): K and V are read once per KV head.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from .pdl import launch_options

# Launch configuration (bench/flash_decode_sweep.py measures the alternatives on the GPU).
BLOCK_N = 64
NSPLIT_PER_SM = 2  # programs per SM, summed over KV heads
NUM_WARPS = 4
NUM_STAGES = 3
# The rotary prologue's split kernel follows the q/k/v product directly, and with programmatic
# dependent launch its blocks are placed while that product's blocks still hold SMs. At 3 stages
# (70 KB of shared memory) three fit an SM, and on the H200 at 32k a call took 44.5 us against the
# plain split's 37.5 (38.8 without PDL). At 4 stages (102 KB) at most two fit: the 8B step 5.41
# against 5.55 ms at 32k, 4.30 at 1k either way; the plain split, after a small kernel, is better at
# 3 (twenty-seventh session, docs/gpu-results.md).
ROPE_STAGES = 4


@triton.jit
def _attend_block(
    q,
    K,
    V,
    base,
    n0,
    end,
    qpos,
    cols,
    m,
    l,
    acc,
    BLOCK_N: tl.constexpr,
    D: tl.constexpr,
    WIDE: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """One block of BLOCK_N cache positions folded into the running (max, sum, accumulator)."""
    pos = n0 + tl.arange(0, BLOCK_N)
    pos_ok = pos < end
    offs = base + pos.to(tl.int64)[:, None] * D + cols[None, :]
    k = tl.load(K + offs, mask=pos_ok[:, None], other=0.0)
    if UPCAST:  # Triton's CPU interpreter cannot multiply bf16 tiles: widen them there
        k = k.to(tl.float32)
    if WIDE:  # fp32 caches: 3xTF32 keeps fp32 accuracy on the tensor cores
        s = tl.dot(q, tl.trans(k), input_precision="tf32x3")
    else:  # 16-bit: exact products, fp32 sums
        s = tl.dot(q, tl.trans(k))
    s = tl.where((pos[None, :] <= qpos[:, None]) & pos_ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing allowed yet stay at 0
    alpha = tl.exp(m - m_ref)
    p = tl.exp(s - m_ref[:, None])
    l = l * alpha + tl.sum(p, 1)
    v = tl.load(V + offs, mask=pos_ok[:, None], other=0.0)
    if UPCAST:
        v = v.to(tl.float32)
    if WIDE:
        pv = tl.dot(p, v, input_precision="tf32x3")
    else:  # probabilities rounded to the cache dtype for the product, as fused attention kernels do
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, l, acc * alpha[:, None] + pv


@triton.jit
def _merge_rows(
    PACC, PML, OUT, kvh, row, ROWS: tl.constexpr, D: tl.constexpr, NSPLIT: tl.constexpr, NSPLIT_P2: tl.constexpr
):
    """One output row from its NSPLIT partial results, always in the same order."""
    splits = tl.arange(0, NSPLIT_P2)
    ok = splits < NSPLIT
    cols = tl.arange(0, D)
    part = (kvh * NSPLIT + splits) * ROWS + row
    m = tl.load(PML + part * 2, mask=ok, other=float("-inf"))
    l = tl.load(PML + part * 2 + 1, mask=ok, other=0.0)
    m_all = tl.max(m, 0)
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_all))
    acc = tl.load(PACC + part[:, None] * D + cols[None, :], mask=ok[:, None], other=0.0)
    out = tl.sum(acc * w[:, None], 0) / tl.sum(l * w, 0)
    tl.store(OUT + (kvh * ROWS + row) * D + cols, out.to(OUT.dtype.element_ty))


@triton.jit
def _rotated_heads(X, NW, COS, SIN, offs, pos, ok, eps, cols, D: tl.constexpr, QKNORM: tl.constexpr):
    """Rows of D values at X + offs (one a head), each RMS-normalised with NW (QKNORM) and rounded as
    the decoder's norm rounds, then rotated by the rotary embedding: the rows `pos` of the FP32 tables
    COS and SIN, rounded to X's dtype as the decoder reads them. mcore/ops/rope_attention.py's
    computation, in fp32 between those roundings."""
    half = (cols + D // 2) % D  # the partner of each column in rotate_half
    x = tl.load(X + offs[:, None] + cols[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    xr = tl.load(X + offs[:, None] + half[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    if QKNORM:
        r = tl.rsqrt(tl.sum(x * x, 1) / D + eps)[:, None]
        x = (x * r).to(X.dtype.element_ty).to(tl.float32) * tl.load(NW + cols).to(tl.float32)[None, :]
        xr = (xr * r).to(X.dtype.element_ty).to(tl.float32) * tl.load(NW + half).to(tl.float32)[None, :]
    trig = pos.to(tl.int64)[:, None] * D + cols[None, :]
    c = tl.load(COS + trig, mask=ok[:, None], other=0.0).to(X.dtype.element_ty).to(tl.float32)
    s = tl.load(SIN + trig, mask=ok[:, None], other=0.0).to(X.dtype.element_ty).to(tl.float32)
    return x * c + tl.where(cols < D // 2, -1.0, 1.0)[None, :] * xr * s


@triton.jit
def _rope_prologue(
    QKV, K, V, QNW, KNW, COS, SIN, eps, scale, kvh, length, start, end, base, rows, row_ok, cols,
    S: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr, KVH: tl.constexpr, S_P2: tl.constexpr,
    QKNORM: tl.constexpr,
):  # fmt: skip
    """The split's query rows from the q/k/v product's row [S, (H + 2 KVH) D], normalised, rotated, scaled
    and rounded; and the new keys and values whose positions fall in [start, end) written into the
    caches, seen by the whole block before it reads its share."""
    G: tl.constexpr = ROWS // S
    width: tl.constexpr = (G + 2) * KVH * D
    tok = rows % S
    offs = tok * width + (kvh * G + rows // S) * D
    q = _rotated_heads(QKV, QNW, COS, SIN, offs, length - S + tok, row_ok, eps, cols, D, QKNORM)
    q = (q * scale).to(K.dtype.element_ty)  # the scaled query, rounded as the unfused step stores it
    toks = tl.arange(0, S_P2)
    pos = length - S + toks
    new = toks < S
    k = _rotated_heads(QKV, KNW, COS, SIN, toks * width + (G * KVH + kvh) * D, pos, new, eps, cols, D, QKNORM)
    v = tl.load(QKV + (toks * width + (G * KVH + KVH + kvh) * D)[:, None] + cols[None, :], mask=new[:, None])
    mine = (new & (pos >= start) & (pos < end))[:, None]
    dst = base + pos.to(tl.int64)[:, None] * D + cols[None, :]
    tl.store(K + dst, k.to(K.dtype.element_ty), mask=mine)
    tl.store(V + dst, v.to(V.dtype.element_ty), mask=mine)
    tl.debug_barrier()  # the whole block sees them before it reads its share
    return q


@triton.jit
def _split_kernel(
    Q,
    K,
    V,
    LEN,
    PACC,
    PML,
    OUT,
    QNW,
    KNW,
    COS,
    SIN,
    eps,
    scale,
    C,
    S: tl.constexpr,
    ROWS: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NSPLIT: tl.constexpr,
    NSPLIT_P2: tl.constexpr,
    WIDE: tl.constexpr,
    UPCAST: tl.constexpr,
    INTERP: tl.constexpr,
    PDL: tl.constexpr,
    ROPE: tl.constexpr,
    QKNORM: tl.constexpr,
    KVH: tl.constexpr,
    S_P2: tl.constexpr,
):
    """ROPE: Q is the q/k/v product's row [S, (H + 2 KVH) D] (mcore/ops/rope_attention.py): the program
    normalises and rotates its query heads itself, and writes the new keys and values whose positions
    fall in its share into the caches before it reads that share (a barrier between: one block)."""
    kvh = tl.program_id(0)
    split = tl.program_id(1)
    if PDL:  # the query and the caches are the previous kernels' output (mcore/ops/pdl.py)
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    length = tl.load(LEN) + S if ROPE else tl.load(LEN)  # ROPE: LEN counts what was cached before
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, D)
    row_ok = rows < ROWS
    share = tl.cdiv(tl.cdiv(length, NSPLIT), BLOCK_N) * BLOCK_N
    start = split * share
    end = tl.minimum(start + share, length)
    base = kvh.to(tl.int64) * C * D
    if ROPE:
        q = _rope_prologue(Q, K, V, QNW, KNW, COS, SIN, eps, scale, kvh, length, start, end, base, rows, row_ok, cols,
                           S, ROWS, D, KVH, S_P2, QKNORM)  # fmt: skip
    else:
        q = tl.load(Q + (kvh * ROWS + rows)[:, None] * D + cols[None, :], mask=row_ok[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    qpos = length - S + (rows % S)  # absolute position of each row's query token
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    if INTERP:  # the interpreter (Triton 3.6 with numpy 2) takes no tensor bounds in range(): same blocks
        n0 = start
        while n0 < end:
            m, l, acc = _attend_block(q, K, V, base, n0, end, qpos, cols, m, l, acc, BLOCK_N, D, WIDE, UPCAST)
            n0 += BLOCK_N
    else:
        for n0 in range(start, end, BLOCK_N):
            m, l, acc = _attend_block(q, K, V, base, n0, end, qpos, cols, m, l, acc, BLOCK_N, D, WIDE, UPCAST)
    part = (kvh * NSPLIT + split) * ROWS + rows
    tl.store(PACC + part[:, None] * D + cols[None, :], acc, mask=row_ok[:, None])
    tl.store(PML + part * 2, m, mask=row_ok)
    tl.store(PML + part * 2 + 1, l, mask=row_ok)


@triton.jit
def _merge_kernel(
    PACC,
    PML,
    OUT,
    ROWS: tl.constexpr,
    D: tl.constexpr,
    NSPLIT: tl.constexpr,
    NSPLIT_P2: tl.constexpr,
    PDL: tl.constexpr,
):
    kvh = tl.program_id(0)
    row = tl.program_id(1)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    _merge_rows(PACC, PML, OUT, kvh, row, ROWS, D, NSPLIT, NSPLIT_P2)


@triton.jit
def _inputs_kernel(
    QKV, Q, K, V, LEN, LOUT, QNW, KNW, COS, SIN, eps, scale, C,
    S: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, KVH: tl.constexpr,
    S_P2: tl.constexpr, QKNORM: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """The rotary prologue alone (mcore::rope_decode_inputs): one program a KV head writes its new keys
    and values into the caches and its query heads, scaled, into Q [1, H, S, D], for an attention
    kernel that is not this module's (a bound slot's); the first also the length it reads, LOUT."""
    kvh = tl.program_id(0)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    length = tl.load(LEN) + S
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, D)
    row_ok = rows < ROWS
    base = kvh.to(tl.int64) * C * D
    q = _rope_prologue(QKV, K, V, QNW, KNW, COS, SIN, eps, scale, kvh, length, 0, length, base, rows, row_ok, cols,
                       S, ROWS, D, KVH, S_P2, QKNORM)  # fmt: skip
    tl.store(Q + (kvh * ROWS + rows)[:, None] * D + cols[None, :], q, mask=row_ok[:, None])
    if kvh == 0:
        tl.store(LOUT, length)


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _nsplit(device_index: int, kv_heads: int) -> int:
    return max(1, triton.cdiv(NSPLIT_PER_SM * _sm_count(device_index), kv_heads))


def supported(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    d = k_cache.shape[-1]
    return (
        q.is_cuda
        and q.dtype in (torch.float16, torch.bfloat16, torch.float32)
        and k_cache.dtype == q.dtype
        and d >= 16
        and d & (d - 1) == 0
        and q.shape[0] == 1
    )


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_lengths: torch.Tensor, nsplit: int | None = None
) -> torch.Tensor:
    """q [1, H, s, D] (scaled), caches [1, KV, C, D], kv_lengths INT32[1] on the device -> [1, H, s, D].

    `nsplit` (programs per KV head) defaults to about two programs per SM; tests pass their own."""
    _, h, s, _ = q.shape
    return _launch(q.contiguous(), h, s, k_cache, v_cache, kv_lengths, nsplit, None)


def _rope_args(
    qkv: torch.Tensor,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    eps: float,
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    scale: float,
) -> tuple[int, int, tuple]:
    """(query heads H, new tokens s, the prologue's arguments: norm weights or None, eps, the tables,
    scale) for a q/k/v row and caches the prologue can take; ValueError naming what does not fit."""
    from .rope_attention import split_heads

    kvh, cap, d = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    h, s = split_heads(qkv, kvh, d)
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("rope_decode_attention: the caches are written in place and must be contiguous")
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError("rope_decode_attention: give both q/k norm weights or neither")
    for name, table in (("cos", cos_table), ("sin", sin_table)):
        if table.dim() != 2 or table.shape[0] < cap or table.shape[1] != d or table.dtype != torch.float32:
            raise ValueError(
                f"rope_decode_attention: the {name} table {tuple(table.shape)} is not FP32 [>= {cap}, {d}]"
            )
    norms = None
    if q_norm_weight is not None and k_norm_weight is not None:
        norms = (q_norm_weight.contiguous(), k_norm_weight.contiguous())
    return h, s, (norms, float(eps), cos_table.contiguous(), sin_table.contiguous(), float(scale))


def decode_attention_from_qkv(
    qkv: torch.Tensor,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    eps: float,
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_length: torch.Tensor,
    scale: float,
    nsplit: int | None = None,
) -> torch.Tensor:
    """mcore::rope_decode_attention (mcore/ops/rope_attention.py) in the split kernel's prologue: qkv
    [1, s, (H + 2 KV) D], the q/k norm weights [D] (or None), the FP32 rope tables [C, D], the count
    already cached (INT32 [1]); writes the s new keys and values into k_cache and v_cache (which must be
    contiguous) -> [1, H, s, D]."""
    h, s, rope = _rope_args(qkv, q_norm_weight, k_norm_weight, eps, cos_table, sin_table, k_cache, v_cache, scale)
    return _launch(qkv.contiguous(), h, s, k_cache, v_cache, cache_length, nsplit, rope)


def decode_inputs_from_qkv(
    qkv: torch.Tensor,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    eps: float,
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_length: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """mcore::rope_decode_inputs: the prologue of `decode_attention_from_qkv` as a kernel of its own (one
    program a KV head), for an attention that is a bound slot -> (the scaled query [1, H, s, D], the
    same bits the prologue attends with; the INT32 [1] length cache_length + s); the caches written as
    it writes them."""
    h, s, (norms, eps, cos, sin, scale) = _rope_args(
        qkv, q_norm_weight, k_norm_weight, eps, cos_table, sin_table, k_cache, v_cache, scale
    )
    kvh, cap, d = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    rows = (h // kvh) * s
    q = torch.empty((1, h, s, d), dtype=k_cache.dtype, device=qkv.device)
    lengths = torch.empty(1, dtype=torch.int32, device=qkv.device)
    pdl = launch_options(qkv.device)
    _inputs_kernel[(kvh,)](
        qkv.contiguous(),
        q,
        k_cache,
        v_cache,
        cache_length,
        lengths,
        norms[0] if norms else qkv,  # unread without the q/k norms
        norms[1] if norms else qkv,
        cos,
        sin,
        eps,
        scale,
        cap,
        S=s,
        ROWS=rows,
        D=d,
        BLOCK_M=max(16, triton.next_power_of_2(rows)),
        KVH=kvh,
        S_P2=triton.next_power_of_2(s),
        QKNORM=norms is not None,
        PDL=bool(pdl),
        num_warps=NUM_WARPS,
        **pdl,
    )
    return q, lengths


def _launch(
    q: torch.Tensor,
    h: int,
    s: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_lengths: torch.Tensor,
    nsplit: int | None,
    rope: tuple | None,
) -> torch.Tensor:
    """The split kernel, then the merge kernel. `q` is the scaled query [1, H,
    s, D] and `kv_lengths` counts the new tokens; or with `rope` (norm weights or None, eps, the cos and
    sin tables, scale) `q` is the q/k/v row it comes from and `kv_lengths` counts only the cached ones."""
    kvh, cap, d = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    rows = (h // kvh) * s
    if rope is None:
        k_cache, v_cache = k_cache.contiguous(), v_cache.contiguous()
    if nsplit is None:
        nsplit = _nsplit(q.device.index if q.device.index is not None else torch.cuda.current_device(), kvh)
    pacc = torch.empty(kvh * nsplit * rows * d, dtype=torch.float32, device=q.device)
    pml = torch.empty(kvh * nsplit * rows * 2, dtype=torch.float32, device=q.device)
    out = torch.empty((1, h, s, d), dtype=k_cache.dtype, device=q.device)
    block_m = max(16, triton.next_power_of_2(rows))
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    pdl = launch_options(q.device)
    norms, eps, cos, sin, scale = rope if rope is not None else (None, 0.0, q, q, 1.0)  # cos/sin unread without ROPE
    _split_kernel[(kvh, nsplit)](
        q,
        k_cache,
        v_cache,
        kv_lengths,
        pacc,
        pml,
        out,
        norms[0] if norms else q,  # unread without the q/k norms
        norms[1] if norms else q,
        cos,
        sin,
        eps,
        scale,
        cap,
        S=s,
        ROWS=rows,
        D=d,
        BLOCK_M=block_m,
        BLOCK_N=BLOCK_N,
        NSPLIT=nsplit,
        NSPLIT_P2=triton.next_power_of_2(nsplit),
        WIDE=k_cache.dtype == torch.float32,
        UPCAST=k_cache.dtype == torch.bfloat16 and interp,
        INTERP=interp,
        PDL=bool(pdl),
        ROPE=rope is not None,
        QKNORM=norms is not None,
        KVH=kvh,
        S_P2=triton.next_power_of_2(s),
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES if rope is None else ROPE_STAGES,
        **pdl,
    )
    _merge_kernel[(kvh, rows)](
        pacc,
        pml,
        out,
        ROWS=rows,
        D=d,
        NSPLIT=nsplit,
        NSPLIT_P2=triton.next_power_of_2(nsplit),
        PDL=bool(pdl),
        num_warps=4,
        **pdl,
    )
    return out
