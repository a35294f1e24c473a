// BitAgreement (csrc/core/bit_agreement.h): N participants in one process,
// their messages delivered in a random order, rounds started at random
// moments. Every participant must leave every round with the same vector,
// the AND/OR/MAX of all, and no message may be refused.
#include "core/bit_agreement.h"

#include <random>

#include "check.h"
#include "core/wire.h"

using hvd::AgreementLayout;
using hvd::AgreementMessage;
using hvd::BitAgreement;

namespace {

struct Sim {
  AgreementLayout layout;
  std::vector<BitAgreement> ranks;
  struct InFlight {
    int from, to;
    std::string bytes;  // through the wire encoding, as the engine will send it
  };
  std::vector<InFlight> net;
  std::mt19937_64 rng;
  size_t messages = 0;
  size_t refused = 0;

  Sim(int n, AgreementLayout l, uint64_t seed) : layout(l), rng(seed) {
    for (int r = 0; r < n; ++r) ranks.emplace_back(n, r, l);
  }
  void collect(int r) {
    std::vector<std::pair<int, AgreementMessage>> out;
    ranks[r].takeSends(out);
    for (auto& [to, m] : out) net.push_back({r, to, m.encode()});
  }
  // Delivers one message picked at random; false when none is in flight.
  bool deliverOne() {
    if (net.empty()) return false;
    std::uniform_int_distribution<size_t> pick(0, net.size() - 1);
    const size_t i = pick(rng);
    InFlight f = std::move(net[i]);
    net.erase(net.begin() + static_cast<long>(i));
    ++messages;
    hvd::Status s = ranks[f.to].receive(f.from, AgreementMessage::decode(f.bytes, layout.total()));
    if (!s.ok()) {
      ++refused;
      std::printf("  refused: %s\n", s.message.c_str());
    }
    collect(f.to);
    return true;
  }
};

std::vector<uint64_t> randomVector(std::mt19937_64& rng, const AgreementLayout& l) {
  std::vector<uint64_t> v(l.total());
  for (size_t i = 0; i < v.size(); ++i) {
    // Mostly-set words, so the AND keeps some bits; small MAX values.
    v[i] = i < l.and_words ? (rng() | rng() | rng()) : i < l.and_words + l.or_words ? (rng() & rng() & rng()) : rng() % 1000;
  }
  return v;
}

std::vector<uint64_t> combineAll(const std::vector<std::vector<uint64_t>>& vs, const AgreementLayout& l) {
  std::vector<uint64_t> out = vs[0];
  for (size_t r = 1; r < vs.size(); ++r) {
    for (size_t i = 0; i < out.size(); ++i) {
      if (i < l.and_words) out[i] &= vs[r][i];
      else if (i < l.and_words + l.or_words) out[i] |= vs[r][i];
      else out[i] = std::max(out[i], vs[r][i]);
    }
  }
  return out;
}

// Rounds where each rank starts either on its own (at a random moment) or
// because a peer began (peerStartedNext), as the engine will.
void runRounds(int n, uint64_t seed, int rounds) {
  AgreementLayout l{3, 2, 1};
  Sim sim(n, l, seed);
  for (int round = 1; round <= rounds; ++round) {
    std::vector<std::vector<uint64_t>> vectors(n);
    for (int r = 0; r < n; ++r) vectors[r] = randomVector(sim.rng, l);
    std::vector<bool> started(n, false);
    // One rank (at random) starts with something new; the others join when
    // a peer's message reaches them, or on their own now and then.
    std::uniform_int_distribution<int> who(0, n - 1);
    const int first = who(sim.rng);
    sim.ranks[first].start(vectors[first]);
    started[first] = true;
    sim.collect(first);
    for (int guard = 0; guard < 100000; ++guard) {
      for (int r = 0; r < n; ++r) {
        const bool own = sim.rng() % 7 == 0;
        if (!started[r] && !sim.ranks[r].active() && (sim.ranks[r].peerStartedNext() || own)) {
          sim.ranks[r].start(vectors[r]);
          started[r] = true;
          sim.collect(r);
        }
      }
      bool all_done = true;
      for (int r = 0; r < n; ++r) all_done = all_done && started[r] && !sim.ranks[r].active();
      if (all_done) break;
      if (!sim.deliverOne()) {
        // Nothing in flight and someone not started: it must be told (a
        // waiting peer's message), which deliverOne would have done.
        bool any_unstarted = false;
        for (int r = 0; r < n; ++r) any_unstarted = any_unstarted || !started[r];
        CHECK(any_unstarted);
        if (!any_unstarted) break;
      }
    }
    const std::vector<uint64_t> want = combineAll(vectors, l);
    for (int r = 0; r < n; ++r) {
      CHECK(!sim.ranks[r].active());
      CHECK_EQ(sim.ranks[r].round(), static_cast<uint64_t>(round));
      CHECK(sim.ranks[r].result() == want);
    }
  }
  CHECK_EQ(sim.refused, size_t{0});
  CHECK(sim.net.empty());
}

}  // namespace

