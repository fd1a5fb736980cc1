#!/usr/bin/env python3
"""mcore::gemv against the GEMM library at the Qwen3-8B decode shapes, side by side in one run (GPU).

For each weight shape the compiled engine's decode step multiplies by (fused q/k/v, o_proj, fused
gate/up, down, lm_head), in bf16 at one row: device time per call of `F.linear` (cuBLAS, what
Inductor calls by default), of `mcore.gemv` with its default launch configuration, and of a sweep
of configurations; the achieved bandwidth (weight bytes / time) and its ratio to the measured copy
rate; every output checked against float64. Each time is the median of 5 rounds of calls enqueued
behind a GPU spin (mcore.runtime.pipeline.device_seconds), each call on its own copy of the weight where
they fit (so L2 holds none of them from the call before).

    python3 bench/gemv_gpu.py [--sweep] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcore.ops.gemv import gemv_config, gemv_triton  # noqa: E402
from mcore.runtime.pipeline import device_seconds  # noqa: E402

HIDDEN, INTER, VOCAB, HEADS, KV, HEAD_DIM, LAYERS = 4096, 12288, 151936, 32, 8, 128, 36
SHAPES = {  # name: (N, K, calls per decode step)
    "qkv (fused)": (HEADS * HEAD_DIM + 2 * KV * HEAD_DIM, HIDDEN, LAYERS),
    "o_proj": (HIDDEN, HEADS * HEAD_DIM, LAYERS),
    "gate/up (fused)": (2 * INTER, HIDDEN, LAYERS),
    "down": (HIDDEN, INTER, LAYERS),
    "lm_head": (VOCAB, HIDDEN, 1),
}
SWEEP = [(bn, bk, w, 3) for bn in (2, 4, 8, 16) for bk in (256, 512, 1024) for w in (4, 8)]


def copy_rate(dev: torch.device) -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    t = device_seconds(lambda: b.copy_(a), dev, reps=20)
    assert t is not None
    return 2 * a.numel() / t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", action="store_true", help="also time the launch configurations in SWEEP")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("gemv_gpu.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    copy = copy_rate(dev)
    print(f"{props.name}, {props.multi_processor_count} SMs; copy {copy / 1e12:.2f} TB/s; torch {torch.__version__}")
    rows = []
    step = {"cublas": 0.0, "gemv": 0.0}
    for name, (n, k, per_step) in SHAPES.items():
        g = torch.Generator(device="cuda").manual_seed(n + k)
        copies = max(1, min(8, (8 << 30) // (2 * n * k)))  # rotate weights: none in L2 from the call before
        ws = [(torch.randn(n, k, device=dev, generator=g) * 0.02).to(torch.bfloat16) for _ in range(copies)]
        x = torch.randn(1, 1, k, device=dev, generator=g).to(torch.bfloat16)
        ref = (x.double().reshape(k) @ ws[0].double().T).reshape(1, 1, n)
        floor = ((ref.to(torch.bfloat16).double() - ref).norm() / ref.norm()).item()

        def timed(fn, x=x, ws=ws, copies=copies):
            i = [0]

            def call():
                fn(x, ws[i[0] % copies])
                i[0] += 1

            t = device_seconds(call, dev, reps=200)
            assert t is not None
            return t

        def err(fn, x=x, ws=ws, ref=ref, floor=floor):
            return ((fn(x, ws[0]).double() - ref).norm() / ref.norm()).item() / floor

        byte = 2 * n * k
        cands = [("cublas", F.linear), ("gemv", gemv_triton)]
        if a.sweep:
            cands += [(f"gemv {c}", lambda x, w, c=c: gemv_triton(x, w, c)) for c in SWEEP]
        results = []
        for label, fn in cands:
            try:
                t = timed(fn)
                results.append({"kernel": label, "us": t * 1e6, "tbs": byte / t / 1e12, "err_x_floor": err(fn)})
            except Exception as e:  # a configuration the compiler refuses: say so and go on
                results.append({"kernel": label, "error": f"{type(e).__name__}: {str(e)[:120]}"})
        step["cublas"] += per_step * results[0]["us"]
        step["gemv"] += per_step * results[1]["us"]
        best = min((r for r in results if "us" in r), key=lambda r: r["us"])
        print(
            f"\n{name}: N={n} K={k} ({byte / 1e6:.1f} MB, {per_step} a step); default config {gemv_config(n, k, props.multi_processor_count)}"
        )
        for r in results[:2] + ([best] if a.sweep else []):
            if "us" in r:
                print(
                    f"  {r['kernel']:<28} {r['us']:8.1f} us  {r['tbs']:5.2f} TB/s  {r['tbs'] * 1e12 / copy:6.1%} of copy"
                    f"  error {r['err_x_floor']:.2f}x rounding"
                )
        rows.append({"name": name, "n": n, "k": k, "per_step": per_step, "results": results})
    print(
        f"\nall projections of one decode step: cuBLAS {step['cublas'] / 1e3:.3f} ms, mcore.gemv {step['gemv'] / 1e3:.3f} ms "
        f"(ratio {step['cublas'] / step['gemv']:.3f}); weights at the copy rate "
        f"{sum(2 * n * k * p for n, k, p in SHAPES.values()) / copy * 1e3:.3f} ms"
    )
    if a.json:
        Path(a.json).write_text(
            json.dumps({"device": props.name, "copy_bps": copy, "shapes": rows, "step_us": step}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
