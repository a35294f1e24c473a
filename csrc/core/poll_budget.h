// How long the current thread may poll a wait before it sleeps, beyond the
// waits' own setting. A caller driving the engine (Engine::drive) raises its
// thread's budget to HVD_TORCH_CALLER_SPIN_US while it drives: it waits for
// its op anyway, so its polling takes no core from its own process. The
// engine thread keeps none: with more ranks than cores its polling would take
// the core from its rank's compute (topology.cc sets its spin to 0 there).
#pragma once

#include <algorithm>
#include <chrono>

namespace hvd {

inline thread_local std::chrono::microseconds t_poll_budget{0};

// A wait's spin: its own, or this thread's budget if longer.
inline std::chrono::microseconds pollBudget(std::chrono::microseconds own) {
  return std::max(own, t_poll_budget);
}

// Raises this thread's budget for a scope.
class PollBudget {
 public:
  explicit PollBudget(std::chrono::microseconds budget) : saved_(t_poll_budget) {
    t_poll_budget = budget;
  }
  ~PollBudget() { t_poll_budget = saved_; }
  PollBudget(const PollBudget&) = delete;
  PollBudget& operator=(const PollBudget&) = delete;

 private:
  std::chrono::microseconds saved_;
};

}  // namespace hvd
