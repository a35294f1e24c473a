#include "slot_writes.h"

#include <algorithm>

namespace hvd {

bool SlotWriteChooser::streamNext(size_t bytes) {
  if (bytes < kChooseFrom || policy_ == SlotWrites::kCached) return false;
  if (policy_ == SlotWrites::kStreamed) return true;
  const uint64_t op = large_ops_++;
  // Each way kFirstSamples times first, alternating, plain stores first.
  if (samples_[0] < kFirstSamples || samples_[1] < kFirstSamples) {
    return samples_[1] < samples_[0];
  }
  const bool better = cost_[1] < cost_[0];
  return op % kExplorePeriod == kExplorePeriod - 1 ? !better : better;
}

void SlotWriteChooser::record(size_t bytes, bool streamed, uint64_t ns) {
  if (!measures(bytes)) return;
  // The first op each way pays one-time costs (pages of the segment and the
  // outputs faulted in): it is not kept.
  if (samples_[streamed]++ == 0) return;
  double* last = last_[streamed];
  last[(samples_[streamed] - 2) % kKept] =
      static_cast<double>(ns) / static_cast<double>(bytes);
  // The median of the last three: one op that waited long for a late peer does
  // not flip the choice; a change of phase does, in two ops.
  const uint64_t kept = std::min<uint64_t>(samples_[streamed] - 1, kKept);
  double sorted[kKept];
  std::copy(last, last + kept, sorted);
  std::sort(sorted, sorted + kept);
  cost_[streamed] = sorted[(kept - 1) / 2];
}

}  // namespace hvd
