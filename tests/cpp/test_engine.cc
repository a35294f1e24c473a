// The whole engine (engine.h) with several ranks in one process: each rank
// is an Engine on its own thread, meeting the others through a store in
// memory and a real control channel over loopback, with a fake data plane
// that moves bytes between the threads. Negotiation in any submission order,
// fusion, response-cache hits, a late rank, a stalled rank, ranks that
// disagree, a backend that fails, and on one host the fast lane and the
// deferred async ops (lane.h) beside the engine.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "core/engine.h"
#include "core/reduce.h"
#include "memory_store.h"

using namespace hvd;
using hvd_test::MemoryStore;
using hvd_test::MemoryStoreState;
using std::chrono::milliseconds;

namespace {

// ------------------------------------------------------- the data plane

// Where the ranks' fake backends meet: the k-th collective of every rank
// is round k; each rank leaves its bytes and takes everyone's.
struct Hub {
  explicit Hub(int n) : size(n) {}
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  struct Round {
    std::vector<std::string> data;
    int arrived = 0;
    int taken = 0;
  };
  std::map<uint64_t, Round> rounds;
  std::string broken;  // a rank's backend failed: the others' calls fail too
  std::map<std::string, int> calls;  // by op name, over every rank

  std::vector<std::string> exchange(int rank, uint64_t round, const char* op, std::string data) {
    std::unique_lock<std::mutex> lock(mu);
    ++calls[op];
    Round& r = rounds[round];
    if (r.data.empty()) r.data.resize(size);
    r.data[rank] = std::move(data);
    ++r.arrived;
    cv.notify_all();
    if (!cv.wait_for(lock, std::chrono::seconds(10),
                     [&] { return r.arrived == size || !broken.empty(); }))
      throw std::runtime_error("fake backend: round timed out");
    if (r.arrived < size) throw std::runtime_error("connection reset: " + broken);
    std::vector<std::string> all = r.data;
    if (++r.taken == size) rounds.erase(round);
    return all;
  }
  void fail(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    broken = why;
    cv.notify_all();
  }
  int callsOf(const char* op) {
    std::lock_guard<std::mutex> lock(mu);
    return calls[op];
  }
};

class FakeBackend : public Backend {
 public:
  // At its fail_allreduce_at-th allreduce the backend fails: as a broken
  // connection, or (as_bug) as a broken invariant of its own.
  // `name`: "shm" makes the engine treat the ranks as one host's (engine.cc,
  // attachRingsAndLane): control rings and the fast lane in shared memory,
  // while the data still moves through this plane.
  FakeBackend(std::shared_ptr<Hub> hub, int rank, int fail_allreduce_at, bool as_bug,
              const char* name)
      : hub_(std::move(hub)), rank_(rank), fail_at_(fail_allreduce_at), as_bug_(as_bug),
        name_(name) {}
  const char* name() const override { return name_; }

  void allreduce(void* buf, size_t count, DataType dtype, ReduceOp op) override {
    const size_t bytes = count * dataTypeSize(dtype);
    if (allreduces_++ == fail_at_) {
      hub_->fail("rank " + std::to_string(rank_) + "'s backend failed");
      if (as_bug_) throw InternalError("fake backend bug on rank " + std::to_string(rank_));
      throw std::runtime_error("fake backend failure on rank " + std::to_string(rank_));
    }
    auto all = hub_->exchange(rank_, round_++, "allreduce",
                              std::string(static_cast<char*>(buf), bytes));
    std::memcpy(buf, all[0].data(), bytes);
    ReduceFn reduce = reduceFunction(dtype, op);
    for (int r = 1; r < hub_->size; ++r) reduce(buf, buf, all[r].data(), count);
  }
  void allgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                  DataType dtype) override {
    const size_t elem = dataTypeSize(dtype);
    auto all = hub_->exchange(rank_, round_++, "allgatherv",
                              std::string(static_cast<const char*>(in), counts[rank_] * elem));
    char* o = static_cast<char*>(out);
    for (const auto& d : all) {
      std::memcpy(o, d.data(), d.size());
      o += d.size();
    }
  }
  void broadcast(void* buf, size_t count, DataType dtype, int root) override {
    const size_t bytes = count * dataTypeSize(dtype);
    auto all = hub_->exchange(rank_, round_++, "broadcast",
                              std::string(static_cast<char*>(buf), bytes));
    std::memcpy(buf, all[root].data(), bytes);
  }
  void alltoallv(const void*, const std::vector<int64_t>&, void*, const std::vector<int64_t>&,
                 DataType) override {
    throw std::runtime_error("fake backend: no alltoall");
  }
  void barrier() override { hub_->exchange(rank_, round_++, "barrier", ""); }

