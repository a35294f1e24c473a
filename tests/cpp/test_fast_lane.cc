// The fast lane (csrc/core/fast_lane.h): threads stand in for ranks, sharing
// one zero-filled area as the ranks share the control segment. Each rank
// learns the same response, then submits; the checks read what each rank got
// (outcomes and outputs) after the threads joined.
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "core/fast_lane.h"

using namespace hvd;
using Outcome = FastLane::Outcome;

namespace {

constexpr size_t kSlots = 8;
constexpr size_t kRowBytes = 1024;

struct Job {
  // A patience far past any scheduling delay: only the tests that mean a
  // rank to give up shorten it.
  explicit Job(int n, std::chrono::microseconds patience = std::chrono::seconds(5))
      : area(FastLane::footprint(n, kSlots, kRowBytes), 0) {
    for (int r = 0; r < n; ++r)
      lanes.push_back(std::make_unique<FastLane>(area.data(), n, r, kSlots, kRowBytes, patience,
                                                 true));
  }
  int size() const { return static_cast<int>(lanes.size()); }
  std::vector<char> area;
  std::vector<std::unique_ptr<FastLane>> lanes;
};

Request allreduceRequest(const std::string& name, int64_t count) {
  Request q;
  q.type = OpType::kAllreduce;
  q.dtype = DataType::kFloat32;
  q.reduce_op = ReduceOp::kSum;
  q.name = name;
  q.shape = {count};
  return q;
}

Response responseFor(const Request& q, int32_t slot) {
  Response r;
  r.type = q.type;
  r.names = {q.name};
  r.cache_ids = {slot};
  return r;
}

// One rank's submission of a float allreduce of `count` elements, each
// rank + 1 + round: returns the outcome, and the output in `out`.
Outcome allreduceOnce(FastLane& lane, const Request& q, int rank, int round, bool blocking,
                      std::vector<float>* out) {
  std::vector<float> in(static_cast<size_t>(q.shape[0]), static_cast<float>(rank + 1 + round));
  out->assign(in.size(), -1.0f);
  Entry e;
  e.request = q;
  e.input = in.data();
  e.output = out->data();
  e.work = std::make_shared<Work>();
  return lane.submit(e, blocking);
}

// Runs `body(rank)` on one thread per rank and joins them.
template <class Body>
void onEveryRank(int n, Body body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { body(r); });
  for (auto& t : threads) t.join();
}

void checkRounds(int n) {
  Job job(n);
  const Request q = allreduceRequest("x", 5);
  for (auto& lane : job.lanes) lane->learn(q, responseFor(q, 3), 0);
  constexpr int kRounds = 200;
  std::vector<std::vector<Outcome>> outcomes(n);
  std::vector<std::vector<float>> last(n);
  onEveryRank(n, [&](int r) {
    for (int round = 0; round < kRounds; ++round)
      outcomes[r].push_back(allreduceOnce(*job.lanes[r], q, r, round, true, &last[r]));
  });
  const float want = static_cast<float>(n * (n + 1) / 2 + n * (kRounds - 1));
  for (int r = 0; r < n; ++r) {
    int ran = 0;
    for (Outcome o : outcomes[r]) ran += o == Outcome::kRan;
    // With a patience of 200 ms every round meets on the lane.
    CHECK_EQ(ran, kRounds);
    CHECK_EQ(last[r], std::vector<float>(5, want));
    CHECK_EQ(job.lanes[r]->ranOps(), uint64_t{kRounds});
  }
}

}  // namespace

TEST(every_round_of_a_cached_allreduce_runs_on_the_lane_with_2_ranks) { checkRounds(2); }
TEST(every_round_of_a_cached_allreduce_runs_on_the_lane_with_3_ranks) { checkRounds(3); }

TEST(a_name_without_a_slot_is_left_to_the_engine) {
  Job job(2);
  std::vector<float> out;
  CHECK(allreduceOnce(*job.lanes[0], allreduceRequest("never.learnt", 2), 0, 0, true, &out) ==
        Outcome::kUnknown);
}

// One rank submits the instance to the engine (async): the rank waiting on
// the lane sees the cancel and goes to the engine too, and the next instance
// meets on the lane again: the counts stayed in step.
TEST(an_engine_submission_cancels_the_instance_for_every_rank) {
  Job job(2);
  const Request q = allreduceRequest("x", 3);
  for (auto& lane : job.lanes) lane->learn(q, responseFor(q, 0), 0);
  std::vector<Outcome> first(2), second(2);
  std::vector<std::vector<float>> out(2);
  onEveryRank(2, [&](int r) {
    first[r] = allreduceOnce(*job.lanes[r], q, r, 0, /*blocking=*/r == 0, &out[r]);
    second[r] = allreduceOnce(*job.lanes[r], q, r, 1, true, &out[r]);
  });
  CHECK(first[0] == Outcome::kRegistered);
  CHECK(first[1] == Outcome::kRegistered);
  CHECK(second[0] == Outcome::kRan);
  CHECK(second[1] == Outcome::kRan);
  CHECK_EQ(out[0], std::vector<float>(3, 1.0f + 1 + 2.0f + 1));
  CHECK_EQ(job.lanes[0]->gaveUp(), uint64_t{0});
}

