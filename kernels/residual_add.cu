// CUDA half of residual_add (see residual_add.cc for the exported run()).
//
// out[i] = a[i] + b[i] for FP32, FP16 and BF16; FP16/BF16 are added in FP32 and
// rounded once to nearest even, as PyTorch does. When all three pointers are
// 16-byte aligned the bulk is processed 16 bytes per thread (8 halves or 4
// floats) in a grid-stride loop; the remainder, or everything when a pointer is
// not aligned, takes a scalar grid-stride loop. Launched on the caller's stream,
// never synchronized; the launch error is returned to the caller.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

template <typename T>
struct Elem;

template <>
struct Elem<float> {
  __device__ static float ToFloat(float x) { return x; }
  __device__ static float FromFloat(float x) { return x; }
};

template <>
struct Elem<__half> {
  __device__ static float ToFloat(__half x) { return __half2float(x); }
  __device__ static __half FromFloat(float x) { return __float2half_rn(x); }
};

template <>
struct Elem<__nv_bfloat16> {
  __device__ static float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ static __nv_bfloat16 FromFloat(float x) { return __float2bfloat16_rn(x); }
};

template <typename T>
__device__ __forceinline__ T AddOne(T x, T y) {
  return Elem<T>::FromFloat(Elem<T>::ToFloat(x) + Elem<T>::ToFloat(y));
}

// 16 bytes per thread: uint4 loads and stores.
template <typename T>
__global__ void AddVec16(const uint4* __restrict__ a, const uint4* __restrict__ b, uint4* __restrict__ out,
                         int64_t nvec) {
  constexpr int kPer = 16 / sizeof(T);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < nvec; i += stride) {
    uint4 va = a[i];
    uint4 vb = b[i];
    uint4 vo;
    const T* x = reinterpret_cast<const T*>(&va);
    const T* y = reinterpret_cast<const T*>(&vb);
    T* z = reinterpret_cast<T*>(&vo);
#pragma unroll
    for (int k = 0; k < kPer; ++k) z[k] = AddOne<T>(x[k], y[k]);
    out[i] = vo;
  }
}

template <typename T>
__global__ void AddScalar(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, int64_t begin,
                          int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = begin + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = AddOne<T>(a[i], b[i]);
  }
}

inline unsigned Blocks(int64_t work) {
  int64_t blocks = (work + kThreads - 1) / kThreads;
  if (blocks < 1) blocks = 1;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  return static_cast<unsigned>(blocks);
}

template <typename T>
cudaError_t Launch(const void* a, const void* b, void* out, int64_t n, cudaStream_t stream) {
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  T* z = static_cast<T*>(out);
  const bool aligned = ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
                         reinterpret_cast<uintptr_t>(out)) % 16) == 0;
  constexpr int64_t kPer = 16 / sizeof(T);
  int64_t done = 0;
  if (aligned && n >= kPer) {
    const int64_t nvec = n / kPer;
    AddVec16<T><<<Blocks(nvec), kThreads, 0, stream>>>(static_cast<const uint4*>(a), static_cast<const uint4*>(b),
                                                       static_cast<uint4*>(out), nvec);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    done = nvec * kPer;
  }
  if (done < n) {
    AddScalar<T><<<Blocks(n - done), kThreads, 0, stream>>>(x, y, z, done, n);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

}  // namespace

extern "C" cudaError_t mcore_residual_add_cuda(const void* a, const void* b, void* out, int64_t n, int dtype_code,
                                               cudaStream_t stream) {
  switch (dtype_code) {
    case 0:
      return Launch<float>(a, b, out, n, stream);
    case 1:
      return Launch<__half>(a, b, out, n, stream);
    case 2:
      return Launch<__nv_bfloat16>(a, b, out, n, stream);
    default:
      return cudaErrorInvalidValue;
  }
}
