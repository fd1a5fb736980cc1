"""Prefill's causal attention on the 8B-sized shapes, each SDPA backend side by side in one run (GPU; issue 32).

    python3 bench/prefill_attention_gpu.py [--lengths 1024,8192,32768] [--json OUT.json]

Qwen3-8B's attention (32 query heads on 8 KV heads, head_dim 128, bf16, causal) over one prompt of
n tokens: mcore::prefill_attention as it runs (SDPA, PyTorch's choice of kernel, the KV heads shared),
and each SDPA backend asked for alone, with the KV heads shared (enable_gqa) where it takes that and
with them repeated for each query head (the repeat timed with it). Per cell: milliseconds (median of 7, CUDA events), TFLOP/s over the
causal half (4 * n(n+1)/2 * heads * head_dim), the same bits twice, max |difference| against the
default's output (equal bits name the kernel PyTorch chose); a float32 reference at the shortest
length. The 36 layers' attention in a prefill is 36 times the cell: the last lines say what each
backend would save on the whole prefill.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LAYERS, HEADS, KV_HEADS, HEAD_DIM = 36, 32, 8, 128
DEFAULT = "mcore::prefill_attention (SDPA's choice)"


def _time_ms(fn, reps: int = 7) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def variants():
    """(label, callable(q, k, v, scale)) for each way prefill's attention can run; mcore's op first."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from mcore.ops.attention import prefill_attention

    def alone(backend, repeat):
        def run(q, k, v, scale):
            if repeat:
                group = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=not repeat)

        return run

    out = [(DEFAULT, prefill_attention)]
    for name, b in (
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
    ):
        out += [(f"{name}, KV shared (enable_gqa)", alone(b, False)), (f"{name}, KV repeated", alone(b, True))]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="1024,8192,32768")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("prefill_attention_gpu.py: needs a CUDA GPU", file=sys.stderr)
        sys.exit(2)
    lengths = [int(x) for x in a.lengths.split(",") if x]
    scale = HEAD_DIM**-0.5
    rows: dict[str, dict[int, dict]] = {}
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    for n in lengths:
        g = torch.Generator(device="cuda").manual_seed(n)
        q = torch.randn(1, HEADS, n, HEAD_DIM, device="cuda", generator=g).to(torch.bfloat16)
        k = torch.randn(1, KV_HEADS, n, HEAD_DIM, device="cuda", generator=g).to(torch.bfloat16)
        v = torch.randn(1, KV_HEADS, n, HEAD_DIM, device="cuda", generator=g).to(torch.bfloat16)
        flops = 4 * n * (n + 1) / 2 * HEADS * HEAD_DIM
        ref = None
        if n == min(lengths) and n <= 4096:  # float32 reference (n x n scores per head fit at short lengths)
            rep = HEADS // KV_HEADS
            kk, vv = (t.float().repeat_interleave(rep, dim=1) for t in (k, v))
            mask = torch.ones(n, n, dtype=torch.bool, device="cuda").tril()
            ref = torch.softmax((q.float() @ kk.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf")), -1) @ vv
        base = None
        for label, fn in variants():
            cell: dict = {}
            try:
                o1 = fn(q, k, v, scale)
                o2 = fn(q, k, v, scale)
                ms = _time_ms(lambda fn=fn, q=q, k=k, v=v: fn(q, k, v, scale))
                base = o1 if base is None else base
                cell = {
                    "ms": ms,
                    "tflops": flops / (ms / 1e3) / 1e12,
                    "same_bits_twice": bool(torch.equal(o1, o2)),
                    "max_abs_vs_default": (o1.float() - base.float()).abs().max().item(),
                    "same_bits_as_default": bool(torch.equal(o1, base)),
                }
                if ref is not None:
                    cell["max_abs_vs_fp32"] = (o1.float() - ref).abs().max().item()
            except Exception as e:  # noqa: BLE001 - a backend that refuses this shape is a row, not a crash
                cell = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"}
            rows.setdefault(label, {})[n] = cell
            print(f"n={n:6d} {label:44} {json.dumps(cell)}", flush=True)
        q = k = v = ref = base = None  # free this length's tensors before the next one's
        torch.cuda.empty_cache()
    head = f"{'prefill attention (one layer)':44} " + " ".join(f"{n:>26}" for n in lengths)
    print("\n" + head + "\n" + "-" * len(head))
    for label, cells in rows.items():
        out = []
        for n in lengths:
            c = cells.get(n, {})
            out.append(
                f"{'error':>26}"
                if "error" in c
                else f"{c['ms']:8.3f} ms {c['tflops']:5.0f} TF/s {'det' if c['same_bits_twice'] else 'NONDET'}"
            )
        print(f"{label:44} " + " ".join(f"{x:>26}" for x in out))
    default = rows[DEFAULT]
    for label, cells in rows.items():
        saved = [
            f"{LAYERS * (default[n]['ms'] - c['ms']):+.1f} ms at {n}"
            for n, c in cells.items()
            if "ms" in c and "ms" in default.get(n, {})
        ]
        print(f"whole prefill ({LAYERS} layers) saved by {label}: {', '.join(saved)}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
