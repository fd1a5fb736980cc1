"""The shipped TVM-FFI kernels (identity copy, residual add): build, CPU numerics, errors, CLI."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from mcore.common.errors import Cancelled, UserError
from mcore.common.progress import CancelToken, Progress
from mcore.kernels.shipped import KERNELS, build_kernel, cuda_toolkit, detect_cuda_toolkit, kernels_dir

HAVE_TOOLKIT = cuda_toolkit() is not None


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """Each shipped kernel compiled once per test run (cuda="auto": the CUDA path too where a toolkit exists)."""
    d = tmp_path_factory.mktemp("kernels")
    return {name: build_kernel(name, d / f"{name}.so") for name in ("identity-copy", "residual-add")}


@pytest.fixture(scope="session")
def fns(built):
    import tvm_ffi

    return {name: tvm_ffi.load_module(str(path))["run"] for name, path in built.items()}


def random_tensor(dtype: torch.dtype, shape, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.int32:
        return torch.randint(-(2**31), 2**31 - 1, shape, generator=g, dtype=torch.int32)
    return (torch.randn(shape, generator=g, dtype=torch.float32) * 3).to(dtype)


def poisoned_like(t: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(t)
    out.view(torch.uint8).fill_(0xFF)  # NaN for floats, -1 for ints
    return out


# ---------------------------------------------------------------- build


def test_variant_follows_the_toolkit(built):
    want = "cpu+cuda" if HAVE_TOOLKIT else "cpu"
    for name, path in built.items():
        assert isinstance(path, Path) and path.is_file()
        assert path.variant == want and path.function == "run" and path.kernel == name
        assert want in path.describe()
    assert built["residual-add"].cuda_archs == (
        tuple(os.environ.get("TVM_FFI_CUDA_ARCH_LIST", "8.0 9.0").split()) if HAVE_TOOLKIT else ()
    )
    assert [p.name for p in built["identity-copy"].parent.iterdir() if p.name.startswith(".")] == []


def test_cpu_only_build(tmp_path, fns):
    import tvm_ffi

    path = build_kernel("identity-copy", tmp_path / "id.so", cuda="off")
    assert path.variant == "cpu"
    fn = tvm_ffi.load_module(str(path))["run"]
    x = random_tensor(torch.float32, (7, 3), 0)
    y = poisoned_like(x)
    fn(x, y)
    assert torch.equal(x, y)


def test_progress_and_cancel(tmp_path):
    steps = []
    build_kernel("identity-copy", tmp_path / "a.so", cuda="off", progress=lambda s, f: steps.append((s, f)))
    fractions = [f for _, f in steps]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and "built cpu variant" in steps[-1][0]
    token = CancelToken()
    token.cancel()
    with pytest.raises(Cancelled):
        build_kernel("identity-copy", tmp_path / "b.so", cuda="off", progress=Progress(token=token))
    assert not (tmp_path / "b.so").exists()


def test_build_refuses_bad_outputs(tmp_path, built):
    existing = tmp_path / "k.so"
    existing.write_bytes(b"keep")
    with pytest.raises(UserError, match="already exists"):
        build_kernel("identity-copy", existing, cuda="off")
    assert existing.read_bytes() == b"keep"
    with pytest.raises(UserError, match="does not exist"):
        build_kernel("identity-copy", tmp_path / "missing" / "k.so", cuda="off")
    with pytest.raises(UserError, match="is a directory"):
        build_kernel("identity-copy", tmp_path, cuda="off")
    with pytest.raises(UserError, match="unknown kernel 'nope'"):
        build_kernel("nope", tmp_path / "n.so")
    with pytest.raises(UserError, match="--cuda"):
        build_kernel("identity-copy", tmp_path / "n.so", cuda="maybe")
    build_kernel("identity-copy", existing, cuda="off", overwrite=True)
    assert existing.read_bytes()[:4] == b"\x7fELF"


def test_compile_error_is_one_line_with_a_log(tmp_path, monkeypatch):
    src = tmp_path / "src"
    shutil.copytree(kernels_dir(), src)
    (src / "identity_copy.cc").write_text("this is not C++\n")
    monkeypatch.setenv("MCORE_KERNELS_DIR", str(src))
    with pytest.raises(UserError) as e:
        build_kernel("identity-copy", tmp_path / "k.so", cuda="off")
    msg = str(e.value)
    assert "building identity-copy (cpu) failed" in msg and "full log:" in msg and "\n" not in msg
    log = Path(msg.rsplit("full log: ", 1)[1])
    assert "not C++" in log.read_text() or "error" in log.read_text()
    log.unlink()
    assert not (tmp_path / "k.so").exists()


def test_cuda_on_without_a_toolkit(tmp_path, monkeypatch, mcore):
    # hide any toolkit: no CUDA_HOME/CUDA_PATH, and a PATH without nvcc
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    bare = tmp_path / "bin"
    bare.mkdir()
    ninja = shutil.which("ninja")
    if ninja:  # keep the build tool: only the toolkit is missing (on GPU boxes ninja sits beside python)
        (bare / "ninja").symlink_to(ninja)
    monkeypatch.setenv(
        "PATH", f"{bare}:/usr/bin:/bin" if shutil.which("nvcc", path="/usr/bin:/bin") is None else str(bare)
    )
    toolkit, why = detect_cuda_toolkit()
    assert toolkit is None and "nvcc" in why
    r = mcore("kernel", "build", "identity-copy", "-o", tmp_path / "k.so", "--cuda", "on")
    errors = [ln for ln in r.err.splitlines() if ln.startswith("mcore: error:")]
    assert r.code == 2 and len(errors) == 1 and "--cuda on: no usable CUDA toolkit" in errors[0]
    assert "Traceback" not in r.err
    assert not (tmp_path / "k.so").exists()


@pytest.mark.skipif(not HAVE_TOOLKIT, reason="no CUDA toolkit on this machine")
def test_toolkit_detection_finds_the_runtime():
    tk = cuda_toolkit()
    assert (tk.include_dir / "cuda_runtime.h").is_file() and (tk.lib_dir / "libcudart.so").exists()
    assert tk.nvcc.exists() and tk.version


# ---------------------------------------------------------------- identity copy (CPU path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32])
def test_identity_copy_is_bit_exact(fns, dtype):
    for seed, shape in enumerate([(1, 151936), (3, 5, 7), (1,), (0, 4)]):
        x = random_tensor(dtype, shape, seed)
        y = poisoned_like(x)
        fns["identity-copy"](x, y)
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), (dtype, shape)


def test_identity_copy_reshapes_same_numel(fns):
    x = random_tensor(torch.float16, (4, 6), 1)
    y = poisoned_like(x).reshape(24)
    fns["identity-copy"](x, y)
    assert torch.equal(x.reshape(24).view(torch.int16), y.view(torch.int16))


def test_identity_copy_rejects_mismatches(fns):
    run = fns["identity-copy"]
    x = torch.zeros(4, 6)
    with pytest.raises(ValueError, match="24 elements but output has 25"):
        run(x, torch.zeros(25))
    with pytest.raises(TypeError, match="dtype float32 differs from output dtype float16"):
        run(x, torch.zeros(4, 6, dtype=torch.float16))
    with pytest.raises(ValueError, match="contiguous"):
        run(x.t(), torch.zeros(6, 4))
    with pytest.raises(TypeError):
        run(x)  # wrong argument count: a clear error, not a crash
    assert torch.equal(x, torch.zeros(4, 6))


# ---------------------------------------------------------------- residual add (CPU path)

TOLERANCE = {torch.float32: 2**-23, torch.float16: 2**-10, torch.bfloat16: 2**-7}  # one ulp, relative


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_residual_add_matches_float64_reference(fns, dtype):
    for seed, shape in enumerate([(256, 768), (3, 5, 7), (1,), (0,)]):
        a = random_tensor(dtype, shape, 2 * seed)
        b = random_tensor(dtype, shape, 2 * seed + 1)
        out = poisoned_like(a)
        fns["residual-add"](a, b, out)
        ref = a.double() + b.double()
        err = (out.double() - ref).abs()
        assert bool((err <= ref.abs() * TOLERANCE[dtype] / 2 + 1e-30).all()), (dtype, shape, err.max())
        # and bit for bit what PyTorch computes (FP32 math, one rounding)
        assert torch.equal(out, a + b), (dtype, shape)


def test_residual_add_special_values(fns):
    a = torch.tensor([65504.0, -65504.0, 1e-7, float("inf"), 0.0, -0.0], dtype=torch.float16)
    b = torch.tensor([65504.0, -16.0, -3e-8, 1.0, -0.0, -0.0], dtype=torch.float16)
    out = poisoned_like(a)
    fns["residual-add"](a, b, out)
    assert torch.equal(out.view(torch.int16), (a + b).view(torch.int16))
    x = torch.tensor([3.0e38, -1e-40, 1.0], dtype=torch.bfloat16)
    out = poisoned_like(x)
    fns["residual-add"](x, x, out)
    assert torch.equal(out.view(torch.int16), (x + x).view(torch.int16))


def test_residual_add_rejects_mismatches(fns):
    run = fns["residual-add"]
    a = torch.zeros(4, 6, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"b has shape \[25\]"):
        run(a, torch.zeros(25, dtype=torch.float16), a.clone())
    with pytest.raises(TypeError, match="b has dtype float32 but out has float16"):
        run(a, torch.zeros(4, 6), a.clone())
    with pytest.raises(TypeError, match="supported: float16, bfloat16, float32"):
        i = torch.zeros(3, dtype=torch.int32)
        run(i, i, i.clone())
    with pytest.raises(ValueError, match="not contiguous"):
        run(a, a.clone(), torch.zeros(6, 4, dtype=torch.float16).t())
    with pytest.raises(TypeError):
        run(a, a)


# ---------------------------------------------------------------- CLI


def test_cli_list(mcore):
    r = mcore("kernel", "list")
    assert r.code == 0
    for name, spec in KERNELS.items():
        assert name in r.out and spec.abi in r.out


def test_cli_build(mcore, tmp_path):
    out = tmp_path / "kernel.so"
    r = mcore("kernel", "build", "identity-copy", "-o", out, "--cuda", "off")
    assert r.code == 0, r
    assert f"built identity-copy: {out.resolve()}" in r.out
    assert "variant: cpu" in r.out and "function: run" in r.out and "native code" in r.out
    assert "[100%]" in r.err
    r = mcore("kernel", "build", "identity-copy", "-o", out, "--cuda", "off")
    assert r.code == 2 and "already exists" in r.err and "--force" in r.err and r.err.count("\n") == 1
    r = mcore("kernel", "build", "identity-copy", "-o", tmp_path / "nowhere" / "k.so")
    assert r.code == 2 and r.err.count("\n") == 1 and "does not exist" in r.err
    assert "Traceback" not in r.err
    r = mcore("kernel", "build", "no-such-kernel", "-o", tmp_path / "x.so")
    assert r.code == 2 and "unknown kernel" in r.err and "identity-copy" in r.err
    r = mcore("kernel", "build", "identity-copy", "-o", out, "--cuda", "off", "--force")
    assert r.code == 0


def test_slow_copy_is_a_correct_copy(tmp_path):
    """The perf gate's negative control: same results as identity-copy (it is only slower)."""
    import tvm_ffi

    fn = tvm_ffi.load_module(str(build_kernel("slow-copy", tmp_path / "slow.so", cuda="off")))["run"]
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        x = random_tensor(dtype, (3, 1001), seed=5)
        out = poisoned_like(x)
        fn(x, out)
        assert torch.equal(out.view(torch.uint8), x.view(torch.uint8))


