// How a large op of the shared-memory plane (backends/shm) writes its
// segment: with plain stores, so that the peers read the lines from the
// writer's cache, or with streaming stores, so that they read them from memory.
//
// Which is faster depends on where the ranks' cores sit, and on a virtual
// machine that changes while a job runs. On this project's 2-core VM the
// rate at which one core reads what the other just wrote moves every few
// seconds between about 24, 8 and 2 GB/s, while through memory it stays near
// 10 GB/s (make core-link; docs/architecture.md, "Where the cores sit"). A 1
// MiB allreduce took 140 us with plain stores and 200 streamed in the middle
// phase, 505 and 200 in the far one; a 4 MiB allreduce 520 and 850 in the
// middle one. So each op kind measures both ways and keeps the faster, trying
// the other one op in kExplorePeriod; a way's cost is the median of its last
// three ops.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hvd {

enum class SlotWrites { kCached, kStreamed, kAuto };

class SlotWriteChooser {
 public:
  // Ops smaller than this always use plain stores: their rounds fit the caches.
  static constexpr size_t kChooseFrom = size_t{256} << 10;
  // One large op in this many runs the way that is not the current choice.
  static constexpr uint64_t kExplorePeriod = 32;

  explicit SlotWriteChooser(SlotWrites policy = SlotWrites::kAuto) : policy_(policy) {}

  // Whether the next op, of `bytes` (the same number on every rank), streams.
  // Every rank sees the same sequence of ops, so the ops that try the other
  // way are the same ops everywhere.
  bool streamNext(size_t bytes);
  // Whether an op of `bytes` is timed for record(): only ops that choose.
  bool measures(size_t bytes) const {
    return policy_ == SlotWrites::kAuto && bytes >= kChooseFrom;
  }
  // The op that streamNext(bytes) just chose took `ns` nanoseconds.
  void record(size_t bytes, bool streamed, uint64_t ns);

  // Nanoseconds per byte measured each way (0: not measured yet), for tests.
  double cost(bool streamed) const { return cost_[streamed]; }

 private:
  SlotWrites policy_;
  // Ops measured each way before the cheaper one is kept (the first of them
  // not counted): one slow op among them does not decide.
  static constexpr uint64_t kFirstSamples = 3;

  static constexpr uint64_t kKept = 3;  // the last ops kept each way

  uint64_t large_ops_ = 0;
  // [cached, streamed]: ops measured; the last kKept ops' ns per byte (a
  // ring); their median, the cost.
  uint64_t samples_[2] = {0, 0};
  double last_[2][kKept] = {};
  double cost_[2] = {0, 0};
};

}  // namespace hvd
