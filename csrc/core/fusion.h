// Fusion planning: ready allreduces that agree on dtype, reduce op, scale
// factors and process set are merged into one response (one collective over
// one buffer) while the merged size stays within the fusion threshold.
// Pure function of its input, so it is unit-tested without any ranks.
#pragma once

#include <cstddef>
#include <vector>

#include "message.h"

namespace hvd {

struct ReadyOp {
  Response response;  // single-name response as negotiated
  Request request;    // a representative request (shape, dtype, scales)
  // Negotiated in full: every rank's request (at its global rank), for the
  // response cache once the op is known not to fail (a group's errors).
  std::vector<Request> slot_requests;
};

// Keeps the first-ready order of the groups; ops that cannot fuse (errors,
// inline results, other op types, tensors above the threshold) pass through.
std::vector<Response> planFusion(std::vector<ReadyOp> ready, size_t threshold_bytes);

}  // namespace hvd
