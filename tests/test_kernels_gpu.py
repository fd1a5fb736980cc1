"""GPU tests of the shipped kernels and the generated CuTe DSL exporter (run on the device: pytest -m gpu)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from .conftest import needs_cute

pytestmark = pytest.mark.gpu

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def gpu_fns(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import tvm_ffi

    from mcore.kernels.shipped import build_kernel

    d = tmp_path_factory.mktemp("gpu-kernels")
    fns = {}
    for name in ("identity-copy", "residual-add"):
        built = build_kernel(name, d / f"{name}.so", cuda="on")
        assert built.variant == "cpu+cuda"
        fns[name] = tvm_ffi.load_module(str(built))["run"]
    return fns


def _sleep(seconds: float = 0.5) -> None:
    """Keep the current stream busy for a while."""
    torch.cuda._sleep(int(seconds * 2e9))


def check_runs_on_the_current_stream(call, produce, check) -> None:
    """`call()` must run on torch's current stream: ordered after work queued there before it, and not on the
    default stream. A kernel's first call may load its module (CUDA lazy loading synchronizes the context), so
    the caller warms it up first."""
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        _sleep()
        produce()  # queued behind the sleep on `side`
        call()  # must wait for produce()
    side.synchronize()
    check()
    # not on the default stream: with the default stream busy, work on `side` still finishes
    _sleep(1.0)  # on the default stream
    with torch.cuda.stream(side):
        call()
    side.synchronize()
    busy = not torch.cuda.default_stream().query()
    torch.cuda.synchronize()
    assert busy, "the call waited for the default stream"


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32])
def test_identity_copy_on_the_current_stream(gpu_fns, dtype):
    run = gpu_fns["identity-copy"]
    shape = (4, 151936)
    src = (
        (torch.randn(shape, device="cuda") * 3).to(dtype)
        if dtype != torch.int32
        else torch.randint(-(2**31), 2**31 - 1, shape, device="cuda", dtype=torch.int32)
    )
    x = torch.zeros_like(src)
    y = torch.empty_like(x)
    run(x, y)  # warm-up
    y.view(torch.uint8).fill_(0xFF)
    check_runs_on_the_current_stream(
        lambda: run(x, y),
        lambda: x.copy_(src),
        lambda: (
            torch.equal(src.view(torch.uint8), y.view(torch.uint8))
            or pytest.fail("the copy did not see the data produced before it on its stream")
        ),
    )


@needs_cuda
def test_identity_copy_in_a_cuda_graph(gpu_fns):
    run = gpu_fns["identity-copy"]
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    y = torch.zeros_like(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run(x, y)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run(x, y)
    x.copy_(torch.randn_like(x))
    y.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(x, y)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_residual_add_on_gpu(gpu_fns, dtype):
    run = gpu_fns["residual-add"]
    x = torch.zeros(8, device="cuda", dtype=dtype)
    run(x, x, x.clone())  # warm-up
    src = torch.randn(256, 768, device="cuda").to(dtype)
    a, b, out = torch.zeros_like(src), torch.ones_like(src), torch.empty_like(src)
    check_runs_on_the_current_stream(
        lambda: run(a, b, out),
        lambda: a.copy_(src),
        lambda: torch.equal(out, src + b) or pytest.fail("wrong sum or order"),
    )
    for shape in [(256, 768), (3, 5, 7), (1,), (1000003,)]:
        a = (torch.randn(shape, device="cuda") * 3).to(dtype)
        b = torch.randn(shape, device="cuda").to(dtype)
        out = torch.full_like(a, float("nan"))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            run(a, b, out)
        side.synchronize()
        assert torch.equal(out, a + b), (dtype, shape)
        ref = a.double() + b.double()
        tol = {torch.float32: 2**-24, torch.float16: 2**-11, torch.bfloat16: 2**-8}[dtype]
        assert bool(((out.double() - ref).abs() <= ref.abs() * tol + 1e-30).all())
    # unaligned views take the scalar path
    base = torch.randn(1 + 4099, device="cuda").to(dtype)
    a, b = base[1:], torch.randn(4099, device="cuda").to(dtype)
    out = torch.empty(1 + 4099, device="cuda", dtype=dtype)[1:]
    run(a, b, out)
    torch.cuda.synchronize()
    assert torch.equal(out, a + b)


@needs_cuda
def test_residual_add_errors_on_gpu(gpu_fns):
    run = gpu_fns["residual-add"]
    a = torch.zeros(8, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="one device"):
        run(a, a.cpu(), a.clone())


# ---------------------------------------------------------------- the generated CuTe DSL exporter on the GPU


def _export(script, rp, sp, out):
    r = subprocess.run(
        [sys.executable, str(script), "--snapshot", str(sp), "--selection", str(rp), "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"dso={out.resolve()}" in r.stdout
    import tvm_ffi

    return tvm_ffi.load_module(str(out))["run"]


@needs_cuda
@needs_cute
def test_generated_cutedsl_residual_add_runs(tmp_path):
    from mcore.kernels.stubgen import write_exporter
    from tests.test_stubgen import receipts, write_pair

    snap, receipt = receipts()["tutorial"]
    rp, sp = write_pair(tmp_path, snap, receipt)
    res = write_exporter(rp, sp, tmp_path / "my_residual_add.py")
    run = _export(res.path, rp, sp, tmp_path / "residual-add-cutedsl.so")
    src = torch.randn(256, 768, device="cuda", dtype=torch.float16)
    a = torch.zeros_like(src)
    b = torch.randn(256, 768, device="cuda", dtype=torch.float16)
    out = torch.full_like(a, float("nan"))
    run(a, b, out)  # warm-up
    check_runs_on_the_current_stream(
        lambda: run(a, b, out),
        lambda: a.copy_(src),
        lambda: torch.equal(out, src + b) or pytest.fail("wrong sum or order"),
    )
    # the CuTe DSL's TVM-FFI wrapper picks the error type of its shape check; any error is the point here
    with pytest.raises(Exception):  # noqa: B017
        run(a, b, torch.empty(128, 768, device="cuda", dtype=torch.float16))  # the wrapper checks shapes


@needs_cuda
@needs_cute
def test_generated_cutedsl_dynamic_and_cast_run(tmp_path):
    from mcore.kernels.stubgen import write_exporter
    from tests.test_stubgen import receipts, write_pair

    cases = receipts()
    snap, receipt = cases["dynamic_sub"]  # FP16 [-1, 8, 64] - [-1, 8, 64]
    rp, sp = write_pair(tmp_path, snap, receipt, "sub")
    run = _export(write_exporter(rp, sp, tmp_path / "sub.py").path, rp, sp, tmp_path / "sub.so")
    for rows in (1, 5, 1000):
        a = torch.randn(rows, 8, 64, device="cuda", dtype=torch.float16)
        b = torch.randn(rows, 8, 64, device="cuda", dtype=torch.float16)
        out = torch.empty_like(a)
        run(a, b, out)
        torch.cuda.synchronize()
        assert torch.equal(out, a - b), rows
    snap, receipt = cases["cast"]  # FP32 [3, 5, 7] -> BF16
    rp, sp = write_pair(tmp_path, snap, receipt, "cast")
    run = _export(write_exporter(rp, sp, tmp_path / "cast.py").path, rp, sp, tmp_path / "cast.so")
    x = torch.randn(3, 5, 7, device="cuda") * 1e3
    y = torch.empty(3, 5, 7, device="cuda", dtype=torch.bfloat16)
    run(x, y)
    torch.cuda.synchronize()
    assert torch.equal(y, x.to(torch.bfloat16))