TEST(every_size_from_1_to_33_agrees_on_every_round) {
  for (int n = 1; n <= 33; ++n) runRounds(n, 1000 + n, 6);
}

TEST(rounds_overlap_when_a_rank_starts_the_next_before_others_finish) {
  // Each rank starts its next round the moment it finishes one: messages of
  // round k + 1 reach ranks still in round k and must wait there.
  for (int n : {2, 3, 4, 5, 7, 8, 11, 16, 19}) {
    AgreementLayout l{2, 1, 1};
    const int rounds = 12;
    Sim sim(n, l, 99 + n);
    std::vector<std::vector<std::vector<uint64_t>>> vectors(rounds);
    for (auto& per_rank : vectors) {
      per_rank.resize(n);
      for (auto& v : per_rank) v = randomVector(sim.rng, l);
    }
    std::vector<std::vector<std::vector<uint64_t>>> results(n);
    for (int r = 0; r < n; ++r) {
      sim.ranks[r].start(vectors[0][r]);
      sim.collect(r);
    }
    for (int guard = 0; guard < 1000000; ++guard) {
      for (int r = 0; r < n; ++r) {
        BitAgreement& a = sim.ranks[r];
        if (a.active() || results[r].size() == a.round()) continue;
        results[r].push_back(a.result());
        if (a.round() < static_cast<uint64_t>(rounds)) {
          a.start(vectors[a.round()][r]);
          sim.collect(r);
        }
      }
      if (!sim.deliverOne()) break;
    }
    for (int r = 0; r < n; ++r) {
      CHECK_EQ(results[r].size(), static_cast<size_t>(rounds));
      for (size_t k = 0; k < results[r].size() && k < vectors.size(); ++k)
        CHECK(results[r][k] == combineAll(vectors[k], l));
    }
    CHECK_EQ(sim.refused, size_t{0});
  }
}

TEST(larger_odd_sizes_agree) {
  for (int n : {63, 64, 65, 100}) runRounds(n, 7 * n, 3);
}

TEST(a_round_needs_no_one_but_the_rank_that_starts_it_to_begin) {
  // Only rank n-1 (an extra rank when n is not a power of two) starts: every
  // other rank must be drawn in by messages alone.
  for (int n : {2, 3, 5, 6, 7, 12}) {
    AgreementLayout l{1, 0, 0};
    Sim sim(n, l, 42);
    sim.ranks[n - 1].start({~0ull});
    sim.collect(n - 1);
    for (int guard = 0; guard < 10000; ++guard) {
      for (int r = 0; r < n; ++r) {
        if (!sim.ranks[r].active() && sim.ranks[r].round() == 0 && sim.ranks[r].peerStartedNext()) {
          sim.ranks[r].start({static_cast<uint64_t>(r + 1)});
          sim.collect(r);
        }
      }
      if (!sim.deliverOne()) break;
    }
    uint64_t want = ~0ull;
    for (int r = 0; r < n - 1; ++r) want &= static_cast<uint64_t>(r + 1);
    for (int r = 0; r < n; ++r) {
      CHECK_EQ(sim.ranks[r].round(), uint64_t{1});
      CHECK(!sim.ranks[r].active());
      CHECK_EQ(sim.ranks[r].result()[0], want);
    }
  }
}

