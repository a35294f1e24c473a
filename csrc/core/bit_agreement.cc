#include "bit_agreement.h"

#include <algorithm>
#include <stdexcept>

#include "wire.h"

namespace hvd {

std::string AgreementMessage::encode() const {
  Writer w;
  w.put<uint64_t>(round);
  w.put<uint8_t>(step);
  w.put<uint32_t>(static_cast<uint32_t>(words.size()));
  w.append(words.data(), words.size() * sizeof(uint64_t));
  return std::move(w.buffer());
}

AgreementMessage AgreementMessage::decode(const std::string& bytes, size_t words) {
  Reader r(bytes);
  AgreementMessage m;
  m.round = r.get<uint64_t>();
  m.step = r.get<uint8_t>();
  const uint32_t count = r.getCount(sizeof(uint64_t));
  // A poke carries nothing; every other step carries the whole vector.
  const size_t expected = m.step == kPokeStep ? 0 : words;
  if (count != expected)
    throw WireError("agreement message of " + std::to_string(count) + " words, expected " +
                    std::to_string(expected));
  m.words.resize(count);
  for (uint32_t i = 0; i < count; ++i) m.words[i] = r.get<uint64_t>();
  if (!r.done()) throw WireError("agreement message: bytes after its words");
  return m;
}

BitAgreement::BitAgreement(int size, int rank, AgreementLayout layout)
    : size_(size), rank_(rank), layout_(layout) {
  if (size < 1 || rank < 0 || rank >= size)
    throw std::invalid_argument("BitAgreement: rank " + std::to_string(rank) + " of " +
                                std::to_string(size));
  while (pow2_ * 2 <= size_) {
    pow2_ *= 2;
    ++log2p_;
  }
  extras_ = size_ - pow2_;
  for (auto& box : inbox_) box.assign(log2p_ + 3, {});
  for (auto& have : have_) have.assign(log2p_ + 3, false);
}

int BitAgreement::sendsPerRound() const {
  if (rank_ >= pow2_) return 1;
  return log2p_ + (rank_ < extras_ ? 1 : 0);
}

std::vector<int> BitAgreement::partners() const {
  std::vector<int> out;
  if (rank_ >= pow2_) return {rank_ - pow2_};
  for (int j = 0; j < log2p_; ++j) out.push_back(rank_ ^ (1 << j));
  if (rank_ < extras_) out.push_back(rank_ + pow2_);
  std::sort(out.begin(), out.end());
  return out;
}

int BitAgreement::senderOf(int step) const {
  if (step == AgreementMessage::kPokeStep) return rank_ >= pow2_ ? rank_ - pow2_ : -1;
  if (step == 0) return rank_ < extras_ ? rank_ + pow2_ : -1;
  if (step <= log2p_) return rank_ < pow2_ ? rank_ ^ (1 << (step - 1)) : -1;
  if (step == log2p_ + 1) return rank_ >= pow2_ ? rank_ - pow2_ : -1;
  return -1;
}

bool BitAgreement::awaits(int peer) const {
  if (!active_) return false;
  for (int step = next_step_; step <= log2p_ + 1; ++step)
    if (senderOf(step) == peer && !have_[0][slotOf(step)]) return true;
  return false;
}

void BitAgreement::start(const std::vector<uint64_t>& mine) {
  if (active_) throw std::logic_error("BitAgreement::start during round " + std::to_string(round_));
  if (mine.size() != layout_.total())
    throw std::invalid_argument("BitAgreement::start: " + std::to_string(mine.size()) +
                                " words, the layout has " + std::to_string(layout_.total()));
  ++round_;
  active_ = true;
  acc_ = mine;
  next_step_ = 0;
  sent_ = false;
  // Rank r + P may not know a round began: it hears nothing else until the end.
  if (rank_ < extras_ && !have_[0][0]) {
    AgreementMessage poke;
    poke.round = round_;
    poke.step = AgreementMessage::kPokeStep;
    sends_.emplace_back(rank_ + pow2_, std::move(poke));
  }
  advance();
}

Status BitAgreement::receive(int from, AgreementMessage m) {
  const auto refuse = [&](const std::string& why) {
    return Status::internal("agreement: rank " + std::to_string(rank_) + " refused rank " +
                            std::to_string(from) + "'s message (round " +
                            std::to_string(m.round) + ", step " + std::to_string(m.step) +
                            "): " + why);
  };
  // A poke may come after the round it announced began here anyway (the
  // rank it pokes started on its own): nothing to keep, nothing wrong.
  if (m.step == AgreementMessage::kPokeStep && m.round <= round_ && m.words.empty() &&
      from >= 0 && from == senderOf(m.step))
    return Status();
  // Which box: while active, this round or the next; between rounds, the next.
  int box;
  if (active_ && m.round == round_) {
    box = 0;
  } else if (m.round == round_ + 1) {
    box = active_ ? 1 : 0;
  } else {
    return refuse("this rank is at round " + std::to_string(round_) +
                  (active_ ? " (active)" : " (finished)"));
  }
  if (m.step != AgreementMessage::kPokeStep && m.step > log2p_ + 1)
    return refuse("no such step");
  const int expected = senderOf(m.step);
  if (expected < 0 || expected != from) {
    return refuse(expected < 0 ? "this rank receives nothing at that step"
                               : "that step's sender is rank " + std::to_string(expected));
  }
  const size_t words = m.step == AgreementMessage::kPokeStep ? 0 : layout_.total();
  if (m.words.size() != words) return refuse("wrong size");
  const int slot = slotOf(m.step);
  if (have_[box][slot]) return refuse("a second copy");
  have_[box][slot] = true;
  inbox_[box][slot] = std::move(m.words);
  if (active_ && box == 0) advance();
  return Status();
}

void BitAgreement::takeSends(std::vector<std::pair<int, AgreementMessage>>& out) {
  for (auto& s : sends_) out.push_back(std::move(s));
  sends_.clear();
}

bool BitAgreement::peerStartedNext() const {
  if (active_) return false;
  return std::find(have_[0].begin(), have_[0].end(), true) != have_[0].end();
}

void BitAgreement::combine(const std::vector<uint64_t>& in) {
  size_t i = 0;
  for (; i < layout_.and_words; ++i) acc_[i] &= in[i];
  for (; i < layout_.and_words + layout_.or_words; ++i) acc_[i] |= in[i];
  for (; i < layout_.total(); ++i) acc_[i] = std::max(acc_[i], in[i]);
}

void BitAgreement::send(int to, int step) {
  AgreementMessage m;
  m.round = round_;
  m.step = static_cast<uint8_t>(step);
  m.words = acc_;
  sends_.emplace_back(to, std::move(m));
}

void BitAgreement::advance() {
  const int last = log2p_ + 1;
  auto take = [&](int step) -> bool {
    if (!have_[0][step]) return false;
    combine(inbox_[0][step]);
    return true;
  };
  while (active_) {
    const int step = next_step_;
    if (rank_ >= pow2_) {
      // An extra rank: hand over, then wait for the result.
      if (step == 0) {
        send(rank_ - pow2_, 0);
        next_step_ = last;
        continue;
      }
      if (!have_[0][last]) return;
      acc_ = std::move(inbox_[0][last]);
    } else if (step == 0) {
      if (rank_ < extras_ && !take(0)) return;
      next_step_ = 1;
      continue;
    } else if (step < last) {
      if (!sent_) {
        send(rank_ ^ (1 << (step - 1)), step);
        sent_ = true;
      }
      if (!take(step)) return;
      next_step_ = step + 1;
      sent_ = false;
      continue;
    } else if (rank_ < extras_) {
      send(rank_ + pow2_, last);
    }
    // The round is done: the next round's early messages become current.
    result_ = std::move(acc_);
    acc_.clear();
    active_ = false;
    std::swap(inbox_[0], inbox_[1]);
    std::swap(have_[0], have_[1]);
    for (auto& words : inbox_[1]) words.clear();
    std::fill(have_[1].begin(), have_[1].end(), false);
  }
}

}  // namespace hvd
