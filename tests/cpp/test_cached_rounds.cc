// CachedRounds over BitAgreement (csrc/core/cached_rounds.h): N ranks in one
// process, each submitting the same cached names in its own random order,
// step after step, their agreement messages delivered in a random order.
// Every rank must run the same responses in the same order (a set's members
// the same list), each op once per step and only after every member
// submitted it; nothing comes from rank 0.
#include "core/cached_rounds.h"

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "check.h"

using namespace hvd;

namespace {

ReadyOp cachedOp(const std::string& name, int32_t slot, int32_t process_set = 0,
                 const std::string& group = "", int32_t group_size = 0, int64_t elements = 256) {
  ReadyOp op;
  op.request.name = name;
  op.request.shape = {elements};
  op.request.process_set = process_set;
  op.request.group = group;
  op.request.group_size = group_size;
  op.response.kind = Response::kExecute;
  op.response.type = OpType::kAllreduce;
  op.response.names = {name};
  op.response.process_set = process_set;
  op.response.cache_ids = {slot};
  return op;
}

struct Names {
  std::vector<ReadyOp> ops;
  std::vector<std::set<int>> members;  // by slot
};

// 6 global names (two of them a group), 2 names of a set of the even ranks.
Names jobNames(int n) {
  Names job;
  std::set<int> all, even;
  for (int r = 0; r < n; ++r) {
    all.insert(r);
    if (r % 2 == 0) even.insert(r);
  }
  for (int i = 0; i < 4; ++i) job.ops.push_back(cachedOp("grad." + std::to_string(i), i));
  job.ops.push_back(cachedOp("g.0", 4, 0, "g", 2));
  job.ops.push_back(cachedOp("g.1", 5, 0, "g", 2));
  job.ops.push_back(cachedOp("even.0", 6, 1));
  job.ops.push_back(cachedOp("even.1", 7, 1, "", 0, 1 << 20));  // over the threshold: alone
  for (const ReadyOp& op : job.ops) job.members.push_back(op.request.process_set == 0 ? all : even);
  return job;
}

struct Rank {
  CachedRounds rounds{100, 64 * 1024};
  std::unique_ptr<BitAgreement> agreement;
  std::vector<int32_t> to_submit;     // this step's, in this rank's order
  std::vector<std::string> ran;       // names, in the order run
  std::vector<size_t> fused;          // names per response run
  std::vector<uint64_t> batches;      // per round
};

struct Job {
  int n;
  std::mt19937_64 rng;
  Names names;
  std::vector<Rank> ranks;
  std::vector<std::tuple<int, int, std::string>> net;  // from, to, bytes
  size_t refused = 0;

