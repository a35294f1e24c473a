#include "shm_backend.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <thread>

#include "../../core/reduction_plan.h"
#include "../../core/store_client.h"
#include "../../core/stream_copy.h"
#include "shm_peer.h"

namespace hvd {

namespace {

constexpr size_t kPage = 4096;
constexpr size_t kLine = 64;

size_t roundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// [a, a + n) and [b, b + m) share a byte.
bool overlap(const void* a, size_t n, const void* b, size_t m) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return n > 0 && m > 0 && x < y + m && y < x + n;
}

// memcpy, or through streaming stores: for a result going to cold memory
// (outputs in an op of kStreamCopyFrom bytes or more, stream_copy.h), or for
// the segment when its op's chooser says so (slot_writes.h).
void copyBytes(void* dst, const void* src, size_t n, bool stream) {
  if (stream) {
    streamCopy(dst, src, n);
  } else {
    std::memcpy(dst, src, n);
  }
}

// One op's way of writing the segment (slot_writes.h), timed for its chooser
// from here to the end of the op when it chose (the clock is not read for
// the others). An op that throws is not counted.
class TimedWrites {
 public:
  TimedWrites(SlotWriteChooser& chooser, size_t bytes)
      : chooser_(chooser), bytes_(bytes), stream_(chooser.streamNext(bytes)),
        timed_(chooser.measures(bytes)),
        start_(timed_ ? std::chrono::steady_clock::now()
                      : std::chrono::steady_clock::time_point{}) {}
  ~TimedWrites() {
    if (!timed_ || std::uncaught_exceptions() > 0) return;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now() - start_);
    chooser_.record(bytes_, stream_, static_cast<uint64_t>(ns.count()));
  }
  TimedWrites(const TimedWrites&) = delete;
  TimedWrites& operator=(const TimedWrites&) = delete;
  bool stream() const { return stream_; }

 private:
  SlotWriteChooser& chooser_;
  size_t bytes_;
  bool stream_;
  bool timed_;
  std::chrono::steady_clock::time_point start_;
};

// The tensors of a fused op seen as one array: copies a range of it out of
// the inputs or into the outputs.
class SpanList {
 public:
  SpanList(const std::vector<Backend::Span>& spans, size_t elem) : spans_(spans), elem_(elem) {
    starts_.reserve(spans.size());
    size_t total = 0;
    for (const auto& s : spans) {
      starts_.push_back(total);
      total += s.count;
    }
    total_ = total;
  }
  size_t total() const { return total_; }

  void read(size_t first, size_t count, char* dst, bool stream) const {
    walk(first, count, [&](const Backend::Span& s, size_t at, size_t n) {
      copyBytes(dst, static_cast<const char*>(s.in) + at * elem_, n * elem_, stream);
      dst += n * elem_;
    });
  }
  // Calls fn(in, at, n) for each stretch of the inputs in [first, first +
  // count): `in` its first element, `at` its offset from `first`, in elements.
  template <typename Fn>
  void eachInput(size_t first, size_t count, Fn fn) const {
    size_t at = 0;
    walk(first, count, [&](const Backend::Span& s, size_t from, size_t n) {
      fn(static_cast<const char*>(s.in) + from * elem_, at, n);
      at += n;
    });
  }
  // `stream`: a large op, whose outputs other than its inputs are cold.
  void write(size_t first, size_t count, const char* src, bool stream) const {
    walk(first, count, [&](const Backend::Span& s, size_t at, size_t n) {
      copyBytes(static_cast<char*>(s.out) + at * elem_, src, n * elem_, stream && s.out != s.in);
      src += n * elem_;
    });
  }

 private:
  template <typename Fn>
  void walk(size_t first, size_t count, Fn fn) const {
    if (count == 0) return;
    size_t i = std::upper_bound(starts_.begin(), starts_.end(), first) - starts_.begin() - 1;
    while (count > 0) {
      const size_t at = first - starts_[i];
      const size_t n = std::min(count, spans_[i].count - at);
      if (n > 0) fn(spans_[i], at, n);
      first += n;
      count -= n;
      ++i;
    }
  }

