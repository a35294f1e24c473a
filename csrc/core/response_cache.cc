#include "response_cache.h"

namespace hvd {

int32_t CoordinatorCache::insert(const std::string& key, std::vector<Request> per_rank) {
  auto it = by_key_.find(key);
  if (it != by_key_.end()) {
    slots_[it->second] = std::move(per_rank);
    return it->second;
  }
  if (slots_.size() >= capacity_) return -1;
  slots_.push_back(std::move(per_rank));
  keys_.push_back(key);
  const int32_t id = static_cast<int32_t>(slots_.size() - 1);
  by_key_.emplace(key, id);
  return id;
}

const std::vector<Request>* CoordinatorCache::find(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= slots_.size()) return nullptr;
  return &slots_[id];
}

int32_t RankCache::lookup(const std::string& key, const Request& request) const {
  auto it = slots_.find(key);
  return it != slots_.end() && it->second.request == request ? it->second.id : -1;
}

void RankCache::remember(const std::string& key, const Request& request, int32_t id) {
  Slot& slot = slots_[key];
  if (!(slot.request == request)) slot.request = request;
  slot.id = id;
}

}  // namespace hvd
