// The process sets this job has registered: id -> the global ranks in the set
// (ascending). Set 0 is the global set. Every rank holds the same table: it
// changes only when a kAddProcessSet/kRemoveProcessSet response runs, and
// every rank runs responses in the coordinator's one order.
//
// Threading: written by whoever holds the engine's baton, read from any thread
// (the torch layer checks arguments and computes set ranks on user threads).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace hvd {

class ProcessSetTable {
 public:
  explicit ProcessSetTable(int world_size);

  void add(int32_t id, std::vector<int> ranks);
  void remove(int32_t id);
  // False when no set has this id.
  bool find(int32_t id, std::vector<int>* ranks) const;
  // True when set `id` exists and has `rank` (copies nothing: once per op).
  bool contains(int32_t id, int rank) const;
  // True when every registered set has `rank` as a member.
  bool allContain(int rank) const;
  // Registered ids, ascending (for error messages).
  std::vector<int32_t> ids() const;

 private:
  mutable std::mutex mu_;
  std::map<int32_t, std::vector<int>> sets_;
};

// `rank`'s position in `ranks`, or -1 when it is not a member.
int indexIn(const std::vector<int>& ranks, int rank);
std::string rankList(const std::vector<int>& ranks);

}  // namespace hvd
