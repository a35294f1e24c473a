#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "scale_kernels.h"

namespace hvd {

namespace {

constexpr int kThreads = 256;
// Enough blocks to fill an H100 several times over; a grid-stride loop covers
// the rest, so one launch serves any size.
constexpr size_t kMaxBlocks = 4096;

#define HVD_GRID_STRIDE(i, n)                                              \
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < (n); \
       i += size_t(gridDim.x) * blockDim.x)

// Integers: multiply in double, truncate toward zero (the host's cast).
template <typename T>
__global__ void scaleIntegerKernel(T* p, size_t n, double factor) {
  HVD_GRID_STRIDE(i, n) { p[i] = static_cast<T>(static_cast<double>(p[i]) * factor); }
}

// float32 by the factor rounded to float; float64 by the double factor.
template <typename T>
__global__ void scaleFloatKernel(T* p, size_t n, T factor) {
  HVD_GRID_STRIDE(i, n) { p[i] = p[i] * factor; }
}

__global__ void scaleHalfKernel(__half* p, size_t n, float factor) {
  HVD_GRID_STRIDE(i, n) { p[i] = __float2half_rn(__half2float(p[i]) * factor); }
}

__global__ void scaleBf16Kernel(__nv_bfloat16* p, size_t n, float factor) {
  HVD_GRID_STRIDE(i, n) { p[i] = __float2bfloat16_rn(__bfloat162float(p[i]) * factor); }
}

unsigned blocksFor(size_t n) {
  size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

template <typename T>
void scaleInteger(void* buf, size_t n, double factor, cudaStream_t stream) {
  scaleIntegerKernel<T><<<blocksFor(n), kThreads, 0, stream>>>(static_cast<T*>(buf), n, factor);
}

}  // namespace

void launchScale(void* buf, size_t n, DataType dtype, double factor, cudaStream_t stream) {
  if (factor == 1.0 || n == 0) return;
  const float f32 = static_cast<float>(factor);
  const unsigned blocks = blocksFor(n);
  switch (dtype) {
    case DataType::kUInt8: scaleInteger<uint8_t>(buf, n, factor, stream); break;
    case DataType::kInt8: scaleInteger<int8_t>(buf, n, factor, stream); break;
    case DataType::kInt16: scaleInteger<int16_t>(buf, n, factor, stream); break;
    case DataType::kInt32: scaleInteger<int32_t>(buf, n, factor, stream); break;
    case DataType::kInt64: scaleInteger<int64_t>(buf, n, factor, stream); break;
    case DataType::kFloat32:
      scaleFloatKernel<float><<<blocks, kThreads, 0, stream>>>(static_cast<float*>(buf), n, f32);
      break;
    case DataType::kFloat64:
      scaleFloatKernel<double><<<blocks, kThreads, 0, stream>>>(static_cast<double*>(buf), n,
                                                                factor);
      break;
    case DataType::kFloat16:
      scaleHalfKernel<<<blocks, kThreads, 0, stream>>>(static_cast<__half*>(buf), n, f32);
      break;
    case DataType::kBFloat16:
      scaleBf16Kernel<<<blocks, kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(buf), n, f32);
      break;
    case DataType::kBool: return;  // callers refuse scaling a truth value
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("scale kernel launch failed: ") +
                             cudaGetErrorString(err));
  }
}

}  // namespace hvd