  const std::vector<Backend::Span>& spans_;
  size_t elem_;
  std::vector<size_t> starts_;
  size_t total_ = 0;
};

// Rank r's range of an array of `total` elements cut into `parts` parts.
struct Part {
  size_t first;
  size_t count;
};
Part partOf(size_t total, int parts, int r) {
  // Parts start on cache-line multiples, so two ranks never write one line.
  const size_t per = roundUp((total + parts - 1) / parts, 64);
  const size_t first = std::min(total, per * r);
  return {first, std::min(total, first + per) - first};
}

}  // namespace

size_t ShmBackend::segmentBytes(int ranks, size_t slot_bytes) {
  return roundUp(ShmControl::bytes(ranks), kPage) + 2 * (ranks + 1) * slot_bytes;
}

ShmBackend::ShmBackend(ShmSegment segment, size_t slot_bytes, int rank,
                       const std::vector<int>& pids, const std::vector<int>& ranks,
                       const EngineConfig& config)
    : segment_(std::move(segment)),
      control_(reinterpret_cast<ShmControl*>(segment_.data())),
      data_(segment_.data() + roundUp(ShmControl::bytes(static_cast<int>(pids.size())), kPage)),
      slot_bytes_(slot_bytes),
      rank_(rank),
      size_(static_cast<int>(pids.size())),
      sync_(control_, rank, pids, ranks, config.engine_spin, config.op_timeout) {
  // Pieces are cut in whole lines, one or more per rank (tryShmBackend rounds
  // a setting up to that): anything less overruns the next rank's slot.
  if (slot_bytes % kLine != 0 || slot_bytes < static_cast<size_t>(size_) * kLine)
    throw std::invalid_argument("shm plane: slots of " + std::to_string(slot_bytes) +
                                " bytes for " + std::to_string(size_) +
                                " ranks (whole cache lines, at least one per rank)");
  for (auto& chooser : writes_) chooser = SlotWriteChooser(config.shm_slot_writes);
}

char* ShmBackend::slot(int buffer, int rank) const {
  return data_ + (static_cast<size_t>(buffer) * (size_ + 1) + rank) * slot_bytes_;
}

char* ShmBackend::result(int buffer) const { return slot(buffer, size_); }

void ShmBackend::allreduce(void* buf, size_t count, DataType dtype, ReduceOp op) {
  allreduceSpans({{buf, buf, count}}, dtype, op, 1.0, 1.0);
}

bool ShmBackend::allreduceSpans(const std::vector<Span>& spans, DataType dtype, ReduceOp op,
                                double prescale, double postscale) {
  const size_t elem = dataTypeSize(dtype);
  const SpanList list(spans, elem);
  // Average's division is in postscale already (the executor's), so divisor 1.
  const ReductionPlan plan(dtype, op, prescale, postscale, 1);
  // A piece: what one rank contributes to one part in one round.
  const size_t piece = std::max<size_t>(1, slot_bytes_ / size_ / kLine * kLine / elem);
  const Part mine = partOf(list.total(), size_, rank_);
  const size_t longest = partOf(list.total(), size_, 0).count;
  // An output other than its input was not read this round: cold, past the caches.
  const bool stream = list.total() * elem >= kStreamCopyFrom;
  TimedWrites writes(writes_[kAllreduceWrites], list.total() * elem);
  const bool fill_stream = writes.stream();
  // Unscaled, this rank's own part goes from its input to the reduction
  // without a copy into its slot: only the others read the slot.
  const bool own_direct = !plan.scalesInputs();
  for (size_t done = 0; done < longest; done += piece) {
    const int b = nextBuffer();
    char* in = slot(b, rank_);
    for (int r = 0; r < size_; ++r) {
      const Part p = partOf(list.total(), size_, r);
      if (done >= p.count || (r == rank_ && own_direct)) continue;
      char* dst = in + r * piece * elem;
      const size_t n = std::min(piece, p.count - done);
      list.read(p.first + done, n, dst, fill_stream);
      plan.prescale(dst, n);
    }
    sync_.barrier("allreduce");
    if (done < mine.count) {
      const size_t n = std::min(piece, mine.count - done);
      const size_t at = rank_ * piece * elem;
      if (fill_stream && scratch_.size() < piece * elem) scratch_.resize(piece * elem);
      char* acc = fill_stream ? scratch_.data() : result(b) + at;
      // Every rank sums in rank order, so results are identical everywhere.
      const auto sum = [&](size_t off, size_t m, const char* own) {
        const auto from = [&](int s) -> const void* {
          return s == rank_ ? own : slot(b, s) + at + off * elem;
        };
        plan.combine(acc + off * elem, size_, from, m);
      };
      if (own_direct) {
        list.eachInput(mine.first + done, n,
                       [&](const char* own, size_t off, size_t m) { sum(off, m, own); });
      } else {
        sum(0, n, in + at);
      }
      plan.finish(acc, n);
      if (fill_stream) streamCopy(result(b) + at, acc, n * elem);
    }
    sync_.barrier("allreduce");
    for (int r = 0; r < size_; ++r) {
      const Part p = partOf(list.total(), size_, r);
      if (done >= p.count) continue;
      list.write(p.first + done, std::min(piece, p.count - done), result(b) + r * piece * elem,
                 stream);
    }
  }
  return true;
}

