"""The prefill's gate/up product with its gating (mcore::matmul_glu) beside what the compiled engine
runs without it: the library GEMM writing [M, 2I] and Inductor's gating kernel reading it back.

    python3 bench/prefill_glu_gpu.py [--rows 1024,8192,32768] [--hidden 4096] [--intermediate 12288]

Qwen3-8B's MLP shape by default, bf16, one process. Each row: the median of 20 timed calls (CUDA
events, after 3 warm-ups), TFLOP/s of the product (2 x M x K x 2I), and each Triton schedule's
largest difference from the baseline (in units of the baseline's largest value) and whether two
calls give the same bits. Schedules: `mcore.ops.glu_matmul` configs (BM, BN, BK, GROUP_M, warps,
stages), with pointer loads and, where Triton has them, TMA tensor descriptors.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CONFIGS = [
    (128, 128, 64, 8, 8, 3),
    (128, 128, 64, 8, 8, 4),
    (128, 64, 64, 8, 4, 4),
    (128, 64, 64, 8, 8, 4),
    (64, 128, 64, 8, 4, 4),
    (128, 128, 32, 8, 8, 5),
    (256, 64, 64, 8, 8, 3),
]


def _time(fn, reps: int = 20) -> float:
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main() -> None:
    import torch
    import torch.nn.functional as F

    from mcore.ops.glu_matmul import _tma, glu_matmul_triton

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1024,8192,32768")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--intermediate", type=int, default=12288)
    a = ap.parse_args()
    k, n = a.hidden, a.intermediate
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; TMA descriptors: {_tma()}", flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(2 * n, k, device="cuda", generator=g) * k**-0.5).bfloat16()

    @torch.compile(dynamic=False)
    def unfused(x, w):  # what the compiled prefill runs: the library GEMM, then Inductor's gating kernel
        gate, up = F.linear(x, w).chunk(2, dim=-1)
        return F.silu(gate) * up

    for m in [int(r) for r in a.rows.split(",")]:
        x = torch.randn(1, m, k, device="cuda", generator=g).bfloat16()
        flops = 2 * m * k * 2 * n
        base = unfused(x, w)
        scale = base.float().abs().max().item()
        t_mm = _time(lambda x=x: F.linear(x, w))
        t_base = _time(lambda x=x: unfused(x, w))
        print(f"M={m}: library GEMM alone {t_mm:.3f} ms ({flops / t_mm / 1e9:.0f} TF/s)", flush=True)
        for lib in ("cublaslt", "cublas"):  # which of torch's BLAS back ends picks the faster kernel here
            try:
                torch.backends.cuda.preferred_blas_library(lib)
                t_lib = _time(lambda x=x: F.linear(x, w))
                print(f"M={m}: library GEMM alone, {lib} preferred {t_lib:.3f} ms ({flops / t_lib / 1e9:.0f} TF/s)")
            except Exception as e:  # noqa: BLE001  (a torch without the switch)
                print(f"M={m}: {lib}: {type(e).__name__}: {e}")
        torch.backends.cuda.preferred_blas_library("cublas")  # torch's default on CUDA
        print(f"M={m}: GEMM + gating (compiled, unfused) {t_base:.3f} ms ({flops / t_base / 1e9:.0f} TF/s)", flush=True)
        for tma in [False, True] if _tma() else [False]:
            for cfg in CONFIGS:
                try:
                    y = glu_matmul_triton(x, w, cfg, tma=tma)
                    same = torch.equal(y, glu_matmul_triton(x, w, cfg, tma=tma))
                    diff = (y.float() - base.float()).abs().max().item() / scale
                    t = _time(lambda x=x, cfg=cfg, tma=tma: glu_matmul_triton(x, w, cfg, tma=tma))
                except Exception as e:  # a schedule this Triton or card cannot run: say so, go on
                    print(f"M={m}: {'tma' if tma else 'ptr'} {cfg}: failed ({type(e).__name__}: {str(e)[:160]})")
                    continue
                print(
                    f"M={m}: {'tma' if tma else 'ptr'} {cfg}: {t:.3f} ms ({flops / t / 1e9:.0f} TF/s, "
                    f"{t_base / t:.3f}x the unfused) diff {diff:.2e} same bits twice {same}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
