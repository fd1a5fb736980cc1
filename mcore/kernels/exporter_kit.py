"""The exporter kit: what every CuTe DSL exporter shares, written once.

An exporter is a Python script that compiles one kernel for a selection receipt and writes a TVM-FFI
DSO exporting `run`: the stubs `mcore kernel stub` generates (kernels/templates/cutedsl_exporter.py.tmpl),
the committed tutorial example kernels/export_cutedsl_residual_add.py and the hand-written
kernels/cutedsl_decode_attention.py. Each of them is its contract, its kernel and a call to `main`;
this module is the rest:

- the receipt contract check: the receipt and the snapshot are parsed by mcore's own validators
  (`Receipt.from_dict`: fields, types, the ABI hash against its readable ABI; `Snapshot.from_dict`:
  the fingerprint against the content; `check_receipt_against`: the region on that graph), then
  compared with what the exporter takes (`FixedContract` for a generated stub: dtypes, shapes,
  workspace, extra args, ABI hash, graph and region of its receipt);
- the ABI argument order: an exporter names `run`'s arguments by role (`Boundary`); the order is
  `Receipt.call_args`, the one place that knows it, and export refuses a `run` whose parameters are in
  any other order;
- the export-and-link step: CUTE_DSL_ARCH=sm_90a on a machine without a GPU, `cute.compile` with
  `--enable-tvm-ffi` on the TVM-FFI environment stream, `export_to_c`, a link against the CuTe DSL
  runtime archive and libcudart, a load check, and the DSO put in place without replacing a file.

Importing it needs neither torch nor the CuTe DSL (an exporter's --check-only runs without them).
Generated stubs import it as `from mcore import exporter_kit`: the names they use (`__all__`) stay.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Generic, TypeVar

from ..common.errors import UserError
from ..graph.snapshot import KIND as SNAPSHOT_KIND
from ..graph.snapshot import Snapshot
from ..selection.patch import check_receipt_against
from ..selection.receipt import RECEIPT_KIND, Receipt

T = TypeVar("T")

EXIT_CONTRACT = 2  # a selection/snapshot that does not match, an existing output, a missing kernel body
EXIT_EXPORT = 1  # compile, export or link failed
RESELECT = "recreate it with `mcore graph select`"
REGENERATE = "regenerate the exporter for your selection with `mcore kernel stub`"


class ContractError(Exception):
    """The selection or snapshot does not match this exporter; the message says what and what to do."""


class ExportError(Exception):
    """Compile, export or link failed."""


# ---------------------------------------------------------------- the receipt contract check


def load_json(path: str | os.PathLike, what: str) -> Any:
    p = Path(path)
    if not p.is_file():
        raise ContractError(f"{path}: {what} not found; check the path")
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ContractError(f"{path}: cannot read the {what} as JSON ({type(e).__name__}: {e})") from None


def check_receipt(data: Any, where: str, todo: str = RESELECT) -> Receipt:
    """A selection receipt checked by mcore's own validator (fields, types, ABI hash)."""
    if not isinstance(data, dict) or data.get("kind") != RECEIPT_KIND:
        raise ContractError(
            f"{where}: not a selection receipt; pass the .selection.json from `mcore graph select` "
            "or `mcore build --recipe`"
        )
    try:
        return Receipt.from_dict(data, where, todo)
    except UserError as e:
        raise ContractError(str(e)) from None


def check_snapshot(data: Any, receipt: Receipt, where: str) -> Snapshot:
    """The graph the receipt was made from: intact (its fingerprint matches its content), the same
    graph, and the receipt's region selects the same boundary on it."""
    if not isinstance(data, dict) or data.get("kind") != SNAPSHOT_KIND:
        raise ContractError(f"{where}: not a graph snapshot; pass the file from `mcore graph inspect --snapshot`")
    try:
        snapshot = Snapshot.from_dict(data, where)
    except UserError as e:
        raise ContractError(str(e)) from None
    if snapshot.fingerprint != receipt.graph_fingerprint:
        raise ContractError(
            f"{where}: this is another graph (fingerprint {snapshot.fingerprint[:16]}..., the selection's is "
            f"{receipt.graph_fingerprint[:16]}...); pass the snapshot the selection was made from"
        )
    try:
        check_receipt_against(receipt, snapshot, where)
    except UserError as e:
        raise ContractError(str(e)) from None
    return snapshot