bool ShmBackend::reducescatter(const void* in, void* out, const std::vector<size_t>& counts,
                               DataType dtype, ReduceOp op, double prescale, double postscale) {
  const size_t elem = dataTypeSize(dtype);
  const ReductionPlan plan(dtype, op, prescale, postscale, 1);  // as allreduceSpans'
  const size_t piece = std::max<size_t>(1, slot_bytes_ / size_ / kLine * kLine / elem);
  std::vector<size_t> first(size_, 0);
  for (int r = 1; r < size_; ++r) first[r] = first[r - 1] + counts[r - 1];
  const size_t longest = *std::max_element(counts.begin(), counts.end());
  const char* src = static_cast<const char*>(in);
  TimedWrites writes(writes_[kReducescatterWrites], (first[size_ - 1] + counts[size_ - 1]) * elem);
  for (size_t done = 0; done < longest; done += piece) {
    const int b = nextBuffer();
    for (int r = 0; r < size_; ++r) {
      if (done >= counts[r]) continue;
      char* dst = slot(b, rank_) + r * piece * elem;
      const size_t n = std::min(piece, counts[r] - done);
      copyBytes(dst, src + (first[r] + done) * elem, n * elem, writes.stream());
      plan.prescale(dst, n);
    }
    // One barrier a round: the next write to this buffer comes two rounds
    // on, after every rank has passed the next round's barrier.
    sync_.barrier("reducescatter");
    if (done < counts[rank_]) {
      const size_t n = std::min(piece, counts[rank_] - done);
      const size_t at = rank_ * piece * elem;
      char* acc = static_cast<char*>(out) + done * elem;
      plan.combine(acc, size_, [&](int s) -> const void* { return slot(b, s) + at; }, n);
      plan.finish(acc, n);
    }
  }
  return true;
}