// A rank that does not come within the patience: the waiting rank gives up
// and takes the engine; the late rank finds the instance cancelled and takes
// the engine too; the next instance meets on the lane.
TEST(a_late_rank_costs_one_instance_then_the_lane_resumes) {
  Job job(2, std::chrono::microseconds(2000));
  const Request q = allreduceRequest("x", 1);
  for (auto& lane : job.lanes) lane->learn(q, responseFor(q, 1), 0);
  std::vector<Outcome> first(2), second(2);
  std::vector<std::vector<float>> out(2);
  onEveryRank(2, [&](int r) {
    // Rank 1 comes only once rank 0 has given up on it.
    while (r == 1 && job.lanes[0]->gaveUp() == 0) std::this_thread::yield();
    first[r] = allreduceOnce(*job.lanes[r], q, r, 0, true, &out[r]);
  });
  onEveryRank(2, [&](int r) { second[r] = allreduceOnce(*job.lanes[r], q, r, 1, true, &out[r]); });
  CHECK(first[0] == Outcome::kRegistered);
  CHECK(first[1] == Outcome::kRegistered);
  CHECK_EQ(job.lanes[0]->gaveUp(), uint64_t{1});
  CHECK(second[0] == Outcome::kRan);
  CHECK(second[1] == Outcome::kRan);
  CHECK_EQ(out[1], std::vector<float>(1, 5.0f));
}

// Ranks that learnt different responses for one slot (one missed a
// renegotiation) never run it on the lane, whatever their requests say.
TEST(ranks_that_learnt_different_shapes_leave_the_op_to_the_engine) {
  Job job(2);
  const Request a = allreduceRequest("x", 4);
  const Request b = allreduceRequest("x", 2);
  job.lanes[0]->learn(a, responseFor(a, 2), 0);
  job.lanes[1]->learn(b, responseFor(b, 2), 0);
  std::vector<Outcome> got(2);
  std::vector<std::vector<float>> out(2);
  onEveryRank(2, [&](int r) { got[r] = allreduceOnce(*job.lanes[r], r == 0 ? a : b, r, 0, true, &out[r]); });
  CHECK(got[0] == Outcome::kRegistered);
  CHECK(got[1] == Outcome::kRegistered);
  CHECK_EQ(job.lanes[0]->ranOps() + job.lanes[1]->ranOps(), uint64_t{0});
  CHECK_EQ(out[0], std::vector<float>(4, -1.0f));  // nothing written
}

// A joined rank registers others' instances as a bystander: once its join
// ends, the lane meets again.
TEST(a_bystander_keeps_the_counts_in_step) {
  Job job(2);
  const Request q = allreduceRequest("x", 1);
  for (auto& lane : job.lanes) lane->learn(q, responseFor(q, 4), 0);
  std::vector<float> out0, out1;
  job.lanes[1]->joined(true);
  // Rank 0 sees rank 1 joined: it does not wait, it registers and takes the engine.
  CHECK(allreduceOnce(*job.lanes[0], q, 0, 0, true, &out0) == Outcome::kRegistered);
  job.lanes[1]->bystander("x");
  job.lanes[1]->joined(false);
  std::vector<Outcome> got(2);
  std::vector<std::vector<float>> out(2);
  onEveryRank(2, [&](int r) { got[r] = allreduceOnce(*job.lanes[r], q, r, 1, true, &out[r]); });
  CHECK(got[0] == Outcome::kRan);
  CHECK(got[1] == Outcome::kRan);
  CHECK_EQ(out[0], std::vector<float>(1, 5.0f));
}