 private:
  std::shared_ptr<Hub> hub_;
  const int rank_;
  const int fail_at_;
  const bool as_bug_;
  const char* const name_;
  int allreduces_ = 0;
  uint64_t round_ = 0;
};

// ------------------------------------------------------------ the ranks

struct Job {
  std::vector<std::shared_ptr<Engine>> engines;
  std::shared_ptr<Hub> hub;
  ~Job() {
    for (auto& e : engines)
      if (e) e->shutdown();
  }
};

// Starts n in-process ranks; `tweak` adjusts each rank's config;
// `fail_rank`'s backend throws at its `fail_at`-th allreduce (InternalError
// if `as_bug`, else a transport failure); `plane`: the fake plane's name
// (FakeBackend).
// `hosts`: the ranks split into that many hosts of n / hosts ranks each,
// consecutive ranks on one host (as hvdrun places them).
std::unique_ptr<Job> startJob(int n, const std::function<void(EngineConfig&)>& tweak = nullptr,
                              int fail_rank = -1, int fail_at = -1, bool as_bug = false,
                              const char* plane = "fake", int hosts = 1) {
  auto job = std::make_unique<Job>();
  job->hub = std::make_shared<Hub>(n);
  job->engines.resize(n);
  auto store = std::make_shared<MemoryStoreState>();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Topology t;
      t.rank = r;
      t.size = n;
      t.local_size = n / hosts;
      t.local_rank = r % t.local_size;
      t.cross_rank = r / t.local_size;
      t.cross_size = hosts;
      EngineConfig c;
      c.store_host = "memory";
      c.secret = "secret";
      c.hostname = "localhost";
      c.start_timeout = milliseconds(10000);
      c.inline_threshold = 0;  // every op through the backend unless a test says
      if (tweak) tweak(c);
      auto hub = job->hub;
      BackendFactory make = [hub, fail_rank, fail_at, as_bug, plane](
                                const Topology& topo, const EngineConfig&, StoreClient&,
                                const std::string&) {
        return std::unique_ptr<Backend>(new FakeBackend(
            hub, topo.rank, topo.rank == fail_rank ? fail_at : -1, as_bug, plane));
      };
      try {
        job->engines[r] = Engine::start(t, c, make, 1, nullptr, std::make_unique<MemoryStore>(store));
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r)
    if (!errors[r].empty()) throw std::runtime_error("rank " + std::to_string(r) + ": " + errors[r]);
  return job;
}

// One op's buffers, kept alive until it completes.
struct Op {
  std::vector<float> in, out;
  std::shared_ptr<Work> work;
  std::vector<float> gathered;
};

std::shared_ptr<Op> allreduce(Engine& e, const std::string& name, std::vector<float> data,
                              ReduceOp op = ReduceOp::kSum,
                              SubmitMode mode = SubmitMode::kAsync) {
  auto o = std::make_shared<Op>();
  o->in = std::move(data);
  o->out.resize(o->in.size());
  Entry entry;
  entry.request.type = OpType::kAllreduce;
  entry.request.dtype = DataType::kFloat32;
  entry.request.reduce_op = op;
  entry.request.name = name;
  entry.request.shape = {static_cast<int64_t>(o->in.size())};
  entry.input = o->in.data();
  entry.output = o->out.data();
  o->work = e.enqueue(std::move(entry), mode);
  return o;
}

std::shared_ptr<Op> allgather(Engine& e, const std::string& name, std::vector<float> rows) {
  auto o = std::make_shared<Op>();
  o->in = std::move(rows);
  Entry entry;
  entry.request.type = OpType::kAllgather;
  entry.request.dtype = DataType::kFloat32;
  entry.request.name = name;
  entry.request.shape = {static_cast<int64_t>(o->in.size())};
  entry.input = o->in.data();
  Op* raw = o.get();
  entry.allocate = [raw](int64_t total) {
    raw->gathered.resize(static_cast<size_t>(total));
    return static_cast<void*>(raw->gathered.data());
  };
  o->work = e.enqueue(std::move(entry));
  return o;
}

