// Completion record of one submitted operation. The background thread
// completes it exactly once; any thread may poll or wait on it.
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "device.h"
#include "types.h"

namespace hvd {

class Work {
 public:
  bool done() const { return done_flag_.load(std::memory_order_acquire); }
  // Blocks until completed; returns the outcome. Small ops complete within
  // tens of microseconds, less than a sleep/wake-up costs, so the caller
  // yields the CPU in a short loop before it sleeps on the condition variable.
  Status wait(std::chrono::microseconds spin = std::chrono::microseconds(0)) const {
    const auto spin_until = std::chrono::steady_clock::now() + spin;
    while (!done() && std::chrono::steady_clock::now() < spin_until) sched_yield();
    if (done()) return status_;  // written before the flag's release store
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    return status_;
  }
  // Rows per rank, set before completion: an allgather's rows from each rank
  // (its first dimension), an alltoall's rows received from each rank.
  const std::vector<int64_t>& rankRows() const { return rank_rows_; }
  // Set before completion, -1 on every other op: add_process_set's new set id,
  // and join's last rank to join (the response's new_set_id and last_joined_rank).
  int32_t newSetId() const { return new_set_id_; }
  int32_t lastJoinedRank() const { return last_joined_rank_; }

  // Plane::kDevice: completion means the work is enqueued on the device's
  // stream; this event marks its end, and whoever reads the output orders
  // itself after it. Set before complete(); null on the host planes.
  const std::shared_ptr<DeviceEvent>& deviceDone() const { return device_done_; }

  void setRankRows(std::vector<int64_t> rows) { rank_rows_ = std::move(rows); }
  void setNewSetId(int32_t id) { new_set_id_ = id; }
  void setLastJoinedRank(int32_t rank) { last_joined_rank_ = rank; }
  void setDeviceDone(std::shared_ptr<DeviceEvent> event) { device_done_ = std::move(event); }
  void complete(Status status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) return;
      status_ = std::move(status);
      done_ = true;
      done_flag_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
  }

 private:
  std::atomic<bool> done_flag_{false};
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  Status status_;
  std::vector<int64_t> rank_rows_;
  int32_t new_set_id_ = -1;
  int32_t last_joined_rank_ = -1;
  std::shared_ptr<DeviceEvent> device_done_;
};

}  // namespace hvd
