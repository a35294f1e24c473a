// Rank 0's watch over ops that some ranks submitted and others did not
// (Horovod's stall check): after HOROVOD_STALL_CHECK_TIME_SECONDS it warns,
// naming each op and the ranks missing; after
// HOROVOD_STALL_SHUTDOWN_TIME_SECONDS it fails the job, so every rank gets an
// error instead of hanging. The clock is passed in, so tests drive it.
//
// Threading: whoever holds the engine's baton (one thread at a time).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "coordinator.h"

namespace hvd {

class StallInspector {
 public:
  using Clock = std::chrono::steady_clock;

  // warning: how long an op may wait before a warning (and between warnings);
  // shutdown: how long before the job fails (zero: never).
  StallInspector(std::chrono::seconds warning, std::chrono::seconds shutdown)
      : warning_(warning), shutdown_(shutdown) {}

  struct Verdict {
    std::string warning;  // non-empty: log it
    std::string fatal;    // non-empty: fail every rank with it
  };
  // Looks at most once a second (earlier calls return an empty verdict).
  Verdict inspect(const std::vector<Coordinator::Waiting>& waiting, Clock::time_point now);

 private:
  const std::chrono::seconds warning_;
  const std::chrono::seconds shutdown_;
  Clock::time_point last_check_{};
  Clock::time_point last_warning_{};
};

}  // namespace hvd