  Job(int size, uint64_t seed) : n(size), rng(seed), names(jobNames(size)), ranks(size) {
    for (int r = 0; r < n; ++r) {
      ranks[r].agreement = std::make_unique<BitAgreement>(n, r, ranks[r].rounds.layout());
      for (size_t s = 0; s < names.ops.size(); ++s)
        ranks[r].rounds.learn(static_cast<int32_t>(s), names.ops[s], names.members[s].count(r) > 0);
    }
  }
  void collect(int r) {
    std::vector<std::pair<int, AgreementMessage>> out;
    ranks[r].agreement->takeSends(out);
    for (auto& [to, m] : out) net.emplace_back(r, to, m.encode());
  }
  // What the engine will do between events: start a round when there is
  // news or a peer began one; apply a finished round.
  void tick(int r) {
    Rank& k = ranks[r];
    BitAgreement& a = *k.agreement;
    if (!a.active() && a.round() > k.batches.size()) {
      CachedRounds::Outcome o = k.rounds.apply(a.result());
      k.batches.push_back(o.batches);
      for (const Response& resp : o.run) {
        k.fused.push_back(resp.names.size());
        for (const auto& name : resp.names) k.ran.push_back(name);
      }
    }
    if (!a.active() && a.round() == k.batches.size() &&
        (k.rounds.hasNews() || a.peerStartedNext())) {
      a.start(k.rounds.vector());
      collect(r);
    }
  }
  bool deliverOne() {
    if (net.empty()) return false;
    const size_t i = std::uniform_int_distribution<size_t>(0, net.size() - 1)(rng);
    auto [from, to, bytes] = net[i];
    net.erase(net.begin() + static_cast<long>(i));
    Status s = ranks[to].agreement->receive(
        from, AgreementMessage::decode(bytes, ranks[to].rounds.layout().total()));
    if (!s.ok()) {
      ++refused;
      std::printf("  %s\n", s.message.c_str());
    }
    collect(to);
    return true;
  }
  // One training step: each rank submits its names (those of its sets) in
  // a random order, one at a time at random moments.
  void step() {
    for (int r = 0; r < n; ++r) {
      ranks[r].to_submit.clear();
      for (size_t s = 0; s < names.ops.size(); ++s)
        if (names.members[s].count(r)) ranks[r].to_submit.push_back(static_cast<int32_t>(s));
      std::shuffle(ranks[r].to_submit.begin(), ranks[r].to_submit.end(), rng);
    }
    for (int guard = 0; guard < 1000000; ++guard) {
      const int r = std::uniform_int_distribution<int>(0, n - 1)(rng);
      if (!ranks[r].to_submit.empty() && rng() % 3 == 0) {
        ranks[r].rounds.submit(ranks[r].to_submit.back());
        ranks[r].to_submit.pop_back();
      }
      for (int q = 0; q < n; ++q) tick(q);
      bool quiet = net.empty();
      for (int q = 0; q < n; ++q)
        quiet = quiet && ranks[q].to_submit.empty() && !ranks[q].agreement->active() &&
                ranks[q].rounds.waiting() == 0;
      if (quiet) return;
      deliverOne();
    }
    CHECK(false);  // the step never finished
  }
};

// One round between two ranks' CachedRounds, over a real BitAgreement: each
// rank's outcome.
std::vector<CachedRounds::Outcome> roundOfTwo(std::vector<CachedRounds>& ranks) {
  const AgreementLayout l = ranks[0].layout();
  BitAgreement a0(2, 0, l), a1(2, 1, l);
  a0.start(ranks[0].vector());
  a1.start(ranks[1].vector());
  std::vector<std::pair<int, AgreementMessage>> out0, out1;
  a0.takeSends(out0);
  a1.takeSends(out1);
  CHECK(a1.receive(0, out0.at(0).second).ok());
  CHECK(a0.receive(1, out1.at(0).second).ok());
  return {ranks[0].apply(a0.result()), ranks[1].apply(a1.result())};
}

}  // namespace

TEST(every_rank_runs_the_same_ops_in_the_same_order) {
  for (int n : {1, 2, 3, 4, 5, 8, 13}) {
    Job job(n, 17 * n);
    const int steps = 5;
    for (int i = 0; i < steps; ++i) job.step();
    CHECK_EQ(job.refused, size_t{0});
    // Rank 0 (a member of both sets) is the reference; others the same
    // sequence, the even set's names only where they are members.
    const Rank& ref = job.ranks[0];
    CHECK_EQ(ref.ran.size(), static_cast<size_t>(8 * steps));
    for (int r = 1; r < n; ++r) {
      std::vector<std::string> want;
      for (const auto& name : ref.ran)
        if (r % 2 == 0 || name.rfind("even.", 0) != 0) want.push_back(name);
      CHECK(job.ranks[r].ran == want);
    }
    // Each name once per step.
    std::map<std::string, int> count;
    for (const auto& name : ref.ran) ++count[name];
    for (const auto& [name, c] : count) CHECK_EQ(c, steps);
    // A group's members run together, one after the other.
    for (size_t i = 0; i < ref.ran.size(); ++i)
      if (ref.ran[i] == "g.0") CHECK(i + 1 < ref.ran.size() && ref.ran[i + 1] == "g.1");
  }
}

