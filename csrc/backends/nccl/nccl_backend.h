// The data plane for CUDA tensors: one NCCL communicator per process set on
// this rank's GPU, on the stream its CudaMemory uses. Collectives are
// enqueued and return at once (core/backend.h, device backends).
//
// Threading: made and used by the thread that holds the engine's baton (its
// background thread or a caller driving its op, engine.h: one at a time).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "../../core/backend.h"

namespace hvd {

class NcclBackend : public Backend {
 public:
  NcclBackend(int device, cudaStream_t stream, ncclComm_t comm, int size)
      : device_(device), stream_(stream), comm_(comm), size_(size) {}
  ~NcclBackend() override;

  const char* name() const override { return "nccl"; }
  void allreduce(void* buf, size_t count, DataType dtype, ReduceOp op) override;
  void allgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                  DataType dtype) override;
  void broadcast(void* buf, size_t count, DataType dtype, int root) override;
  void alltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                 const std::vector<int64_t>& recv_counts, DataType dtype) override;
  void barrier() override;
  void abort() override;

 private:
  int device_;
  cudaStream_t stream_;
  ncclComm_t comm_;
  int size_;
  bool aborted_ = false;
};

// Whether NCCL has a type for `dtype` (int16 has none: such tensors take the
// host-staged plane).
bool ncclSupports(DataType dtype);

// The device plane of one process set: a communicator made through the store
// (the set's first member draws NCCL's unique id and publishes it under
// `prefix`), a CudaMemory and an NcclBackend on `stream`.
DevicePlane makeNcclPlane(int device, cudaStream_t stream, const Topology& set,
                          const EngineConfig& config, StoreClient* store,
                          const std::string& prefix);

}  // namespace hvd
