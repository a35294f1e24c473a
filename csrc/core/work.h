// Completion record of one submitted operation. The background thread
// completes it exactly once; any thread may poll or wait on it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "types.h"

namespace hvd {

class Work {
 public:
  bool done() const {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  // Blocks until completed; returns the outcome.
  Status wait() const {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    return status_;
  }
  // Allgather: each rank's first dimension, set before completion.
  const std::vector<int64_t>& firstDims() const { return first_dims_; }

  void setFirstDims(std::vector<int64_t> dims) { first_dims_ = std::move(dims); }
  void complete(Status status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) return;
      status_ = std::move(status);
      done_ = true;
    }
    cv_.notify_all();
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  Status status_;
  std::vector<int64_t> first_dims_;
};

}  // namespace hvd
