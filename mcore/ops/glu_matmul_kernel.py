"""The Triton kernels behind mcore::matmul_glu (mcore/ops/glu_matmul.py imports them on first use)."""

import triton
import triton.language as tl


@triton.jit
def _tile(M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's output tile (row block, column block), GROUP_M row blocks walked together so that
    the programs in flight share their weight columns in L2."""
    pid = tl.program_id(0)
    blocks_m = tl.cdiv(M, BM)
    blocks_n = tl.cdiv(N, BN)
    in_group = GROUP_M * blocks_n
    first_m = (pid // in_group) * GROUP_M
    size_m = min(blocks_m - first_m, GROUP_M)
    return first_m + (pid % in_group) % size_m, (pid % in_group) // size_m


@triton.jit
def _gate(acc_g, acc_u, dtype: tl.constexpr):
    # g and u rounded to the output's dtype as the unfused step stores them, the gating in fp32, one rounding
    g = acc_g.to(dtype).to(tl.float32)
    u = acc_u.to(dtype).to(tl.float32)
    return (g * tl.sigmoid(g) * u).to(dtype)


@triton.jit
def glu_matmul_kernel(
    X,
    W,
    Y,
    M,
    N,
    K: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """Y[m, n] = silu(X[m] . W[n]) * (X[m] . W[N + n]) for a BM x BN tile a program: W holds the gate's
    N rows, then the up projection's; a program reads each X tile once for both products and keeps
    both accumulators, so the [M, 2N] product is never written. K is a multiple of BK."""
    pid_m, pid_n = _tile(M, N, BM, BN, GROUP_M)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    row_ok = rows < M
    col_ok = cols < N
    xp = X + rows.to(tl.int64)[:, None] * K + ks[None, :]
    gp = W + cols.to(tl.int64)[None, :] * K + ks[:, None]  # [BK, BN]: the gate rows, k down the tile
    up = gp + N * K
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K // BK):
        a = tl.load(xp, mask=row_ok[:, None], other=0.0)
        acc_g = tl.dot(a, tl.load(gp, mask=col_ok[None, :], other=0.0), acc_g)
        acc_u = tl.dot(a, tl.load(up, mask=col_ok[None, :], other=0.0), acc_u)
        xp += BK
        gp += BK
        up += BK
    y = _gate(acc_g, acc_u, Y.dtype.element_ty)
    tl.store(Y + rows.to(tl.int64)[:, None] * N + cols[None, :], y, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def glu_matmul_tma_kernel(
    x_desc,
    w_desc,
    y_desc,
    M,
    N,
    K: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
    DTYPE: tl.constexpr,
):
    """glu_matmul_kernel with the tiles moved by the tensor memory accelerator (Hopper): bulk loads
    into shared memory, out-of-bounds rows filled with zeros and never stored."""
    pid_m, pid_n = _tile(M, N, BM, BN, GROUP_M)
    m0 = pid_m * BM
    n0 = pid_n * BN
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = x_desc.load([m0, k0])
        acc_g = tl.dot(a, w_desc.load([n0, k0]).T, acc_g)
        acc_u = tl.dot(a, w_desc.load([N + n0, k0]).T, acc_u)
    y_desc.store([m0, n0], _gate(acc_g, acc_u, DTYPE))
