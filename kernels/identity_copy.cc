// identity_copy: the tutorial's first kernel, exported through TVM-FFI as
//
//     run(TensorView input, TensorView output)
//
// It copies `input` into `output` byte for byte (same dtype, same element count,
// both contiguous, same device). That is the whole ABI of a region whose one
// input and one output have the same dtype and shape, e.g. the Qwen3 logits +
// zero-bias region of the tutorial.
//
// CPU tensors: memmove. CUDA tensors: cudaMemcpyAsync(DeviceToDevice) on the
// TVM-FFI environment stream of the tensor's device (the engine's current
// stream); the kernel never synchronizes and never picks a stream of its own.
// The CUDA path is compiled in only when MCORE_WITH_CUDA is defined (mcore's
// build_kernel does that when it finds a CUDA toolkit); without it a CUDA
// tensor is refused with a clear error.
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>

// MCORE_COPY_REPEAT (default 1) repeats the copy: `mcore kernel build slow-copy` sets it to 512, a
// correct kernel that is measurably slower, for checking that the perf gate rejects regressions.
// MCORE_COPY_REPEAT_CPU (default MCORE_COPY_REPEAT) is the count for CPU tensors: a memmove of a
// tiny demo's logits row takes tens of nanoseconds, so 512 of them are 2% of a CPU decode step,
// inside the gate's margin; slow-copy sets 65536 there (a tiny demo's CPU step takes about twice as long).
#ifndef MCORE_COPY_REPEAT
#define MCORE_COPY_REPEAT 1
#endif
#ifndef MCORE_COPY_REPEAT_CPU
#define MCORE_COPY_REPEAT_CPU MCORE_COPY_REPEAT
#endif

#ifdef MCORE_WITH_CUDA
#include <cuda_runtime.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/cuda/base.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#endif

namespace {

using tvm::ffi::TensorView;

const char* DeviceName(int32_t device_type) {
  switch (device_type) {
    case kDLCPU:
      return "cpu";
    case kDLCUDA:
      return "cuda";
    case kDLCUDAHost:
      return "cuda_host";
    case kDLCUDAManaged:
      return "cuda_managed";
    default:
      return "other";
  }
}

std::string ShapeStr(const TensorView& t) {
  std::ostringstream os;
  os << "[";
  for (int32_t i = 0; i < t.ndim(); ++i) os << (i ? ", " : "") << t.size(i);
  os << "]";
  return os.str();
}

char* DataStart(const TensorView& t) { return static_cast<char*>(t.data_ptr()) + t.byte_offset(); }

void Run(TensorView input, TensorView output) {
  const DLDevice in_dev = input.device();
  const DLDevice out_dev = output.device();
  if (in_dev.device_type != out_dev.device_type || in_dev.device_id != out_dev.device_id) {
    TVM_FFI_THROW(ValueError) << "identity_copy: input is on " << DeviceName(in_dev.device_type) << ":"
                              << in_dev.device_id << " but output is on " << DeviceName(out_dev.device_type)
                              << ":" << out_dev.device_id << "; both must be on the same device";
  }
  const DLDataType in_dt = input.dtype();
  const DLDataType out_dt = output.dtype();
  if (in_dt.code != out_dt.code || in_dt.bits != out_dt.bits || in_dt.lanes != out_dt.lanes) {
    TVM_FFI_THROW(TypeError) << "identity_copy: input dtype " << in_dt << " differs from output dtype " << out_dt
                             << "; the copy needs identical dtypes";
  }
  if (input.numel() != output.numel()) {
    TVM_FFI_THROW(ValueError) << "identity_copy: input has " << input.numel() << " elements but output has "
                              << output.numel() << "; shapes " << ShapeStr(input) << " and " << ShapeStr(output)
                              << " must hold the same number of elements";
  }
  if (!input.IsContiguous() || !output.IsContiguous()) {
    TVM_FFI_THROW(ValueError) << "identity_copy: input and output must be contiguous (linear) tensors";
  }
  const int64_t numel = input.numel();
  if (numel == 0) return;
  const size_t bytes = tvm::ffi::GetDataSize(static_cast<size_t>(numel), in_dt);
  if (input.data_ptr() == nullptr || output.data_ptr() == nullptr) {
    TVM_FFI_THROW(ValueError) << "identity_copy: a tensor with " << numel << " elements has a null data pointer";
  }
  const char* src = DataStart(input);
  char* dst = DataStart(output);
  if (src == dst) return;

  if (in_dev.device_type == kDLCPU) {
    for (int rep = 0; rep < MCORE_COPY_REPEAT_CPU; ++rep) {
      std::memmove(dst, src, bytes);
      // keep the repeats: the compiler may not merge copies it cannot see the reason for
      asm volatile("" : : "r"(dst) : "memory");
    }
    return;
  }
  if (in_dev.device_type == kDLCUDA) {
#ifdef MCORE_WITH_CUDA
    tvm::ffi::CUDADeviceGuard guard(in_dev.device_id);
    // The engine's current stream for this device (torch's current stream when called with torch tensors).
    cudaStream_t stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, in_dev.device_id));
    for (int rep = 0; rep < MCORE_COPY_REPEAT; ++rep) {
      TVM_FFI_CHECK_CUDA_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
    }
    return;
#else
    TVM_FFI_THROW(RuntimeError) << "identity_copy: this DSO was built without CUDA, so it cannot copy CUDA tensors; "
                                << "rebuild it with `mcore kernel build identity-copy --cuda on` on a machine with "
                                   "the CUDA toolkit";
#endif
  }
  TVM_FFI_THROW(ValueError) << "identity_copy: tensors on device type " << DeviceName(in_dev.device_type) << " ("
                            << in_dev.device_type << ") are not supported; use cpu or cuda tensors";
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, Run);
