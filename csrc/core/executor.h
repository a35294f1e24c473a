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
  // backend may be null when size == 1 (everything is local).
  Executor(Backend* backend, int size, int rank = 0) : backend_(backend), size_(size), rank_(rank) {}

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
  std::vector<char> fusion_buffer_;
};

}  // namespace hvd
