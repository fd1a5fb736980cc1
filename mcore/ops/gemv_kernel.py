"""The Triton kernel behind mcore::gemv and mcore::gemv_silu_mul (mcore/ops/gemv.py imports it on first use)."""

import triton
import triton.language as tl


@triton.jit
def load_x(X, U, offs, ok, GLU: tl.constexpr):
    """x[offs] widened to fp32; with GLU, x = silu(X) * U rounded once to X's dtype (as the
    unfused step stores it for the product)."""
    x = tl.load(X + offs, mask=ok, other=0.0)
    if GLU:
        g = x.to(tl.float32)
        u = tl.load(U + offs, mask=ok, other=0.0).to(tl.float32)
        x = (g * tl.sigmoid(g) * u).to(X.dtype.element_ty)
    return x.to(tl.float32)


@triton.jit
def gemv_kernel(
    X,
    U,
    W,
    Y,
    N,
    K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
    GLU: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    cols = tl.arange(0, BLOCK_K)
    base = W + rows.to(tl.int64)[:, None] * K + cols[None, :]
    k_ok = cols < K
    # the first weight tile is read before waiting for the kernel before this one (programmatic
    # dependent launch): no kernel writes weights, so that read may overlap the previous kernel
    w = tl.load(base, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()  # x is the previous kernel's output
        tl.extra.cuda.gdc_launch_dependents()  # the next kernel waits for all of this one anyway
    x = load_x(X, U, cols, k_ok, GLU)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc += w.to(tl.float32) * x[None, :]  # widened first: fp32 products and sums
    for k0 in range(BLOCK_K, K, BLOCK_K):
        k_ok = (k0 + cols) < K
        w = tl.load(base + k0, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        x = load_x(X, U, k0 + cols, k_ok, GLU)
        acc += w.to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1)
    tl.store(Y + rows, y.to(Y.dtype.element_ty), mask=row_ok)
