// The smallest kernel for a copy region (the tests' and bench/tui_walkthrough.py's, not shipped in
// `mcore kernel list`): out = in * scale over float32, the scale a C literal put in place of the
// placeholder below before compiling. 1.0f computes exactly what the region does; any other scale is
// ABI-compatible but wrong by (scale - 1) * in.
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>
void Run(tvm::ffi::TensorView in, tvm::ffi::TensorView out) {
  const float* a = reinterpret_cast<const float*>(static_cast<char*>(in.data_ptr()) + in.byte_offset());
  float* b = reinterpret_cast<float*>(static_cast<char*>(out.data_ptr()) + out.byte_offset());
  for (int64_t i = 0; i < in.numel(); ++i) b[i] = a[i] * SCALE_VALUE;
}
TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, Run);