void ShmBackend::allgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                            DataType dtype) {
  const size_t elem = dataTypeSize(dtype);
  std::vector<size_t> first(size_, 0);
  for (int r = 1; r < size_; ++r) first[r] = first[r - 1] + counts[r - 1];
  char* dst = static_cast<char*>(out);
  char* own = dst + first[rank_] * elem;
  const size_t mine = counts[rank_] * elem;
  const size_t total = (first[size_ - 1] + counts[size_ - 1]) * elem;
  // A rank's own rows reach its output round by round, from the slot it just
  // filled (in cache), instead of in a first pass over its input: the input
  // is read once. An input lying in the output elsewhere than its own place
  // moves there whole first, before any round could overwrite it.
  const bool moved = own != in && overlap(in, mine, dst, total);
  if (moved) std::memmove(own, in, mine);
  const bool own_rounds = own != in && !moved;
  const size_t longest = *std::max_element(counts.begin(), counts.end()) * elem;
  const char* src = moved ? own : static_cast<const char*>(in);
  const bool stream = total >= kStreamCopyFrom;
  TimedWrites writes(writes_[kAllgatherWrites], total);
  for (size_t done = 0; done < longest; done += slot_bytes_) {
    const int b = nextBuffer();
    if (done < mine)
      copyBytes(slot(b, rank_), src + done, std::min(slot_bytes_, mine - done), writes.stream());
    sync_.barrier("allgather");
    for (int r = 0; r < size_; ++r) {
      const size_t bytes = counts[r] * elem;
      if ((r == rank_ && !own_rounds) || done >= bytes) continue;
      copyBytes(dst + first[r] * elem + done, slot(b, r), std::min(slot_bytes_, bytes - done),
              stream);
    }
  }
}

void ShmBackend::broadcast(void* buf, size_t count, DataType dtype, int root) {
  broadcastInto(buf, buf, count, dtype, root);
}

bool ShmBackend::broadcastInto(const void* in, void* out, size_t count, DataType dtype,
                               int root) {
  const size_t bytes = count * dataTypeSize(dtype);
  // The root fills a whole buffer (every slot of it) per round.
  const size_t chunk = (size_ + 1) * slot_bytes_;
  // A large broadcast's destination was not read this round: cold, past the caches.
  const bool stream = bytes >= kStreamCopyFrom;
  TimedWrites writes(writes_[kBroadcastWrites], bytes);
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  for (size_t done = 0; done < bytes; done += chunk) {
    const int b = nextBuffer();
    const size_t n = std::min(chunk, bytes - done);
    if (rank_ == root) copyBytes(slot(b, 0), src + done, n, writes.stream());
    sync_.barrier("broadcast");
    // Out of place, the root copies its chunk while the others copy theirs
    // out of the segment (from its cache, where the chunk just went, unless
    // it was streamed).
    if (rank_ == root && dst == src) continue;
    copyBytes(dst + done, slot(b, 0), n, stream);
  }
  return true;
}

uint64_t ShmBackend::maxOverRanks(uint64_t value, const char* what) {
  const int b = nextBuffer();
  std::memcpy(slot(b, rank_), &value, sizeof(value));
  sync_.barrier(what);
  uint64_t most = 0;
  for (int r = 0; r < size_; ++r) {
    uint64_t v;
    std::memcpy(&v, slot(b, r), sizeof(v));
    most = std::max(most, v);
  }
  return most;
}

void ShmBackend::alltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                           const std::vector<int64_t>& recv_counts, DataType dtype) {
  const size_t elem = dataTypeSize(dtype);
  std::vector<size_t> send_first(size_, 0), recv_first(size_, 0);
  for (int r = 1; r < size_; ++r) {
    send_first[r] = send_first[r - 1] + send_counts[r - 1] * elem;
    recv_first[r] = recv_first[r - 1] + recv_counts[r - 1] * elem;
  }
  // Each slot holds one piece per other rank, in rank order without the
  // sender; a rank's own block goes straight from its input to its output.
  const int others = std::max(1, size_ - 1);
  const size_t piece = std::max<size_t>(kLine, slot_bytes_ / others / kLine * kLine);
  const auto place = [](int d, int s) { return static_cast<size_t>(d < s ? d : d - 1); };
  uint64_t longest = 0;
  for (int r = 0; r < size_; ++r) longest = std::max<uint64_t>(longest, send_counts[r] * elem);
  longest = maxOverRanks(longest, "alltoall");
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  const bool stream = recv_first[size_ - 1] + recv_counts[size_ - 1] * elem >= kStreamCopyFrom;
  // `longest` is the same on every rank: each chooser sees the same ops.
  TimedWrites writes(writes_[kAlltoallWrites], longest * size_);
  for (size_t done = 0; done < longest; done += piece) {
    const int b = nextBuffer();
    for (int d = 0; d < size_; ++d) {
      const size_t bytes = send_counts[d] * elem;
      if (d != rank_ && done < bytes) {
        copyBytes(slot(b, rank_) + place(d, rank_) * piece, src + send_first[d] + done,
                std::min(piece, bytes - done), writes.stream());
      }
    }
    sync_.barrier("alltoall");
    for (int s = 0; s < size_; ++s) {
      const size_t bytes = recv_counts[s] * elem;
      if (done >= bytes) continue;
      const char* from =
          s == rank_ ? src + send_first[s] + done : slot(b, s) + place(rank_, s) * piece;
      copyBytes(dst + recv_first[s] + done, from, std::min(piece, bytes - done), stream);
    }
  }
}

