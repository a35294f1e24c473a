// "Prescale each contribution, reduce them in rank order, postscale once":
// the one composition of every path that promises rank-order results (rank
// 0's inline reduction, the fast lane, the shared-memory plane, and so the
// hierarchical plane within a host), so that they agree to the bit
// (tests/ranks/test_reduction_paths.py). Gloo's ring reduces in ring order
// and uses prescale() and finish() alone. No state beyond the five values:
// build one per op, on the stack.
#pragma once

#include <cstddef>
#include <cstring>
#include <vector>

#include "reduce.h"
#include "types.h"

namespace hvd {

class ReductionPlan {
 public:
  // divisor: what Average divides by (the members, or those that contributed);
  // Average folds into the postscale factor here, once (reduce.h).
  ReductionPlan(DataType dtype, ReduceOp op, double prescale, double postscale, int divisor)
      : dtype_(dtype),
        fn_(reduceFunction(dtype, op)),
        prescale_(prescale),
        post_(postscaleFactor(op, divisor, postscale)) {}

  bool scalesInputs() const { return prescale_ != 1.0; }
  DataType dtype() const { return dtype_; }

  // One contribution, before it is reduced: buf *= prescale (nothing at 1).
  void prescale(void* buf, size_t n) const { scaleBuffer(buf, n, dtype_, prescale_); }

  // out = row(0) op row(1) op ... op row(k - 1), left to right, over rows
  // already prescaled; row(r) -> const void*. out may be row(0).
  template <class RowAt>
  void combine(void* out, int k, RowAt row, size_t n) const {
    if (k == 1) {
      if (out != row(0)) std::memcpy(out, row(0), n * dataTypeSize(dtype_));
      return;
    }
    fn_(out, row(0), row(1), n);
    for (int r = 2; r < k; ++r) fn_(out, out, row(r), n);
  }

  // The same over rows this plan must not write (another rank's, say): each
  // is prescaled in out or in scratch first. Then finish(out) is still due.
  template <class RowAt>
  void reduce(void* out, int k, RowAt row, size_t n, std::vector<char>& scratch) const {
    if (!scalesInputs()) return combine(out, k, row, n);
    const size_t bytes = n * dataTypeSize(dtype_);
    std::memcpy(out, row(0), bytes);
    prescale(out, n);
    if (scratch.size() < bytes) scratch.resize(bytes);
    for (int r = 1; r < k; ++r) {
      std::memcpy(scratch.data(), row(r), bytes);
      prescale(scratch.data(), n);
      fn_(out, out, scratch.data(), n);
    }
  }

  // The reduced result, once: buf *= postscale (over the divisor for Average).
  void finish(void* buf, size_t n) const { scaleBuffer(buf, n, dtype_, post_); }

 private:
  DataType dtype_;
  ReduceFn fn_;
  double prescale_;
  double post_;
};

}  // namespace hvd