Status waitFor(const Op& o) { return o.work->wait(); }

// Runs fn(rank, engine) on every rank at once, as the ranks' own threads would.
void onEveryRank(Job& job, const std::function<void(int, Engine&)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < static_cast<int>(job.engines.size()); ++r)
    threads.emplace_back([&, r] { fn(r, *job.engines[r]); });
  for (auto& t : threads) t.join();
}

}  // namespace

TEST(ranks_that_submit_in_different_orders_get_every_sum) {
  for (int n : {2, 3}) {
    auto job = startJob(n);
    std::vector<std::vector<float>> a(n), b(n);
    onEveryRank(*job, [&](int r, Engine& e) {
      std::shared_ptr<Op> x, y;
      if (r % 2 == 0) {
        x = allreduce(e, "a", {float(r), 1});
        y = allreduce(e, "b", {10.f * r});
      } else {
        y = allreduce(e, "b", {10.f * r});
        x = allreduce(e, "a", {float(r), 1});
      }
      CHECK(waitFor(*x).ok());
      CHECK(waitFor(*y).ok());
      a[r] = x->out;
      b[r] = y->out;
    });
    const float ranks = float(n * (n - 1) / 2);
    for (int r = 0; r < n; ++r) {
      CHECK(a[r] == (std::vector<float>{ranks, float(n)}));
      CHECK(b[r] == (std::vector<float>{10 * ranks}));
    }
  }
}

TEST(ops_submitted_together_are_fused_into_one_backend_call) {
  auto job = startJob(2);
  onEveryRank(*job, [&](int r, Engine& e) {
    std::vector<std::shared_ptr<Op>> ops;
    for (int i = 0; i < 8; ++i)  // asleep until the last: one batch
      ops.push_back(allreduce(e, "g" + std::to_string(i), {float(i + r)}, ReduceOp::kSum,
                              i == 7 ? SubmitMode::kAsync : SubmitMode::kGroupMember));
    for (int i = 0; i < 8; ++i) {
      CHECK(waitFor(*ops[i]).ok());
      CHECK_EQ(ops[i]->out[0], float(2 * i + 1));
    }
  });
  CHECK(job->hub->callsOf("allreduce") < 2 * 8);  // 2 ranks x fewer than 8 calls
  CHECK(job->hub->callsOf("allreduce") >= 2);
}

TEST(a_repeated_op_goes_as_its_cache_slot) {
  auto job = startJob(3);
  onEveryRank(*job, [&](int r, Engine& e) {
    for (int step = 0; step < 5; ++step) {
      auto o = allreduce(e, "grad", {float(r + step)});
      CHECK(waitFor(*o).ok());
      CHECK_EQ(o->out[0], float(3 + 3 * step));
    }
  });
  for (auto& e : job->engines) CHECK(e->cachedSubmissions() >= 4);
}

TEST(a_late_rank_is_waited_for) {
  auto job = startJob(3);
  onEveryRank(*job, [&](int r, Engine& e) {
    if (r == 2) std::this_thread::sleep_for(milliseconds(300));
    auto o = allreduce(e, "late", {1.f});
    CHECK(waitFor(*o).ok());
    CHECK_EQ(o->out[0], 3.f);
  });
}

TEST(allgather_concatenates_rows_of_different_counts) {
  auto job = startJob(3);
  onEveryRank(*job, [&](int r, Engine& e) {
    std::vector<float> rows(r + 1, float(r));
    auto o = allgather(e, "ag", rows);
    CHECK(waitFor(*o).ok());
    CHECK(o->gathered == (std::vector<float>{0, 1, 1, 2, 2, 2}));
    CHECK(o->work->rankRows() == (std::vector<int64_t>{1, 2, 3}));
  });
}

TEST(small_ops_can_go_inline_through_rank_0_without_the_backend) {
  auto job = startJob(2, [](EngineConfig& c) { c.inline_threshold = 1 << 20; });
  onEveryRank(*job, [&](int r, Engine& e) {
    auto o = allreduce(e, "tiny", {float(r + 1), 2});
    CHECK(waitFor(*o).ok());
    CHECK(o->out == (std::vector<float>{3, 4}));
  });
  CHECK_EQ(job->hub->callsOf("allreduce"), 0);
}

