// The lane (csrc/core/lane.h): threads stand in for ranks, each with its
// Lane over one shared zero-filled area (as the ranks share the control
// segment) and a sink that stands in for its engine. Async submissions are
// deferred until their callers wait; a poll, the watch thread or a failure
// send them on. The checks read what each rank got after the threads joined.
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "core/lane.h"

using namespace hvd;

namespace {

constexpr size_t kSlots = 8;
constexpr size_t kRowBytes = 256;

// The engine as the lane sees it: a queue that records what it was given.
class FakeEngine final : public Lane::Sink {
 public:
  Status stopped() override {
    std::lock_guard<std::mutex> lock(mu_);
    return stopped_;
  }
  bool queueForEngine(Entry&& e) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!stopped_.ok()) {
      const Status why = stopped_;
      lock.unlock();
      e.work->complete(why);
      return false;
    }
    queued_.push_back(std::move(e));
    cv_.notify_all();
    return true;
  }
  void wake() override {
    std::lock_guard<std::mutex> lock(mu_);
    ++wakes_;
  }
  void stop(Status why) {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = std::move(why);
  }
  // Waits until `n` entries were queued (the event the watch thread causes).
  bool awaitQueued(size_t n, std::chrono::seconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return queued_.size() >= n; });
  }
  size_t queued() {
    std::lock_guard<std::mutex> lock(mu_);
    return queued_.size();
  }
  int wakes() {
    std::lock_guard<std::mutex> lock(mu_);
    return wakes_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  Status stopped_;
  std::vector<Entry> queued_;
  int wakes_ = 0;
};

struct Job {
  // A patience far past any scheduling delay; `defer`: the watch thread's.
  explicit Job(int n, std::chrono::microseconds defer = std::chrono::seconds(60))
      : area(FastLane::footprint(n, kSlots, kRowBytes), 0), sinks(n) {
    for (int r = 0; r < n; ++r) {
      auto fast = std::make_unique<FastLane>(area.data(), n, r, kSlots, kRowBytes,
                                             std::chrono::seconds(5), true);
      lanes.push_back(std::make_unique<Lane>(std::move(fast), defer, sinks[r]));
    }
  }
  int size() const { return static_cast<int>(lanes.size()); }
  std::vector<char> area;
  std::vector<FakeEngine> sinks;  // declared before lanes: the lanes' watch threads use them
  std::vector<std::unique_ptr<Lane>> lanes;
};

Request allreduceRequest(const std::string& name) {
  Request q;
  q.type = OpType::kAllreduce;
  q.dtype = DataType::kFloat32;
  q.reduce_op = ReduceOp::kSum;
  q.name = name;
  q.shape = {2};
  return q;
}

// Every rank learns `names`, slot i for names[i], as from one response each.
void learn(Job& job, const std::vector<std::string>& names) {
  for (size_t i = 0; i < names.size(); ++i) {
    const Request q = allreduceRequest(names[i]);
    Response r;
    r.type = q.type;
    r.names = {q.name};
    r.cache_ids = {static_cast<int32_t>(i)};
    for (auto& lane : job.lanes) lane->learn(q, r, 0);
  }
}

// One rank's allreduce of {rank + 1, rank + 1}; the caller keeps it alive.
struct Op {
  std::vector<float> in, out;
  Entry entry;
  std::shared_ptr<Work> work = std::make_shared<Work>();
  Op(const std::string& name, int rank) : in(2, float(rank + 1)), out(2, -1.0f) {
    entry.request = allreduceRequest(name);
    entry.input = in.data();
    entry.output = out.data();
    entry.work = work;
  }
};

template <class Body>
void onEveryRank(int n, Body body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { body(r); });
  for (auto& t : threads) t.join();
}

}  // namespace

// K async ops then their waits (the optimizer's pattern): each is deferred
// when submitted and runs on the lane when its caller waits, with the
// other ranks' in one pass each; nothing reaches the engine.
TEST(async_ops_are_deferred_and_run_on_the_lane_when_their_callers_wait) {
  Job job(2);
  learn(job, {"a", "b", "c"});
  std::vector<std::vector<std::unique_ptr<Op>>> ops(2);
  std::vector<std::vector<bool>> deferred(2), done_early(2);
  onEveryRank(2, [&](int r) {
    for (const char* name : {"a", "b", "c"}) {
      ops[r].push_back(std::make_unique<Op>(name, r));
      deferred[r].push_back(job.lanes[r]->submit(ops[r].back()->entry, SubmitMode::kAsync));
      done_early[r].push_back(ops[r].back()->work->done());
    }
    job.lanes[r]->resolveAll(true);  // the first synchronize
  });
  for (int r = 0; r < 2; ++r) {
    CHECK_EQ(deferred[r], std::vector<bool>(3, true));
    CHECK_EQ(done_early[r], std::vector<bool>(3, false));
    for (auto& op : ops[r]) {
      CHECK(op->work->done() && op->work->wait().ok());
      CHECK_EQ(op->out, std::vector<float>(2, 3.0f));
    }
    CHECK_EQ(job.lanes[r]->ranOps(), uint64_t{3});
    CHECK_EQ(job.sinks[r].queued(), size_t{0});
  }
}

