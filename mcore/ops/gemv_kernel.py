"""The Triton kernel behind mcore::gemv, mcore::gemv_glu, mcore::gemv_add and mcore::rms_gemv
(mcore/ops/gemv.py imports it on first use)."""

import triton
import triton.language as tl


@triton.jit
def gemv_kernel(
    X,
    W,
    Y,
    NW,
    R,
    N,
    eps,
    K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
    GLU: tl.constexpr,
    NORM: tl.constexpr,
    RESIDUAL: tl.constexpr,
):
    """Y[n] = sum_k X[k] * W[n, k] for BLOCK_N rows a program.

    GLU: W holds 2N rows (the gate's, then the up projection's) and Y[n] = silu(g_n) * u_n: a
    program takes gate row n and up row n together (interleaved in its tile), so the gating costs no
    read and no launch of its own.
    NORM: X is RMS-normalised first, X * NW / sqrt(mean(X^2) + eps), in the same pass: every program
    reads all of X anyway, so it sums X^2 beside the products and scales its sums once at the end.
    RESIDUAL: Y[n] = R[n] + the product rounded to Y's dtype, the residual add as the unfused step
    computes it (same bits)."""
    pid = tl.program_id(0)
    if GLU:
        r = tl.arange(0, 2 * BLOCK_N)
        out_rows = pid * BLOCK_N + r // 2
        rows = out_rows + (r % 2) * N  # even tile rows: gate row n; odd: up row n
    else:
        out_rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        rows = out_rows
    row_ok = out_rows < N
    cols = tl.arange(0, BLOCK_K)
    base = W + rows.to(tl.int64)[:, None] * K + cols[None, :]
    k_ok = cols < K
    # the first weight tile is read before waiting for the kernel before this one (programmatic
    # dependent launch): no kernel writes weights, so that read may overlap the previous kernel
    w = tl.load(base, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()  # x is the previous kernel's output
        tl.extra.cuda.gdc_launch_dependents()  # the next kernel waits for all of this one anyway
    x = tl.load(X + cols, mask=k_ok, other=0.0).to(tl.float32)
    ss = x * x
    if NORM:
        x = x * tl.load(NW + cols, mask=k_ok, other=0.0).to(tl.float32)
    acc = w.to(tl.float32) * x[None, :]  # widened first: fp32 products and sums
    for k0 in range(BLOCK_K, K, BLOCK_K):
        k_ok = (k0 + cols) < K
        w = tl.load(base + k0, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(X + k0 + cols, mask=k_ok, other=0.0).to(tl.float32)
        if NORM:
            ss += x * x
            x = x * tl.load(NW + k0 + cols, mask=k_ok, other=0.0).to(tl.float32)
        acc += w.to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1)
    if NORM:
        y = y * tl.rsqrt(tl.sum(ss, axis=0) / K + eps)
    if GLU:
        # g and u rounded to Y's dtype as the unfused step stores them, the gating in fp32, one rounding
        g, u = tl.split(tl.reshape(y.to(Y.dtype.element_ty).to(tl.float32), [BLOCK_N, 2]))
        y = g * tl.sigmoid(g) * u
        out_rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    if RESIDUAL:
        y = y.to(Y.dtype.element_ty).to(tl.float32) + tl.load(R + out_rows, mask=out_rows < N).to(tl.float32)
    tl.store(Y + out_rows, y.to(Y.dtype.element_ty), mask=out_rows < N)