TEST(ranks_that_disagree_get_the_same_error_and_go_on) {
  for (int n : {2, 3}) {
    auto job = startJob(n);
    std::vector<Status> statuses(n);
    onEveryRank(*job, [&](int r, Engine& e) {
      auto bad = allreduce(e, "shape", std::vector<float>(r == 1 ? 3 : 2, 1.f));
      statuses[r] = waitFor(*bad);
      auto good = allreduce(e, "after", {1.f});
      CHECK(waitFor(*good).ok());
      CHECK_EQ(good->out[0], float(n));
    });
    for (int r = 0; r < n; ++r) {
      CHECK(statuses[r].code == Status::kRefused);
      CHECK(statuses[r].message.find("shape") != std::string::npos);
      CHECK_EQ(statuses[r].message, statuses[0].message);
    }
  }
}

// Every rank runs an allreduce that succeeds, then "boom" (which a backend
// set up to fail fails): each rank's status for "boom".
std::vector<Status> okThenBoom(Job& job) {
  std::vector<Status> statuses(job.engines.size());
  onEveryRank(job, [&](int r, Engine& e) {
    auto first = allreduce(e, "ok", {1.f});
    CHECK(waitFor(*first).ok());
    auto second = allreduce(e, "boom", {1.f});
    statuses[r] = waitFor(*second);
  });
  return statuses;
}

TEST(a_failing_backend_fails_every_rank_as_a_peer_failure) {
  auto job = startJob(3, nullptr, /*fail_rank=*/1, /*fail_at=*/1);
  const std::vector<Status> statuses = okThenBoom(*job);
  for (int r = 0; r < 3; ++r) {
    CHECK(statuses[r].code == Status::kPeerFailure);
    CHECK(!statuses[r].message.empty());
  }
  // The job is broken: a later op fails at once with the same kind.
  auto later = allreduce(*job->engines[0], "later", {1.f});
  CHECK(waitFor(*later).code == Status::kPeerFailure);
}

// Three ranks; `buggy`'s backend breaks an invariant of its own in "boom".
std::vector<Status> statusesWhenABackendHasABug(int buggy) {
  auto job = startJob(3, nullptr, /*fail_rank=*/buggy, /*fail_at=*/1, /*as_bug=*/true);
  return okThenBoom(*job);
}

TEST(a_bug_on_rank_0_reaches_every_rank_as_a_bug_not_a_dead_peer) {
  // The others' data plane sees a reset; rank 0's abort tells them the kind.
  const std::vector<Status> statuses = statusesWhenABackendHasABug(0);
  for (int r = 0; r < 3; ++r) {
    CHECK_EQ(statuses[r].code, Status::kInternal);
    CHECK(statuses[r].message.find("fake backend bug on rank 0") != std::string::npos);
  }
}

TEST(a_bug_on_another_rank_is_a_bug_there) {
  const std::vector<Status> statuses = statusesWhenABackendHasABug(2);
  CHECK_EQ(statuses[2].code, Status::kInternal);
  CHECK(statuses[2].message.find("fake backend bug on rank 2") != std::string::npos);
  for (int r = 0; r < 2; ++r) CHECK(!statuses[r].ok());  // and the job ends everywhere
}

