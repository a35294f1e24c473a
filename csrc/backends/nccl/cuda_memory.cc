#include "cuda_memory.h"

#include "cuda_check.h"
#include "cuda_event.h"
#include "scale_kernels.h"

namespace hvd {

CudaMemory::~CudaMemory() {
  if (scratch_ != nullptr) {
    CudaDeviceScope on(device_);
    cudaStreamSynchronize(stream_);
    cudaFree(scratch_);
  }
}

void CudaMemory::copy(void* dst, const void* src, size_t bytes) {
  if (dst == src || bytes == 0) return;
  CudaDeviceScope on(device_);
  HVD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

void CudaMemory::scale(void* buf, size_t count, DataType dtype, double factor) {
  CudaDeviceScope on(device_);
  launchScale(buf, count, dtype, factor, stream_);
}

void* CudaMemory::scratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return scratch_;
  CudaDeviceScope on(device_);
  // Growing is rare (the buffer only grows, up to the fusion threshold); the
  // old buffer may still be read by queued work, so wait for it first.
  if (scratch_ != nullptr) {
    HVD_CUDA_CHECK(cudaStreamSynchronize(stream_));
    HVD_CUDA_CHECK(cudaFree(scratch_));
    scratch_ = nullptr;
    scratch_bytes_ = 0;
  }
  HVD_CUDA_CHECK(cudaMalloc(&scratch_, bytes));
  scratch_bytes_ = bytes;
  return scratch_;
}

std::shared_ptr<void> CudaMemory::zeros(size_t bytes) {
  CudaDeviceScope on(device_);
  void* p = nullptr;
  HVD_CUDA_CHECK(cudaMalloc(&p, bytes > 0 ? bytes : 1));
  HVD_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
  const int device = device_;
  cudaStream_t stream = stream_;
  return std::shared_ptr<void>(p, [device, stream](void* q) {
    // Freed after the work that used it: only joined ranks' stand-ins come here.
    CudaDeviceScope on(device);
    cudaStreamSynchronize(stream);
    cudaFree(q);
  });
}

void CudaMemory::waitFor(const DeviceEvent& ready) {
  // The caller recorded `ready` on its stream after the input's producer;
  // making our stream wait keeps the host free (no cudaEventSynchronize).
  static_cast<const CudaEvent&>(ready).streamWait(stream_);
}

std::shared_ptr<DeviceEvent> CudaMemory::record() {
  return std::make_shared<CudaEvent>(device_, stream_);
}

}  // namespace hvd
