"""The kernels shipped in kernels/ and the one function that builds them into TVM-FFI DSOs.

`build_kernel()` serves both the CLI (`mcore kernel build`) and the TUI: it compiles
with `tvm_ffi.cpp.build` in a temporary folder, then puts the DSO at `output`
atomically (never half-written, never over an existing file unless asked).

CUDA: "auto" builds the CUDA path in when a CUDA toolkit is found (nvcc, cuda_runtime.h
and libcudart); a GPU is not needed to build. "on" requires the toolkit, "off" builds the
CPU-only variant (a CUDA tensor then gets a clear error from the kernel).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..common.errors import UserError
from ..common.fileio import check_overwrite, install_file
from ..common.progress import Progress

KERNEL_FUNCTION = "run"
CUDA_MODES = ("auto", "on", "off")
# Default GPU targets when TVM_FFI_CUDA_ARCH_LIST is not set: SASS for these, plus PTX of
# the first one so newer GPUs can JIT it. Override with TVM_FFI_CUDA_ARCH_LIST="9.0" etc.
DEFAULT_CUDA_ARCHS = ("8.0", "9.0")


@dataclass(frozen=True)
class KernelSpec:
    name: str
    cpp_sources: tuple[str, ...]  # relative to the kernels folder
    cuda_sources: tuple[str, ...]  # compiled only for the CUDA variant
    description: str
    abi: str  # the exported call, in ABI order
    dtypes: tuple[str, ...]
    function: str = KERNEL_FUNCTION
    defines: tuple[str, ...] = ()  # -D flags for every source

    @property
    def sources(self) -> tuple[str, ...]:
        return self.cpp_sources + self.cuda_sources


KERNELS: dict[str, KernelSpec] = {
    "identity-copy": KernelSpec(
        name="identity-copy",
        cpp_sources=("identity_copy.cc",),
        cuda_sources=(),
        description="copies input to output byte for byte (the tutorial's logits + zero-bias region)",
        abi="run(input, output): same dtype and element count, contiguous; "
        "CUDA: cudaMemcpyAsync on the TVM-FFI env stream",
        dtypes=("any",),
    ),
    "slow-copy": KernelSpec(
        name="slow-copy",
        cpp_sources=("identity_copy.cc",),
        cuda_sources=(),
        description="identity-copy that repeats its copy 512 times (65536 on CPU, where one copy of a small "
        "row takes nanoseconds): correct but slow, for checking that the perf gate rejects a regression",
        abi="run(input, output): as identity-copy",
        dtypes=("any",),
        defines=("MCORE_COPY_REPEAT=512", "MCORE_COPY_REPEAT_CPU=65536"),
    ),
    "residual-add": KernelSpec(
        name="residual-add",
        cpp_sources=("residual_add.cc",),
        cuda_sources=("residual_add.cu",),
        description="out = a + b elementwise (the tutorial's DistilBERT residual-add region)",
        abi="run(a, b, out): one dtype (FP16/BF16/FP32), equal element counts, contiguous; "
        "CUDA: kernel on the TVM-FFI env stream",
        dtypes=("FP16", "BF16", "FP32"),
    ),
}


def kernels_dir() -> Path:
    """The folder holding the kernel sources: $MCORE_KERNELS_DIR, else kernels/ beside the mcore package."""
    env = os.environ.get("MCORE_KERNELS_DIR")
    d = Path(env) if env else Path(__file__).resolve().parent.parent.parent / "kernels"
    if not d.is_dir():
        raise UserError(
            f"kernel sources folder {d} not found; run from a checkout of the repository "
            "or set MCORE_KERNELS_DIR to its kernels/ folder"
        )
    return d


def get_kernel(name: str) -> KernelSpec:
    try:
        return KERNELS[name]
    except KeyError:
        raise UserError(
            f"unknown kernel {name!r}; known kernels: {', '.join(sorted(KERNELS))} (see `mcore kernel list`)"
        ) from None


# ---------------------------------------------------------------- CUDA toolkit detection


@dataclass(frozen=True)
class CudaToolkit:
    home: Path  # the toolkit root (CUDA_HOME)
    nvcc: Path
    include_dir: Path  # holds cuda_runtime.h
    lib_dir: Path  # holds libcudart.so
    version: str  # "13.0", or "" when nvcc did not say

    def describe(self) -> str:
        return f"CUDA {self.version or '?'} at {self.home}"


def _nvcc_top(nvcc: str) -> Path | None:
    """The toolkit root as nvcc itself sees it (works through wrapper scripts)."""
    try:
        r = subprocess.run(
            [nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"^#\$ TOP=(.+)$", r.stdout + r.stderr, re.M)
    return Path(os.path.normpath(m.group(1).strip())) if m else None


def _nvcc_version(nvcc: Path) -> str:
    try:
        r = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    m = re.search(r"release (\d+\.\d+)", r.stdout)
    return m.group(1) if m else ""


def _first_dir(home: Path, subdirs: tuple[str, ...], probe: str) -> Path | None:
    for sub in subdirs:
        d = home / sub
        if (d / probe).exists():
            return d
    return None


def detect_cuda_toolkit() -> tuple[CudaToolkit | None, str]:
    """(toolkit, "") when a usable CUDA toolkit is found, else (None, why not)."""
    env_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if env_home:
        home = Path(env_home)
        nvcc = home / "bin" / "nvcc"
        if not nvcc.exists():
            return None, f"CUDA_HOME={env_home} has no bin/nvcc"
    else:
        found = shutil.which("nvcc")
        if not found:
            return None, "nvcc is not on PATH and CUDA_HOME is not set"
        home = _nvcc_top(found) or Path(found).resolve().parent.parent
        nvcc = home / "bin" / "nvcc"
        if not nvcc.exists():
            nvcc = Path(found)
    include = _first_dir(
        home, ("include", "targets/x86_64-linux/include", "targets/sbsa-linux/include"), "cuda_runtime.h"
    )
    if include is None:
        return None, f"cuda_runtime.h not found under {home}"
    lib = _first_dir(home, ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"), "libcudart.so")
    if lib is None:
        return None, f"libcudart.so not found under {home}"
    return CudaToolkit(home=home, nvcc=nvcc, include_dir=include, lib_dir=lib, version=_nvcc_version(nvcc)), ""


def cuda_toolkit() -> CudaToolkit | None:
    """The CUDA toolkit that `build_kernel(cuda="auto")` would use, or None."""
    return detect_cuda_toolkit()[0]


def cuda_arch_list() -> list[str]:
    """GPU targets for a CUDA build: $TVM_FFI_CUDA_ARCH_LIST ("8.0 9.0") or DEFAULT_CUDA_ARCHS."""
    env = os.environ.get("TVM_FFI_CUDA_ARCH_LIST", "").split()
    archs = env or list(DEFAULT_CUDA_ARCHS)
    for a in archs:
        if not re.fullmatch(r"\d+\.\d+a?", a):
            raise UserError(f"TVM_FFI_CUDA_ARCH_LIST entry {a!r} is not an architecture like 9.0 or 9.0a")
    return archs


# ---------------------------------------------------------------- the build


class BuiltKernel(type(Path())):  # type: ignore[misc]
    """The path of a built DSO, plus what was built (`variant` is "cpu" or "cpu+cuda")."""

    kernel: str
    variant: str
    function: str
    cuda: CudaToolkit | None
    cuda_archs: tuple[str, ...]

    def describe(self) -> str:
        if self.variant == "cpu":
            return "cpu (CPU path only; CUDA tensors are refused)"
        toolkit = self.cuda.describe() if self.cuda else "CUDA"
        if not self.cuda_archs:
            return f"cpu+cuda (CPU path and CUDA path through the CUDA runtime; {toolkit})"
        archs = ", ".join(f"sm_{a.replace('.', '')}" for a in self.cuda_archs)
        return f"cpu+cuda (CPU path and CUDA kernels for {archs} + PTX; {toolkit})"


_BUILD_LOCK = threading.Lock()  # build_kernel adjusts os.environ for tvm_ffi while it builds

ProgressArg = Progress | Callable[[str, float], None] | None


def _as_progress(progress: ProgressArg) -> Progress:
    if progress is None:
        return Progress()
    if isinstance(progress, Progress):
        return progress
    return Progress(callback=progress)


def _check_output(output: str | os.PathLike, overwrite: bool) -> Path:
    """The one output rule (check_overwrite: on the text as given, whose trailing '/' Path() drops),
    with a DSO's name suggested for an existing folder named without one."""
    path = Path(output)
    if path.is_dir() and not os.fspath(output).endswith(os.sep):
        raise UserError(f"{path}: is a directory; give a file path for the DSO, e.g. {path / 'kernel.so'}")
    return check_overwrite(output, overwrite)


