// The data plane: collectives over raw buffers, one implementation per
// transport (backends/gloo for host memory, backends/nccl for CUDA memory).
// The engine calls a backend only from the thread that holds its baton (one
// at a time), in the order the coordinator dictated, so every rank calls the
// same collectives in the same order. A host backend's methods block until done; a device backend's
// enqueue the collective on the stream its Memory (device.h) uses and return.
// Both throw std::exception on failure (a dead peer, a timeout); the engine
// turns that into a peer-failure status.
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
  // One tensor of a fused op: `count` elements read at `in`, the result
  // written at `out` (in may equal out).
  struct Span {
    const void* in;
    void* out;
    size_t count;
  };

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

  // Direct forms, for a host backend that can read every input and write
  // every output itself (no fusion buffer, no copy into the output first).
  // Offered when directForms() is true; otherwise they return false and the
  // executor packs a buffer and calls the forms above.
  virtual bool directForms() const { return false; }
  //
  // Reduces the concatenation of the spans' inputs over all ranks into their
  // outputs; each rank's input counts times prescale, the result is
  // multiplied by postscale (scaleBuffer's rules). op: as allreduce().
  virtual bool allreduceSpans(const std::vector<Span>& /*spans*/, DataType /*dtype*/,
                              ReduceOp /*op*/, double /*prescale*/, double /*postscale*/) {
    return false;
  }
  // Offered by any backend that has it (not only direct ones): `in` holds
  // counts[r] elements for each rank r, in rank order; `out` receives this
  // rank's block reduced over all ranks, scaled as above.
  virtual bool reducescatter(const void* /*in*/, void* /*out*/,
                             const std::vector<size_t>& /*counts*/, DataType /*dtype*/,
                             ReduceOp /*op*/, double /*prescale*/, double /*postscale*/) {
    return false;
  }
  // A direct broadcast out of place: `out` receives the root's `in` on every
  // rank (the root's too; `in` is read on the root only).
  virtual bool broadcastInto(const void* /*in*/, void* /*out*/, size_t /*count*/,
                             DataType /*dtype*/, int /*root*/) {
    return false;
  }
  // Called once the job is known to be broken: a device backend stops work
  // that waits on the dead peer (it would otherwise spin on the GPU forever);
  // the shared-memory plane tells this host's peers that wait for this rank
  // (they would otherwise wait out the op timeout). Unusable after it.
  virtual void abort() {}
};

// How the engine obtains its backend once the ranks have met: the store is
// connected and `prefix` is unique to this init() generation.
using BackendFactory = std::function<std::unique_ptr<Backend>(
    const Topology&, const EngineConfig&, StoreClient& store, const std::string& prefix)>;

class Memory;

// A device's data plane: its collectives and its buffer work, on one stream.
struct DevicePlane {
  std::unique_ptr<Memory> memory;
  std::unique_ptr<Backend> backend;
};

// How the engine obtains a device plane for a process set, the first time an
// op of the set runs on device memory (`device`: this rank's CUDA index).
// `set` holds this rank's position and the set's size. Every member runs
// that response at the same point of the one order, so a rendezvous inside
// (NCCL's unique id through the store under `prefix`) meets. store is null
// in a one-process job.
using DevicePlaneFactory = std::function<DevicePlane(
    int device, const Topology& set, const EngineConfig&, StoreClient* store,
    const std::string& prefix)>;

}  // namespace hvd