def read_receipt(path: str | os.PathLike, todo: str = RESELECT) -> Receipt:
    return check_receipt(load_json(path, "selection receipt"), str(path), todo)


def read_snapshot(path: str | os.PathLike, receipt: Receipt) -> Snapshot:
    return check_snapshot(load_json(path, "graph snapshot"), receipt, str(path))


def _describe(entries: Sequence[Any]) -> str:
    return ", ".join(f"{_dtype(e)} {_shape(e)}" for e in entries) or "none"


def _dtype(e: Any) -> str:
    return e["dtype"] if isinstance(e, Mapping) else e.dtype


def _shape(e: Any) -> list[int]:
    return list(e["shape"] if isinstance(e, Mapping) else e.shape)


@dataclass(frozen=True)
class FixedContract:
    """The one receipt a generated exporter was made for (its constants). `check` refuses any other
    receipt, naming the first difference: boundary, call, then identity (hash, graph, binding, region)."""

    binding_id: str
    graph_fingerprint: str
    abi_sha256: str
    node_ids: Sequence[str]
    inputs: Sequence[Mapping[str, Any]]  # {"param", "tensor_id", "name", "dtype", "shape"} in call order
    workspace_bytes: int
    outputs: Sequence[Mapping[str, Any]]
    extra_args: Sequence[Mapping[str, Any]]
    output_shape_input: int | None
    todo: str = REGENERATE

    def check(self, receipt: Receipt, where: str) -> None:
        self._check_side(receipt.inputs, self.inputs, "input", "takes", where)
        self._check_side(receipt.outputs, self.outputs, "output", "writes", where)
        self._check_call(receipt, where)
        self._check_identity(receipt, where)

    def check_files(self, selection: str | os.PathLike, snapshot: str | os.PathLike | None) -> Receipt:
        """Both files against this contract (the snapshot is required); returns the receipt."""
        receipt = read_receipt(selection)
        self.check(receipt, str(selection))
        if snapshot is None:
            raise ContractError("--snapshot is required: this exporter checks the graph too")
        read_snapshot(snapshot, receipt)
        return receipt

    def _check_side(self, got: Sequence[Any], want: Sequence[Mapping[str, Any]], side: str, verb: str, where: str):
        if len(got) != len(want):
            detail = f" ({_describe(got)})" if side == "input" else ""
            mine = f" ({_describe(want)})" if side == "input" else ""
            raise ContractError(
                f"{where}: the selection has {len(got)} {side}s{detail} but this exporter {verb} {len(want)}{mine}; "
                f"{self.todo}"
            )
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            if g.dtype != w["dtype"]:
                raise ContractError(
                    f"{where}: {side} {i} is {g.dtype} but this exporter {verb} {w['dtype']}; {self.todo}"
                )
            if list(g.shape) != list(w["shape"]):
                raise ContractError(
                    f"{where}: {side} {i} has shape {list(g.shape)} but this exporter {verb} {list(w['shape'])}; "
                    f"{self.todo}"
                )

    def _check_call(self, receipt: Receipt, where: str) -> None:
        if receipt.workspace_bytes != self.workspace_bytes:
            raise ContractError(
                f"{where}: workspace is {receipt.workspace_bytes} bytes but this exporter was made for "
                f"{self.workspace_bytes}; {self.todo}"
            )
        if list(receipt.extra_args) != [dict(a) for a in self.extra_args]:
            raise ContractError(
                f"{where}: extra args {json.dumps(list(receipt.extra_args))} differ from this exporter's "
                f"{json.dumps(list(self.extra_args))}; {self.todo}"
            )
        if receipt.output_shape_input != self.output_shape_input:
            raise ContractError(
                f"{where}: output shape rule (output like input {receipt.output_shape_input}) differs from this "
                f"exporter's (output like input {self.output_shape_input}); {self.todo}"
            )

    def _check_identity(self, receipt: Receipt, where: str) -> None:
        if receipt.abi_sha256 != self.abi_sha256:
            raise ContractError(
                f"{where}: abi_sha256 {receipt.abi_sha256[:16]}... is not this exporter's {self.abi_sha256[:16]}...; "
                f"{self.todo}"
            )
        if receipt.graph_fingerprint != self.graph_fingerprint:
            raise ContractError(
                f"{where}: the selection was made on another graph (fingerprint {receipt.graph_fingerprint[:16]}..., "
                f"this exporter's is {self.graph_fingerprint[:16]}...); {self.todo}"
            )
        if receipt.binding_id != self.binding_id:
            raise ContractError(
                f"{where}: binding ID {receipt.binding_id!r} is not this exporter's {self.binding_id!r}; {self.todo}"
            )
        if (
            list(receipt.node_ids) != list(self.node_ids)
            or list(receipt.input_tensor_ids) != [e["tensor_id"] for e in self.inputs]
            or list(receipt.output_tensor_ids) != [e["tensor_id"] for e in self.outputs]
        ):
            raise ContractError(
                f"{where}: the selected region ({', '.join(receipt.node_ids)}) is not this exporter's "
                f"({', '.join(self.node_ids)}); {self.todo}"
            )


