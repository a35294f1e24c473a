// The handle table (csrc/torch/handle_table.h) over a fake op record: every
// kind of handle, groups (grouped ops and bundles), the blocking op's
// thread-local slot, unknown handles, and handles given out concurrently.
#include <set>
#include <thread>

#include "check.h"
#include "core/work.h"
#include "torch/handle_table.h"

using namespace hvd;
using hvd::torch_layer::HandleKind;

namespace {

struct FakeOp {
  std::shared_ptr<Work> work;
  int tag = 0;
};

using Table = torch_layer::HandleTable<FakeOp>;

FakeOp op(int tag) { return {std::make_shared<Work>(), tag}; }

}  // namespace

TEST(handles_are_positive_distinct_and_taken_once) {
  Table t;
  const int64_t a = t.add(op(1));
  const int64_t b = t.add(op(2), HandleKind::kAlltoall);
  CHECK(a > 0);
  CHECK(b > 0);
  CHECK(a != b);
  CHECK_EQ(t.size(), 2);
  Table::Record r;
  CHECK(t.take(b, &r));
  CHECK_EQ(r.op.tag, 2);
  CHECK(r.kind == HandleKind::kAlltoall);
  CHECK(!t.take(b, &r));  // already synchronized
  CHECK(t.take(a, &r));
  CHECK_EQ(r.op.tag, 1);
  CHECK(r.kind == HandleKind::kSingle);
  CHECK_EQ(t.size(), 0);
}

TEST(unknown_handles_are_refused_by_every_lookup) {
  Table t;
  bool done = false;
  HandleKind kind;
  Table::Record r;
  CHECK(!t.poll(7, &done));
  CHECK(!t.kind(7, &kind));
  CHECK(!t.take(7, &r));
  CHECK(!t.take(-1, &r));
  CHECK(!t.take(Table::kThisThreadsOp, &r));  // the slot is empty
}

TEST(poll_follows_the_work) {
  Table t;
  FakeOp o = op(1);
  const int64_t h = t.add(FakeOp(o));
  bool done = true;
  CHECK(t.poll(h, &done));
  CHECK(!done);
  o.work->complete(Status::Ok());
  CHECK(t.poll(h, &done));
  CHECK(done);
  CHECK_EQ(t.size(), 1);  // polling leaves the handle in place
}

TEST(a_group_takes_its_members_in_order_under_one_handle) {
  Table t;
  std::vector<FakeOp> ops{op(10), op(11), op(12)};
  std::vector<int64_t> members;
  for (const FakeOp& o : ops) members.push_back(t.add(FakeOp(o)));
  const int64_t other = t.add(op(99));
  int64_t g = 0;
  CHECK(t.group(members, &g));
  CHECK(g > 0);
  CHECK_EQ(t.size(), 2);  // the group and the other op
  HandleKind kind;
  CHECK(t.kind(g, &kind));
  CHECK(kind == HandleKind::kGroup);
  Table::Record r;
  for (int64_t m : members) CHECK(!t.take(m, &r));  // members are no handles now
  for (int64_t m : members) CHECK(!t.kind(m, &kind));
  CHECK(t.take(g, &r));
  CHECK(r.kind == HandleKind::kGroup);
  CHECK_EQ(r.members.size(), 3);
  for (size_t i = 0; i < r.members.size(); ++i) CHECK_EQ(r.members[i].tag, 10 + int(i));
  CHECK(t.take(other, &r));
  CHECK_EQ(r.op.tag, 99);
}

TEST(a_group_is_done_when_every_member_is) {
  Table t;
  std::vector<FakeOp> ops{op(0), op(1), op(2)};
  std::vector<int64_t> members;
  for (const FakeOp& o : ops) members.push_back(t.add(FakeOp(o)));
  int64_t g = 0;
  CHECK(t.group(members, &g));
  bool done = true;
  for (size_t i = 0; i < ops.size(); ++i) {
    CHECK(t.poll(g, &done));
    CHECK(!done);
    ops[i].work->complete(Status::Ok());
  }
  CHECK(t.poll(g, &done));
  CHECK(done);
}

