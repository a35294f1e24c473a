#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "scale_kernels.h"

namespace hvd {

namespace {

constexpr int kThreads = 256;
// Enough blocks to fill an H100 several times over; a grid-stride loop covers
// the rest, so one launch serves any size.
constexpr size_t kMaxBlocks = 4096;

// float32/float64 and integers: the host's `static_cast<T>(x * factor)`.
template <typename T>
__global__ void scaleKernel(T* p, size_t n, double factor) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    p[i] = static_cast<T>(p[i] * factor);
  }
}

// float16/bfloat16: widen to float32, multiply by the double factor, round
// the product to float32 and then to the narrow type, as the host does.
__global__ void scaleHalfKernel(__half* p, size_t n, double factor) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    p[i] = __float2half_rn(static_cast<float>(__half2float(p[i]) * factor));
  }
}

__global__ void scaleBf16Kernel(__nv_bfloat16* p, size_t n, double factor) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    p[i] = __float2bfloat16_rn(static_cast<float>(__bfloat162float(p[i]) * factor));
  }
}

template <typename T>
__global__ void floorDivideKernel(T* p, size_t n, int divisor) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    auto q = p[i] / divisor;
    // Floor, not truncation, for a negative quotient (signed types only).
    if constexpr (std::is_signed<T>::value) {
      if ((p[i] % divisor != 0) && ((p[i] < 0) != (divisor < 0))) --q;
    }
    p[i] = static_cast<T>(q);
  }
}

unsigned blocksFor(size_t n) {
  size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

template <typename T>
void scaleAs(void* buf, size_t n, double factor, cudaStream_t stream) {
  scaleKernel<T><<<blocksFor(n), kThreads, 0, stream>>>(static_cast<T*>(buf), n, factor);
}

template <typename T>
void divideAs(void* buf, size_t n, int divisor, cudaStream_t stream) {
  floorDivideKernel<T><<<blocksFor(n), kThreads, 0, stream>>>(static_cast<T*>(buf), n, divisor);
}

void checkLaunch(const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + " kernel launch failed: " +
                             cudaGetErrorString(err));
  }
}

}  // namespace

void launchScale(void* buf, size_t n, DataType dtype, double factor, cudaStream_t stream) {
  if (factor == 1.0 || n == 0) return;
  switch (dtype) {
    case DataType::kUInt8: scaleAs<uint8_t>(buf, n, factor, stream); break;
    case DataType::kInt8: scaleAs<int8_t>(buf, n, factor, stream); break;
    case DataType::kInt16: scaleAs<int16_t>(buf, n, factor, stream); break;
    case DataType::kInt32: scaleAs<int32_t>(buf, n, factor, stream); break;
    case DataType::kInt64: scaleAs<int64_t>(buf, n, factor, stream); break;
    case DataType::kFloat32: scaleAs<float>(buf, n, factor, stream); break;
    case DataType::kFloat64: scaleAs<double>(buf, n, factor, stream); break;
    case DataType::kFloat16:
      scaleHalfKernel<<<blocksFor(n), kThreads, 0, stream>>>(static_cast<__half*>(buf), n, factor);
      break;
    case DataType::kBFloat16:
      scaleBf16Kernel<<<blocksFor(n), kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(buf), n,
                                                             factor);
      break;
    case DataType::kBool: return;  // callers refuse scaling a truth value
  }
  checkLaunch("scale");
}

void launchDivide(void* buf, size_t n, DataType dtype, int divisor, cudaStream_t stream) {
  if (divisor == 1 || n == 0) return;
  switch (dtype) {
    case DataType::kUInt8: divideAs<uint8_t>(buf, n, divisor, stream); break;
    case DataType::kInt8: divideAs<int8_t>(buf, n, divisor, stream); break;
    case DataType::kInt16: divideAs<int16_t>(buf, n, divisor, stream); break;
    case DataType::kInt32: divideAs<int32_t>(buf, n, divisor, stream); break;
    case DataType::kInt64: divideAs<int64_t>(buf, n, divisor, stream); break;
    case DataType::kBool: return;
    // Floating point multiplies by 1/divisor, as the host (and Horovod) do.
    default: return launchScale(buf, n, dtype, 1.0 / divisor, stream);
  }
  checkLaunch("divide");
}

}  // namespace hvd