# ---------------------------------------------------------------- the ABI argument order


@dataclass(frozen=True)
class Boundary(Generic[T]):
    """One value per `run` argument, by role. `in_call_order` puts them in the receipt's ABI order
    (`Receipt.call_args`: inputs, the workspace when the ABI has one, outputs, extra args)."""

    inputs: Sequence[T]
    workspace: T | None
    outputs: Sequence[T]
    extras: Sequence[T] = ()

    def in_call_order(self, receipt: Receipt) -> list[T]:
        return receipt.call_args(self.inputs, self.workspace, self.outputs, self.extras)


def generic_names(receipt: Receipt) -> Boundary[str]:
    """`run`'s parameter names in a generated exporter: input0.., workspace, output0.., extra0.."""
    return Boundary(
        [f"input{i}" for i in range(len(receipt.inputs))],
        "workspace",
        [f"output{i}" for i in range(len(receipt.outputs))],
        [f"extra{i}" for i in range(len(receipt.extra_args))],
    )


@dataclass(frozen=True)
class Kernel:
    """What an exporter compiles: its `run` (a @cute.jit function whose last parameter is the stream),
    the names of run's parameters and the compile-time stand-ins, both by role."""

    run: Callable[..., Any]
    names: Boundary[str]
    fakes: Boundary[Any]


def check_signature(kernel: Kernel, receipt: Receipt) -> None:
    """`run` takes the receipt's arguments in the ABI's order, then the stream."""
    want = kernel.names.in_call_order(receipt)
    got = list(inspect.signature(kernel.run).parameters)[:-1]
    if got != want:
        raise ExportError(
            f"run({', '.join(got)}) does not take the receipt's arguments in ABI order: run({', '.join(want)}); "
            "reorder run's parameters"
        )


# ---------------------------------------------------------------- export and link


def gpu_visible() -> bool:
    if os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
        return False
    try:
        if any(os.scandir("/proc/driver/nvidia/gpus")):
            return True
    except OSError:
        pass
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
        return r.returncode == 0 and "GPU" in r.stdout
    except (OSError, subprocess.SubprocessError):
        return False


def default_arch() -> None:
    """Compile and export need no GPU: without one, target sm_90a unless CUTE_DSL_ARCH says otherwise.
    Call it before the CuTe DSL is imported (the DSL reads the variable once)."""
    if not os.environ.get("CUTE_DSL_ARCH") and not gpu_visible():
        os.environ["CUTE_DSL_ARCH"] = "sm_90a"


