"""Launch configurations of the split-KV decode attention kernel, timed as the model runs it.

    python3 bench/flash_decode_sweep.py [--contexts 1024,8192,32768] [--capacity 40960]

36 calls (one per layer of a Qwen3-8B-sized model: 32 query / 8 KV heads, head_dim 128, bf16),
each over its own cache (so nothing is served from L2), captured in one CUDA graph and replayed;
prints ms per call and the achieved bandwidth (K and V bytes of the active length / time).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mcore.ops import flash_decode as fd  # noqa: E402


def capture_graph(fn) -> torch.cuda.CUDAGraph:
    """`fn` captured in a CUDA graph after a warm-up run on a side stream, and replayed once."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def time_graph(fn, reps=20) -> float:
    g = capture_graph(fn)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="1024,8192,32768")
    ap.add_argument("--capacity", type=int, default=40960)
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--quick", action="store_true", help="a dozen configurations around the default")
    a = ap.parse_args()
    ctxs = [int(x) for x in a.contexts.split(",")]
    h, kv, d = 32, 8, 128
    caches = [
        (
            torch.randn(1, kv, a.capacity, d, device="cuda", dtype=torch.bfloat16),
            torch.randn(1, kv, a.capacity, d, device="cuda", dtype=torch.bfloat16),
        )
        for _ in range(a.layers)
    ]
    q = torch.randn(1, h, 1, d, device="cuda", dtype=torch.bfloat16) * 0.1
    lens = torch.zeros(1, dtype=torch.int32, device="cuda")
    results = []
    if a.quick:
        configs = list(itertools.product((32, 64, 128), (2, 4, 8), (4,), (3,)))
        configs += [(64, 4, 8, 3), (128, 4, 8, 3), (64, 4, 4, 4), (128, 2, 4, 2)]
    else:
        configs = list(itertools.product((32, 64, 128), (1, 2, 4, 8), (4,), (2, 3)))
        configs += list(itertools.product((64, 128), (2, 4), (8,), (2, 3)))
    for bn, split, warps, stages in configs:
        fd.BLOCK_N, fd.NSPLIT_PER_SM, fd.NUM_WARPS, fd.NUM_STAGES = bn, split, warps, stages
        try:
            row = []
            for n in ctxs:
                lens.fill_(n)
                ms = time_graph(lambda: [fd.decode_attention(q, k, v, lens) for k, v in caches]) / a.layers
                row.append((ms, 2 * n * kv * d * 2 / (ms * 1e-3) / 1e12))
        except Exception as e:  # out of shared memory and the like
            print(f"BLOCK_N={bn} split/SM={split} warps={warps} stages={stages}: {type(e).__name__}")
            continue
        results.append(((bn, split, warps, stages), row))
        print(
            f"BLOCK_N={bn:3} split/SM={split} warps={warps} stages={stages}: "
            + "  ".join(f"ctx {n}: {ms * 1e3:6.1f} us {bw:4.2f} TB/s" for n, (ms, bw) in zip(ctxs, row, strict=True)),
            flush=True,
        )
    best = min(results, key=lambda r: sum(ms for ms, _ in r[1]))
    print("best (sum over contexts):", best[0], " ".join(f"{ms * 1e3:.1f}us/{bw:.2f}TB/s" for ms, bw in best[1]))
    best_long = min(results, key=lambda r: r[1][-1][0])
    print(
        "best at the longest context:",
        best_long[0],
        " ".join(f"{ms * 1e3:.1f}us/{bw:.2f}TB/s" for ms, bw in best_long[1]),
    )


if __name__ == "__main__":
    main()
