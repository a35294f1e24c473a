#include "fusion.h"

namespace hvd {

namespace {

// Allreduce, allgather and broadcast fuse: one collective over a packed
// buffer (executor.cc) instead of one per tensor.
bool fusable(const ReadyOp& op) {
  const OpType t = op.response.type;
  return op.response.kind == Response::kExecute &&
         (t == OpType::kAllreduce || t == OpType::kAllgather || t == OpType::kBroadcast);
}

bool sameGroup(const Request& a, const Request& b) {
  return a.type == b.type && a.dtype == b.dtype && a.reduce_op == b.reduce_op &&
         a.prescale == b.prescale && a.postscale == b.postscale &&
         a.process_set == b.process_set && a.plane == b.plane &&
         (a.type != OpType::kBroadcast || a.root_rank == b.root_rank);
}

}  // namespace

std::vector<Response> planFusion(std::vector<ReadyOp> ready, size_t threshold_bytes) {
  std::vector<Response> out;
  out.reserve(ready.size());
  if (ready.size() == 1) {  // the common case of a lone op: nothing to fuse with
    out.push_back(std::move(ready[0].response));
    return out;
  }
  std::vector<bool> taken(ready.size(), false);
  for (size_t i = 0; i < ready.size(); ++i) {
    if (taken[i]) continue;
    taken[i] = true;
    Response group = std::move(ready[i].response);
    if (!fusable(ready[i])) {
      out.push_back(std::move(group));
      continue;
    }
    size_t bytes = ready[i].request.numBytes();
    // Greedy first fit over the later ready ops: O(n^2) in the worst case, but
    // n is the number of ops that became ready together (tens to hundreds).
    for (size_t j = i + 1; j < ready.size() && bytes < threshold_bytes; ++j) {
      if (taken[j] || !fusable(ready[j]) || !sameGroup(ready[i].request, ready[j].request)) continue;
      size_t more = ready[j].request.numBytes();
      if (bytes + more > threshold_bytes) continue;
      taken[j] = true;
      bytes += more;
      group.names.push_back(ready[j].response.names[0]);
      group.cache_ids.push_back(ready[j].response.cache_ids[0]);
      if (!ready[j].response.rank_first_dims.empty())
        group.rank_first_dims.push_back(ready[j].response.rank_first_dims[0]);
      if (!ready[j].response.templates.empty())
        group.templates.push_back(ready[j].response.templates[0]);
    }
    out.push_back(std::move(group));
  }
  return out;
}

}  // namespace hvd
