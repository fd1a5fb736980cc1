"""A CPU copy kernel whose output is its input times a scale: 1.0f computes exactly what a copy region
does, any other scale is ABI-compatible but wrong by a known amount (out - in = (scale - 1) * in)."""

from __future__ import annotations

import shutil
from pathlib import Path

SOURCE = """
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>
void Run(tvm::ffi::TensorView in, tvm::ffi::TensorView out) {
  const float* a = reinterpret_cast<const float*>(static_cast<char*>(in.data_ptr()) + in.byte_offset());
  float* b = reinterpret_cast<float*>(static_cast<char*>(out.data_ptr()) + out.byte_offset());
  for (int64_t i = 0; i < in.numel(); ++i) b[i] = a[i] * SCALE_VALUE;
}
TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, Run);
"""


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
