#include "fast_lane.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "cpu_relax.h"
#include "log.h"
#include "reduction_plan.h"

namespace hvd {

namespace {

// A decision word: [instance:39][arrived:12][cancelled:1][finished:12].
constexpr uint64_t kFinishedMask = (uint64_t{1} << 12) - 1;
constexpr uint64_t kCancelled = uint64_t{1} << 12;
constexpr int kArrivedShift = 13;
constexpr uint64_t kArrivedOne = uint64_t{1} << kArrivedShift;
constexpr uint64_t kArrivedMask = kFinishedMask << kArrivedShift;
constexpr int kInstanceShift = 25;

uint64_t instanceOf(uint64_t s) { return s >> kInstanceShift; }
int arrivedOf(uint64_t s) { return static_cast<int>((s & kArrivedMask) >> kArrivedShift); }
int finishedOf(uint64_t s) { return static_cast<int>(s & kFinishedMask); }

constexpr size_t kLine = 64;
size_t roundUp(size_t n) { return (n + kLine - 1) / kLine * kLine; }

// How long a rank waits for the others to finish a slot's previous instance
// before it gives the lane up: they finish within microseconds unless one is
// stopped or dead, and the engine's own timeouts handle those.
constexpr auto kInstanceWait = std::chrono::seconds(2);

// FNV-1a over what every rank learnt alike from one response.
struct Fingerprint {
  uint64_t h = 1469598103934665603ull;
  template <class T>
  void add(const T& v) {
    const auto* p = reinterpret_cast<const unsigned char*>(&v);
    for (size_t i = 0; i < sizeof(T); ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  void add(const std::vector<int64_t>& v) {
    add(v.size());
    for (int64_t x : v) add(x);
  }
};

}  // namespace

struct FastLane::Header {
  std::atomic<uint32_t> off;
  std::atomic<uint32_t> paused;
};

struct FastLane::Word {
  std::atomic<uint64_t> state;
};

// A rank's row: who wrote it (slot, instance, fingerprint), then its input.
struct FastLane::Row {
  std::atomic<uint64_t> instance;  // instance + 1 of the data below (0: none)
  std::atomic<int64_t> slot;
  std::atomic<uint64_t> fingerprint;
  std::atomic<uint32_t> joined;
};

struct FastLane::Op {
  int32_t slot = -1;
  bool eligible = false;
  Request request;  // this rank's, as cached
  uint64_t fingerprint = 0;
  // Allgather: every rank's first dimension. Alltoall: the splits matrix
  // (rank s sends rows[s * ranks + d] rows to rank d).
  std::vector<int64_t> rows;
};

size_t FastLane::footprint(int ranks, size_t slots, size_t row_bytes) {
  static_assert(sizeof(Header) <= kLine && sizeof(Row) <= kLine, "one line each");
  return kLine + slots * kLine + static_cast<size_t>(ranks) * (kLine + roundUp(row_bytes));
}

FastLane::FastLane(char* area, int ranks, int rank, size_t slots, size_t row_bytes,
                   std::chrono::microseconds patience, bool attempts)
    : ranks_(ranks),
      rank_(rank),
      slots_(slots),
      row_bytes_(roundUp(row_bytes)),
      patience_(patience),
      attempts_(attempts),
      header_(reinterpret_cast<Header*>(area)),
      words_(area + kLine),
      rows_(area + kLine + slots * kLine),
      instances_(slots, 0) {}

FastLane::Word& FastLane::word(int32_t slot) const {
  return *reinterpret_cast<Word*>(words_ + static_cast<size_t>(slot) * kLine);
}

FastLane::Row& FastLane::row(int rank) const {
  return *reinterpret_cast<Row*>(rows_ + static_cast<size_t>(rank) * (kLine + row_bytes_));
}

char* FastLane::rowData(int rank) const {
  return rows_ + static_cast<size_t>(rank) * (kLine + row_bytes_) + kLine;
}

bool FastLane::off() const { return header_->off.load(std::memory_order_acquire) != 0; }

void FastLane::turnOff() {
  if (header_->off.exchange(1) == 0)
    HVD_LOG(kDebug) << "rank " << rank_ << ": the fast lane is off; every op takes the engine";
}

void FastLane::setPaused(bool paused) {
  if ((header_->paused.load(std::memory_order_relaxed) != 0) != paused)
    header_->paused.store(paused ? 1 : 0, std::memory_order_release);
}

void FastLane::joined(bool yes) { row(rank_).joined.store(yes ? 1 : 0); }

bool FastLane::anyJoined() const {
  for (int r = 0; r < ranks_; ++r)
    if (row(r).joined.load(std::memory_order_acquire) != 0) return true;
  return false;
}

bool FastLane::awaitInstance(int32_t slot, uint64_t instance) {
  Word& w = word(slot);
  std::chrono::steady_clock::time_point deadline{};
  for (unsigned spins = 0;; ++spins) {
    if (off()) return false;
    const uint64_t at = instanceOf(w.state.load(std::memory_order_acquire));
    if (at == instance) return true;
    // The clock only now and then: reading it costs as much as a look.
    const bool late = spins % 32 == 0 && [&] {
      const auto now = std::chrono::steady_clock::now();
      if (spins == 0) deadline = now + kInstanceWait;
      return now > deadline;
    }();
    if (at > instance || late) {
      // Counts out of step, or a peer that never finishes: no instance of
      // this slot can be decided alike any more.
      turnOff();
      return false;
    }
    if (spins % 64 == 63) sched_yield(); else cpuRelax();
  }
}

// The word once one more rank finished the instance: the last one readies it
// for the next instance.
uint64_t FastLane::finished(uint64_t s) const {
  return finishedOf(s) + 1 == ranks_ ? (instanceOf(s) + 1) << kInstanceShift : s + 1;
}

void FastLane::finish(Word& w) {
  uint64_t s = w.state.load(std::memory_order_acquire);
  while (!w.state.compare_exchange_weak(s, finished(s), std::memory_order_acq_rel)) {
  }
}

void FastLane::cancel(int32_t slot) {
  Word& w = word(slot);
  uint64_t s = w.state.load(std::memory_order_acquire);
  while (!w.state.compare_exchange_weak(s, finished(s | kCancelled), std::memory_order_acq_rel)) {
  }
}

FastLane::Outcome FastLane::submit(Entry& e, bool blocking) {
  if (e.request.process_set != 0 || off()) return Outcome::kUnknown;
  const Ticket t = take(e.request.name, &e.request, false);
  if (t.op == nullptr) return Outcome::kUnknown;
  return resolve(e, t, blocking);
}

FastLane::Ticket FastLane::defer(const Entry& e) {
  const Request& q = e.request;
  if (q.process_set != 0 || !attempts_ || off() ||
      header_->paused.load(std::memory_order_acquire) != 0 || anyJoined())
    return Ticket{};
  return take(q.name, &q, true);
}

FastLane::Outcome FastLane::resolve(Entry& e, const Ticket& t, bool attempt) {
  const Op& op = *t.op;
  const bool try_lane = attempt && attempts_ && t.runnable &&
                        header_->paused.load(std::memory_order_acquire) == 0 && !anyJoined();
  if (!awaitInstance(op.slot, t.instance)) return Outcome::kRegistered;
  if (try_lane) {
    std::unique_lock<std::mutex> one(running_, std::try_to_lock);
    if (one.owns_lock() && arrive(op, e, op.slot, t.instance)) return Outcome::kRan;
    // arrive() registered the instance (cancelled or finished) unless it
    // never got to: then cancel it here.
    if (one.owns_lock()) return Outcome::kRegistered;
  }
  cancel(op.slot);
  return Outcome::kRegistered;
}

FastLane::Ticket FastLane::take(const std::string& name, const Request* q, bool runnable_only) {
  Ticket t;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = table_.find(name);
  if (it == table_.end()) return t;
  const Op& op = *it->second;
  t.runnable = q != nullptr && op.eligible && *q == op.request;
  if (runnable_only && !t.runnable) return t;
  t.op = it->second;
  t.instance = instances_[op.slot]++;
  return t;
}

void FastLane::bystander(const std::string& name) {
  if (off()) return;
  const Ticket t = take(name, nullptr, false);
  if (t.op != nullptr && awaitInstance(t.op->slot, t.instance)) cancel(t.op->slot);
}

bool FastLane::arrive(const Op& op, Entry& e, int32_t slot, uint64_t instance) {
  Word& w = word(slot);
  // The clock is read only once a wait is long enough to look at it: most
  // arrivals find the others there or soon after.
  std::chrono::steady_clock::time_point deadline{};
  auto late = [&] {
    const auto now = std::chrono::steady_clock::now();
    if (deadline == std::chrono::steady_clock::time_point{}) deadline = now + patience_;
    return now > deadline;
  };
  // Our row still holds the last lane op's input until every rank has read
  // it (finished that instance).
  if (last_slot_ >= 0) {
    Word& last = word(last_slot_);
    for (unsigned spins = 0; instanceOf(last.state.load(std::memory_order_acquire)) <= last_instance_;
         ++spins) {
      if (spins % 32 == 31 && (off() || late())) {
        cancel(slot);
        return false;
      }
      if (spins % 64 == 63) sched_yield(); else cpuRelax();
    }
    last_slot_ = -1;
  }
  const Request& q = e.request;
  const bool writes = q.type != OpType::kBroadcast || q.root_rank == rank_;
  if (writes && q.numBytes() > 0) std::memcpy(rowData(rank_), e.input, q.numBytes());
  Row& mine = row(rank_);
  mine.slot.store(slot, std::memory_order_relaxed);
  mine.fingerprint.store(op.fingerprint, std::memory_order_relaxed);
  mine.instance.store(instance + 1, std::memory_order_release);

  uint64_t s = w.state.load(std::memory_order_acquire);
  while (!(s & kCancelled) &&
         !w.state.compare_exchange_weak(s, s + kArrivedOne, std::memory_order_acq_rel)) {
  }
  if (s & kCancelled) {
    finish(w);
    return false;
  }
  for (unsigned spins = 1;; ++spins) {
    s = w.state.load(std::memory_order_acquire);
    if (s & kCancelled) {
      finish(w);
      return false;
    }
    if (arrivedOf(s) == ranks_) break;
    const bool give_up = spins % 32 == 0 &&
                         (late() || off() || header_->paused.load(std::memory_order_relaxed) != 0 ||
                          anyJoined());
    // Only while some rank has not arrived: once all have, nobody may cancel.
    if (give_up && w.state.compare_exchange_strong(s, finished(s | kCancelled),
                                                   std::memory_order_acq_rel)) {
      gave_up_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    if (spins % 64 == 63) sched_yield(); else cpuRelax();
  }
  // Every rank arrived: each row says what it holds. Rows stay as they are
  // until every rank finished, so every rank reads the same verdict.
  bool same = true;
  for (int r = 0; r < ranks_ && same; ++r) {
    const Row& other = row(r);
    same = other.instance.load(std::memory_order_acquire) == instance + 1 &&
           other.slot.load(std::memory_order_relaxed) == slot &&
           other.fingerprint.load(std::memory_order_relaxed) == op.fingerprint;
  }
  if (same) execute(op, e);
  finish(w);
  if (!same) return false;
  last_slot_ = slot;
  last_instance_ = instance;
  ran_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void FastLane::execute(const Op& op, Entry& e) {
  const Request& q = e.request;
  const size_t elem = dataTypeSize(q.dtype);
  const int n = ranks_;
  auto reduceRows = [&](char* out, size_t offset, size_t count) {
    // Rank order, as the coordinator's inline path: the same bits on every rank.
    const ReductionPlan plan(q.dtype, q.reduce_op, q.prescale, q.postscale, n);
    plan.reduce(out, n, [&](int r) -> const void* { return rowData(r) + offset; }, count,
                scratch_);
    plan.finish(out, count);
  };
  switch (q.type) {
    case OpType::kAllreduce:
      reduceRows(static_cast<char*>(e.output), 0, static_cast<size_t>(q.numElements()));
      break;
    case OpType::kBroadcast:
      if (q.root_rank != rank_) {
        std::memcpy(e.output, rowData(q.root_rank), q.numBytes());
      } else if (e.output != e.input) {
        std::memcpy(e.output, e.input, q.numBytes());
      }
      break;
    case OpType::kAllgather: {
      const size_t row = static_cast<size_t>(q.rowElements()) * elem;
      int64_t total = 0;
      for (int64_t d : op.rows) total += d;
      e.work->setRankRows(op.rows);
      char* out = static_cast<char*>(e.allocate(total));
      for (int r = 0; r < n; ++r) {
        const size_t bytes = static_cast<size_t>(op.rows[r]) * row;
        if (bytes > 0) std::memcpy(out, rowData(r), bytes);
        out += bytes;
      }
      break;
    }
    case OpType::kAlltoall: {
      const size_t row = static_cast<size_t>(q.rowElements()) * elem;
      std::vector<int64_t> received(n);
      int64_t total = 0;
      for (int s = 0; s < n; ++s) total += received[s] = op.rows[static_cast<size_t>(s) * n + rank_];
      e.work->setRankRows(received);
      char* out = static_cast<char*>(e.allocate(total));
      for (int s = 0; s < n; ++s) {
        int64_t before = 0;  // rows rank s sends to ranks ahead of us
        for (int d = 0; d < rank_; ++d) before += op.rows[static_cast<size_t>(s) * n + d];
        const size_t bytes = static_cast<size_t>(received[s]) * row;
        if (bytes > 0) std::memcpy(out, rowData(s) + static_cast<size_t>(before) * row, bytes);
        out += bytes;
      }
      break;
    }
    case OpType::kReducescatter: {
      const RowSlice mine = reducescatterSlice(q.shape[0], n, rank_);
      const size_t row_elems = static_cast<size_t>(q.rowElements());
      char* out = static_cast<char*>(e.allocate(mine.rows));
      if (mine.rows > 0)
        reduceRows(out, static_cast<size_t>(mine.offset) * row_elems * elem,
                   static_cast<size_t>(mine.rows) * row_elems);
      break;
    }
    default:
      break;  // never eligible
  }
}

void FastLane::learnSlots(const Response& r) {
  if (r.process_set != 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < r.names.size() && i < r.cache_ids.size(); ++i) {
    const int32_t slot = r.cache_ids[i];
    if (slot < 0 || static_cast<size_t>(slot) >= slots_ || table_.count(r.names[i])) continue;
    auto op = std::make_shared<Op>();
    op->slot = slot;  // not eligible: this rank has not seen the op's request
    table_[r.names[i]] = std::move(op);
  }
}

void FastLane::learn(const Request& own, const Response& r, size_t i) {
  if (r.process_set != 0 || i >= r.cache_ids.size() || r.cache_ids[i] < 0) return;
  const int32_t slot = r.cache_ids[i];
  if (static_cast<size_t>(slot) >= slots_) return;
  auto op = std::make_shared<Op>();
  op->slot = slot;
  op->request = own;
  const Request& q = own;
  const size_t elem = dataTypeSize(q.dtype);
  size_t most = 0;  // the largest row any rank writes
  Fingerprint f;
  f.add(q.type);
  f.add(q.dtype);
  f.add(q.reduce_op);
  f.add(q.root_rank);
  f.add(q.prescale);
  f.add(q.postscale);
  switch (q.type) {
    case OpType::kAllreduce:
    case OpType::kBroadcast:
    case OpType::kReducescatter:
      f.add(q.shape);
      most = q.numBytes();
      break;
    case OpType::kAllgather:
      if (i < r.rank_first_dims.size()) {
        op->rows = r.rank_first_dims[i];
        for (int64_t d : op->rows)
          most = std::max(most, static_cast<size_t>(d * q.rowElements()) * elem);
      }
      f.add(std::vector<int64_t>(q.shape.begin() + (q.shape.empty() ? 0 : 1), q.shape.end()));
      f.add(op->rows);
      break;
    case OpType::kAlltoall:
      if (i < r.alltoall_splits.size()) {
        op->rows = r.alltoall_splits[i];
        for (int s = 0; s < ranks_; ++s) {
          int64_t sent = 0;
          for (int d = 0; d < ranks_; ++d) sent += op->rows[static_cast<size_t>(s) * ranks_ + d];
          most = std::max(most, static_cast<size_t>(sent * q.rowElements()) * elem);
        }
      }
      f.add(std::vector<int64_t>(q.shape.begin() + 1, q.shape.end()));
      f.add(op->rows);
      break;
    default:
      break;
  }
  op->fingerprint = f.h;
  const bool shaped = q.type == OpType::kAllgather   ? op->rows.size() == static_cast<size_t>(ranks_)
                      : q.type == OpType::kAlltoall  ? op->rows.size() == static_cast<size_t>(ranks_) * ranks_
                                                     : true;
  op->eligible = r.kind != Response::kError && r.contributors == 0 && shaped &&
                 (q.type == OpType::kAllreduce || q.type == OpType::kBroadcast ||
                  q.type == OpType::kAllgather || q.type == OpType::kAlltoall ||
                  q.type == OpType::kReducescatter) &&
                 !q.isBundle() && q.group.empty() && q.plane == Plane::kHost && q.device < 0 &&
                 q.reduce_op != ReduceOp::kAdasum && most <= row_bytes_ &&
                 (q.type != OpType::kBroadcast || (q.root_rank >= 0 && q.root_rank < ranks_));
  std::lock_guard<std::mutex> lock(mu_);
  table_[q.name] = std::move(op);
}

}  // namespace hvd
