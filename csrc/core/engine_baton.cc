// The engine's waiting and waking (engine.h): the background thread's loop,
// its sleep in poll() and its wake-ups, and the baton that lets a caller
// waiting for its op run the engine's rounds itself ("callers drive",
// docs/architecture.md) instead of paying two thread hand-offs per op.
//
// The one rule everything here keeps: whoever holds the baton runs cycle();
// a submission, a driver or a ring writer that finds the engine asleep rings
// its eventfd or doorbell, and the sleeper checks once more after announcing
// its sleep (sequentially consistent flags), so no wake-up is lost.
#include "engine.h"

#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "cpu_relax.h"
#include "poll_budget.h"

namespace hvd {

void Engine::wake() {
  // Seen true: the background thread has not drained the last write yet and
  // takes the queue after it does, this entry included.
  if (wake_posted_.exchange(true)) return;
  if (!engine_sleeping_.load()) return;  // it spins, and reads wake_posted_
  ringWakeFd();
}

void Engine::ringWakeFd() {
  uint64_t one = 1;
  if (::write(wake_fd_, &one, sizeof(one)) < 0) {
  }
}

bool Engine::inputWaiting() const {
  if (wake_posted_.load(std::memory_order_acquire)) return true;
  return control_.hasInput() || partners_.hasInput();
}

bool Engine::waitForEvents(std::vector<pollfd>& fds, const std::vector<FrameSocket*>& owners,
                           int timeout_ms, std::unique_lock<std::mutex>& baton) {
  // Right after activity the next event (an answer, the caller's next op) is
  // usually tens of microseconds away: check without sleeping, yielding the
  // CPU, for a short while first, since a sleep and wake-up costs more than
  // that on a busy machine. An idle engine sleeps in poll() and costs nothing.
  // The rings and the submission flag are memory: looking costs no system
  // call; with rings (or one rank) the sockets carry only doorbells and
  // closes, so they are polled only every few rounds.
  auto noteReadable = [&] {
    for (size_t i = 0; i < fds.size(); ++i)
      if (owners[i] && fds[i].revents) owners[i]->noteReadable();
  };
  auto handOverNow = [&] {
    uint64_t drained;  // a driver's wake-up: handOver() must not take it for news
    if (fds[0].revents && ::read(wake_fd_, &drained, sizeof(drained)) < 0) {
    }
    handOver(baton, fds);
    for (auto& f : fds) f.revents = 0;
    // A close may have come meanwhile. `owners` may be stale: a driver that
    // failed cleared the sockets.
    control_.noteAllReadable();
    return true;
  };
  const bool frames_on_sockets = control_.framesOnSockets();
  const unsigned poll_every = frames_on_sockets ? 1 : 32;
  const auto until = std::chrono::steady_clock::now() + config_.engine_spin;
  for (unsigned i = 0;; ++i) {
    if (drivers_waiting_.load()) return handOverNow();
    if (inputWaiting()) return true;
    if (i % poll_every == 0) {
      int r = ::poll(fds.data(), fds.size(), 0);
      if (r != 0) {
        noteReadable();
        return r > 0 || errno == EINTR;
      }
      if (std::chrono::steady_clock::now() >= until) break;
    }
    sched_yield();
  }
  // Before sleeping, tell the submitters, drivers and the rings' writers to
  // ring (seq_cst: a driver either sees engine_sleeping_ or we see it).
  engine_sleeping_.store(true);
  bool idle = !wake_posted_.load() && drivers_waiting_.load() == 0;
  idle = control_.sleepIfIdle() && idle;
  const int r = ::poll(fds.data(), fds.size(), idle ? timeout_ms : 0);
  const int err = errno;
  engine_sleeping_.store(false);
  control_.awake();
  if (r > 0) noteReadable();
  if (r >= 0 && drivers_waiting_.load()) return handOverNow();
  return r >= 0 || err == EINTR;
}

namespace {
int64_t steadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

bool Engine::actsOnOthersFrames() const {
  return coordinator_ != nullptr && !process_sets_.allContain(topology_.rank);
}

void Engine::handOver(std::unique_lock<std::mutex>& baton, const std::vector<pollfd>& fds) {
  // While drivers come back (a loop of synchronous ops), they do all the
  // work and this thread only watches: for the wake-up eventfd (another
  // thread's submission, a driver that left work behind) and the sockets (a
  // doorbell, a peer's close), which it cannot read without the baton. Peers
  // see our rings as read (no doorbells). A frame needs reading while no op
  // of ours is pending only on the coordinator of a process set it is not
  // in: there it waits at most engine_spin for a driver before this thread
  // takes the baton back. Elsewhere this thread wakes only when called (and
  // once a second, for rank 0's stall check), so it never takes a busy core
  // from the drivers.
  std::vector<pollfd> watch = fds;
  for (auto& f : watch) f.events = POLLIN;
  const int64_t window = std::chrono::nanoseconds(config_.engine_spin).count();
  const bool prompt = actsOnOthersFrames();
  handed_over_.store(true);
  engine_sleeping_.store(true);  // others' submissions write the eventfd
  if (drivers_waiting_.load() == 0) {
    // The driver we would hand over to gave up meanwhile (drive()) and may
    // have seen us awake, so nobody rings: keep the baton and run its op.
    handed_over_.store(false);
    engine_sleeping_.store(false);
    return;
  }
  baton.unlock();
  while (true) {
    // A driver in a long op (longer than the window) is not disturbed: it
    // rings when it ends.
    const int64_t now = steadyNs();
    int64_t left = 1000000000;  // until called (1 s at most: rank 0's stall check)
    if (prompt && !driving_.load()) {
      left = last_drive_end_ns_.load() + window - now;
    } else if (prompt) {
      left = now - drive_start_ns_.load() < window ? window : 1000000;
    }
    left = std::max<int64_t>(left, 20000);  // never a busy loop
    timespec ts{left / 1000000000, left % 1000000000};
    const int r = ::ppoll(watch.data(), watch.size(), &ts, nullptr);
    uint64_t drained;
    if (r > 0 && watch[0].revents && ::read(wake_fd_, &drained, sizeof(drained)) < 0) {
    }
    if (r > 0) {
      // Something to do: after the driver's op if one is running (blocking,
      // since a close stays readable and polling again would spin).
      baton.lock();
      break;
    }
    if (drivers_waiting_.load() == 0 && steadyNs() - last_drive_end_ns_.load() >= window &&
        baton.try_lock())
      break;
  }
  handed_over_.store(false);
  engine_sleeping_.store(false);
}

bool Engine::awaitInput(std::vector<pollfd>& fds, const std::vector<FrameSocket*>& owners,
                        const Work& work, std::chrono::steady_clock::time_point deadline) {
  // Rounds are pauses, not system calls: a frame is seen within tens of
  // nanoseconds. Yielding now and then lets an oversubscribed peer run.
  // With rings, sockets bring only a peer's close or a doorbell: a look every
  // 256 rounds, not at once (a poll() costs about as much as the 4-byte op's
  // rounds). Bytes waiting to go out are the exception.
  const bool frames_on_sockets = control_.framesOnSockets();
  const unsigned poll_every = frames_on_sockets ? 1 : 256;
  bool writes = false;
  for (const pollfd& p : fds) writes = writes || (p.events & POLLOUT);
  for (unsigned i = writes ? 0 : 1;; ++i) {
    if (work.done()) return false;
    if (inputWaiting()) return true;
    if (i % poll_every == 0) {
      const int r = ::poll(fds.data() + 1, fds.size() - 1, 0);  // not the eventfd: not ours
      if (r != 0) {
        for (size_t k = 1; k < fds.size(); ++k)
          if (fds[k].revents) owners[k]->noteReadable();
        return true;
      }
      if (std::chrono::steady_clock::now() >= deadline) return false;
    }
    if (i % 16 == 15) {
      sched_yield();
    } else {
      cpuRelax();
    }
  }
}

bool Engine::drive(const Work& work) {
  // Deferred async ops run on the lane now, this one among them: the other
  // ranks' callers wait for theirs too.
  if (lane_) lane_->resolveAll(true);
  if (work.done()) return true;
  if (!config_.callers_drive) {
    wake();  // the submission skipped it
    return false;
  }
  const auto deadline = std::chrono::steady_clock::now() + config_.caller_spin;
  drivers_waiting_.fetch_add(1);
  // Asleep in poll() with the baton: wake it so that it hands over.
  if (engine_sleeping_.load() && !handed_over_.load()) ringWakeFd();
  std::unique_lock<std::mutex> baton(baton_, std::defer_lock);
  while (!baton.try_lock()) {
    if (work.done() || std::chrono::steady_clock::now() >= deadline) {
      drivers_waiting_.fetch_sub(1);
      // The background thread takes our op (our submission skipped the
      // wake-up). If it has handed the engine over to us, it sleeps until
      // rung: ring it even when a wake-up is posted (wake() would not). The
      // decrement and this load pair with handOver()'s store and check
      // (seq_cst): either we see it asleep, or it sees nobody waiting.
      if (engine_sleeping_.load()) {
        ringWakeFd();
      } else {
        wake();
      }
      return work.done();
    }
    sched_yield();
  }
  drivers_waiting_.fetch_sub(1);
  const int64_t drive_start = steadyNs();
  drive_start_ns_.store(drive_start);
  driving_.store(true);
  std::vector<pollfd> fds;
  std::vector<FrameSocket*> owners;
  bool running = true;
  {
    // The data planes' barriers poll as long as this caller would.
    PollBudget budget(config_.caller_spin);
    while (running && !work.done()) {
      running = cycle(false);
      if (!running || work.done()) break;
      watchList(fds, owners);
      if (!awaitInput(fds, owners, work, deadline)) break;
    }
  }
  // What is left for the background thread: ops waiting for peers, bytes a
  // full socket did not take, a stop or failure to act on.
  bool needs_engine = !running || !pending_.empty();
  needs_engine = needs_engine || control_.hasOutput() || partners_.hasOutput();
  const int64_t drive_end = steadyNs();
  last_drive_end_ns_.store(drive_end);
  driving_.store(false);
  baton.unlock();
  // After a long drive the background thread sleeps long (see handOver).
  const auto drove = std::chrono::nanoseconds(drive_end - drive_start);
  if (needs_engine || (drove > config_.engine_spin && actsOnOthersFrames())) ringWakeFd();
  if (!work.done()) return false;
  driven_ops_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void Engine::watchList(std::vector<pollfd>& fds, std::vector<FrameSocket*>& owners) const {
  control_.watchList(wake_fd_, fds, owners);
  if (agreement_) partners_.watchList(fds, owners);
}

void Engine::loop() {
  std::unique_lock<std::mutex> baton(baton_);
  std::vector<pollfd> fds;
  std::vector<FrameSocket*> owners;
  while (true) {
    watchList(fds, owners);
    // Rank 0 wakes once a second while ops wait for other ranks, to check
    // for stalls; otherwise the loop sleeps until something happens.
    // So does every rank while cached ops wait for an agreement, for its own
    // stall check (checkAgreementStall).
    const bool watch = config_.stall_check &&
                       ((coordinator_ && coordinator_->hasWaiting()) ||
                        (rounds_ && rounds_->waiting() > 0));
    if (!waitForEvents(fds, owners, watch ? 1000 : -1, baton)) {
      fail(Status::peerFailure(std::string("poll failed: ") + std::strerror(errno)));
      return;
    }
    uint64_t drained;
    if (fds[0].revents != 0 && ::read(wake_fd_, &drained, sizeof(drained)) < 0) {
    }
    if (!cycle(true)) return;
  }
}

}  // namespace hvd