@dataclass(frozen=True)
class _CompilePlan:
    """What `tvm_ffi.cpp.build` is given for one variant: sources, flags, GPU targets."""

    variant: str  # "cpu" or "cpu+cuda"
    archs: tuple[str, ...]  # GPU targets; empty for the CPU variant or a kernel without .cu sources
    cpp_files: list[str]
    cuda_files: list[str]
    cflags: list[str]
    cuda_cflags: list[str]
    ldflags: list[str]
    include_paths: list[str]


def _check_build_request(spec: KernelSpec, cuda: str, output: str | os.PathLike, overwrite: bool) -> Path:
    """Refuse a bad request before anything compiles; returns the kernel sources folder."""
    if cuda not in CUDA_MODES:
        raise UserError(f"--cuda {cuda!r} is not one of {', '.join(CUDA_MODES)}")
    _check_output(output, overwrite)
    src_dir = kernels_dir()
    for s in spec.sources:
        if not (src_dir / s).is_file():
            raise UserError(f"kernel source {src_dir / s} is missing; restore it from the repository")
    if shutil.which("ninja") is None:
        raise UserError("ninja is not on PATH (tvm_ffi.cpp.build needs it); install it with `pip install ninja`")
    return src_dir


def _pick_toolkit(cuda: str) -> CudaToolkit | None:
    """The toolkit the build uses: none for "off", the detected one (or none) for "auto", required for "on"."""
    if cuda == "off":
        return None
    toolkit, why = detect_cuda_toolkit()
    if toolkit is None and cuda == "on":
        raise UserError(
            f"--cuda on: no usable CUDA toolkit ({why}); install the CUDA toolkit or set CUDA_HOME, "
            "or build the CPU variant with --cuda off"
        )
    return toolkit