TEST(a_bundles_members_share_one_work) {
  // A bundle: one work for all members; the group completes with it.
  Table t;
  auto work = std::make_shared<Work>();
  std::vector<int64_t> members{t.add({work, 0}), t.add({work, 1})};
  int64_t g = 0;
  CHECK(t.group(members, &g));
  bool done = true;
  CHECK(t.poll(g, &done));
  CHECK(!done);
  work->complete(Status::Ok());
  CHECK(t.poll(g, &done));
  CHECK(done);
}

TEST(a_bad_group_changes_nothing) {
  Table t;
  const int64_t a = t.add(op(1));
  const int64_t b = t.add(op(2));
  int64_t g = -5;
  CHECK(!t.group({a, 12345}, &g));  // unknown member
  CHECK(!t.group({a, b, a}, &g));   // repeated member
  CHECK_EQ(g, -5);
  CHECK_EQ(t.size(), 2);
  CHECK(t.group({a, b}, &g));
  CHECK(!t.group({g}, &g));  // a group of a group
  CHECK_EQ(t.size(), 1);
  Table::Record r;
  CHECK(t.take(g, &r));
  CHECK_EQ(r.members.size(), 2);
}

TEST(an_empty_group_is_done_at_once) {
  Table t;
  int64_t g = 0;
  CHECK(t.group({}, &g));
  bool done = false;
  CHECK(t.poll(g, &done));
  CHECK(done);
}

TEST(the_blocking_slot_belongs_to_its_thread) {
  Table t;
  CHECK_EQ(t.addBlocking(op(1), HandleKind::kAlltoall), Table::kThisThreadsOp);
  CHECK_EQ(t.size(), 0);  // not in the map
  // A second blocking op while the slot is taken goes to the map.
  const int64_t h = t.addBlocking(op(2), HandleKind::kSingle);
  CHECK(h > 0);
  CHECK_EQ(t.size(), 1);
  bool other_thread_took = true;
  std::thread([&] {
    Table::Record r;
    other_thread_took = t.take(Table::kThisThreadsOp, &r);
  }).join();
  CHECK(!other_thread_took);
  HandleKind kind;
  CHECK(t.kind(Table::kThisThreadsOp, &kind));
  CHECK(kind == HandleKind::kAlltoall);
  Table::Record r;
  CHECK(t.take(Table::kThisThreadsOp, &r));
  CHECK_EQ(r.op.tag, 1);
  CHECK(!t.take(Table::kThisThreadsOp, &r));  // free again
  CHECK_EQ(t.addBlocking(op(3), HandleKind::kSingle), Table::kThisThreadsOp);
  CHECK(t.take(Table::kThisThreadsOp, &r));
  CHECK_EQ(r.op.tag, 3);
  CHECK(t.take(h, &r));
  CHECK_EQ(r.op.tag, 2);
}

TEST(clear_forgets_the_map_and_this_threads_slot) {
  Table t;
  const int64_t h = t.add(op(1));
  t.addBlocking(op(2), HandleKind::kSingle);
  t.clear();
  Table::Record r;
  CHECK_EQ(t.size(), 0);
  CHECK(!t.take(h, &r));
  CHECK(!t.take(Table::kThisThreadsOp, &r));
  CHECK(t.add(op(3)) > h);  // handles are not reused after a clear
}

TEST(threads_adding_at_once_get_distinct_handles) {
  Table t;
  constexpr int kThreads = 4;
  constexpr int kEach = 500;
  std::vector<std::vector<int64_t>> got(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < kEach; ++k) got[i].push_back(t.add(op(i)));
    });
  }
  for (auto& th : threads) th.join();
  std::set<int64_t> all;
  for (const auto& v : got) all.insert(v.begin(), v.end());
  CHECK_EQ(all.size(), kThreads * kEach);
  CHECK_EQ(t.size(), kThreads * kEach);
}

int main() { return check::runAll(); }
