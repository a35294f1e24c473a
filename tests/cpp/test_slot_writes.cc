// How large shm ops write the segment (csrc/core/slot_writes.h): each way
// measured three times first (the first not kept), then the cheaper one, with
// the other tried one op in kExplorePeriod; a median of three against a slow
// op; a fixed policy never measures; small ops never stream.
#include <cstdint>
#include <vector>

#include "check.h"
#include "core/slot_writes.h"

using namespace hvd;

namespace {

constexpr size_t kBig = size_t{1} << 20;

// Runs `ops` large ops, each costing `cached` or `streamed` ns per byte
// depending on the way chosen; returns how many streamed.
int runOps(SlotWriteChooser& c, int ops, double cached, double streamed) {
  int streams = 0;
  for (int i = 0; i < ops; ++i) {
    const bool s = c.streamNext(kBig);
    streams += s;
    c.record(kBig, s, static_cast<uint64_t>((s ? streamed : cached) * kBig));
  }
  return streams;
}

}  // namespace

TEST(measures_each_way_three_times_first_without_the_first) {
  SlotWriteChooser c;
  CHECK(!c.streamNext(kBig));
  c.record(kBig, false, 30 * kBig);  // a first op, faulting its pages in
  CHECK(c.streamNext(kBig));
  c.record(kBig, true, 20 * kBig);
  CHECK(!c.streamNext(kBig));
  c.record(kBig, false, 3 * kBig);
  CHECK(c.streamNext(kBig));
  c.record(kBig, true, 1 * kBig);
  CHECK(!c.streamNext(kBig));
  c.record(kBig, false, 9 * kBig);  // the lower of two: one slow op does not decide
  CHECK(c.streamNext(kBig));
  c.record(kBig, true, 2 * kBig);
  CHECK_EQ(c.cost(false), 3.0);
  CHECK_EQ(c.cost(true), 1.0);
  // Then the median of the last three.
  CHECK(c.streamNext(kBig));
  c.record(kBig, true, 5 * kBig);
  CHECK_EQ(c.cost(true), 2.0);
  c.record(kBig, true, 4 * kBig);  // the 1 drops out: 2, 5, 4
  CHECK_EQ(c.cost(true), 4.0);
}

TEST(keeps_the_cheaper_way_and_tries_the_other_once_a_period) {
  const int periods = 10;
  const int ops = 6 + periods * static_cast<int>(SlotWriteChooser::kExplorePeriod);
  SlotWriteChooser c;
  // Streaming cheaper: after the six first ops (three streamed), all stream
  // but one op a period.
  CHECK_EQ(runOps(c, ops, 3.0, 1.0), 3 + (ops - 6 - periods));
  SlotWriteChooser d;
  // Plain stores cheaper: only three of the first ops and one op a period stream.
  CHECK_EQ(runOps(d, ops, 1.0, 3.0), 3 + periods);
}

TEST(one_slow_op_does_not_flip_the_choice) {
  SlotWriteChooser c;
  runOps(c, 40, 1.0, 2.0);  // plain stores cheaper
  CHECK(!c.streamNext(kBig));
  c.record(kBig, false, 50 * kBig);  // one op waited long for a late peer
  CHECK(!c.streamNext(kBig));
  c.record(kBig, false, 1 * kBig);
  CHECK(!c.streamNext(kBig));
}

TEST(follows_a_change_of_phase_within_a_few_ops) {
  SlotWriteChooser c;
  runOps(c, 100, 1.0, 2.0);  // plain stores cheaper
  CHECK(!c.streamNext(kBig) || !c.streamNext(kBig));
  // The cores move apart: plain stores now cost 4x, streaming the same. The
  // current way's cost rises at once, so the choice turns within a few ops.
  int streams = runOps(c, 8, 4.0, 2.0);
  CHECK(streams >= 4);
  CHECK(c.streamNext(kBig) || c.streamNext(kBig));
}

TEST(small_ops_never_stream_nor_count) {
  SlotWriteChooser c;
  const size_t small = SlotWriteChooser::kChooseFrom - 1;
  CHECK(!c.measures(small));
  CHECK(c.measures(kBig));
  for (int i = 0; i < 100; ++i) {
    CHECK(!c.streamNext(small));
    c.record(small, false, 1000);
  }
  CHECK_EQ(c.cost(false), 0.0);
  // The first large op is still the first: not kept, as a first op is.
  CHECK(!c.streamNext(kBig));
  c.record(kBig, false, 7 * kBig);
  CHECK(c.streamNext(kBig));
  c.record(kBig, true, 7 * kBig);
  CHECK(!c.streamNext(kBig));
  c.record(kBig, false, 2 * kBig);
  CHECK_EQ(c.cost(false), 2.0);
  CHECK_EQ(c.cost(true), 0.0);
}

TEST(a_fixed_way_is_kept_and_never_measured) {
  SlotWriteChooser streamed(SlotWrites::kStreamed), cached(SlotWrites::kCached);
  CHECK_EQ(runOps(streamed, 50, 1.0, 9.0), 50);
  CHECK_EQ(runOps(cached, 50, 9.0, 1.0), 0);
  CHECK_EQ(streamed.cost(true), 0.0);
  CHECK_EQ(cached.cost(false), 0.0);
  CHECK(!streamed.measures(kBig) && !cached.measures(kBig));
  // Small ops use plain stores whatever the policy.
  CHECK(!streamed.streamNext(SlotWriteChooser::kChooseFrom / 2));
}

int main() { return check::runAll(); }
