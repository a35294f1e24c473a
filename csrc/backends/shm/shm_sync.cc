#include "shm_sync.h"

#include "../../core/cpu_relax.h"
#include "../../core/poll_budget.h"

#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace hvd {

namespace {

#ifndef SYS_pidfd_open
constexpr long SYS_pidfd_open = 434;
#endif

// How long a sleeper waits before looking at the peers again.
constexpr auto kWatchInterval = std::chrono::milliseconds(5);

uint32_t* futexWord(ShmControl* c) {
  // The low half of the 64-bit epoch (little-endian): what the kernel compares.
  return reinterpret_cast<uint32_t*>(&c->epoch.value);
}

void futexWait(ShmControl* c, uint32_t expected) {
  timespec ts{0, static_cast<long>(std::chrono::nanoseconds(kWatchInterval).count())};
  // Shared (not FUTEX_PRIVATE): the word lives in memory other processes map.
  syscall(SYS_futex, futexWord(c), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futexWakeAll(ShmControl* c) {
  syscall(SYS_futex, futexWord(c), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

}  // namespace

ShmSync::ShmSync(ShmControl* control, int rank, const std::vector<int>& pids,
                 const std::vector<int>& ranks, std::chrono::microseconds spin,
                 std::chrono::milliseconds timeout)
    : control_(control),
      rank_(rank),
      size_(static_cast<int>(pids.size())),
      ranks_(ranks),
      pidfds_(pids.size(), -1),
      spin_(spin),
      timeout_(timeout) {
  for (int i = 0; i < size_; ++i) {
    if (i == rank_) continue;
    int fd = static_cast<int>(syscall(SYS_pidfd_open, pids[i], 0));
    if (fd < 0) {
      const int err = errno;
      for (int f : pidfds_)
        if (f >= 0) ::close(f);
      throw std::runtime_error("cannot watch rank " + std::to_string(ranks_[i]) + " (pid " +
                               std::to_string(pids[i]) + "): " + std::strerror(err));
    }
    pidfds_[i] = fd;
  }
}

bool ShmSync::canWatch(const std::vector<int>& pids, int self) {
  for (size_t i = 0; i < pids.size(); ++i) {
    if (static_cast<int>(i) == self) continue;
    int fd = static_cast<int>(syscall(SYS_pidfd_open, pids[i], 0));
    if (fd < 0) return false;
    ::close(fd);
  }
  return true;
}

ShmSync::~ShmSync() {
  for (int fd : pidfds_)
    if (fd >= 0) ::close(fd);
}

bool ShmSync::allReached(uint64_t step) const {
  ShmLine* lines = control_->arrived();
  for (int i = 0; i < size_; ++i) {
    // An abandoned rank that had not reached `step` never will.
    if ((lines[i].value.load(std::memory_order_acquire) & ~ShmControl::kAbandoned) < step) return false;
  }
  return true;
}

void ShmSync::barrier(const char* what) {
  const uint64_t step = ++step_;
  // Release: everything this rank wrote to the segment before the barrier is
  // visible to a peer that sees the new step (its load is an acquire).
  control_->arrived()[rank_].value.store(step, std::memory_order_release);
  control_->epoch.value.fetch_add(1, std::memory_order_acq_rel);
  if (control_->sleepers.value.load(std::memory_order_acquire) > 0) futexWakeAll(control_);

  if (allReached(step)) return;
  // Spin, yielding now and then so an oversubscribed peer gets the core.
  const auto start = std::chrono::steady_clock::now();
  const auto spin = pollBudget(spin_);
  if (spin.count() > 0) {
    for (unsigned i = 1;; ++i) {
      if (allReached(step)) return;
      if (i % 64 == 0) {
        if (std::chrono::steady_clock::now() - start > spin) break;
        sched_yield();
      } else {
        cpuRelax();
      }
    }
  }
  const auto deadline = start + timeout_;
  while (true) {
    control_->sleepers.value.fetch_add(1, std::memory_order_acq_rel);
    const uint32_t seen =
        static_cast<uint32_t>(control_->epoch.value.load(std::memory_order_acquire));
    if (allReached(step)) {
      control_->sleepers.value.fetch_sub(1, std::memory_order_acq_rel);
      return;
    }
    futexWait(control_, seen);  // returns at once if an arrival changed epoch
    control_->sleepers.value.fetch_sub(1, std::memory_order_acq_rel);
    if (allReached(step)) return;
    checkPeers(what, deadline);
  }
}

void ShmSync::abandon() {
  control_->arrived()[rank_].value.fetch_or(ShmControl::kAbandoned, std::memory_order_acq_rel);
  control_->epoch.value.fetch_add(1, std::memory_order_acq_rel);
  futexWakeAll(control_);
}

void ShmSync::checkPeers(const char* what, std::chrono::steady_clock::time_point deadline) const {
  std::vector<pollfd> fds;
  std::vector<int> who;
  for (int i = 0; i < size_; ++i) {
    if (pidfds_[i] < 0) continue;
    fds.push_back({pidfds_[i], POLLIN, 0});
    who.push_back(i);
  }
  if (!fds.empty() && ::poll(fds.data(), fds.size(), 0) > 0) {
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents != 0) {
        throw std::runtime_error("rank " + std::to_string(ranks_[who[k]]) + " exited during " +
                                 what + " (shared memory, same host)");
      }
    }
  }
  // After the dead: a peer that gave up did so because of a failure, which
  // a dead peer here is more likely to explain.
  ShmLine* lines = control_->arrived();
  for (int i = 0; i < size_; ++i) {
    if (i != rank_ && (lines[i].value.load(std::memory_order_acquire) & ShmControl::kAbandoned)) {
      throw std::runtime_error("rank " + std::to_string(ranks_[i]) + " gave up during " + what +
                               ": its job failed (shared memory, same host)");
    }
  }
  if (std::chrono::steady_clock::now() < deadline) return;
  std::string late;
  for (int i = 0; i < size_; ++i) {
    if (lines[i].value.load(std::memory_order_acquire) < step_) {
      late += (late.empty() ? "" : ", ") + std::to_string(ranks_[i]);
    }
  }
  throw std::runtime_error(std::string(what) + " timed out after " +
                           std::to_string(timeout_.count() / 1000) +
                           " s (HOROVOD_GLOO_TIMEOUT_SECONDS) waiting for ranks " + late +
                           " (shared memory, same host)");
}

std::string shmHostIdentity() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  char ns[128] = {0};
  ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
  char ipc[128] = {0};
  ssize_t m = ::readlink("/proc/self/ns/ipc", ipc, sizeof(ipc) - 1);
  return boot + "/" + std::string(ns, n > 0 ? n : 0) + "/" + std::string(ipc, m > 0 ? m : 0);
}

}  // namespace hvd