// A blocking submission first resolves the deferred ones, in order, then
// runs itself on the lane.
TEST(a_blocking_submission_runs_the_deferred_ones_first) {
  Job job(2);
  learn(job, {"a", "b"});
  std::vector<std::unique_ptr<Op>> async(2), blocking(2);
  std::vector<int> ran(2);  // not vector<bool>: its bits share words across threads
  onEveryRank(2, [&](int r) {
    async[r] = std::make_unique<Op>("a", r);
    blocking[r] = std::make_unique<Op>("b", r);
    job.lanes[r]->submit(async[r]->entry, SubmitMode::kAsync);
    ran[r] = job.lanes[r]->submit(blocking[r]->entry, SubmitMode::kCallerWaits);
  });
  for (int r = 0; r < 2; ++r) {
    CHECK(ran[r]);
    CHECK(async[r]->work->done() && blocking[r]->work->done());
    CHECK_EQ(async[r]->out, std::vector<float>(2, 3.0f));
    CHECK_EQ(blocking[r]->out, std::vector<float>(2, 3.0f));
    CHECK_EQ(job.lanes[r]->ranOps(), uint64_t{2});
  }
}

// A poll on one rank sends its deferred op to the engine: the other rank's
// attempt sees the instance cancelled and goes to the engine too, and the
// next instance meets on the lane again.
TEST(a_poll_sends_the_deferred_ops_to_the_engine_on_every_rank) {
  Job job(2);
  learn(job, {"a"});
  std::vector<std::unique_ptr<Op>> first(2), second(2);
  onEveryRank(2, [&](int r) {
    first[r] = std::make_unique<Op>("a", r);
    job.lanes[r]->submit(first[r]->entry, SubmitMode::kAsync);
    job.lanes[r]->resolveAll(r == 0);  // rank 1 polls, rank 0 waits
    second[r] = std::make_unique<Op>("a", r);
    job.lanes[r]->submit(second[r]->entry, SubmitMode::kCallerWaits);
  });
  for (int r = 0; r < 2; ++r) {
    CHECK(!first[r]->work->done());  // the engine's now
    CHECK_EQ(job.sinks[r].queued(), size_t{1});
    CHECK(job.sinks[r].wakes() >= 1);
    CHECK(second[r]->work->done());
    CHECK_EQ(second[r]->out, std::vector<float>(2, 3.0f));
  }
}

// A rank whose caller never waits: once it deferred nothing for `defer`, the
// watch thread sends its ops to the engine.
TEST(the_watch_thread_sends_ops_on_once_the_rank_stopped_deferring) {
  Job job(1, std::chrono::milliseconds(2));
  learn(job, {"a", "b"});
  Op a("a", 0), b("b", 0);
  CHECK(job.lanes[0]->submit(a.entry, SubmitMode::kAsync));
  CHECK(job.lanes[0]->submit(b.entry, SubmitMode::kAsync));
  CHECK(job.sinks[0].awaitQueued(2, std::chrono::seconds(30)));
  CHECK(!a.work->done() && !b.work->done());
}

// A failure completes the deferred ops with its status; once the engine
// stopped, a submission is refused rather than deferred.
TEST(a_failure_completes_the_deferred_ops_and_refuses_new_ones) {
  Job job(1);
  learn(job, {"a", "b"});
  Op a("a", 0), b("b", 0);
  CHECK(job.lanes[0]->submit(a.entry, SubmitMode::kAsync));
  job.sinks[0].stop(Status::peerFailure("rank 1 is gone"));
  job.lanes[0]->fail(Status::peerFailure("rank 1 is gone"));
  CHECK(a.work->done() && a.work->wait().code == Status::kPeerFailure);
  CHECK(job.lanes[0]->submit(b.entry, SubmitMode::kAsync));
  CHECK(b.work->done() && b.work->wait().code == Status::kPeerFailure);
  job.lanes[0]->resolveAll(true);  // nothing left
  CHECK_EQ(job.sinks[0].queued(), size_t{0});
}

// Grouped members and names without a slot are never deferred: the lane
// registers them (or knows nothing of them) and the caller queues them.
TEST(what_the_lane_cannot_run_is_left_to_the_engine) {
  Job job(1);
  Op unknown("never.learnt", 0);
  CHECK(!job.lanes[0]->submit(unknown.entry, SubmitMode::kAsync));
  CHECK(!job.lanes[0]->submit(unknown.entry, SubmitMode::kGroupMember));
  CHECK(!unknown.work->done());
}

int main() { return check::runAll(); }
