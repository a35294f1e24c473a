#include "response_cache.h"

namespace hvd {

int32_t CoordinatorCache::insert(std::vector<Request> per_rank) {
  if (slots_.size() >= capacity_) return -1;
  slots_.push_back(std::move(per_rank));
  return static_cast<int32_t>(slots_.size() - 1);
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
