// A rank's side of agreeing on cached ops without rank 0 (issue #47;
// docs/control_plane_scale.md, "The agreement"). Every rank keeps, per cache
// slot, the op it learnt when the slot was negotiated (the single-name
// response and its request); between rounds of a BitAgreement it records
// what it submitted; after a round, every rank turns the same combined
// vector and the same slots into the same ordered list of responses, so no
// response comes from rank 0 for a cached op.
//
// A round's vector (layout()):
//   AND: bit s of word s / 64: slot s was submitted here with the request
//        this rank learnt for it, or this rank is not in the slot's process
//        set (a non-member never holds it back).
//   OR:  bit s: this rank submitted the name of slot s with another request
//        (another shape, say): the slot is stale. Then bit s: this rank sent
//        its op of slot s to rank 0 this time (small enough to go inline,
//        with its data). Then one word of flags: kSomeoneJoined.
//   MAX: the number of response batches rank 0's coordinator had dispatched
//        when it made its vector, and rank 0's fusion threshold (the
//        autotuner moves it); 0 on the other ranks. Every rank plans a
//        round's fusion with the round's threshold, never its own copy.
// After a round (apply()), in this order on every rank:
//   1. the coordinator's batches up to the MAX word run first: they were
//      decided before the round, and without this rule one rank could run a
//      new op's response before a cached op and another after it;
//   2. stale slots are forgotten everywhere; a rank that holds one of their
//      ops renegotiates it through rank 0 with its full request; a slot some
//      rank sent to rank 0 goes there from every rank that holds it (rank 0
//      then runs it, inline or not, exactly as without the agreement);
//   3. while some rank has joined, nothing cached runs: the ops go to rank 0,
//      which knows how to run them without the joined ranks (join is rare);
//   4. the slots every rank submitted run, in ascending slot order, whole
//      groups only, fused by planFusion: the same plan on every rank.
// Slots submitted and not agreed stay submitted for the next round.
//
// Threading: one thread at a time (the engine's baton holder); no locks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "bit_agreement.h"
#include "fusion.h"

namespace hvd {

class CachedRounds {
 public:
  static constexpr uint64_t kSomeoneJoined = 1;

  // `capacity`: slots (the coordinator gives out ids below it).
  CachedRounds(size_t capacity, size_t fusion_threshold);

  AgreementLayout layout() const;

  // A slot every rank learns from the negotiated response that made it;
  // `member`: this rank is in the op's process set.
  void learn(int32_t slot, ReadyOp op, bool member);
  const ReadyOp* find(int32_t slot) const;
  size_t learnt() const { return learnt_; }

  // This rank submitted the slot's name with the slot's request. `request`:
  // what fusion plans with, the same on every member (the engine makes it so:
  // an allgather's first dimension is the set's first rank's, the device none).
  void submit(int32_t slot, const Request& request);
  void submit(int32_t slot) {
    const ReadyOp* op = find(slot);
    submit(slot, op ? op->request : Request());
  }
  // This rank submitted the slot's name with another request.
  void invalidate(int32_t slot);
  // This rank sent its op of the slot to rank 0 (inline): at the next round
  // every rank that submitted the slot hands its op to rank 0 too.
  void sentToCoordinator(int32_t slot);
  void setJoined(bool joined);
  // Rank 0: response batches its coordinator has dispatched so far.
  void setBatches(uint64_t dispatched);
  // Rank 0: the fusion threshold in force, announced in its vectors.
  void announceFusionThreshold(size_t bytes);
  // Every slot submitted here and not yet agreed turns stale at the next
  // round: the ops go to rank 0 in full, where the stall inspector sees who
  // is missing (the engine's answer to a cached op that waits too long).
  void staleAllSubmitted();

  // Something to tell the others since the last vector(): a round is worth
  // starting (the other reason to start one is a peer's, BitAgreement's).
  bool hasNews() const { return news_; }
  // This rank's vector for the next round.
  std::vector<uint64_t> vector();

  struct Outcome {
    uint64_t batches = 0;                   // run the coordinator's batches up to this many, first
    std::vector<int32_t> stale;             // forgotten slots this rank had submitted: renegotiate
    std::vector<int32_t> to_coordinator;    // submitted slots to send rank 0 (someone joined)
    std::vector<Response> run;              // then these, in order
  };
  // What a finished round's result means here (result: the agreement's).
  Outcome apply(const std::vector<uint64_t>& result);

  // Slots submitted here and not yet run.
  size_t waiting() const { return waiting_; }

 private:
  struct Slot {
    bool known = false;
    bool member = false;
    ReadyOp op;
  };
  size_t words() const { return (capacity_ + 63) / 64; }
  // A stale slot, at a round's end: this rank's op of it (if any) renegotiates.
  void forget(size_t slot, Outcome& out);

  size_t capacity_;
  size_t fusion_threshold_;    // when no rank announces one
  uint64_t announced_threshold_ = 0;
  std::vector<Slot> slots_;  // up to the highest slot learnt: memory by what is cached
  size_t learnt_ = 0;
  std::vector<uint64_t> submitted_;  // bit per slot
  std::vector<uint64_t> stale_;      // bit per slot
  std::vector<uint64_t> elsewhere_;  // bit per slot sent to rank 0 since the last vector
  std::vector<uint64_t> others_;     // bit per known slot of a set this rank is not in
  size_t waiting_ = 0;
  bool joined_ = false;
  uint64_t batches_ = 0;
  bool news_ = false;
};

}  // namespace hvd
