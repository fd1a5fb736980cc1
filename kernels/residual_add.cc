// residual_add: out = a + b elementwise, exported through TVM-FFI as
//
//     run(TensorView a, TensorView b, TensorView out)
//
// For the tutorial's DistilBERT residual-add region (two FP16 [256, 768] inputs,
// one FP16 [256, 768] output) and any other same-shape add. All three tensors
// must share one dtype (FP16, BF16 or FP32), one element count and one device,
// and be contiguous. Like PyTorch, FP16/BF16 are added in FP32 and rounded once
// (round to nearest even), so results match `a + b` in PyTorch bit for bit.
//
// CPU tensors: a plain loop. CUDA tensors: the kernel in residual_add.cu, launched
// on the TVM-FFI environment stream of the tensors' device (the engine's current
// stream), never synchronized. The CUDA path is compiled in only when
// MCORE_WITH_CUDA is defined; without it a CUDA tensor is refused with a clear error.
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>

#ifdef MCORE_WITH_CUDA
#include <cuda_runtime.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/cuda/base.h>
#include <tvm/ffi/extra/cuda/device_guard.h>

// Defined in residual_add.cu. dtype_code: 0 = FP32, 1 = FP16, 2 = BF16.
extern "C" cudaError_t mcore_residual_add_cuda(const void* a, const void* b, void* out, int64_t n, int dtype_code,
                                               cudaStream_t stream);
#endif

namespace {

using tvm::ffi::TensorView;

enum DType { kFP32 = 0, kFP16 = 1, kBF16 = 2 };

std::string ShapeStr(const TensorView& t) {
  std::ostringstream os;
  os << "[";
  for (int32_t i = 0; i < t.ndim(); ++i) os << (i ? ", " : "") << t.size(i);
  os << "]";
  return os.str();
}

int DTypeCode(DLDataType dt) {
  if (dt.lanes == 1 && dt.bits == 32 && dt.code == kDLFloat) return kFP32;
  if (dt.lanes == 1 && dt.bits == 16 && dt.code == kDLFloat) return kFP16;
  if (dt.lanes == 1 && dt.bits == 16 && dt.code == kDLBfloat) return kBF16;
  return -1;
}

// ---- FP16 / BF16 <-> FP32 with round-to-nearest-even (portable, no compiler extensions)

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return BitsFloat(sign | 0x7f800000u | (mant << 13));  // inf / nan
  if (exp == 0) {
    if (mant == 0) return BitsFloat(sign);  // +-0
    uint32_t e = 113;                       // subnormal: normalize
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    return BitsFloat(sign | (e << 23) | ((mant & 0x3ffu) << 13));
  }
  return BitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t FloatToHalf(float value) {
  uint32_t f = FloatBits(value);
  const uint32_t sign = f & 0x80000000u;
  f ^= sign;
  uint16_t out;
  if (f >= (143u << 23)) {  // >= 2^16 (or inf/nan): inf, or a quiet nan
    out = f > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (f < (113u << 23)) {  // below 2^-14: subnormal half; let the FPU round
    const uint32_t magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    out = static_cast<uint16_t>(FloatBits(BitsFloat(f) + BitsFloat(magic)) - magic);
  } else {
    const uint32_t odd = (f >> 13) & 1u;
    f += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + odd;
    out = static_cast<uint16_t>(f >> 13);
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

inline float BF16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

inline uint16_t FloatToBF16(float value) {
  const uint32_t f = FloatBits(value);
  if ((f & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((f >> 16) | 0x40u);  // quiet nan
  return static_cast<uint16_t>((f + 0x7fffu + ((f >> 16) & 1u)) >> 16);
}

void AddCPU(const void* a, const void* b, void* out, int64_t n, int code) {
  if (code == kFP32) {
    const float* x = static_cast<const float*>(a);
    const float* y = static_cast<const float*>(b);
    float* z = static_cast<float*>(out);
    for (int64_t i = 0; i < n; ++i) z[i] = x[i] + y[i];
    return;
  }
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  uint16_t* z = static_cast<uint16_t*>(out);
  if (code == kFP16) {
    for (int64_t i = 0; i < n; ++i) z[i] = FloatToHalf(HalfToFloat(x[i]) + HalfToFloat(y[i]));
  } else {
    for (int64_t i = 0; i < n; ++i) z[i] = FloatToBF16(BF16ToFloat(x[i]) + BF16ToFloat(y[i]));
  }
}

const char* DeviceName(int32_t device_type) {
  return device_type == kDLCPU ? "cpu" : device_type == kDLCUDA ? "cuda" : "other";
}

void Run(TensorView a, TensorView b, TensorView out) {
  const TensorView* all[3] = {&a, &b, &out};
  const char* names[3] = {"a", "b", "out"};
  const DLDevice dev = out.device();
  const int code = DTypeCode(out.dtype());
  if (code < 0) {
    TVM_FFI_THROW(TypeError) << "residual_add: out has dtype " << out.dtype() << "; supported: float16, bfloat16, float32";
  }
  for (int i = 0; i < 2; ++i) {
    const TensorView& t = *all[i];
    if (t.device().device_type != dev.device_type || t.device().device_id != dev.device_id) {
      TVM_FFI_THROW(ValueError) << "residual_add: " << names[i] << " is on " << DeviceName(t.device().device_type)
                                << ":" << t.device().device_id << " but out is on " << DeviceName(dev.device_type)
                                << ":" << dev.device_id << "; all tensors must be on one device";
    }
    if (DTypeCode(t.dtype()) != code) {
      TVM_FFI_THROW(TypeError) << "residual_add: " << names[i] << " has dtype " << t.dtype() << " but out has "
                               << out.dtype() << "; a, b and out must share one dtype";
    }
    if (t.numel() != out.numel()) {
      TVM_FFI_THROW(ValueError) << "residual_add: " << names[i] << " has shape " << ShapeStr(t) << " ("
                                << t.numel() << " elements) but out has shape " << ShapeStr(out) << " ("
                                << out.numel() << "); the add is elementwise over equal element counts";
    }
  }
  for (int i = 0; i < 3; ++i) {
    if (!all[i]->IsContiguous()) {
      TVM_FFI_THROW(ValueError) << "residual_add: " << names[i] << " is not contiguous; pass linear tensors";
    }
  }
  const int64_t n = out.numel();
  if (n == 0) return;
  const void* pa = static_cast<const char*>(a.data_ptr()) + a.byte_offset();
  const void* pb = static_cast<const char*>(b.data_ptr()) + b.byte_offset();
  void* po = static_cast<char*>(out.data_ptr()) + out.byte_offset();

  if (dev.device_type == kDLCPU) {
    AddCPU(pa, pb, po, n, code);
    return;
  }
  if (dev.device_type == kDLCUDA) {
#ifdef MCORE_WITH_CUDA
    tvm::ffi::CUDADeviceGuard guard(dev.device_id);
    cudaStream_t stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, dev.device_id));
    TVM_FFI_CHECK_CUDA_ERROR(mcore_residual_add_cuda(pa, pb, po, n, code, stream));
    return;
#else
    TVM_FFI_THROW(RuntimeError) << "residual_add: this DSO was built without CUDA, so it cannot add CUDA tensors; "
                                << "rebuild it with `mcore kernel build residual-add --cuda on` on a machine with "
                                   "the CUDA toolkit";
#endif
  }
  TVM_FFI_THROW(ValueError) << "residual_add: tensors on device type " << dev.device_type
                            << " are not supported; use cpu or cuda tensors";
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, Run);
