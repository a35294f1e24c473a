// The hierarchical host plane (backends/hierarchical_backend) with its ranks
// as threads of one process, split into "hosts" by the host name each rank
// publishes (EngineConfig::hostname): makeHostBackend, the factory the engine
// uses, gives each host of several ranks a shared-memory plane, the first
// rank of each host a Gloo context with the other hosts' first ranks, and
// every rank a Gloo context over all (loopback TCP), meeting through a store
// in memory. Every op kind on two hosts of 3 and 4 ranks (a host of one rank
// among them, and hosts whose ranks interleave), against the references of
// backend_checks.h.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "backend_checks.h"
#include "backends/host_backend.h"
#include "check.h"
#include "memory_store.h"

using namespace hvd;
using namespace hvd_test;

namespace {

// One rank per entry of `hosts`, named by it.
std::vector<std::unique_ptr<Backend>> hostRanks(const std::vector<std::string>& hosts,
                                                bool split_gather = true) {
  const int n = static_cast<int>(hosts.size());
  auto state = std::make_shared<MemoryStoreState>();
  return makeRanks(n, [&](int r) -> std::unique_ptr<Backend> {
    Topology t;  // cross_size 1: Gloo listens on loopback only
    t.rank = r;
    t.size = n;
    EngineConfig config;
    config.op_timeout = kOpTimeout;
    config.start_timeout = kOpTimeout;
    config.hostname = hosts[r];
    config.hierarchical_allgather = split_gather;
    config.shm_slot_bytes = 16 << 10;  // large ops take several rounds
    MemoryStore store(state);
    return makeHostBackend(t, config, store, "hvd/0/set0/");
  });
}

void everyOp(const std::vector<Backend*>& ranks) {
  const int n = static_cast<int>(ranks.size());
  for (DataType t : {DataType::kUInt8, DataType::kInt32, DataType::kFloat16, DataType::kFloat64}) {
    for (size_t count : {size_t{1}, size_t{1000}, largeCount(t)})
      checkAllreduce(ranks, t, ReduceOp::kSum, count);
  }
  checkAllreduce(ranks, DataType::kFloat32, ReduceOp::kMax, 77);
  checkAllreduce(ranks, DataType::kInt64, ReduceOp::kProduct, 77);
  for (DataType t : {DataType::kInt32, DataType::kBFloat16}) {
    checkReducescatter(ranks, t, ReduceOp::kSum, unevenCounts(n, 50), prescaleFor(t),
                       postscaleFor(t));
    checkReducescatter(ranks, t, ReduceOp::kSum, unevenCounts(n, largeCount(t) / n), 1.0, 1.0);
  }
  for (DataType t : {DataType::kUInt8, DataType::kFloat32}) {
    checkAllgather(ranks, t, unevenCounts(n, 3));
    checkAllgather(ranks, t, unevenCounts(n, largeCount(t) / n));
  }
  // The last rank's host holding nothing (in the first layout, a host of one).
  std::vector<size_t> none_last = unevenCounts(n, 40);
  none_last[n - 1] = 0;
  checkAllgather(ranks, DataType::kInt64, none_last);
  checkReducescatter(ranks, DataType::kFloat32, ReduceOp::kSum, none_last, 0.5, 4.0);
  for (int root = 0; root < n; ++root) {  // a root on every host, leader or not
    checkBroadcast(ranks, DataType::kInt16, 9, root, false);
    checkBroadcast(ranks, DataType::kInt16, largeCount(DataType::kInt16), root, false);
  }
  checkAlltoall(ranks, DataType::kFloat32, unevenSends(n, 7));
  checkAlltoall(ranks, DataType::kUInt8, unevenSends(n, static_cast<int64_t>(largeCount(DataType::kUInt8) / n)));
  checkAlltoall(ranks, DataType::kInt32, sendsWithIdleRank(n, 11, n - 1));
  checkBarrier(ranks, 2);
}

// Host a: ranks 0 and 1 (shared memory); host b: rank 2 alone.
TEST(two_hosts_of_2_and_1) {
  auto made = hostRanks({"a", "a", "b"});
  if (made.empty()) return;
  CHECK_EQ(std::string(made[0]->name()), "shm+gloo");
  everyOp(pointers(made));
}

// Host a: ranks 0 and 3; host b: ranks 1 and 2. Gathers reorder host-major
// blocks into rank order; host b's leader is rank 1.
TEST(two_interleaved_hosts_of_2) {
  auto made = hostRanks({"a", "b", "b", "a"});
  if (made.empty()) return;
  CHECK_EQ(std::string(made[2]->name()), "shm+gloo");
  everyOp(pointers(made));
}

// HOROVOD_HIERARCHICAL_ALLGATHER=0: allgather over the all-ranks context,
// the rest still split.
TEST(allgather_not_split) {
  auto made = hostRanks({"a", "a", "b"}, false);
  if (made.empty()) return;
  const auto ranks = pointers(made);
  checkAllgather(ranks, DataType::kInt32, unevenCounts(3, 1000));
  checkAllreduce(ranks, DataType::kFloat32, ReduceOp::kSum, 1000);
}

}  // namespace

int main() { return check::runAll(); }
