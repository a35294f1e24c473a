// One agreement among `size` participants, round after round: each brings a
// vector of words, and each leaves with the same combination of all of them
// (AND, OR or MAX, word by word, by the layout). Issue #47's cached ops are
// agreed this way, without rank 0: a word of bits per 64 cache slots, ANDed,
// says which slots every rank has submitted (docs/control_plane_scale.md,
// "The agreement").
//
// The schedule is recursive doubling: with P the largest power of two not
// above `size`, the E = size - P ranks past P first hand their vector to
// rank r - P (step 0); the P ranks then exchange with rank r ^ 2^j at step
// j + 1, for j = 0 .. log2(P) - 1, combining as they go; last, the first E
// hand the result back (step log2(P) + 1). No rank sends or receives more
// than log2(P) + 1 messages per round, and a round's critical path is
// log2(P) + 2 messages at most: nothing grows faster than log N on any rank,
// or N log N in all.
//
// Event-driven, as the engine is: nothing here blocks or reads a socket. The
// caller starts a round with its vector, feeds the messages it receives, and
// sends what takeSends() gives it, until done(). A peer may be one round
// ahead (it finished first and started the next): its messages wait here,
// and peerStartedNext() tells the caller to join that round even with nothing
// new of its own, which is what keeps a round from waiting forever on a rank
// that has nothing to say.
//
// With E > 0, rank r < E pokes rank r + P when it starts a round that rank
// has not joined (an empty message at kPokeStep): an extra rank hears nothing
// else until the round's end, so without it a round could wait on it forever.
//
// Hostile input: receive() checks every message's round, step, sender and
// size against the schedule before keeping it, and refuses duplicates; what
// it keeps is bounded by two rounds of at most log2(P) + 2 messages each.
//
// Threading: one thread at a time (the engine's baton holder); no locks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "types.h"

namespace hvd {

// How a vector's words combine: the first `and_words` by AND, the next
// `or_words` by OR, the last `max_words` by MAX (unsigned).
struct AgreementLayout {
  size_t and_words = 0;
  size_t or_words = 0;
  size_t max_words = 0;
  size_t total() const { return and_words + or_words + max_words; }
};

struct AgreementMessage {
  uint64_t round = 0;  // from 1
  uint8_t step = 0;    // in the schedule above, or kPokeStep
  static constexpr uint8_t kPokeStep = 255;
  std::vector<uint64_t> words;

  std::string encode() const;
  // Throws WireError for a cut message or a word count other than `words`.
  static AgreementMessage decode(const std::string& bytes, size_t words);
  // The message's size on the wire for a vector of `words`.
  static size_t encodedBytes(size_t words) { return 8 + 1 + 4 + 8 * words; }
};

class BitAgreement {
 public:
  BitAgreement(int size, int rank, AgreementLayout layout);

  // Begins round round() + 1 with this rank's vector (layout.total() words).
  // Only while !active().
  void start(const std::vector<uint64_t>& mine);
  bool active() const { return active_; }
  // The current round, or the last one finished; 0 before the first.
  uint64_t round() const { return round_; }
  // A message from rank `from`. Not ok, and nothing kept, for one the
  // schedule does not expect: another round than this one or the next, a
  // step this rank never receives, a sender other than that step's, a
  // second copy, or another size. The caller treats that as a broken peer.
  Status receive(int from, AgreementMessage message);
  // Moves the messages due to peers into `out` as (to, message).
  void takeSends(std::vector<std::pair<int, AgreementMessage>>& out);
  // A peer has begun the round after this one (its message waits here).
  bool peerStartedNext() const;
  // The round under way still waits for a message from `peer`. A peer that
  // left after sending what this round needs from it holds nothing up: the
  // result it would get back is its own loss.
  bool awaits(int peer) const;
  // The combined vector of the last finished round.
  const std::vector<uint64_t>& result() const { return result_; }

  // The ranks this rank exchanges messages with (each way), ascending.
  std::vector<int> partners() const;

  // The schedule's numbers, for the bench and the docs.
  int stepsPerRound() const { return log2p_ + 2; }
  // Messages this rank sends per round.
  int sendsPerRound() const;

 private:
  // The peer this rank hears from at `step`, or -1 when it hears from none.
  int senderOf(int step) const;
  // The slot of `step` in the inbox (the poke after the schedule's steps).
  int slotOf(int step) const { return step == AgreementMessage::kPokeStep ? log2p_ + 2 : step; }
  void combine(const std::vector<uint64_t>& in);
  // Sends and receives what the schedule allows now; finishes the round.
  void advance();
  void send(int to, int step);

  const int size_;
  const int rank_;
  const AgreementLayout layout_;
  int pow2_ = 1;    // P
  int log2p_ = 0;   // log2(P)
  int extras_ = 0;  // E
  bool active_ = false;
  uint64_t round_ = 0;
  int next_step_ = 0;  // the next step this rank acts on in the round
  std::vector<uint64_t> acc_;
  std::vector<uint64_t> result_;
  // Received and not yet used, by step (the poke last): while active, [0]
  // this round's and [1] the next round's; between rounds, [0] the next one's.
  std::vector<std::vector<uint64_t>> inbox_[2];
  std::vector<bool> have_[2];
  bool sent_ = false;  // this rank sent its message of next_step_
  std::vector<std::pair<int, AgreementMessage>> sends_;
};

}  // namespace hvd
