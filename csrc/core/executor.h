// Runs a negotiated response over this rank's entries through the backend,
// packing fused allreduces into one reusable fusion buffer.
//
// Threading: the engine's background thread only.
#pragma once

#include <vector>

#include "backend.h"
#include "entry.h"
#include "message.h"

namespace hvd {

class Executor {
 public:
  // backend may be null when size == 1 (everything is local). rank is this
  // rank's position in the process set whose global ranks are `ranks`
  // (empty: the global set, where positions are the global ranks).
  Executor(Backend* backend, int size, int rank = 0, std::vector<int> ranks = {})
      : backend_(backend), size_(size), rank_(rank), ranks_(std::move(ranks)) {}

  // Throws what the backend throws (a peer failure).
  void execute(const Response& response, const std::vector<Entry*>& entries);

 private:
  void allreduce(const std::vector<Entry*>& entries, int divisor);
  void allgather(const Response& response, Entry& entry);
  void broadcast(Entry& entry);
  void alltoall(const Response& response, Entry& entry);
  void reducescatter(Entry& entry, int divisor);

  Backend* backend_;
  int size_;
  int rank_;
  std::vector<int> ranks_;
  std::vector<char> fusion_buffer_;
};

}  // namespace hvd
