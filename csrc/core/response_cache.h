// The response cache: steady-state steps repeat the same named operations,
// so after the first negotiation a rank names an operation by a 4-byte slot id
// instead of its full request, and the coordinator skips validation when every
// rank names the same slot. Slots are assigned only by the coordinator and are
// never reused, so a rank can never refer to a slot that changed meaning.
//
// Threading: both classes are used only by the thread that holds the engine's
// baton (its background thread or a caller driving its op, engine.h: one at a
// time).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "message.h"

namespace hvd {

// Coordinator side: slot id -> the request of every rank, one slot per name
// (`key`: tableKey(process set, name)). A name negotiated afresh (its request
// changed) keeps its slot with the new requests: an op whose shape changes
// every step (a variable-length allgather) does not use up the cache. This is
// safe because a rank resolves a slot on arrival, and a rank names a slot
// only with the request it last learnt for that name from a response.
class CoordinatorCache {
 public:
  explicit CoordinatorCache(size_t capacity) : capacity_(capacity) {}

  // Returns the name's slot (new, or its old one now holding `per_rank`),
  // or -1 when the name has none and the cache is full.
  int32_t insert(const std::string& key, std::vector<Request> per_rank);
  // nullptr when `id` was never assigned.
  const std::vector<Request>* find(int32_t id) const;
  // The key an assigned slot was inserted under (the coordinator's table key).
  const std::string& key(int32_t id) const { return keys_[id]; }
  size_t size() const { return slots_.size(); }

 private:
  size_t capacity_;
  std::vector<std::vector<Request>> slots_;
  std::vector<std::string> keys_;  // by slot id
  std::unordered_map<std::string, int32_t> by_key_;
};

// Rank side: one slot per name (by tableKey(process set, name)), as in
// Horovod's cache. A name whose request changed (another shape, op or
// scale) misses and is negotiated afresh; its new slot replaces the old one.
// Comparing the request is cheaper than encoding it into a key per op.
class RankCache {
 public:
  // -1 when `request` is not the one cached under `key`.
  int32_t lookup(const std::string& key, const Request& request) const;
  void remember(const std::string& key, const Request& request, int32_t id);
  size_t size() const { return slots_.size(); }

 private:
  struct Slot {
    Request request;
    int32_t id;
  };
  std::unordered_map<std::string, Slot> slots_;
};

}  // namespace hvd