STATIC_RUNTIME = "libcuda_dialect_runtime_static.a"


def cute_runtime_libdir() -> Path:
    """The CuTe DSL runtime folder holding libcuda_dialect_runtime_static.a (cu13 libs preferred)."""
    import cutlass

    candidates = []
    if os.environ.get("CUTE_DSL_RUNTIME_DIR"):
        candidates.append(Path(os.environ["CUTE_DSL_RUNTIME_DIR"]))
    try:
        from cutlass.cute.export.aot_config import get_libdir

        if get_libdir():
            candidates.append(Path(get_libdir()))
    except Exception:  # older CuTe DSL: search the package below
        pass
    package = Path(cutlass.__file__).resolve().parents[2]  # .../nvidia_cutlass_dsl
    candidates += [package / "cu13" / "lib", package / "cu12" / "lib"]
    for d in candidates:
        if (d / STATIC_RUNTIME).is_file():
            return d
    raise ExportError(
        f"{STATIC_RUNTIME} not found in the installed nvidia-cutlass-dsl; install its CUDA 13 libs "
        "(pip install 'nvidia-cutlass-dsl[cu13]') or set CUTE_DSL_RUNTIME_DIR"
    )


def cudart_libdir() -> Path | None:
    """A folder with libcudart.so: CUDA_HOME, CUDA_PATH, the toolkit of nvcc, /usr/local/cuda; None to let gcc search."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        homes.append(str(Path(nvcc).resolve().parent.parent))
    homes.append("/usr/local/cuda")
    for home in filter(None, homes):
        for sub in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
            if (Path(home) / sub / "libcudart.so").exists():
                return Path(home) / sub
    return None


# Newer CuTe DSL wrappers report a CUDA error through this helper of libcute_dsl_runtime.so. Defining
# it in the DSO keeps the DSO self-contained: at run time it needs only libcudart and libtvm_ffi.
ERROR_SHIM_C = r"""
#include <stdio.h>
typedef void (*set_raised_parts_fn)(const char* kind, const char** parts, int num_parts);
__attribute__((visibility("hidden")))
void CuteDSLRT_TVMFFISetRaisedCudaError(set_raised_parts_fn set_raised, int code) {
  char number[32];
  const char* parts[2];
  if (!set_raised) return;
  snprintf(number, sizeof number, "%d", code);
  parts[0] = "CUDA error in the CuTe DSL kernel wrapper, cudaError_t ";
  parts[1] = number;
  set_raised("RuntimeError", parts, 2);
}
"""


def _run(cmd: Sequence[Any], what: str) -> None:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode != 0:
        raise ExportError(f"{what} failed ({' '.join(map(str, cmd))}): {(r.stderr or r.stdout).strip()[-2000:]}")


def link(obj: Path, dso: str | os.PathLike, with_dsl_runtime: bool = False) -> None:
    """Link the exported object with the CuTe DSL runtime archive and the CUDA runtime into a shared library.

    with_dsl_runtime: also link libcute_dsl_runtime.so (found at run time through the rpath), for a
    CuTe DSL whose wrapper needs more of it than the error helper above.
    """
    import tvm_ffi.libinfo

    cc = os.environ.get("CC", "gcc")
    runtime = cute_runtime_libdir()
    tvm_ffi_dir = Path(tvm_ffi.libinfo.find_libtvm_ffi()).parent
    cudart = cudart_libdir()
    shim_c = Path(obj).with_name("cute_dsl_error_shim.c")
    shim_c.write_text(ERROR_SHIM_C)
    shim_o = shim_c.with_suffix(".o")
    _run([cc, "-c", "-fPIC", "-O2", "-o", shim_o, shim_c], "compiling the error helper")
    cmd = (
        [cc, "-shared", "-o", dso, obj]
        + ([] if with_dsl_runtime else [shim_o])
        + [runtime / STATIC_RUNTIME, "-Wl,--exclude-libs,ALL", "-Wl,--as-needed"]
    )
    rpath = [str(d) for d in (cudart, tvm_ffi_dir) if d]
    if with_dsl_runtime:
        cmd += [f"-L{runtime}", "-lcute_dsl_runtime"]
        rpath.insert(0, str(runtime))
    if cudart:
        cmd += [f"-L{cudart}"]
    cmd += ["-lcudart", f"-L{tvm_ffi_dir}", "-ltvm_ffi", "-Wl,--no-as-needed", "-Wl,-rpath," + ":".join(rpath)]
    try:
        _run(cmd, "linking")
    except ExportError as e:
        raise ExportError(
            f"{e}" + ("" if cudart else "; set CUDA_HOME to the CUDA toolkit so libcudart is found")
        ) from None


def _load_check(dso: str | os.PathLike) -> str | None:
    """Load the DSO we just built (our own code) and look up run; returns the error text, or None."""
    import tvm_ffi

    try:
        tvm_ffi.load_module(str(dso))["run"]
    except Exception as e:
        return str(e)
    return None


def _cute() -> Any:
    try:
        import cutlass.cute as cute
        from cutlass.cute.runtime import make_fake_stream
    except (ImportError, RuntimeError) as e:  # no CuTe DSL, or no CUDA flavour of it
        raise ExportError(
            f"the CuTe DSL is not importable ({e}); pip install 'nvidia-cutlass-dsl[cu13]' apache-tvm-ffi"
        ) from None
    return cute, make_fake_stream


def compile_kernel(make: Callable[[], Kernel], receipt: Receipt) -> Any:
    """`make()`'s run compiled for the TVM-FFI ABI, its stand-ins in ABI order, on the TVM-FFI
    environment stream (the engine's current stream; not an argument of the exported run)."""
    cute, make_fake_stream = _cute()
    try:
        kernel = make()
    except Exception as e:
        raise ExportError(f"cute.compile failed: {type(e).__name__}: {e}") from e
    check_signature(kernel, receipt)
    args = [*kernel.fakes.in_call_order(receipt), make_fake_stream(use_tvm_ffi_env_stream=True)]
    try:
        return cute.compile(kernel.run, *args, options="--enable-tvm-ffi")
    except Exception as e:
        raise ExportError(f"cute.compile failed: {type(e).__name__}: {e}") from e


def _link_loadable(obj: Path, staged: str) -> None:
    """Link `obj` into `staged` and check it loads; with libcute_dsl_runtime.so when the DSO needs it."""
    link(obj, staged)
    problem = _load_check(staged)
    if problem and "undefined symbol" in problem and (cute_runtime_libdir() / "libcute_dsl_runtime.so").exists():
        link(obj, staged, with_dsl_runtime=True)
        problem = _load_check(staged)
        if not problem:
            print(
                f"note: this DSO needs libcute_dsl_runtime.so at run time (rpath: {cute_runtime_libdir()})",
                file=sys.stderr,
            )
    if problem:
        raise ExportError(f"the linked DSO does not load: {problem}")


def export(output: str | os.PathLike, make: Callable[[], Kernel], receipt: Receipt) -> None:
    """Compile `make()`'s run, export it as `run`, link it and put the DSO at `output` (never replaced)."""
    compiled = compile_kernel(make, receipt)
    output = Path(output)
    with tempfile.TemporaryDirectory(prefix="cutedsl-export-") as tmp:
        obj = Path(tmp) / "run.o"
        try:
            compiled.export_to_c(str(obj), function_name="run", export_only_tvm_ffi_symbols=True)
        except TypeError:  # older CuTe DSL without export_only_tvm_ffi_symbols
            compiled.export_to_c(str(obj), function_name="run")
        fd, staged = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp.so", dir=output.parent)
        os.close(fd)
        try:
            _link_loadable(obj, staged)
            os.chmod(staged, 0o755)
            try:
                os.link(staged, output)  # atomic, and never replaces an existing file
            except FileExistsError:
                raise ExportError(f"{output} appeared while exporting; choose a fresh path") from None
        finally:
            os.unlink(staged)


# ---------------------------------------------------------------- the command line


@dataclass(frozen=True)
class Checked:
    """A receipt an exporter accepted: what it compiles for (`detail`), the check-only line's
    description and the lines printed after a successful export."""

    receipt: Receipt
    summary: str
    detail: Any = None
    report: Sequence[str] = ()


@dataclass(frozen=True)
class Exporter:
    """One exporter's command line: how it checks its files and what it compiles."""

    description: str
    check: Callable[[str, str | None], Checked]  # (selection, snapshot or None) -> Checked; raises ContractError
    kernel: Callable[[Checked], Kernel]
    snapshot_required: bool = True
    unfinished: str = ""  # why export stops (a generated stub whose kernel body is not written yet)


def prog() -> str:
    return Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "exporter"


def _parser(exporter: Exporter) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog(), description=exporter.description)
    optional = "" if exporter.snapshot_required else " (optional check)"
    parser.add_argument(
        "--snapshot", required=exporter.snapshot_required, help=f"graph snapshot the selection was made from{optional}"
    )
    parser.add_argument("--selection", required=True, help="selection receipt (.selection.json)")
    parser.add_argument("--output", help="DSO to write (.so); never overwritten")
    parser.add_argument("--check-only", action="store_true", help="only check the selection and snapshot")
    return parser