// A joined rank that only saw a name reduced inline knows its slot, not its
// request: it registers the instance (cancels) instead of arriving, and the
// lane meets once it learnt the op.
TEST(a_slot_learnt_without_its_request_registers_and_keeps_counts) {
  Job job(2);
  const Request q = allreduceRequest("x", 1);
  job.lanes[0]->learn(q, responseFor(q, 6), 0);
  job.lanes[1]->learnSlots(responseFor(q, 6));
  std::vector<Outcome> first(2), second(2);
  std::vector<std::vector<float>> out(2);
  onEveryRank(2, [&](int r) { first[r] = allreduceOnce(*job.lanes[r], q, r, 0, true, &out[r]); });
  job.lanes[1]->learn(q, responseFor(q, 6), 0);
  onEveryRank(2, [&](int r) { second[r] = allreduceOnce(*job.lanes[r], q, r, 1, true, &out[r]); });
  CHECK(first[0] == Outcome::kRegistered);
  CHECK(first[1] == Outcome::kRegistered);
  CHECK(second[0] == Outcome::kRan);
  CHECK(second[1] == Outcome::kRan);
}

// Rank 0's timeline pauses the lane: every rank registers and takes the
// engine, whose ops the timeline records.
TEST(a_paused_lane_runs_nothing) {
  Job job(2);
  const Request q = allreduceRequest("x", 1);
  for (auto& lane : job.lanes) lane->learn(q, responseFor(q, 5), 0);
  job.lanes[0]->setPaused(true);
  std::vector<Outcome> got(2);
  std::vector<std::vector<float>> out(2);
  onEveryRank(2, [&](int r) { got[r] = allreduceOnce(*job.lanes[r], q, r, 0, true, &out[r]); });
  CHECK(got[0] == Outcome::kRegistered);
  CHECK(got[1] == Outcome::kRegistered);
}

// Allgather of uneven rows (rank r brings r + 1 rows of 2), alltoall with
// uneven splits, broadcast from rank 2, reducescatter with Average: 3 ranks.
TEST(allgather_alltoall_broadcast_and_reducescatter_on_3_ranks) {
  constexpr int n = 3;
  Job job(n);
  std::vector<Request> gathers(n), alltoalls(n);
  Response gathered;
  gathered.type = OpType::kAllgather;
  gathered.cache_ids = {0};
  gathered.rank_first_dims = {{1, 2, 3}};
  Response exchanged;
  exchanged.type = OpType::kAlltoall;
  exchanged.cache_ids = {1};
  // Rank s sends s + d + 1 rows of 1 element to rank d.
  exchanged.alltoall_splits = {{1, 2, 3, 2, 3, 4, 3, 4, 5}};
  Request bcast;
  bcast.type = OpType::kBroadcast;
  bcast.dtype = DataType::kInt32;
  bcast.root_rank = 2;
  bcast.name = "b";
  bcast.shape = {4};
  Request scatter = allreduceRequest("rs", 0);
  scatter.type = OpType::kReducescatter;
  scatter.reduce_op = ReduceOp::kAverage;
  scatter.shape = {4, 2};  // rows 2, 1, 1 to ranks 0, 1, 2
  for (int r = 0; r < n; ++r) {
    gathers[r] = allreduceRequest("g", 0);
    gathers[r].type = OpType::kAllgather;
    gathers[r].shape = {r + 1, 2};
    alltoalls[r] = allreduceRequest("a", 0);
    alltoalls[r].type = OpType::kAlltoall;
    alltoalls[r].shape = {3 * r + 6};
    alltoalls[r].send_splits = {r + 1, r + 2, r + 3};
    job.lanes[r]->learn(gathers[r], gathered, 0);
    job.lanes[r]->learn(alltoalls[r], exchanged, 0);
    job.lanes[r]->learn(bcast, responseFor(bcast, 2), 0);
    job.lanes[r]->learn(scatter, responseFor(scatter, 3), 0);
  }
  std::vector<std::vector<float>> gather_out(n), alltoall_out(n), scatter_out(n);
  std::vector<std::vector<int32_t>> bcast_out(n);
  std::vector<std::vector<int64_t>> received(n);
  std::vector<int> ran(n, 0);
  onEveryRank(n, [&](int r) {
    auto into = [](std::vector<float>& v, int64_t row_elems) {
      return [&v, row_elems](int64_t rows) {
        v.assign(static_cast<size_t>(rows * row_elems), -1.0f);
        return static_cast<void*>(v.data());
      };
    };
    std::vector<float> g(static_cast<size_t>(2 * (r + 1)), static_cast<float>(r));
    Entry e;
    e.request = gathers[r];
    e.input = g.data();
    e.allocate = into(gather_out[r], 2);
    e.work = std::make_shared<Work>();
    ran[r] += job.lanes[r]->submit(e, true) == Outcome::kRan;

    std::vector<float> a;  // the block for rank d holds 10 * r + d
    for (int d = 0; d < n; ++d) a.insert(a.end(), static_cast<size_t>(r + d + 1), 10.0f * r + d);
    Entry x;
    x.request = alltoalls[r];
    x.input = a.data();
    x.allocate = into(alltoall_out[r], 1);
    x.work = std::make_shared<Work>();
    ran[r] += job.lanes[r]->submit(x, true) == Outcome::kRan;
    received[r] = x.work->rankRows();

    std::vector<int32_t> b(4, r == 2 ? 42 : r);
    bcast_out[r].assign(4, -1);
    Entry y;
    y.request = bcast;
    y.input = b.data();
    y.output = bcast_out[r].data();
    y.work = std::make_shared<Work>();
    ran[r] += job.lanes[r]->submit(y, true) == Outcome::kRan;

    std::vector<float> s(8);
    for (int i = 0; i < 8; ++i) s[i] = static_cast<float>(3 * i + r);  // mean over ranks: 3i + 1
    Entry z;
    z.request = scatter;
    z.input = s.data();
    z.allocate = into(scatter_out[r], 2);
    z.work = std::make_shared<Work>();
    ran[r] += job.lanes[r]->submit(z, true) == Outcome::kRan;
  });
  for (int r = 0; r < n; ++r) {
    CHECK_EQ(ran[r], 4);
    CHECK_EQ(gather_out[r], (std::vector<float>{0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2}));
    std::vector<float> want;
    for (int s = 0; s < n; ++s) want.insert(want.end(), static_cast<size_t>(s + r + 1), 10.0f * s + r);
    CHECK_EQ(alltoall_out[r], want);
    CHECK_EQ(received[r], (std::vector<int64_t>{r + 1, r + 2, r + 3}));
    CHECK_EQ(bcast_out[r], std::vector<int32_t>(4, 42));
  }
  CHECK_EQ(scatter_out[0], (std::vector<float>{1, 4, 7, 10}));
  CHECK_EQ(scatter_out[1], (std::vector<float>{13, 16}));
  CHECK_EQ(scatter_out[2], (std::vector<float>{19, 22}));
}

