#include "process_sets.h"

#include <algorithm>
#include <sstream>

namespace hvd {

ProcessSetTable::ProcessSetTable(int world_size) {
  std::vector<int> all(world_size);
  for (int r = 0; r < world_size; ++r) all[r] = r;
  sets_[0] = std::move(all);
}

void ProcessSetTable::add(int32_t id, std::vector<int> ranks) {
  std::lock_guard<std::mutex> lock(mu_);
  sets_[id] = std::move(ranks);
}

void ProcessSetTable::remove(int32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  sets_.erase(id);
}

bool ProcessSetTable::find(int32_t id, std::vector<int>* ranks) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) return false;
  if (ranks != nullptr) *ranks = it->second;
  return true;
}

bool ProcessSetTable::contains(int32_t id, int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  return it != sets_.end() && std::binary_search(it->second.begin(), it->second.end(), rank);
}

bool ProcessSetTable::allContain(int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, ranks] : sets_)
    if (!std::binary_search(ranks.begin(), ranks.end(), rank)) return false;
  return true;
}

std::vector<int32_t> ProcessSetTable::ids() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int32_t> out;
  for (const auto& [id, ranks] : sets_) out.push_back(id);
  return out;
}

int indexIn(const std::vector<int>& ranks, int rank) {
  auto it = std::lower_bound(ranks.begin(), ranks.end(), rank);
  return it != ranks.end() && *it == rank ? static_cast<int>(it - ranks.begin()) : -1;
}

std::string rankList(const std::vector<int>& ranks) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  os << "]";
  return os.str();
}

}  // namespace hvd