def _compile_plan(spec: KernelSpec, src_dir: Path, toolkit: CudaToolkit | None) -> _CompilePlan:
    """Flags and sources: the CUDA path is built in (-DMCORE_WITH_CUDA) whenever a toolkit is used."""
    archs = tuple(cuda_arch_list()) if toolkit is not None and spec.cuda_sources else ()
    cflags = ["-O2", "-Wall", *(f"-D{d}" for d in spec.defines)]
    cuda_cflags = ["-O3", *(f"-D{d}" for d in spec.defines)]
    ldflags: list[str] = []
    include_paths: list[str] = []
    cuda_files: list[str] = []
    if toolkit is not None:
        cflags.append("-DMCORE_WITH_CUDA")
        cuda_cflags.append("-DMCORE_WITH_CUDA")
        include_paths.append(str(toolkit.include_dir))
        ldflags += [f"-L{toolkit.lib_dir}", "-lcudart", f"-Wl,-rpath,{toolkit.lib_dir}"]
        if archs:
            ptx = archs[0].replace(".", "").rstrip("a")
            cuda_cflags.append(f"-gencode=arch=compute_{ptx},code=compute_{ptx}")
            cuda_files = [str(src_dir / s) for s in spec.cuda_sources]
    return _CompilePlan(
        variant="cpu+cuda" if toolkit is not None else "cpu",
        archs=archs,
        cpp_files=[str(src_dir / s) for s in spec.cpp_sources],
        cuda_files=cuda_files,
        cflags=cflags,
        cuda_cflags=cuda_cflags,
        ldflags=ldflags,
        include_paths=include_paths,
    )


