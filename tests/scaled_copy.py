"""kernels/scaled_copy.cc for the tests: a CPU copy kernel whose output is its input times a scale: 1.0f
computes exactly what a copy region does, any other scale is ABI-compatible but wrong by a known amount
(out - in = (scale - 1) * in)."""

from __future__ import annotations

import shutil
from pathlib import Path

SOURCE = (Path(__file__).resolve().parents[1] / "kernels" / "scaled_copy.cc").read_text(encoding="utf-8")


def source(scale: str) -> str:
    """The C++ source for `scale`, a C float literal such as "2.0f"."""
    return SOURCE.replace("SCALE_VALUE", scale)


def build_scaled_copy(output: Path, scale: str, work: Path) -> Path:
    """Compile the kernel into the DSO `output` (exports `run`), building under `work`."""
    import tvm_ffi.cpp

    work.mkdir(parents=True, exist_ok=True)
    (work / "k.cc").write_text(source(scale))
    lib = tvm_ffi.cpp.build("scaled_copy", cpp_files=[str(work / "k.cc")], build_directory=str(work / "b"))
    shutil.copyfile(lib, output)
    return output