// awaits(p): the round under way still needs a message from p. On 6 ranks
// (P = 4, ranks 4 and 5 extra), rank 1 hears from 5 (step 0), 0 (step 1) and
// 3 (step 2); once a sender's message is in, its leaving holds nothing up,
// which is what lets a rank finish the job's last round after a partner that
// finished first has exited. Between rounds nothing is awaited.
TEST(a_round_awaits_only_the_senders_it_has_not_heard_from) {
  AgreementLayout l{1, 0, 0};
  BitAgreement one(6, 1, l);
  CHECK(!one.awaits(0));
  one.start({1});
  for (int p : {0, 3, 5}) CHECK(one.awaits(p));
  for (int p : {2, 4}) CHECK(!one.awaits(p));
  auto from = [&](int sender, uint8_t step) {
    AgreementMessage m;
    m.round = 1;
    m.step = step;
    m.words = {~0ull};
    CHECK(one.receive(sender, std::move(m)).ok());
  };
  from(5, 0);
  from(0, 1);
  CHECK(!one.awaits(5));
  CHECK(!one.awaits(0));
  CHECK(one.awaits(3));
  from(3, 2);
  CHECK(!one.active());
  CHECK(!one.awaits(3));
  // An extra rank awaits only its result, from rank r - P.
  BitAgreement five(6, 5, l);
  five.start({1});
  CHECK(five.awaits(1));
  CHECK(!five.awaits(0));
}

TEST(messages_per_round_are_logarithmic) {
  for (int n : {2, 3, 8, 9, 1024, 1025, 4096}) {
    int most = 0;
    int total = 0;
    int log2p = 0;
    while ((2 << log2p) <= n) ++log2p;
    for (int r = 0; r < n; ++r) {
      BitAgreement a(n, r, {1, 0, 0});
      most = std::max(most, a.sendsPerRound());
      total += a.sendsPerRound();
      CHECK_EQ(a.stepsPerRound(), log2p + 2);
    }
    CHECK(most <= log2p + 1);
    CHECK(total <= n * (log2p + 1));
  }
}

TEST(a_message_the_schedule_does_not_expect_is_refused) {
  AgreementLayout l{2, 0, 0};
  BitAgreement a(4, 0, l);  // hears rank 1 at step 1, rank 2 at step 2
  AgreementMessage m;
  m.round = 1;
  m.step = 1;
  m.words = {1, 2};
  CHECK(!a.receive(2, m).ok());   // step 1 comes from rank 1
  CHECK(!a.receive(1, AgreementMessage{3, 1, {1, 2}}).ok());  // a round too far
  CHECK(!a.receive(1, AgreementMessage{1, 1, {1}}).ok());     // wrong size
  CHECK(!a.receive(1, AgreementMessage{1, 0, {1, 2}}).ok());  // no step 0 at 4 ranks
  CHECK(!a.receive(1, AgreementMessage{1, 9, {1, 2}}).ok());  // no such step
  CHECK(a.receive(1, m).ok());
  CHECK(a.peerStartedNext());
  CHECK(!a.receive(1, m).ok());  // a second copy
  a.start({~0ull, ~0ull});
  CHECK(a.active());
  CHECK(!a.receive(1, AgreementMessage{0, 1, {1, 2}}).ok());  // a round gone
}

TEST(decode_checks_its_bytes) {
  AgreementMessage m{5, 2, {7, 8, 9}};
  const std::string bytes = m.encode();
  CHECK_EQ(bytes.size(), AgreementMessage::encodedBytes(3));
  AgreementMessage back = AgreementMessage::decode(bytes, 3);
  CHECK_EQ(back.round, uint64_t{5});
  CHECK_EQ(static_cast<int>(back.step), 2);
  CHECK(back.words == m.words);
  CHECK_THROWS(AgreementMessage::decode(bytes, 2), hvd::WireError);
  CHECK_THROWS(AgreementMessage::decode(bytes.substr(0, bytes.size() - 1), 3), hvd::WireError);
  CHECK_THROWS(AgreementMessage::decode(bytes + "x", 3), hvd::WireError);
  AgreementMessage poke{5, AgreementMessage::kPokeStep, {}};
  CHECK(AgreementMessage::decode(poke.encode(), 3).words.empty());
}

int main() { return check::runAll(); }
