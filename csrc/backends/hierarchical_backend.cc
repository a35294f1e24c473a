#include "hierarchical_backend.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <stdexcept>

#include "../core/reduction_plan.h"

namespace hvd {

HierarchicalBackend::HierarchicalBackend(HostLayout layout, int rank,
                                         std::unique_ptr<Backend> local,
                                         std::unique_ptr<Backend> leaders,
                                         std::unique_ptr<Backend> all, bool allreduce_split,
                                         bool allgather_split)
    : layout_(std::move(layout)),
      rank_(rank),
      host_(layout_.host_of[rank]),
      local_(std::move(local)),
      leaders_(std::move(leaders)),
      all_(std::move(all)),
      allreduce_split_(allreduce_split),
      allgather_split_(allgather_split) {}

void HierarchicalBackend::allreduce(void* buf, size_t count, DataType dtype, ReduceOp op) {
  if (!allreduce_split_) return all_->allreduce(buf, count, dtype, op);
  if (local_) local_->allreduce(buf, count, dtype, op);
  if (leaders_) leaders_->allreduce(buf, count, dtype, op);
  if (local_) local_->broadcast(buf, count, dtype, 0);
}

void HierarchicalBackend::allgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                                     DataType dtype) {
  if (!allgather_split_) return all_->allgatherv(in, out, counts, dtype);
  const size_t elem = dataTypeSize(dtype);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  // Host-major order: host 0's members, then host 1's, ...
  std::vector<size_t> host_counts;
  for (const auto& m : layout_.members) {
    size_t c = 0;
    for (int p : m) c += counts[p];
    host_counts.push_back(c);
  }
  size_t host_first = 0;
  for (int h = 0; h < host_; ++h) host_first += host_counts[h];
  staging_.resize(total * elem);
  char* staged = staging_.data();
  const std::vector<int>& mine = layout_.members[host_];
  if (local_) {
    std::vector<size_t> local_counts;
    for (int p : mine) local_counts.push_back(counts[p]);
    local_->allgatherv(in, staged + host_first * elem, local_counts, dtype);
  } else if (counts[rank_] > 0) {
    // An empty input may have no storage: memcpy from null is undefined even
    // for 0 bytes (UBSan, test_hierarchical_backend).
    std::memcpy(staged + host_first * elem, in, counts[rank_] * elem);
  }
  if (leaders_) {
    const char* block = staged + host_first * elem;
    std::vector<char> own(block, block + host_counts[host_] * elem);
    leaders_->allgatherv(own.data(), staged, host_counts, dtype);
  }
  if (local_) local_->broadcast(staged, total, dtype, 0);
  // Into rank order.
  std::vector<size_t> first(counts.size(), 0);
  for (size_t r = 1; r < counts.size(); ++r) first[r] = first[r - 1] + counts[r - 1];
  size_t at = 0;
  for (const auto& m : layout_.members) {
    for (int p : m) {
      std::memcpy(static_cast<char*>(out) + first[p] * elem, staged + at * elem,
                  counts[p] * elem);
      at += counts[p];
    }
  }
}

bool HierarchicalBackend::reducescatter(const void* in, void* out,
                                        const std::vector<size_t>& counts, DataType dtype,
                                        ReduceOp op, double prescale, double postscale) {
  if (!allreduce_split_) return all_->reducescatter(in, out, counts, dtype, op, prescale, postscale);
  // Sum inside the host (memory only), reduce-scatter host segments between
  // the leaders (each host's segment: its members' blocks), then the leader
  // passes its segment to its host. Between hosts a leader sends (h-1)/h of
  // the tensor, half of what the hierarchical allreduce's leaders send.
  const size_t elem = dataTypeSize(dtype);
  std::vector<size_t> first(counts.size(), 0);  // rank order
  for (size_t r = 1; r < counts.size(); ++r) first[r] = first[r - 1] + counts[r - 1];
  const size_t total = first.back() + counts.back();
  std::vector<size_t> host_counts;
  size_t host_first = 0, mine_in_segment = 0;
  staging_.resize(total * elem);
  char* staged = staging_.data();  // host-major order: host 0's members' blocks, then host 1's...
  size_t at = 0;
  for (size_t h = 0; h < layout_.members.size(); ++h) {
    if (static_cast<int>(h) == host_) host_first = at;
    size_t c = 0;
    for (int p : layout_.members[h]) {
      if (p == rank_) mine_in_segment = c;
      std::memcpy(staged + at * elem, static_cast<const char*>(in) + first[p] * elem,
                  counts[p] * elem);
      at += counts[p];
      c += counts[p];
    }
    host_counts.push_back(c);
  }
  // Rank order within the host (shared memory), ring order between the leaders.
  const ReductionPlan plan(dtype, op, prescale, postscale, 1);  // Average folded: divisor 1
  plan.prescale(staged, total);
  if (local_) local_->allreduce(staged, total, dtype, op);
  char* segment = staged + host_first * elem;
  if (leaders_) {
    std::vector<char> reduced(host_counts[host_] * elem);
    if (!leaders_->reducescatter(staged, reduced.data(), host_counts, dtype, op, 1.0, 1.0))
      throw std::runtime_error("reducescatter: the leaders' plane has no reduce-scatter");
    if (!reduced.empty()) std::memcpy(segment, reduced.data(), reduced.size());
  }
  if (local_) local_->broadcast(segment, host_counts[host_], dtype, 0);
  if (counts[rank_] > 0) std::memcpy(out, segment + mine_in_segment * elem, counts[rank_] * elem);
  plan.finish(out, counts[rank_]);
  return true;
}

void HierarchicalBackend::broadcast(void* buf, size_t count, DataType dtype, int root) {
  const int root_host = layout_.host_of[root];
  const std::vector<int>& mine = layout_.members[host_];
  if (host_ == root_host && local_) {
    const int local_root =
        static_cast<int>(std::find(mine.begin(), mine.end(), root) - mine.begin());
    local_->broadcast(buf, count, dtype, local_root);
  }
  if (leaders_) leaders_->broadcast(buf, count, dtype, root_host);
  if (host_ != root_host && local_) local_->broadcast(buf, count, dtype, 0);
}

void HierarchicalBackend::alltoallv(const void* in, const std::vector<int64_t>& send_counts,
                                    void* out, const std::vector<int64_t>& recv_counts,
                                    DataType dtype) {
  all_->alltoallv(in, send_counts, out, recv_counts, dtype);
}

void HierarchicalBackend::barrier() { all_->barrier(); }

}  // namespace hvd
