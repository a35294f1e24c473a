// Barriers between the ranks of one host, through counters in a shared
// segment: no socket and no syscall on the fast path.
//
// Each rank owns one cache line holding the number of the last barrier it
// reached. Barrier b: publish b, then wait until every line reads >= b. A
// waiter spins for a short while (the peers are usually microseconds away,
// since every rank runs the same negotiated collective), then sleeps on a
// futex that every arrival bumps. While asleep it wakes every few
// milliseconds to check that the peers are alive (a pidfd per peer becomes
// readable when that process exits, SIGKILL included) and that the op
// timeout has not passed, so a dead peer is an exception within
// milliseconds, never a hang.
//
// Threading: one object per rank, used by the thread that holds the engine's
// baton (its background thread or a caller driving its op, engine.h: one at a
// time).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hvd {

// The synchronisation words at the start of the segment.
struct alignas(64) ShmLine {
  std::atomic<uint64_t> value;
};

struct ShmControl {
  ShmLine epoch;     // low 32 bits: the futex word, bumped by every arrival
  ShmLine sleepers;  // ranks asleep on the futex (arrivals wake only then)
  // Followed by one ShmLine per rank: the last barrier it reached, with
  // kAbandoned set once it gave up (ShmSync::abandon).
  static constexpr uint64_t kAbandoned = uint64_t{1} << 63;
  ShmLine* arrived() { return reinterpret_cast<ShmLine*>(this + 1); }
  static size_t bytes(int ranks) { return sizeof(ShmControl) + ranks * sizeof(ShmLine); }
};

class ShmSync {
 public:
  // pids[i]: the process of position i (this rank's entry is ignored);
  // ranks[i]: its global rank, for messages. Throws std::runtime_error when
  // a peer's process cannot be watched (another pid namespace).
  ShmSync(ShmControl* control, int rank, const std::vector<int>& pids,
          const std::vector<int>& ranks, std::chrono::microseconds spin,
          std::chrono::milliseconds timeout);
  ~ShmSync();
  ShmSync(const ShmSync&) = delete;
  ShmSync& operator=(const ShmSync&) = delete;

  // Whether this process may watch every other pid (pidfd_open works: a
  // kernel of 5.3 or later, one pid namespace).
  static bool canWatch(const std::vector<int>& pids, int self);

  // Returns once every rank has called barrier() as often as this one.
  // Throws std::runtime_error naming the rank that died, abandoned the plane
  // or was late. `what` names the collective for the message.
  void barrier(const char* what);
  // This rank's job failed (its engine gave up on a peer elsewhere): its
  // peers' barriers that wait for it throw now, naming it, instead of
  // waiting out the op timeout for a process that is alive but gone. The
  // plane is unusable after it.
  void abandon();

 private:
  bool allReached(uint64_t step) const;
  void checkPeers(const char* what, std::chrono::steady_clock::time_point deadline) const;

  ShmControl* control_;
  int rank_;
  int size_;
  std::vector<int> ranks_;
  std::vector<int> pidfds_;  // -1 for this rank
  std::chrono::microseconds spin_;
  std::chrono::milliseconds timeout_;
  uint64_t step_ = 0;
};

// A pid namespace and boot identity: two processes that agree can watch each
// other's pids and share /dev/shm segments by name.
std::string shmHostIdentity();

}  // namespace hvd
