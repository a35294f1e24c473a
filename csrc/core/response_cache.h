// The response cache: steady-state steps repeat the same named operations,
// so after the first negotiation a rank names an operation by a 4-byte slot id
// instead of its full request, and the coordinator skips validation when every
// rank names the same slot. Slots are assigned only by the coordinator and are
// never reused, so a rank can never refer to a slot that changed meaning.
//
// Threading: both classes are used only by the engine's background thread.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "message.h"

namespace hvd {

// Coordinator side: slot id -> the request of every rank.
class CoordinatorCache {
 public:
  explicit CoordinatorCache(size_t capacity) : capacity_(capacity) {}

  // Returns the new slot, or -1 when the cache is full.
  int32_t insert(std::vector<Request> per_rank);
  // nullptr when `id` was never assigned.
  const std::vector<Request>* find(int32_t id) const;
  size_t size() const { return slots_.size(); }

 private:
  size_t capacity_;
  std::vector<std::vector<Request>> slots_;
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
