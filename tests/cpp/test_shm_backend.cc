// The shared-memory data plane (backends/shm) with its ranks as threads of
// one process: every op kind it implements (allreduce, fused allreduce with
// prescale and postscale, reduce-scatter, allgather, broadcast in and out of
// place, alltoall, barrier) on 2 and 3 ranks, several dtypes, counts from one
// element to past 1 MiB, with slots of every size class (one round or many)
// and both ways of writing the segment (slot_writes.h), checked against
// references computed in backend_checks.h.
//
// The ranks share one mapping of the segment (ShmSegment::borrow), so that
// ThreadSanitizer (make check SAN=tsan) sees each byte of the segment at one
// address on every rank and checks the plane's barriers against its reads and
// writes. One test also makes the plane through its real factory
// (tryShmBackend), with a store in memory and one mapping per rank.
#include <unistd.h>

#include <chrono>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "backend_checks.h"
#include "backends/shm/shm_backend.h"
#include "check.h"
#include "core/shm_segment.h"
#include "memory_store.h"

using namespace hvd;
using namespace hvd_test;

namespace {

EngineConfig configWith(SlotWrites writes) {
  EngineConfig config;
  config.op_timeout = kOpTimeout;
  config.start_timeout = kOpTimeout;
  config.shm_slot_writes = writes;
  return config;
}

// n ranks over one segment, each rank's plane a ShmBackend that borrows it.
struct ShmGroup {
  ShmSegment segment;  // declared first: outlives the backends that borrow it
  std::vector<std::unique_ptr<Backend>> ranks;
  std::vector<Backend*> all() const { return pointers(ranks); }
};

std::unique_ptr<ShmGroup> shmGroup(int n, size_t slot_bytes, SlotWrites writes) {
  auto g = std::make_unique<ShmGroup>();
  g->segment = ShmSegment::create(ShmSegment::uniqueName(), ShmBackend::segmentBytes(n, slot_bytes));
  g->segment.unlink();
  const std::vector<int> pids(n, static_cast<int>(::getpid()));
  std::vector<int> global(n);
  std::iota(global.begin(), global.end(), 0);
  for (int r = 0; r < n; ++r) {
    g->ranks.push_back(std::make_unique<ShmBackend>(g->segment.borrow(), slot_bytes, r, pids,
                                                    global, configWith(writes)));
  }
  return g;
}

// Just past 1 MiB: a large op's outputs are written with streaming stores.
size_t hugeCount(DataType t) { return (1u << 20) / dataTypeSize(t) + 37; }

// Every op kind over one group, small and large.
void everyOp(const std::vector<Backend*>& ranks) {
  const int n = static_cast<int>(ranks.size());
  checkAllreduceEveryDtype(ranks);
  checkAllreduce(ranks, DataType::kFloat32, ReduceOp::kSum, hugeCount(DataType::kFloat32));
  // Fused: tensors of one element to large, an empty one among them.
  for (DataType t : {DataType::kInt32, DataType::kBFloat16, DataType::kFloat32}) {
    checkAllreduceSpans(ranks, t, ReduceOp::kSum, {5, 0, 1, 700, 3}, prescaleFor(t),
                        postscaleFor(t));
    checkAllreduceSpans(ranks, t, ReduceOp::kSum, {largeCount(t), 17, largeCount(t) / 3}, 1.0,
                        postscaleFor(t));
  }
  checkAllreduceSpans(ranks, DataType::kInt8, ReduceOp::kMax, {64, 65}, prescaleFor(DataType::kInt8),
                      1.0);
  checkAllreduceSpans(ranks, DataType::kFloat64, ReduceOp::kSum,
                      {hugeCount(DataType::kFloat64), 9}, 0.5, 4.0);
  for (DataType t : {DataType::kInt64, DataType::kFloat16, DataType::kFloat32}) {
    checkReducescatter(ranks, t, ReduceOp::kSum, unevenCounts(n, 100), prescaleFor(t),
                       postscaleFor(t));
    checkReducescatter(ranks, t, ReduceOp::kSum, unevenCounts(n, largeCount(t) / n), 1.0, 1.0);
  }
  checkReducescatter(ranks, DataType::kInt32, ReduceOp::kMin, std::vector<size_t>(n, 1), 1.0, 1.0);
  for (DataType t : {DataType::kUInt8, DataType::kInt16, DataType::kFloat32, DataType::kFloat64}) {
    for (Placement p : {Placement::kApart, Placement::kOwnPlace, Placement::kAtFront}) {
      checkAllgather(ranks, t, unevenCounts(n, 3), p);
      checkAllgather(ranks, t, unevenCounts(n, largeCount(t) / n), p);
    }
  }
  checkAllgather(ranks, DataType::kInt32, std::vector<size_t>(n, hugeCount(DataType::kInt32) / n));
  for (DataType t : {DataType::kUInt8, DataType::kBFloat16, DataType::kInt64}) {
    for (int root : {0, n - 1}) {
      for (bool into : {false, true}) {
        checkBroadcast(ranks, t, 7, root, into);
        checkBroadcast(ranks, t, largeCount(t), root, into);
      }
    }
  }
  checkBroadcast(ranks, DataType::kFloat32, hugeCount(DataType::kFloat32), 1, true);
  for (DataType t : {DataType::kUInt8, DataType::kFloat16, DataType::kFloat64}) {
    checkAlltoall(ranks, t, unevenSends(n, 5));
    checkAlltoall(ranks, t, unevenSends(n, static_cast<int64_t>(largeCount(t) / n)));
  }
  checkAlltoall(ranks, DataType::kInt32, sendsWithIdleRank(n, 11, n - 1));
  checkBarrier(ranks, 3);
}

// ---------------------------------------------------------------- tests

// The plane's default slot (256 KiB): small ops in one round, large in several.
TEST(every_op_2_ranks_default_slots) {
  auto g = shmGroup(2, 256 << 10, SlotWrites::kAuto);
  everyOp(g->all());
}

TEST(every_op_3_ranks_default_slots) {
  auto g = shmGroup(3, 256 << 10, SlotWrites::kAuto);
  everyOp(g->all());
}

// Small slots: every op in many rounds, pieces of a few cache lines, with
// every large op's writes streamed.
TEST(every_op_3_ranks_small_slots_streamed) {
  auto g = shmGroup(3, 4 << 10, SlotWrites::kStreamed);
  everyOp(g->all());
}

TEST(every_op_2_ranks_large_slots_cached) {
  auto g = shmGroup(2, 1 << 20, SlotWrites::kCached);
  everyOp(g->all());
}

// The smallest slots the plane takes: one cache line per rank, so an
// alltoall's line-sized pieces just fit and an allreduce's pieces are a line.
TEST(smallest_slots_3_ranks) {
  auto g = shmGroup(3, 3 * 64, SlotWrites::kAuto);
  const auto ranks = g->all();
  checkAllreduce(ranks, DataType::kFloat64, ReduceOp::kSum, 100);
  checkAllreduceSpans(ranks, DataType::kInt16, ReduceOp::kSum, {33, 0, 31}, 3.0, 0.5);
  checkReducescatter(ranks, DataType::kInt32, ReduceOp::kSum, unevenCounts(3, 20), 1.0, 1.0);
  checkAllgather(ranks, DataType::kUInt8, unevenCounts(3, 70), Placement::kAtFront);
  checkBroadcast(ranks, DataType::kFloat32, 100, 2, false);
  checkAlltoall(ranks, DataType::kUInt8, unevenSends(3, 50));
  checkAlltoall(ranks, DataType::kInt64, unevenSends(3, 30));
}

// Slots of less than a line per rank would cut pieces that overrun the next
// rank's slot (an alltoall's pieces are at least a line): refused.
TEST(slots_under_a_line_per_rank_are_refused) {
  ShmSegment segment = ShmSegment::create(ShmSegment::uniqueName(), ShmBackend::segmentBytes(3, 64));
  segment.unlink();
  const std::vector<int> pids(3, static_cast<int>(::getpid()));
  CHECK_THROWS(ShmBackend(segment.borrow(), 64, 0, pids, {0, 1, 2}, configWith(SlotWrites::kAuto)),
               std::invalid_argument);
  CHECK_THROWS(ShmBackend(segment.borrow(), 200, 0, pids, {0, 1, 2}, configWith(SlotWrites::kAuto)),
               std::invalid_argument);
}

// HVD_TORCH_SHM_SLOT_BYTES=1 on 3 ranks: the factory rounds it up to a line
// per rank (it once made 64-byte slots, whose alltoall pieces overran).
TEST(factory_rounds_tiny_slots_up_3_ranks) {
  auto state = std::make_shared<MemoryStoreState>();
  auto made = makeRanks(3, [&](int r) -> std::unique_ptr<Backend> {
    Topology t;
    t.rank = r;
    t.size = 3;
    MemoryStore store(state);
    EngineConfig config = configWith(SlotWrites::kAuto);
    config.shm_slot_bytes = 1;
    return tryShmBackend(t, config, store, "hvd/0/set0/");
  });
  if (made.empty()) return;
  const auto ranks = pointers(made);
  checkAlltoall(ranks, DataType::kUInt8, unevenSends(3, 50));
  checkAllreduce(ranks, DataType::kFloat64, ReduceOp::kSum, 100);
}

// Through the factory the engine uses: the members agree through the store,
// rank 0 makes the segment and the others map it by name.
TEST(factory_over_a_store_3_ranks) {
  auto state = std::make_shared<MemoryStoreState>();
  auto made = makeRanks(3, [&](int r) -> std::unique_ptr<Backend> {
    Topology t;
    t.rank = r;
    t.size = 3;
    MemoryStore store(state);
    EngineConfig config = configWith(SlotWrites::kAuto);
    config.shm_slot_bytes = 8 << 10;
    return tryShmBackend(t, config, store, "hvd/0/set0/");
  });
  if (made.empty()) return;
  CHECK_EQ(std::string(made[0]->name()), "shm");
  const auto ranks = pointers(made);
  checkAllreduce(ranks, DataType::kFloat32, ReduceOp::kSum, 20000);
  checkAllgather(ranks, DataType::kInt32, unevenCounts(3, 5000));
  checkAlltoall(ranks, DataType::kFloat16, unevenSends(3, 3000));
  checkBarrier(ranks, 2);
}

}  // namespace

int main() { return check::runAll(); }