TEST(a_stalled_rank_fails_the_job_after_the_shutdown_time_naming_it) {
  auto job = startJob(2, [](EngineConfig& c) {
    c.stall_warning = std::chrono::seconds(1);
    c.stall_shutdown = std::chrono::seconds(2);
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto o = allreduce(*job->engines[0], "never", {1.f});  // rank 1 never submits it
  const Status s = waitFor(*o);
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(s.code == Status::kPeerFailure);
  CHECK(s.message.find("'never' waited") != std::string::npos);
  CHECK(s.message.find("ranks [1]") != std::string::npos);
  CHECK(took >= std::chrono::seconds(2));  // not before the shutdown time
  CHECK(took < std::chrono::seconds(30));  // and it ends: no hang (bound generous for load)
}

// ------------------------------------------------------ one host: the lane

// Ranks on one host (the fake plane named "shm"), with a patience far past
// any scheduling delay; `defer`: HVD_TORCH_FAST_LANE_DEFER_US.
std::unique_ptr<Job> startOneHostJob(int n, std::chrono::microseconds defer) {
  return startJob(
      n,
      [defer](EngineConfig& c) {
        c.caller_spin = std::chrono::seconds(2);
        c.lane_defer = defer;
      },
      -1, -1, false, "shm");
}

// Waits for `o` as a kernel's caller does: driving the engine first.
Status driveAndWait(Engine& e, const std::shared_ptr<Op>& o) {
  e.drive(*o->work);
  return waitFor(*o);
}

// A blocking op of a cached name runs on the lane; K async ops then their
// waits run there too, each deferred until its caller waits; an async op
// whose caller waits without driving (elsewhere) goes to the engine through
// the watch thread. Every result is the sum.
TEST(on_one_host_the_lane_runs_cached_ops_and_defers_async_ones) {
  auto job = startOneHostJob(2, std::chrono::milliseconds(1));
  onEveryRank(*job, [&](int r, Engine& e) {
    for (int step = 0; step < 10; ++step) {
      auto b = allreduce(e, "blocking", {float(r + step)}, ReduceOp::kSum,
                         SubmitMode::kCallerWaits);
      CHECK(driveAndWait(e, b).ok());
      CHECK_EQ(b->out[0], float(1 + 2 * step));
      std::vector<std::shared_ptr<Op>> burst;
      for (int i = 0; i < 3; ++i)
        burst.push_back(allreduce(e, "async." + std::to_string(i), {float(r + i)}));
      for (int i = 0; i < 3; ++i) {
        CHECK(driveAndWait(e, burst[i]).ok());
        CHECK_EQ(burst[i]->out[0], float(1 + 2 * i));
      }
    }
    auto elsewhere = allreduce(e, "async.0", {float(r)});
    CHECK(waitFor(*elsewhere).ok());
    CHECK_EQ(elsewhere->out[0], 1.f);
  });
  for (auto& e : job->engines) {
    CHECK(e->laneOps() > 0);
    CHECK(!e->laneOff());
  }
}

// Shutdown completes an async op the lane still holds with an error.
TEST(on_one_host_shutdown_fails_the_deferred_ops) {
  auto job = startOneHostJob(2, std::chrono::seconds(60));
  std::vector<std::shared_ptr<Op>> held(2);
  onEveryRank(*job, [&](int r, Engine& e) {
    auto first = allreduce(e, "x", {float(r)});  // through the engine: the lane learns "x"
    CHECK(driveAndWait(e, first).ok());
    held[r] = allreduce(e, "x", {float(r)});
  });
  for (int r = 0; r < 2; ++r) CHECK(!held[r]->work->done());  // deferred: nobody waited
  onEveryRank(*job, [&](int, Engine& e) { e.shutdown(); });
  // Its own shutdown, or the peer's seen first (a peer failure): an error, no hang.
  for (int r = 0; r < 2; ++r) CHECK(!waitFor(*held[r]).ok());
}

// Issue #47: with the agreement on, a cached op's every step runs without
// rank 0 (agreedOps), with the same sums, on 2 and 3 ranks; names submitted
// in other orders and a changed shape (a stale slot, renegotiated) included.
TEST(cached_ops_are_agreed_among_the_ranks_without_rank_0) {
  for (int n : {2, 3}) {
    auto job = startJob(n, [](EngineConfig& c) { c.agreement = EngineConfig::Agreement::kOn; });
    const int steps = 6;
    std::vector<std::string> errors(n);
    onEveryRank(*job, [&](int r, Engine& e) {
      for (int step = 0; step < steps; ++step) {
        // Odd ranks submit in the other order; step 4 changes b's shape.
        const size_t b_len = step >= 4 ? 3 : 1;
        std::shared_ptr<Op> x, y;
        if (r % 2 == 0) {
          x = allreduce(e, "a", {float(r), float(step)});
          y = allreduce(e, "b", std::vector<float>(b_len, 10.f * r));
        } else {
          y = allreduce(e, "b", std::vector<float>(b_len, 10.f * r));
          x = allreduce(e, "a", {float(r), float(step)});
        }
        Status sx = waitFor(*x), sy = waitFor(*y);
        float sum_r = 0;
        for (int q = 0; q < n; ++q) sum_r += float(q);
        if (!sx.ok() || !sy.ok() || x->out != std::vector<float>{sum_r, float(step * n)} ||
            y->out != std::vector<float>(b_len, 10.f * sum_r))
          errors[r] = "step " + std::to_string(step) + ": " + sx.message + sy.message;
      }
    });
    for (int r = 0; r < n; ++r) CHECK_EQ(errors[r], std::string());
    for (int r = 0; r < n; ++r) {
      // Steps 1-3 of a and b, and 5 of both (4 renegotiates b, and a with it
      // when they share a round): at least 6 ops agreed, by rounds.
      CHECK(job->engines[r]->agreedOps() >= 6);
      CHECK(job->engines[r]->agreementRounds() >= 3);
      CHECK_EQ(job->engines[r]->cachedSubmissions(), uint64_t{0});
    }
  }
}

TEST(an_agreed_job_fails_every_rank_when_one_leaves) {
  // Rank 2 of 3 shuts down while the others wait for an agreed op: they fail
  // with a peer failure, never hang.
  auto job = startJob(3, [](EngineConfig& c) { c.agreement = EngineConfig::Agreement::kOn; });
  onEveryRank(*job, [&](int r, Engine& e) {
    auto x = allreduce(e, "warm", {1.f});
    waitFor(*x);
    (void)r;
  });
  onEveryRank(*job, [&](int r, Engine& e) {
    auto x = allreduce(e, "warm", {1.f});
    waitFor(*x);
    (void)r;
  });
  job->engines[2]->shutdown();
  std::vector<Status> got(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] { got[r] = waitFor(*allreduce(*job->engines[r], "warm", {1.f})); });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    CHECK(!got[r].ok());
    CHECK_EQ(static_cast<int>(got[r].code), static_cast<int>(Status::kPeerFailure));
  }
}

