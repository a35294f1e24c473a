#include "cuda_event.h"

#include "cuda_check.h"

namespace hvd {

CudaEvent::CudaEvent(int device, cudaStream_t stream) : device_(device) {
  CudaDeviceScope on(device);
  // No timing: a timing event costs more to record and we never read times.
  HVD_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  HVD_CUDA_CHECK(cudaEventRecord(event_, stream));
}

CudaEvent::~CudaEvent() {
  // Destroying an event whose work is pending is allowed: CUDA releases it
  // once the work is done.
  if (event_ != nullptr) cudaEventDestroy(event_);
}

void CudaEvent::synchronize() const { HVD_CUDA_CHECK(cudaEventSynchronize(event_)); }

void CudaEvent::streamWait(cudaStream_t stream) const {
  HVD_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0));
}

}  // namespace hvd