TEST(ops_submitted_together_are_fused_on_every_rank_alike) {
  // Every rank submits every name before any round: one round runs them all,
  // and the fused plan is the same everywhere.
  const int n = 4;
  Job job(n, 5);
  for (int r = 0; r < n; ++r)
    for (size_t s = 0; s < job.names.ops.size(); ++s)
      if (job.names.members[s].count(r)) job.ranks[r].rounds.submit(static_cast<int32_t>(s));
  for (int guard = 0; guard < 10000; ++guard) {
    for (int r = 0; r < n; ++r) job.tick(r);
    if (!job.deliverOne()) break;
  }
  for (int r = 0; r < n; ++r) job.tick(r);
  for (int r = 0; r < n; ++r) {
    CHECK_EQ(job.ranks[r].batches.size(), size_t{1});
    CHECK_EQ(job.ranks[r].rounds.waiting(), size_t{0});
  }
  // grad.0-3 and the group fuse into one allreduce (6 x 1 KiB); the even
  // set's two stay apart (another set; one is over the threshold).
  CHECK(job.ranks[0].fused == (std::vector<size_t>{6, 1, 1}));
  CHECK(job.ranks[1].fused == (std::vector<size_t>{6}));
  CHECK(job.ranks[2].fused == job.ranks[0].fused);
  CHECK(job.ranks[3].fused == job.ranks[1].fused);
}

TEST(a_stale_slot_is_forgotten_by_every_rank_at_the_same_round) {
  const int n = 3;
  Job job(n, 9);
  job.ranks[0].rounds.submit(2);
  job.ranks[1].rounds.submit(2);
  job.ranks[2].rounds.invalidate(2);  // rank 2 submitted grad.2 with another shape
  for (int guard = 0; guard < 10000; ++guard) {
    for (int r = 0; r < n; ++r) job.tick(r);
    if (!job.deliverOne()) break;
  }
  std::vector<CachedRounds::Outcome> outcomes;
  for (int r = 0; r < n; ++r) {
    Rank& k = job.ranks[r];
    CHECK(!k.agreement->active());
    CHECK_EQ(k.agreement->round(), uint64_t{1});
    CHECK(k.ran.empty());
    CHECK(k.rounds.find(2) == nullptr);  // forgotten everywhere
    CHECK(k.rounds.find(3) != nullptr);
    CHECK_EQ(k.rounds.waiting(), size_t{0});
  }
}

TEST(the_outcome_names_what_each_rank_renegotiates_and_the_batches) {
  std::vector<CachedRounds> ranks(2, CachedRounds(100, 1 << 16));
  for (int r = 0; r < 2; ++r)
    for (int s = 0; s < 4; ++s) ranks[r].learn(s, cachedOp("grad." + std::to_string(s), s), true);
  ranks[0].submit(1);
  ranks[0].submit(3);
  ranks[1].submit(3);
  ranks[1].invalidate(1);
  ranks[0].setBatches(7);  // rank 0 dispatched 7 batches of responses
  std::vector<CachedRounds::Outcome> outcomes = roundOfTwo(ranks);
  for (int r = 0; r < 2; ++r) {
    const CachedRounds::Outcome& o = outcomes[r];
    CHECK_EQ(o.batches, uint64_t{7});
    CHECK(o.stale == std::vector<int32_t>{1});  // rank 0 submitted it, rank 1 invalidated it
    CHECK_EQ(o.run.size(), size_t{1});
    if (!o.run.empty()) CHECK(o.run[0].names == std::vector<std::string>{"grad.3"});
  }
}