// Issue #47: across hosts, each host's first rank relays its ranks' control
// frames, so rank 0 holds one connection per other host; new names (every
// step's) negotiate through them with the right sums, on 2 hosts of 3 ranks,
// 3 hosts of 2, and 3 hosts of 1 (leaders with no ranks to relay).
TEST(new_names_reach_rank_0_through_host_leaders) {
  for (auto [n, hosts] : {std::pair{6, 2}, std::pair{6, 3}, std::pair{3, 3}}) {
    const int per = n / hosts;
    auto job = startJob(n, nullptr, -1, -1, false, "fake", hosts);
    std::vector<std::string> errors(n);
    onEveryRank(*job, [&](int r, Engine& e) {
      for (int step = 0; step < 4; ++step) {
        auto fresh = allreduce(e, "new." + std::to_string(step), {float(r), 1.f});
        auto cached = allreduce(e, "cached", {float(step)});
        Status a = waitFor(*fresh), b = waitFor(*cached);
        if (!a.ok() || !b.ok() || fresh->out != std::vector<float>{n * (n - 1) / 2.f, float(n)} ||
            cached->out != std::vector<float>{float(n * step)})
          errors[r] = "step " + std::to_string(step) + ": " + a.message + b.message;
      }
    });
    for (int r = 0; r < n; ++r) CHECK_EQ(errors[r], std::string());
    // Rank 0: its host's other ranks and one leader per other host.
    CHECK_EQ(job->engines[0]->controlLinks(), size_t(per - 1 + hosts - 1));
    for (int r = 1; r < n; ++r) {
      const bool leader = r % per == 0;
      CHECK_EQ(job->engines[r]->controlLinks(), size_t(leader ? per : 1));
      if (leader) CHECK(job->engines[r]->relayedFrames() >= size_t(4 * (per - 1)));
      if (!leader) CHECK_EQ(job->engines[r]->relayedFrames(), uint64_t{0});
    }
  }
}

// A host leader that leaves takes its host's path to rank 0 with it: every
// other rank's op fails as a peer failure, none hangs.
TEST(a_host_leader_that_leaves_fails_every_rank) {
  const int n = 6;
  auto job = startJob(n, nullptr, -1, -1, false, "fake", 2);
  onEveryRank(*job, [&](int, Engine& e) { waitFor(*allreduce(e, "warm", {1.f})); });
  job->engines[3]->shutdown();  // host 1's leader
  std::vector<Status> got(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    if (r == 3) continue;
    threads.emplace_back([&, r] { got[r] = waitFor(*allreduce(*job->engines[r], "after", {1.f})); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    if (r == 3) continue;
    CHECK(!got[r].ok());
    CHECK(got[r].message.find("rank 3") != std::string::npos);
    CHECK_EQ(static_cast<int>(got[r].code), static_cast<int>(Status::kPeerFailure));
  }
}

int main() { return check::runAll(); }
