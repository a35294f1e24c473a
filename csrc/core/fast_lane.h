// The fast lane: a blocking, cached op of the global set, with every rank on
// one host, in one pass through shared memory instead of a round trip
// through rank 0 followed by the data plane (docs/architecture.md, "The fast
// lane").
//
// Each cached name (a response-cache slot of the global set) has a decision
// word in shared memory and, on every rank, a count of that name's
// submissions (instances). Every submission of such a name registers its
// instance, so the counts agree on every rank:
//   - a blocking caller *arrives*: it writes its input into its row, adds
//     itself to the word's arrivals and waits; once every rank has arrived,
//     each reads the rows it needs and the op is done, with no frame sent;
//   - an engine submission (async, grouped, or a lane attempt that gave up)
//     *cancels* the instance: ranks that arrived see it and go to the engine
//     too, where the op is negotiated as before;
//   - a joined rank, which takes part in others' ops without submitting
//     them, cancels the instance when it handles the op's response.
// A word is reused for the next instance once every rank has seen this one
// (arrived and finished, or cancelled). An instance that waits longer than
// the caller's patience is cancelled by the waiter: a rank that is late, or
// busy elsewhere, costs the others that wait and then the engine's usual
// path. Anything that cannot keep the counts in step (a peer that never
// moves on) turns the lane off for every rank; the engine alone remains.
//
// Threading: learn(), bystander() and joined() on the thread that holds the
// engine's baton; submit() from any thread (one lane op at a time per
// process: a second caller goes to the engine); setPaused() from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "entry.h"
#include "message.h"

namespace hvd {

class FastLane {
 public:
  // Bytes of shared memory for `ranks` ranks with `slots` cache slots and
  // rows of `row_bytes` (the largest input a rank may bring).
  static size_t footprint(int ranks, size_t slots, size_t row_bytes);

  // `area`: footprint() bytes, zero-filled when the first rank maps it (the
  // lane's initial state), shared by every rank. `patience`: how long an
  // arrival waits for the others before it cancels. `attempts`: this rank
  // runs blocking ops on the lane (else it only registers).
  FastLane(char* area, int ranks, int rank, size_t slots, size_t row_bytes,
           std::chrono::microseconds patience, bool attempts);

  enum class Outcome {
    kRan,         // done on the lane: the entry's output is written
    kRegistered,  // the instance is cancelled here: submit it to the engine
    kUnknown,     // not a name with a lane slot: submit it to the engine
  };
  // Registers one submission of `e` (the global set's). `blocking`: the
  // caller waits for the result on this thread, so the lane may run it.
  // kRan sets the entry's work's rank rows (allgather, alltoall) but does
  // not complete it.
  Outcome submit(Entry& e, bool blocking);

  // What a slot's later instances need; shared with callers (any thread).
  struct Op;
  // An async submission the lane may run later, when its caller waits for it
  // (the deferred entries of lane.h): the name's next instance, taken now, in
  // submission order, registered by resolve().
  struct Ticket {
    std::shared_ptr<const Op> op;  // null: the lane cannot run it (submit() it)
    uint64_t instance = 0;
    // The op may take the lane and the entry's request is the one it learnt:
    // resolve() may run it (else it only registers the instance).
    bool runnable = false;
  };
  Ticket defer(const Entry& e);
  // Registers a deferred submission: runs it (`attempt`: its caller waits) or
  // cancels it (kRegistered: submit it to the engine).
  Outcome resolve(Entry& e, const Ticket& ticket, bool attempt);

  // Baton holder, once op `i` of a successful response of the global set
  // completed on this rank (`own`: this rank's request, or the template a
  // joined rank took part with): remember what the name's later instances
  // need.
  void learn(const Request& own, const Response& r, size_t i);
  // Baton holder of a joined rank, for a response of others' ops it does not
  // take part in (reduced inline): the names' slots, so that this rank
  // registers their later instances as the others do (never run here until
  // a response teaches it the op).
  void learnSlots(const Response& r);
  // Baton holder of a joined rank, for each op of the global set it handles
  // without having submitted it: registers that instance as the submitting
  // ranks did (before learn() of the same response).
  void bystander(const std::string& name);

  // This rank called join() (true) or its join completed (false): the others
  // stop arriving, since this rank would not come.
  void joined(bool yes);
  // Rank 0's timeline records the job: every rank leaves lane ops to the
  // engine, whose ops the timeline shows.
  void setPaused(bool paused);

  // Diagnostics and tests: ops run on the lane, instances cancelled by
  // arrivals that waited too long or saw a mismatch, and whether the lane
  // was turned off.
  uint64_t ranOps() const { return ran_.load(std::memory_order_relaxed); }
  uint64_t gaveUp() const { return gave_up_.load(std::memory_order_relaxed); }
  bool off() const;

 private:
  struct Word;
  struct Row;
  struct Header;

  Word& word(int32_t slot) const;
  Row& row(int rank) const;
  char* rowData(int rank) const;
  // The name's slot and this rank's next instance of it, counted, and
  // whether the lane may run `q` (null: no request) there; no op when the
  // name has no slot. `runnable_only`: nothing counted unless it may.
  Ticket take(const std::string& name, const Request* q, bool runnable_only);
  // Waits until the slot's word is at this rank's next instance; false (and
  // the lane turned off) when it never comes.
  bool awaitInstance(int32_t slot, uint64_t instance);
  // Marks the instance seen by this rank; the last rank resets the word.
  uint64_t finished(uint64_t state) const;
  void finish(Word& w);
  void cancel(int32_t slot);
  void turnOff();
  bool anyJoined() const;
  // An arrival: true when every rank arrived with the same op and the
  // output was written.
  bool arrive(const Op& op, Entry& e, int32_t slot, uint64_t instance);
  void execute(const Op& op, Entry& e);

  const int ranks_;
  const int rank_;
  const size_t slots_;
  const size_t row_bytes_;
  const std::chrono::microseconds patience_;
  const bool attempts_;
  Header* header_;
  char* words_;
  char* rows_;

  // Guards table_ and instances_ (never held while waiting).
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const Op>> table_;  // by name
  std::vector<uint64_t> instances_;  // by slot: this rank's next instance
  std::mutex running_;  // one lane op at a time in this process
  // The last instance this rank finished on the lane: its row is read until
  // every rank has finished it.
  int32_t last_slot_ = -1;
  uint64_t last_instance_ = 0;
  std::vector<char> scratch_;  // prescaled rows
  std::atomic<uint64_t> ran_{0};
  std::atomic<uint64_t> gave_up_{0};
};

}  // namespace hvd
