#include "cached_rounds.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

namespace hvd {

CachedRounds::CachedRounds(size_t capacity, size_t fusion_threshold)
    : capacity_(capacity),
      fusion_threshold_(fusion_threshold),
      submitted_(words(), 0),
      stale_(words(), 0),
      elsewhere_(words(), 0),
      others_(words(), 0) {}

AgreementLayout CachedRounds::layout() const {
  AgreementLayout l;
  l.and_words = words();
  l.or_words = 2 * words() + 1;  // the stale bits, the sent-to-rank-0 bits, the flags
  l.max_words = 2;           // rank 0's dispatched batches, its fusion threshold
  return l;
}

void CachedRounds::learn(int32_t slot, ReadyOp op, bool member) {
  if (slot < 0 || static_cast<size_t>(slot) >= capacity_)
    throw std::out_of_range("CachedRounds::learn: slot " + std::to_string(slot));
  if (static_cast<size_t>(slot) >= slots_.size()) slots_.resize(slot + 1);
  Slot& s = slots_[slot];
  if (!s.known) ++learnt_;
  s.known = true;
  s.member = member;
  s.op = std::move(op);
  const uint64_t b = uint64_t{1} << (slot % 64);
  others_[slot / 64] = member ? others_[slot / 64] & ~b : others_[slot / 64] | b;
}

const ReadyOp* CachedRounds::find(int32_t slot) const {
  if (slot < 0 || static_cast<size_t>(slot) >= slots_.size() || !slots_[slot].known) return nullptr;
  return &slots_[slot].op;
}

void CachedRounds::submit(int32_t slot, const Request& request) {
  if (find(slot) == nullptr)
    throw std::logic_error("CachedRounds::submit: slot " + std::to_string(slot) + " is not learnt");
  uint64_t& w = submitted_[slot / 64];
  const uint64_t b = uint64_t{1} << (slot % 64);
  if (w & b) throw std::logic_error("CachedRounds::submit: slot " + std::to_string(slot) + " twice");
  w |= b;
  if (&slots_[slot].op.request != &request) slots_[slot].op.request = request;
  ++waiting_;
  news_ = true;
}

void CachedRounds::invalidate(int32_t slot) {
  if (find(slot) == nullptr) return;  // nothing to forget
  stale_[slot / 64] |= uint64_t{1} << (slot % 64);
  news_ = true;
}

void CachedRounds::sentToCoordinator(int32_t slot) {
  if (find(slot) == nullptr) return;
  elsewhere_[slot / 64] |= uint64_t{1} << (slot % 64);
  news_ = true;
}

void CachedRounds::setJoined(bool joined) {
  if (joined_ != joined) news_ = true;
  joined_ = joined;
}

void CachedRounds::announceFusionThreshold(size_t bytes) {
  if (bytes != announced_threshold_) news_ = true;
  announced_threshold_ = bytes;
}

void CachedRounds::staleAllSubmitted() {
  for (size_t i = 0; i < submitted_.size(); ++i) {
    if (submitted_[i] & ~stale_[i]) news_ = true;
    stale_[i] |= submitted_[i];
  }
}

void CachedRounds::setBatches(uint64_t dispatched) {
  if (dispatched != batches_) news_ = true;
  batches_ = dispatched;
}

std::vector<uint64_t> CachedRounds::vector() {
  const size_t n = words();
  std::vector<uint64_t> v(layout().total(), 0);
  // A known slot of a set this rank is not in never holds the others back.
  for (size_t i = 0; i < n; ++i) v[i] = submitted_[i] | others_[i];
  for (size_t i = 0; i < n; ++i) v[n + i] = stale_[i];
  for (size_t i = 0; i < n; ++i) v[2 * n + i] = elsewhere_[i];
  std::fill(elsewhere_.begin(), elsewhere_.end(), 0);  // said: once per sending
  v[3 * n] = joined_ ? kSomeoneJoined : 0;
  v[3 * n + 1] = batches_;
  v[3 * n + 2] = announced_threshold_;
  news_ = false;
  return v;
}

void CachedRounds::forget(size_t s, Outcome& out) {
  if (s >= slots_.size() || !slots_[s].known) return;
  const uint64_t b = uint64_t{1} << (s % 64);
  const bool submitted = submitted_[s / 64] & b;
  if (submitted || (stale_[s / 64] & b)) out.stale.push_back(static_cast<int32_t>(s));
  if (submitted) --waiting_;
  submitted_[s / 64] &= ~b;
  stale_[s / 64] &= ~b;
  elsewhere_[s / 64] &= ~b;
  others_[s / 64] &= ~b;
  slots_[s] = Slot();
  --learnt_;
}

CachedRounds::Outcome CachedRounds::apply(const std::vector<uint64_t>& result) {
  const size_t n = words();
  if (result.size() != layout().total())
    throw std::invalid_argument("CachedRounds::apply: " + std::to_string(result.size()) + " words");
  Outcome out;
  out.batches = result[3 * n + 1];
  // Sent to rank 0 by some rank this time (inline, with its data): this
  // rank's copy goes there too, and rank 0 runs the op as before.
  for (size_t i = 0; i < n; ++i) {
    const uint64_t mine = result[2 * n + i] & submitted_[i];
    for (uint64_t w = mine; w; w &= w - 1) {
      out.to_coordinator.push_back(static_cast<int32_t>(64 * i + __builtin_ctzll(w)));
      --waiting_;
    }
    submitted_[i] &= ~mine;
  }
  // Stale slots: forgotten on every rank at this same round.
  for (size_t i = 0; i < n; ++i) {
    for (uint64_t w = result[n + i]; w; w &= w - 1) forget(64 * i + static_cast<size_t>(__builtin_ctzll(w)), out);
  }
  if (result[3 * n] & kSomeoneJoined) {
    // Rank 0 runs them while ranks have joined: hand every submitted slot over.
    for (size_t i = 0; i < n; ++i)
      for (uint64_t w = submitted_[i]; w; w &= w - 1)
        out.to_coordinator.push_back(static_cast<int32_t>(64 * i + __builtin_ctzll(w)));
    std::fill(submitted_.begin(), submitted_.end(), 0);
    waiting_ = 0;
    return out;
  }
  // Agreed slots of this rank's sets, in slot order; a group only when whole.
  std::vector<size_t> agreed;
  std::map<std::pair<int32_t, std::string>, int32_t> group_count;
  for (size_t i = 0; i < n; ++i) {
    uint64_t w = result[i] & submitted_[i];
    while (w) {
      const size_t s = 64 * i + static_cast<size_t>(__builtin_ctzll(w));
      w &= w - 1;
      agreed.push_back(s);
      const Request& q = slots_[s].op.request;
      if (!q.group.empty()) ++group_count[{q.process_set, q.group}];
    }
  }
  std::vector<ReadyOp> ready;
  ready.reserve(agreed.size());
  for (size_t s : agreed) {
    const Request& q = slots_[s].op.request;
    if (!q.group.empty() && group_count[{q.process_set, q.group}] < q.group_size) continue;
    ready.push_back(slots_[s].op);
    submitted_[s / 64] &= ~(uint64_t{1} << (s % 64));
    --waiting_;
  }
  const uint64_t threshold = result[3 * n + 2] ? result[3 * n + 2] : fusion_threshold_;
  if (!ready.empty()) out.run = planFusion(std::move(ready), threshold);
  return out;
}

}  // namespace hvd