TEST(every_rank_fuses_with_the_threshold_rank_0_announced) {
  // Rank 1's own threshold would fuse everything; rank 0 announces 1 KiB,
  // so every rank runs the four 1 KiB ops apart.
  std::vector<CachedRounds> ranks(2, CachedRounds(64, 1 << 20));
  for (int r = 0; r < 2; ++r)
    for (int s = 0; s < 4; ++s) {
      ranks[r].learn(s, cachedOp("grad." + std::to_string(s), s), true);
      ranks[r].submit(s);
    }
  ranks[0].announceFusionThreshold(1024);
  std::vector<CachedRounds::Outcome> outcomes = roundOfTwo(ranks);
  CHECK_EQ(outcomes[0].run.size(), size_t{4});
  CHECK_EQ(outcomes[1].run.size(), size_t{4});
}

TEST(a_waiting_op_turns_stale_so_rank_0_can_name_who_is_missing) {
  CachedRounds c(64, 1 << 16);
  c.learn(0, cachedOp("grad.0", 0), true);
  c.learn(1, cachedOp("grad.1", 1), true);
  c.submit(1);
  c.vector();
  CHECK(!c.hasNews());
  c.staleAllSubmitted();
  CHECK(c.hasNews());
  std::vector<uint64_t> v = c.vector();
  const size_t n = 1;
  CHECK_EQ(v[n], uint64_t{2});  // slot 1's stale bit
  CachedRounds::Outcome o = c.apply(v);  // as if alone
  CHECK(o.stale == std::vector<int32_t>{1});
  CHECK(o.run.empty());
  CHECK(c.find(1) == nullptr);
  CHECK(c.find(0) != nullptr);
}

TEST(a_slot_one_rank_sent_to_rank_0_goes_there_from_every_rank) {
  // Rank 1 sent grad.0 inline to rank 0; rank 0 had submitted it to the
  // agreement: the round hands rank 0's copy to rank 0's coordinator too.
  std::vector<CachedRounds> ranks(2, CachedRounds(64, 1 << 16));
  for (int r = 0; r < 2; ++r) ranks[r].learn(0, cachedOp("grad.0", 0), true);
  ranks[0].submit(0);
  ranks[1].sentToCoordinator(0);
  std::vector<CachedRounds::Outcome> outcomes = roundOfTwo(ranks);
  const CachedRounds::Outcome& o0 = outcomes[0];
  const CachedRounds::Outcome& o1 = outcomes[1];
  CHECK(o0.to_coordinator == std::vector<int32_t>{0});
  CHECK(o1.to_coordinator.empty());
  CHECK(o0.run.empty() && o1.run.empty());
  CHECK_EQ(ranks[0].waiting(), size_t{0});
  CHECK(!ranks[1].hasNews());  // said once
  CHECK(ranks[0].find(0) != nullptr);  // the slot stays learnt
}

TEST(while_a_rank_has_joined_cached_ops_go_to_rank_0) {
  std::vector<CachedRounds> ranks(2, CachedRounds(64, 1 << 16));
  for (int r = 0; r < 2; ++r) ranks[r].learn(0, cachedOp("grad.0", 0), true);
  ranks[0].submit(0);
  ranks[1].setJoined(true);
  CHECK(ranks[1].hasNews());
  CachedRounds::Outcome o = roundOfTwo(ranks)[0];
  CHECK(o.run.empty());
  CHECK(o.to_coordinator == std::vector<int32_t>{0});
  CHECK_EQ(ranks[0].waiting(), size_t{0});
}

TEST(misuse_throws) {
  CachedRounds c(64, 1024);
  CHECK_THROWS(c.submit(3), std::logic_error);  // not learnt
  c.learn(3, cachedOp("x", 3), true);
  c.submit(3);
  CHECK_THROWS(c.submit(3), std::logic_error);
  CHECK_THROWS(c.learn(64, cachedOp("y", 64), true), std::out_of_range);
  CHECK_THROWS(c.apply({1, 2}), std::invalid_argument);
}

int main() { return check::runAll(); }