int main() { return check::runAll(); }

// Deferred submissions (the lane's async ops, lane.h; test_lane.cc): each
// rank takes its tickets for two names in submission order, then resolves
// them when its caller waits; resolving in the same order on every rank, all
// of them run on the lane. A rank that resolves without attempting (a poll,
// the watch thread) cancels: the others go to the engine for that instance,
// and the next one meets on the lane again.
TEST(deferred_submissions_run_on_the_lane_when_resolved_in_order) {
  Job job(2);
  const Request a = allreduceRequest("a", 2);
  const Request b = allreduceRequest("b", 2);
  for (auto& lane : job.lanes) {
    lane->learn(a, responseFor(a, 0), 0);
    lane->learn(b, responseFor(b, 1), 0);
  }
  std::vector<std::vector<Outcome>> outcomes(2);
  std::vector<std::vector<float>> outs(2, std::vector<float>(6, -1.0f));
  onEveryRank(2, [&](int r) {
    FastLane& lane = *job.lanes[r];
    std::vector<float> in(2, static_cast<float>(r + 1));
    std::vector<Entry> entries(3);
    std::vector<FastLane::Ticket> tickets;
    for (int i = 0; i < 3; ++i) {
      entries[i].request = i == 1 ? b : a;
      entries[i].input = in.data();
      entries[i].output = outs[r].data() + 2 * i;
      entries[i].work = std::make_shared<Work>();
      // The third is "a" again: a new instance, deferred while the first waits.
      if (i < 2) tickets.push_back(lane.defer(entries[i]));
    }
    CHECK(tickets[0].op != nullptr && tickets[1].op != nullptr);
    for (int i = 0; i < 2; ++i) outcomes[r].push_back(lane.resolve(entries[i], tickets[i], true));
    FastLane::Ticket again = lane.defer(entries[2]);
    // Rank 1 sends this one to the engine (a poll): rank 0's attempt sees it.
    outcomes[r].push_back(lane.resolve(entries[2], again, r == 0));
    std::vector<float> next;
    outcomes[r].push_back(allreduceOnce(lane, a, r, 0, true, &next));
  });
  for (int r = 0; r < 2; ++r) {
    CHECK(outcomes[r][0] == Outcome::kRan);
    CHECK(outcomes[r][1] == Outcome::kRan);
    CHECK(outcomes[r][2] == Outcome::kRegistered);
    CHECK(outcomes[r][3] == Outcome::kRan);
    CHECK_EQ(std::vector<float>(outs[r].begin(), outs[r].begin() + 4),
             std::vector<float>(4, 3.0f));
  }
}

TEST(a_name_without_a_slot_is_never_deferred) {
  Job job(2);
  Entry e;
  e.request = allreduceRequest("never.learnt", 2);
  CHECK(job.lanes[0]->defer(e).op == nullptr);
}
