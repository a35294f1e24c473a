// The one table behind every int handle that crosses an op schema or
// Horovod's API: a single op's, an alltoall's (whose synchronize also returns
// the rows received from each rank), and a group's (grouped ops and bundles:
// the members in order, on one handle). Python never tells kinds apart by the
// value of a handle; it asks this table (hvd_torch/ops.py).
//
// Generic over the op record (the adapter's Pending, with at::Tensors) so
// that tests/cpp/test_handle_table.cc drives it without torch. `Op` needs a
// `std::shared_ptr<Work> work` member (poll reads work->done()).
//
// Threading: any thread may call any method; a mutex guards the map. The
// thread-local slot (addBlocking) is read and written only by its own thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hvd {
namespace torch_layer {

enum class HandleKind { kSingle = 0, kAlltoall = 1, kGroup = 2 };

template <class Op>
struct HandleRecord {
  HandleKind kind = HandleKind::kSingle;
  Op op;                    // kSingle, kAlltoall
  std::vector<Op> members;  // kGroup, in the group's order
};

template <class Op>
class HandleTable {
 public:
  using Record = HandleRecord<Op>;
  // The handle of this thread's blocking op (addBlocking); the map's handles
  // count from 1, so they never meet it.
  static constexpr int64_t kThisThreadsOp = 0;

  // Ops come by rvalue: a Pending is a dozen members, and a blocking op's
  // path moves it once, from the kernel into the table.
  int64_t add(Op&& op, HandleKind kind = HandleKind::kSingle) {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t h = next_++;
    Record& r = records_[h];
    r.kind = kind;
    r.op = std::move(op);
    return h;
  }

  // A blocking kernel's op, which this thread waits for right after: kept in
  // a thread-local slot, skipping the lock, the node and two lookups (most of
  // a 4-byte allreduce's table cost). When the slot is taken (a blocking op
  // submitted inside another's wait), the op goes to the map.
  int64_t addBlocking(Op&& op, HandleKind kind) {
    Slot& s = slot();
    if (s.used) return add(std::move(op), kind);
    s.used = true;
    s.record.kind = kind;
    s.record.op = std::move(op);
    return kThisThreadsOp;
  }

  // Moves the members' records (single or alltoall handles) into one group
  // handle; the member handles are gone. False, changing nothing, when a
  // member is unknown, repeated, or itself a group.
  bool group(const std::vector<int64_t>& members, int64_t* handle) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < members.size(); ++i) {
      auto it = records_.find(members[i]);
      if (it == records_.end() || it->second.kind == HandleKind::kGroup) return false;
      for (size_t j = 0; j < i; ++j)
        if (members[j] == members[i]) return false;
    }
    Record g;
    g.kind = HandleKind::kGroup;
    g.members.reserve(members.size());
    for (int64_t m : members) {
      auto it = records_.find(m);
      g.members.push_back(std::move(it->second.op));
      records_.erase(it);
    }
    *handle = next_++;
    records_.emplace(*handle, std::move(g));
    return true;
  }

  // Whether the handle's work is done (a group: every member's). False when
  // the handle is unknown.
  bool poll(int64_t h, bool* done) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = records_.find(h);
    if (it == records_.end()) return false;
    const Record& r = it->second;
    if (r.kind != HandleKind::kGroup) {
      *done = r.op.work->done();
      return true;
    }
    *done = std::all_of(r.members.begin(), r.members.end(),
                        [](const Op& m) { return m.work->done(); });
    return true;
  }

  bool kind(int64_t h, HandleKind* kind) const {
    if (h == kThisThreadsOp && slot().used) {
      *kind = slot().record.kind;
      return true;
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = records_.find(h);
    if (it == records_.end()) return false;
    *kind = it->second.kind;
    return true;
  }

  // Removes the handle and hands over its record; false when it is unknown
  // (never given out, already taken, or cleared).
  bool take(int64_t h, Record* out) {
    if (h == kThisThreadsOp) {
      Slot& s = slot();
      if (!s.used) return false;
      *out = std::move(s.record);  // the moved-from record waits for the next op
      s.used = false;
      return true;
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = records_.find(h);
    if (it == records_.end()) return false;
    *out = std::move(it->second);
    records_.erase(it);
    return true;
  }

  // Forgets every handle, and this thread's slot (shutdown: the engine that
  // would complete them is gone).
  void clear() {
    slot() = Slot();
    std::lock_guard<std::mutex> lock(mu_);
    records_.clear();
  }

  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return records_.size();
  }

 private:
  struct Slot {
    bool used = false;
    Record record;
  };
  // One slot per thread, shared by every table of this Op type (the adapter
  // has one).
  static Slot& slot() {
    static thread_local Slot s;
    return s;
  }

  mutable std::mutex mu_;
  std::unordered_map<int64_t, Record> records_;
  int64_t next_ = 1;
};

}  // namespace torch_layer
}  // namespace hvd
