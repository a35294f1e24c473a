// The shared-memory data plane for the ranks of one host: every collective
// goes through one segment that all of them map (shm_segment.h), in rounds,
// with barriers on counters in that segment (shm_sync.h).
//
// The segment holds two buffers (used by alternate rounds, so one barrier per
// round separates writers from readers), each with one slot per rank and a
// result slot of slot_bytes. An allreduce splits the tensor into one part per
// rank; in each round every rank copies its piece of every other rank's part
// into its slot, then reduces the pieces of its own part (its own piece
// straight from its input) from all slots into the result slot, then copies
// every part's result into its output. An alltoall's own block, likewise,
// goes from input to output without the segment. Bytes moved per rank for N
// bytes on n ranks: N(n-1)/n in, N read to reduce, N out; no socket, no kernel.
// Protocol and costs: docs/architecture.md, "Shared memory".
//
// Threading: made on the init() thread, then used only by the thread that holds
// the engine's baton (its background thread or a caller driving its op,
// engine.h: one at a time).
#pragma once

#include <memory>
#include <vector>

#include "../../core/backend.h"
#include "../../core/shm_segment.h"
#include "../../core/slot_writes.h"
#include "shm_sync.h"

namespace hvd {

class ShmBackend : public Backend {
 public:
  // rank/size: this rank's position in the set; pids and ranks (global) of
  // every position. The segment is already mapped by every member.
  ShmBackend(ShmSegment segment, size_t slot_bytes, int rank, const std::vector<int>& pids,
             const std::vector<int>& ranks, const EngineConfig& config);

  const char* name() const override { return "shm"; }
  bool directForms() const override { return true; }
  void allreduce(void* buf, size_t count, DataType dtype, ReduceOp op) override;
  bool allreduceSpans(const std::vector<Span>& spans, DataType dtype, ReduceOp op,
                      double prescale, double postscale) override;
  bool reducescatter(const void* in, void* out, const std::vector<size_t>& counts,
                     DataType dtype, ReduceOp op, double prescale, double postscale) override;
  void allgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                  DataType dtype) override;
  void broadcast(void* buf, size_t count, DataType dtype, int root) override;
  bool broadcastInto(const void* in, void* out, size_t count, DataType dtype,
                     int root) override;
  void alltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                 const std::vector<int64_t>& recv_counts, DataType dtype) override;
  void barrier() override;
  // Peers waiting for this rank fail now, naming it (ShmSync::abandon).
  void abort() override { sync_.abandon(); }

  // The segment's size for `ranks` ranks and slots of slot_bytes.
  static size_t segmentBytes(int ranks, size_t slot_bytes);

 private:
  char* slot(int buffer, int rank) const;
  char* result(int buffer) const;
  int nextBuffer() { return static_cast<int>(rounds_++ & 1); }
  // The largest of every rank's `value` (one extra barrier).
  uint64_t maxOverRanks(uint64_t value, const char* what);

  ShmSegment segment_;
  ShmControl* control_;
  char* data_;
  size_t slot_bytes_;
  // Each op kind's way of writing the segment (slot_writes.h).
  enum { kAllreduceWrites, kReducescatterWrites, kAllgatherWrites, kBroadcastWrites,
         kAlltoallWrites, kWriteKinds };
  SlotWriteChooser writes_[kWriteKinds];
  std::vector<char> scratch_;  // a streamed allreduce's sums, before they go to the segment
  int rank_;
  int size_;
  ShmSync sync_;
  uint64_t rounds_ = 0;
};

// Makes a ShmBackend for the group of `topology` (its rank and size) when
// every member can map one segment and watch the others' processes (one
// machine, one pid and IPC namespace), agreeing through the store under
// `prefix`; null otherwise (every member reaches the same answer).
std::unique_ptr<Backend> tryShmBackend(const Topology& topology, const EngineConfig& config,
                                       StoreClient& store, const std::string& prefix);

}  // namespace hvd