void ShmBackend::barrier() { sync_.barrier("barrier"); }

std::unique_ptr<Backend> tryShmBackend(const Topology& topology, const EngineConfig& config,
                                       StoreClient& store, const std::string& prefix) {
  const int n = topology.size;
  const int me = topology.rank;
  const auto timeout = config.start_timeout;
  const std::string key = prefix + "shm/";
  // 1. Every member's host, namespaces and wish: shm only if all agree.
  store.set(key + "self/" + std::to_string(me), ShmPeer{shmHostIdentity(), ::getpid()}.encode());
  std::vector<int> pids(n);
  std::string common;
  bool same = true;
  for (int r = 0; r < n; ++r) {
    const ShmPeer peer = ShmPeer::decode(store.get(key + "self/" + std::to_string(r), timeout));
    pids[r] = peer.pid;
    if (r == 0) common = peer.identity;
    same = same && peer.identity == common;
  }
  if (!same) return nullptr;
  // 2. Rank 0 makes the segment; the others map it; rank 0 unlinks the name
  // once all have it (or gives up), and says whether everyone got it.
  // 256 KiB keeps a round in cache; with more ranks than cores every barrier
  // waits for a descheduled peer, so fewer, larger rounds win (1 MiB).
  const long cores = static_cast<long>(std::thread::hardware_concurrency());
  const long fallback = (cores == 0 || n <= cores) ? 256 << 10 : 1 << 20;
  // At least a line per rank: every op cuts a slot into one piece per rank
  // (alltoall: per other rank) of whole lines, and an alltoall's piece is
  // never shorter than a line, so smaller slots (HVD_TORCH_SHM_SLOT_BYTES=64
  // on 3 ranks) made pieces overrun into the next rank's slot.
  const size_t slot_bytes = std::max(
      roundUp(config.shm_slot_bytes > 0 ? config.shm_slot_bytes : static_cast<size_t>(fallback),
              kLine),
      static_cast<size_t>(n) * kLine);
  const size_t bytes = ShmBackend::segmentBytes(n, slot_bytes);
  ShmSegment segment;
  bool ok = ShmSync::canWatch(pids, me);
  if (me == 0) {
    std::string name = ShmSegment::uniqueName();
    try {
      if (ok) segment = ShmSegment::create(name, bytes);
    } catch (const std::exception&) {
      ok = false;
    }
    if (!ok) name.clear();
    store.set(key + "name", name);
    for (int r = 1; r < n; ++r) {
      ok = store.get(key + "mapped/" + std::to_string(r), timeout) == "1" && ok;
    }
    segment.unlink();
    store.set(key + "verdict", ok ? "1" : "0");
  } else {
    const std::string name = store.get(key + "name", timeout);
    try {
      if (ok && !name.empty()) segment = ShmSegment::open(name, bytes);
    } catch (const std::exception&) {
    }
    ok = ok && segment.data() != nullptr;
    store.set(key + "mapped/" + std::to_string(me), ok ? "1" : "0");
    ok = store.get(key + "verdict", timeout) == "1";
  }
  if (!ok) return nullptr;
  std::vector<int> ranks(n);
  for (int r = 0; r < n; ++r) ranks[r] = topology.globalRank(r);
  return std::make_unique<ShmBackend>(std::move(segment), slot_bytes, me, pids, ranks, config);
}

}  // namespace hvd
