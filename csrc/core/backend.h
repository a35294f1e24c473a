// The data plane: collectives over raw buffers, one implementation per
// transport (backends/gloo today; NCCL and shared memory later). The engine
// calls a backend only from its background thread, in the order the
// coordinator dictated, so every rank calls the same collectives in the same
// order. Methods block until done and throw std::exception on failure (a dead
// peer, a timeout); the engine turns that into a peer-failure status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "topology.h"
#include "types.h"

namespace hvd {

class StoreClient;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // In place over all ranks. op is Sum, Min, Max or Product (the engine does
  // Average as Sum followed by a division).
  virtual void allreduce(void* buf, size_t count, DataType dtype, ReduceOp op) = 0;
  // Concatenates each rank's `counts[r]` elements into `out` in rank order.
  virtual void allgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                          DataType dtype) = 0;
  virtual void broadcast(void* buf, size_t count, DataType dtype, int root) = 0;
  // Sends send_counts[r] elements (consecutive, in rank order) to rank r and
  // receives recv_counts[r] elements from rank r into `out`, in rank order.
  virtual void alltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                         const std::vector<int64_t>& recv_counts, DataType dtype) = 0;
  virtual void barrier() = 0;
};

// How the engine obtains its backend once the ranks have met: the store is
// connected and `prefix` is unique to this init() generation.
using BackendFactory = std::function<std::unique_ptr<Backend>(
    const Topology&, const EngineConfig&, StoreClient& store, const std::string& prefix)>;

}  // namespace hvd
