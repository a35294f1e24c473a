// Runs a negotiated response over this rank's entries through the backend,
// packing fused allreduces into one reusable fusion buffer. The same code
// serves host and device memory: every copy and scaling goes through Memory
// (device.h), which on a device only enqueues work on the backend's stream.
//
// Threading: the thread that holds the engine's baton (its background thread or
// a caller driving its op, engine.h: one at a time) only.
#pragma once

#include <vector>

#include "backend.h"
#include "device.h"
#include "entry.h"
#include "message.h"
#include "timeline.h"

namespace hvd {

class Executor {
 public:
  // backend may be null when size == 1 (everything is local). rank is this
  // rank's position in the process set whose global ranks are `ranks`
  // (empty: the global set, where positions are the global ranks). memory
  // null: host memory owned by the executor.
  Executor(Backend* backend, int size, int rank = 0, std::vector<int> ranks = {},
           Memory* memory = nullptr)
      : backend_(backend),
        size_(size),
        rank_(rank),
        ranks_(std::move(ranks)),
        host_(memory ? nullptr : std::make_shared<HostMemory>()),
        memory_(memory ? memory : host_.get()) {}

  Memory& memory() { return *memory_; }

  // Throws what the backend throws (a peer failure). timeline: rank 0's,
  // which records the copies and the collective on each name's row.
  void execute(const Response& response, const std::vector<Entry*>& entries,
               Timeline* timeline = nullptr);

 private:
  void allreduce(const std::vector<Entry*>& entries, int divisor);
  // dims: each rank's first dimension (Response::rank_first_dims).
  void allgather(const std::vector<int64_t>& dims, Entry& entry);
  void broadcast(Entry& entry);
  void packInputs(const std::vector<Backend::Span>& spans, size_t elem, char* buf);
  void unpackOutputs(const std::vector<Backend::Span>& spans, size_t elem, const char* buf);
  void allgatherFused(const Response& response, const std::vector<Entry*>& entries);
  void broadcastFused(const std::vector<Entry*>& entries);
  // matrix: every rank's splits (Response::alltoall_splits).
  void alltoall(const std::vector<int64_t>& matrix, Entry& entry);
  void reducescatter(Entry& entry, int divisor);

  Backend* backend_;
  int size_;
  int rank_;
  std::vector<int> ranks_;
  std::shared_ptr<HostMemory> host_;  // shared: executors are copied into place
  Memory* memory_;
  // While execute() runs with a recording timeline: it, the rows of the
  // response's names, and the collective's phase ("GLOO_ALLREDUCE").
  Timeline* timeline_ = nullptr;
  std::vector<std::string> rows_;
  std::string collective_;
  std::vector<Backend::Span> spans_;  // allreduce's, kept for its capacity
};

}  // namespace hvd
