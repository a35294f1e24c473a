// A CUDA event as the engine carries it (core/device.h). Recorded on one
// stream, waited for by another stream (cudaStreamWaitEvent: no host wait)
// or by a host thread (synchronize).
//
// Threading: record() once, on the thread that owns the stream; afterwards
// any thread may wait on it.
#pragma once

#include <cuda_runtime_api.h>

#include "../../core/device.h"

namespace hvd {

class CudaEvent : public DeviceEvent {
 public:
  // Creates the event on `device` and records it on `stream`.
  CudaEvent(int device, cudaStream_t stream);
  ~CudaEvent() override;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  void synchronize() const override;
  // Work issued on `stream` after this call runs after the recorded work.
  void streamWait(cudaStream_t stream) const;
  int device() const { return device_; }

 private:
  int device_;
  cudaEvent_t event_ = nullptr;
};

}  // namespace hvd