@contextmanager
def _build_environ(plan: _CompilePlan, toolkit: CudaToolkit | None) -> Iterator[None]:
    """tvm_ffi reads the GPU targets and the toolkit from os.environ: set them for one build, then restore."""
    env_patch = {"TVM_FFI_CUDA_ARCH_LIST": " ".join(plan.archs)} if plan.archs else {}
    if toolkit is not None and not os.environ.get("CUDA_HOME") and not os.environ.get("CUDA_PATH"):
        env_patch["CUDA_HOME"] = str(toolkit.home)
    with _BUILD_LOCK:
        saved = {k: os.environ.get(k) for k in env_patch}
        os.environ.update(env_patch)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _compile(name: str, plan: _CompilePlan, build_dir: Path) -> Path:
    """Run the compiler; a failure becomes one line (its first error) plus the path of the full log."""
    import tvm_ffi.cpp  # noqa: PLC0415 (heavy import, only when building)

    try:
        return Path(
            tvm_ffi.cpp.build(
                f"mcore_{name.replace('-', '_')}",
                cpp_files=plan.cpp_files,
                cuda_files=plan.cuda_files or None,
                extra_cflags=plan.cflags,
                extra_cuda_cflags=plan.cuda_cflags,
                extra_ldflags=plan.ldflags,
                extra_include_paths=plan.include_paths,
                build_directory=str(build_dir),
            )
        )
    except Exception as e:  # the compiler's output is in the message
        log = Path(tempfile.mkstemp(prefix=f"mcore-build-{name}-", suffix=".log")[1])
        log.write_text(str(e), encoding="utf-8")
        first_error = next(
            (ln.strip() for ln in str(e).splitlines() if "error" in ln.lower()),
            str(e).splitlines()[0] if str(e) else type(e).__name__,
        )
        raise UserError(f"building {name} ({plan.variant}) failed: {first_error[:300]}; full log: {log}") from None


def build_kernel(
    name: str,
    output: str | os.PathLike,
    cuda: str = "auto",
    progress: ProgressArg = None,
    overwrite: bool = False,
) -> BuiltKernel:
    """Build kernel `name` (see KERNELS) into a TVM-FFI DSO at `output` exporting `run`.

    Returns the output path (a Path) carrying `.variant` ("cpu" or "cpu+cuda") and `.describe()`.
    Raises UserError for an unknown kernel, a bad output path, an existing output (unless
    `overwrite`), `cuda="on"` without a toolkit, or a failed compile (with the log's path).
    """
    spec = get_kernel(name)
    src_dir = _check_build_request(spec, cuda, output, overwrite)
    output = Path(output)
    prog = _as_progress(progress)

    prog.report(f"{name}: looking for a CUDA toolkit", 0.02)
    toolkit = _pick_toolkit(cuda)
    plan = _compile_plan(spec, src_dir, toolkit)

    build_dir = Path(tempfile.mkdtemp(prefix=f"mcore-build-{name}-"))
    try:
        prog.report(f"{name}: compiling the {plan.variant} variant", 0.1)
        with _build_environ(plan, toolkit):
            so = _compile(name, plan, build_dir)
        prog.report(f"{name}: installing {output}", 0.9)
        install_file(output, so, overwrite)
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)
    result = BuiltKernel(output)
    result.kernel = name
    result.variant = plan.variant
    result.function = spec.function
    result.cuda = toolkit
    result.cuda_archs = plan.archs
    prog.report(f"{name}: built {plan.variant} variant at {output}", 1.0)
    return result