# ---------------------------------------------------------------- build phases (CPU-testable without a toolkit)


def _fake_toolkit(tmp_path: Path):
    from mcore.kernels.shipped import CudaToolkit

    return CudaToolkit(
        home=tmp_path / "cuda",
        nvcc=tmp_path / "cuda/bin/nvcc",
        include_dir=tmp_path / "inc",
        lib_dir=tmp_path / "lib",
        version="13.0",
    )


def test_compile_plan_builds_the_cuda_path_in_only_with_a_toolkit(tmp_path, monkeypatch):
    from mcore.kernels.shipped import _compile_plan

    monkeypatch.setenv("TVM_FFI_CUDA_ARCH_LIST", "9.0a 10.0")
    src = kernels_dir()
    cpu = _compile_plan(KERNELS["residual-add"], src, None)
    assert cpu.variant == "cpu" and cpu.archs == () and cpu.cuda_files == [] and cpu.ldflags == []
    assert "-DMCORE_WITH_CUDA" not in cpu.cflags and cpu.cpp_files == [str(src / "residual_add.cc")]
    gpu = _compile_plan(KERNELS["residual-add"], src, _fake_toolkit(tmp_path))
    assert gpu.variant == "cpu+cuda" and gpu.archs == ("9.0a", "10.0")
    assert gpu.cuda_files == [str(src / "residual_add.cu")] and gpu.include_paths == [str(tmp_path / "inc")]
    assert "-DMCORE_WITH_CUDA" in gpu.cflags and "-DMCORE_WITH_CUDA" in gpu.cuda_cflags
    # PTX of the first target (its "a" suffix dropped) so newer GPUs can JIT it
    assert gpu.cuda_cflags[-1] == "-gencode=arch=compute_90,code=compute_90"
    assert f"-Wl,-rpath,{tmp_path / 'lib'}" in gpu.ldflags
    # a kernel without .cu sources links the runtime but compiles no GPU targets
    copy = _compile_plan(KERNELS["slow-copy"], src, _fake_toolkit(tmp_path))
    assert copy.variant == "cpu+cuda" and copy.archs == () and copy.cuda_files == []
    assert "-DMCORE_COPY_REPEAT=512" in copy.cflags and "-DMCORE_COPY_REPEAT=512" in copy.cuda_cflags


def test_build_environ_is_restored_after_the_build(tmp_path, monkeypatch):
    from mcore.kernels.shipped import _build_environ, _compile_plan

    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("TVM_FFI_CUDA_ARCH_LIST", "9.0")
    toolkit = _fake_toolkit(tmp_path)
    plan = _compile_plan(KERNELS["residual-add"], kernels_dir(), toolkit)
    monkeypatch.setenv("TVM_FFI_CUDA_ARCH_LIST", "8.0")  # the user's own value comes back afterwards
    with pytest.raises(RuntimeError), _build_environ(plan, toolkit):
        assert os.environ["TVM_FFI_CUDA_ARCH_LIST"] == "9.0" and os.environ["CUDA_HOME"] == str(toolkit.home)
        raise RuntimeError("a failed compile")
    assert os.environ["TVM_FFI_CUDA_ARCH_LIST"] == "8.0" and "CUDA_HOME" not in os.environ
