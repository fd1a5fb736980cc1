"""The split-KV decode attention kernel (mcore/ops/flash_decode.py) against the float64 reference.

On CPU the Triton kernels run under Triton's interpreter (in a subprocess, since the interpreter
is chosen when triton is imported): same indexing, masks, split schedule and merge as on the GPU.
The GPU tests run the compiled kernels on the device (pytest -m gpu)."""

from __future__ import annotations

import pytest
import torch

from .conftest import run_under_triton_interpreter

# (heads, kv heads, head_dim, capacity, length, new tokens, dtype, splits per kv head)
CASES = [
    (8, 8, 64, 64, 1, 1, "float32", 3),  # length 1
    (8, 2, 64, 300, 2, 2, "float32", 5),  # GQA 4, all cache positions are new tokens
    (8, 1, 64, 300, 129, 1, "bfloat16", 5),  # GQA 8, one past a block, some splits empty
    (4, 4, 128, 200, 199, 3, "float16", 4),  # capacity - 1, several new tokens (causal among them)
    (16, 2, 64, 130, 130, 1, "float32", 7),  # length == capacity
    (8, 2, 128, 512, 128, 1, "bfloat16", 64),  # more splits than blocks of work
]

_INTERP = r"""
import json, sys, torch
from mcore.ops import flash_decode as fd
from mcore.ops.attention import decode_attention_reference
out = []
for h, kv, d, cap, n, s, dt, ns in json.loads(sys.argv[1]):
    g = torch.Generator().manual_seed(h * 1000 + n)
    dtype = getattr(torch, dt)
    q = torch.randn(1, h, s, d, generator=g).to(dtype)
    k = torch.randn(1, kv, cap, d, generator=g).to(dtype)
    v = torch.randn(1, kv, cap, d, generator=g).to(dtype)
    lens = torch.tensor([n], dtype=torch.int32)
    a = fd.decode_attention(q, k, v, lens, nsplit=ns)
    b = fd.decode_attention(q, k, v, lens, nsplit=ns)
    ref = decode_attention_reference(q, k, v, lens)
    rel = ((a.double() - ref).norm() / ref.norm()).item()
    # the error of rounding the exact result to the output dtype: the best any kernel can do
    floor = ((ref.to(dtype).double() - ref).norm() / ref.norm()).item()
    out.append({"rel": rel, "floor": floor, "same": bool(torch.equal(a, b)), "finite": bool(torch.isfinite(a).all())})
print(json.dumps(out))
"""


def test_kernels_match_the_float64_reference_under_the_triton_interpreter():
    """The same bits run to run, close to float64."""
    for case, res in zip(CASES, run_under_triton_interpreter(_INTERP, CASES), strict=True):
        dtype = case[6]
        assert res["finite"] and res["same"], (case, res)
        # fp32: fp32 rounding only; 16-bit: one rounding of the output dominates
        assert res["rel"] < (1e-5 if dtype == "float32" else 8e-3), (case, res)
        # the interpreter casts fp32 to bf16 by truncation (round-to-nearest on the GPU): up to twice the floor
        slack = 2.5 if dtype == "bfloat16" else 1.5
        assert res["rel"] < slack * res["floor"] + 1e-6, (case, res)


# ------------------------------------------------------------------------------------------- GPU

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _inputs(h, kv, d, cap, s, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(1, h, s, d, device="cuda", dtype=torch.float32, generator=g).to(dtype) * 0.3
    k = torch.randn(1, kv, cap, d, device="cuda", dtype=torch.float32, generator=g).to(dtype)
    v = torch.randn(1, kv, cap, d, device="cuda", dtype=torch.float32, generator=g).to(dtype)
    return q, k, v


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gqa", [1, 4, 8])
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_matches_reference_over_lengths(dtype, gqa, d):
    from mcore.ops import flash_decode as fd
    from mcore.ops.attention import decode_attention_reference

    cap, kv = 1024, 2
    q1, k, v = _inputs(kv * gqa, kv, d, cap, 3, dtype, seed=gqa * d)
    for s in (1, 3):
        q = q1[:, :, :s].contiguous()
        for n in (s, 2, 127, 128, 129, cap - 1, cap):
            if n < s:
                continue
            lens = torch.tensor([n], dtype=torch.int32, device="cuda")
            out = torch.full_like(q, float("nan"))
            out.copy_(fd.decode_attention(q, k, v, lens))
            ref = decode_attention_reference(q.cpu(), k.cpu(), v.cpu(), lens.cpu())
            got = out.double().cpu()
            assert torch.isfinite(got).all(), (s, n)
            rel = ((got - ref).norm() / ref.norm()).item()
            assert rel < 8e-3, (dtype, gqa, d, s, n, rel)
            # two roundings to the dtype (the probabilities for the product with V, then the output):
            # within a few times what rounding the exact result alone costs
            floor = ((ref.to(dtype).double() - ref).norm() / ref.norm()).item()
            assert rel < 2.5 * floor + 1e-5, (dtype, gqa, d, s, n, rel, floor)


@gpu
@needs_cuda
def test_gpu_deterministic_and_safe_in_a_cuda_graph():
    from mcore.ops import flash_decode as fd
    from mcore.ops.attention import decode_attention_reference

    q, k, v = _inputs(32, 8, 128, 8192, 1, torch.bfloat16, seed=7)
    lens = torch.tensor([5000], dtype=torch.int32, device="cuda")
    first = fd.decode_attention(q, k, v, lens)
    for _ in range(5):
        assert torch.equal(fd.decode_attention(q, k, v, lens), first)
    # capture once, then change the length on the device: the replay follows it (no host read)
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fd.decode_attention(q, k, v, lens)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(g):
        out = fd.decode_attention(q, k, v, lens)
    for n in (1, 77, 5000, 8192):
        lens.fill_(n)
        g.replay()
        torch.cuda.synchronize()
        ref = decode_attention_reference(q.cpu(), k.cpu(), v.cpu(), lens.cpu())
        rel = ((out.double().cpu() - ref).norm() / ref.norm()).item()
        assert rel < 8e-3, (n, rel)
        assert torch.equal(out, fd.decode_attention(q, k, v, lens)), n


@gpu
@pytest.mark.timing
@needs_cuda
def test_gpu_decode_attention_op_uses_the_split_kernel_and_follows_length():
    """The custom op's CUDA path is the split-KV kernel: equal results, and the cost follows the length."""
    from mcore.ops import flash_decode as fd

    q, k, v = _inputs(32, 8, 128, 32768, 1, torch.bfloat16, seed=3)
    lens = torch.tensor([1024], dtype=torch.int32, device="cuda")
    assert torch.equal(torch.ops.mcore.decode_attention(q, k, v, lens), fd.decode_attention(q, k, v, lens))

    # time 20 calls inside one CUDA graph (as the engine runs them), the length changed on the device
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.ops.mcore.decode_attention(q, k, v, lens)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(20):
            torch.ops.mcore.decode_attention(q, k, v, lens)

    def timed(n):
        lens.fill_(n)
        g.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 20

    assert timed(32768) > 4 * timed(1024)  # 32x the bytes; fixed launch costs keep the ratio below 32
