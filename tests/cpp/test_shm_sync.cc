// The shared-memory plane's barrier (csrc/backends/shm/shm_sync.h) and the
// poll budget (csrc/core/poll_budget.h): two threads stand in for two ranks of
// one process, each with its own ShmSync on one zero-filled control block. A
// barrier polls for its own spin or its thread's budget, whichever is longer,
// and only then sleeps on the futex (counted in `sleepers`); the main thread
// plays the late rank and watches.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "backends/shm/shm_sync.h"
#include "check.h"
#include "core/poll_budget.h"

using namespace hvd;
using namespace std::chrono_literals;

namespace {

struct Pair {
  Pair() : words(ShmControl::bytes(2) / sizeof(ShmLine)) {
    for (auto& w : words) w.value.store(0);
  }
  ShmControl* control() { return reinterpret_cast<ShmControl*>(words.data()); }
  ShmSync sync(int rank, std::chrono::microseconds spin) {
    const int pid = static_cast<int>(::getpid());
    return ShmSync(control(), rank, {pid, pid}, {0, 1}, spin, 10s);
  }
  std::vector<ShmLine> words;
};

// Rank 0 (a thread, spinning `spin`, with a budget of `budget`) waits in a
// barrier; rank 1 (this thread) arrives once rank 0's arrival shows and
// `late` has passed. Returns whether rank 0 slept meanwhile.
bool rankZeroSlept(std::chrono::microseconds spin, std::chrono::microseconds budget,
                   std::chrono::milliseconds late) {
  Pair pair;
  ShmSync one = pair.sync(1, 0us);
  std::atomic<bool> done{false};
  std::thread zero([&] {
    PollBudget scope(budget);
    ShmSync sync = pair.sync(0, spin);
    sync.barrier("test");
    done = true;
  });
  ShmControl* c = pair.control();
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  while (c->arrived()[0].value.load() == 0 && std::chrono::steady_clock::now() < give_up)
    std::this_thread::yield();
  CHECK(c->arrived()[0].value.load() == 1);  // else "never slept" would say nothing
  bool slept = false;
  const auto until = std::chrono::steady_clock::now() + late;
  while (std::chrono::steady_clock::now() < until) {
    slept = slept || c->sleepers.value.load() > 0;
    std::this_thread::sleep_for(100us);
  }
  one.barrier("test");
  zero.join();
  CHECK(done.load());
  return slept;
}

}  // namespace

TEST(a_barrier_without_spin_or_budget_sleeps_until_the_peer_comes) {
  CHECK(rankZeroSlept(0us, 0us, 50ms));
}

TEST(a_caller_budget_makes_a_barrier_poll_though_its_own_spin_is_zero) {
  // The engine thread's spin is 0 with more ranks than cores; a driving
  // caller's budget (Engine::drive) still polls its barriers.
  CHECK(!rankZeroSlept(0us, std::chrono::microseconds(5s), 50ms));
}

TEST(a_barrier_polls_its_own_spin_without_a_budget) {
  CHECK(!rankZeroSlept(std::chrono::microseconds(5s), 0us, 50ms));
}

TEST(the_budget_is_the_scopes_and_the_longer_one_wins) {
  CHECK(pollBudget(7us) == 7us);
  {
    PollBudget outer(100us);
    CHECK(pollBudget(7us) == 100us);
    CHECK(pollBudget(200us) == 200us);
    {
      PollBudget inner(0us);
      CHECK(pollBudget(7us) == 7us);
    }
    CHECK(pollBudget(0us) == 100us);
  }
  CHECK(pollBudget(0us) == 0us);
}

// A rank whose job failed elsewhere abandons the plane: a peer waiting for
// it in a barrier fails at once naming it, not at the op timeout (10 s
// here); one that had reached a barrier before it gave up lets its
// peer through that barrier, and fails the next.
TEST(a_rank_that_abandons_fails_its_waiting_peer_at_once_naming_it) {
  for (bool reached_first : {false, true}) {
    Pair pair;
    ShmSync one = pair.sync(1, 0us);
    std::string error;
    int passed = 0;
    std::thread zero([&] {
      ShmSync sync = pair.sync(0, 0us);
      try {
        for (;; ++passed) sync.barrier("allreduce 'x'");
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
    if (reached_first) one.barrier("allreduce 'x'");
    // Rank 0 waits in its next barrier (asleep, past its spin) before rank 1 gives up.
    ShmControl* c = pair.control();
    const uint64_t waiting_at = reached_first ? 2 : 1;
    const auto give_up = std::chrono::steady_clock::now() + 10s;
    while (c->arrived()[0].value.load() < waiting_at && std::chrono::steady_clock::now() < give_up)
      std::this_thread::yield();
    while (c->sleepers.value.load() == 0 && std::chrono::steady_clock::now() < give_up)
      std::this_thread::yield();
    const auto abandoned = std::chrono::steady_clock::now();
    one.abandon();
    zero.join();
    const auto took = std::chrono::steady_clock::now() - abandoned;
    CHECK_EQ(passed, reached_first ? 1 : 0);
    CHECK_EQ(error, std::string("rank 1 gave up during allreduce 'x': its job failed (shared memory, same host)"));
    CHECK(took < 8s);  // before the op timeout (10 s); the message says which path
  }
}

int main() { return check::runAll(); }
