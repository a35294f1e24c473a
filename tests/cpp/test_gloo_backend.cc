// The Gloo data plane (backends/gloo, over Debian's libgloo) with its ranks
// as threads of one process: each rank builds its own full-mesh context over
// loopback TCP through its real factory (makeGlooBackend), meeting the others
// through a store in memory. Every op kind it implements (allreduce,
// allgather, broadcast, alltoall, barrier, and its own ring reduce-scatter
// with prescale and postscale) on 2 and 3 ranks, several dtypes (Gloo moves
// elements by width: 1, 2, 4 and 8 bytes), counts from one element to past
// the reduce-scatter's 4 MiB segment, checked against references computed in
// backend_checks.h.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "backend_checks.h"
#include "backends/gloo/gloo_backend.h"
#include "check.h"
#include "memory_store.h"

using namespace hvd;
using namespace hvd_test;

namespace {

std::vector<std::unique_ptr<Backend>> glooRanks(int n) {
  auto state = std::make_shared<MemoryStoreState>();
  return makeRanks(n, [&](int r) -> std::unique_ptr<Backend> {
    Topology t;  // cross_size 1: one host, so Gloo listens on loopback only
    t.rank = r;
    t.size = n;
    EngineConfig config;
    config.op_timeout = kOpTimeout;
    config.start_timeout = kOpTimeout;
    MemoryStore store(state);
    return makeGlooBackend(t, config, store, "hvd/0/set0/");
  });
}

void everyOp(const std::vector<Backend*>& ranks) {
  const int n = static_cast<int>(ranks.size());
  CHECK(!ranks[0]->directForms());
  checkAllreduceEveryDtype(ranks);
  for (DataType t : {DataType::kInt8, DataType::kInt64, DataType::kBFloat16, DataType::kFloat32}) {
    checkReducescatter(ranks, t, ReduceOp::kSum, unevenCounts(n, 100), prescaleFor(t),
                       postscaleFor(t));
    checkReducescatter(ranks, t, ReduceOp::kSum, unevenCounts(n, largeCount(t) / n), 1.0,
                       postscaleFor(t));
  }
  checkReducescatter(ranks, DataType::kFloat16, ReduceOp::kMax, std::vector<size_t>(n, 1), 1.0,
                     1.0);
  // Blocks past Gloo's 4 MiB segment: the ring sends and receives each in
  // several segments, alternating landing halves.
  checkReducescatter(ranks, DataType::kUInt8, ReduceOp::kSum,
                     std::vector<size_t>(n, (9u << 20) / 2), 1.0, 1.0);
  for (DataType t : {DataType::kUInt8, DataType::kInt16, DataType::kFloat32, DataType::kFloat64}) {
    checkAllgather(ranks, t, unevenCounts(n, 3));
    checkAllgather(ranks, t, unevenCounts(n, largeCount(t) / n));
  }
  checkAllgather(ranks, DataType::kInt32, std::vector<size_t>(n, 5), Placement::kOwnPlace);
  for (DataType t : {DataType::kUInt8, DataType::kBFloat16, DataType::kInt64}) {
    for (int root : {0, n - 1}) {
      checkBroadcast(ranks, t, 7, root, false);
      checkBroadcast(ranks, t, largeCount(t), root, false);
    }
  }
  for (DataType t : {DataType::kUInt8, DataType::kFloat16, DataType::kFloat32, DataType::kFloat64}) {
    checkAlltoall(ranks, t, unevenSends(n, 5));
    checkAlltoall(ranks, t, unevenSends(n, static_cast<int64_t>(largeCount(t) / n)));
  }
  checkAlltoall(ranks, DataType::kInt32, sendsWithIdleRank(n, 11, n - 1));
  checkBarrier(ranks, 3);
}

TEST(every_op_2_ranks) {
  auto made = glooRanks(2);
  if (made.empty()) return;
  CHECK_EQ(std::string(made[0]->name()), "gloo");
  everyOp(pointers(made));
}

TEST(every_op_3_ranks) {
  auto made = glooRanks(3);
  if (made.empty()) return;
  everyOp(pointers(made));
}

// A job of one: every op is a copy, and the reduce-scatter's ring has no step.
TEST(every_op_1_rank) {
  auto made = glooRanks(1);
  if (made.empty()) return;
  const auto ranks = pointers(made);
  checkAllreduce(ranks, DataType::kFloat32, ReduceOp::kSum, 100);
  checkReducescatter(ranks, DataType::kInt32, ReduceOp::kSum, {50}, 3.0, 0.5);
  checkAllgather(ranks, DataType::kUInt8, {9});
  checkBroadcast(ranks, DataType::kInt64, 9, 0, false);
  checkAlltoall(ranks, DataType::kFloat64, {{4}});
  checkBarrier(ranks, 1);
}

// The Gloo our calls bound to is a shared object on disk (the Python layer
// compares it with torch's own).
TEST(gloo_library_path_names_a_shared_object) {
  const std::string path = glooLibraryPath();
  CHECK(path.find("libgloo") != std::string::npos);
}

}  // namespace

int main() { return check::runAll(); }