def fresh_output(output: str | None) -> Path:
    """The DSO path to write: given, not there yet, in a folder that exists."""
    if not output:
        raise ContractError("--output is required (or pass --check-only)")
    path = Path(output)
    if path.exists():
        raise ContractError(f"{path} exists; choose a fresh path (the exporter never overwrites a DSO)")
    if not path.parent.is_dir():
        raise ContractError(f"folder {path.parent} does not exist; create it first")
    return path


def _identity(receipt: Receipt) -> None:
    print(f"binding_id={receipt.binding_id}")
    print(f"abi_sha256={receipt.abi_sha256}")


def main(exporter: Exporter, argv: Sequence[str] | None = None) -> int:
    """Check, then (unless --check-only) export; one line and exit 2 for a mismatch, exit 1 when the
    export fails. Prints binding_id=, abi_sha256=, the exporter's report lines, arch= and dso=."""
    args = _parser(exporter).parse_args(argv)
    try:
        checked = exporter.check(args.selection, args.snapshot)
        if args.check_only:
            print(f"contract OK: {checked.summary}")
            _identity(checked.receipt)
            return 0
        output = fresh_output(args.output)
        if exporter.unfinished:
            raise ContractError(f"export stopped: {exporter.unfinished}")
    except ContractError as e:
        print(f"{prog()}: error: {e}", file=sys.stderr)
        return EXIT_CONTRACT
    try:
        export(output, lambda: exporter.kernel(checked), checked.receipt)
    except ExportError as e:
        print(f"{prog()}: error: {e}", file=sys.stderr)
        return EXIT_EXPORT
    _identity(checked.receipt)
    for line in checked.report:
        print(line)
    print(f"arch={os.environ.get('CUTE_DSL_ARCH') or 'the visible GPU'}")
    print(f"dso={output.resolve()}")
    return 0


# `from mcore import exporter_kit` resolves through mcore's public names to this module, wherever the
# package layout puts it (mcore/__init__.py).
exporter_kit: ModuleType = sys.modules[__name__]

__all__ = [
    "EXIT_CONTRACT",
    "EXIT_EXPORT",
    "REGENERATE",
    "RESELECT",
    "Boundary",
    "Checked",
    "ContractError",
    "ExportError",
    "Exporter",
    "FixedContract",
    "Kernel",
    "check_receipt",
    "check_snapshot",
    "default_arch",
    "export",
    "generic_names",
    "load_json",
    "main",
    "read_receipt",
    "read_snapshot",
]
