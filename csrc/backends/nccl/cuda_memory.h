// Memory (core/device.h) on one CUDA device: every call enqueues work on the
// plane's stream, the one NcclBackend uses, and returns without waiting.
//
// Threading: the thread that holds the engine's baton (its background thread or
// a caller driving its op, engine.h: one at a time) only.
#pragma once

#include <cuda_runtime_api.h>

#include "../../core/device.h"

namespace hvd {

class CudaMemory : public Memory {
 public:
  // `stream` belongs to the caller (the torch layer's stream pool) and must
  // outlive this object.
  CudaMemory(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  ~CudaMemory() override;

  void copy(void* dst, const void* src, size_t bytes) override;
  void scale(void* buf, size_t count, DataType dtype, double factor) override;
  void* scratch(size_t bytes) override;
  std::shared_ptr<void> zeros(size_t bytes) override;
  void waitFor(const DeviceEvent& ready) override;
  std::shared_ptr<DeviceEvent> record() override;

 private:
  int device_;
  cudaStream_t stream_;
  void* scratch_ = nullptr;  // the fusion buffer, on the device
  size_t scratch_bytes_ = 0;
};

}  // namespace hvd
