#include "set_runtimes.h"

#include <stdexcept>

#include "process_sets.h"

namespace hvd {

void SetRuntimes::setRendezvous(StoreClient* store, const std::string& prefix,
                                BackendFactory make_backend, DevicePlaneFactory make_device) {
  store_ = store;
  prefix_ = prefix;
  make_backend_ = std::move(make_backend);
  make_device_ = std::move(make_device);
}

void SetRuntimes::openGlobal(Backend* backend) {
  SetRuntime rt;
  for (int r = 0; r < topology_.size; ++r) rt.ranks.push_back(r);
  rt.index = topology_.rank;
  rt.executor = Executor(backend, topology_.size, topology_.rank);
  if (backend && backend->directForms()) rt.inline_cap = config_.shm_inline_cap;
  {
    std::lock_guard<std::mutex> lock(names_mu_);
    names_[0] = backend ? backend->name() : "local";
  }
  sets_[0] = std::move(rt);
}

void SetRuntimes::open(int32_t id, const std::vector<int>& ranks) {
  const int index = indexIn(ranks, topology_.rank);
  if (index < 0) return;
  SetRuntime rt;
  rt.ranks = ranks;
  rt.index = index;
  if (ranks.size() > 1) {
    Topology sub = topology_;
    sub.rank = index;
    sub.size = static_cast<int>(ranks.size());
    sub.members = ranks;
    rt.backend = make_backend_(sub, config_, *store_, prefix_ + "set" + std::to_string(id) + "/");
  }
  rt.executor = Executor(rt.backend.get(), static_cast<int>(ranks.size()), index, ranks);
  if (rt.backend && rt.backend->directForms()) rt.inline_cap = config_.shm_inline_cap;
  {
    std::lock_guard<std::mutex> lock(names_mu_);
    names_[id] = rt.backend ? rt.backend->name() : "local";
  }
  sets_[id] = std::move(rt);
}

void SetRuntimes::remove(int32_t id) {
  sets_.erase(id);
  std::lock_guard<std::mutex> lock(names_mu_);
  names_.erase(id);
}

SetRuntime* SetRuntimes::find(int32_t id) {
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : &it->second;
}

Executor& SetRuntimes::executorFor(int32_t id, SetRuntime& rt, Plane plane, int device) {
  if (plane != Plane::kDevice) return rt.executor;
  if (rt.device_executor) {
    if (device != rt.device) {
      throw std::runtime_error("rank " + std::to_string(topology_.rank) + " used cuda:" +
                               std::to_string(device) + " in process set " + std::to_string(id) +
                               ", which already runs on cuda:" + std::to_string(rt.device) +
                               ": one GPU per rank");
    }
    return *rt.device_executor;
  }
  if (!make_device_) throw std::runtime_error("internal: a device op, but no device plane is built");
  Topology set = topology_;
  set.rank = rt.index;
  set.size = static_cast<int>(rt.ranks.size());
  const std::string prefix = prefix_ + "set" + std::to_string(id) + "/device/";
  rt.device_plane = make_device_(device, set, config_, store_, prefix);
  rt.device = device;
  rt.device_executor = std::make_unique<Executor>(rt.device_plane.backend.get(), set.size, rt.index,
                                                  id == 0 ? std::vector<int>{} : rt.ranks,
                                                  rt.device_plane.memory.get());
  return *rt.device_executor;
}

void SetRuntimes::abortAll() {
  for (auto& [id, rt] : sets_) {
    if (rt.device_plane.backend) rt.device_plane.backend->abort();
    if (rt.backend) rt.backend->abort();
  }
}

std::string SetRuntimes::backendName(int32_t id) const {
  std::lock_guard<std::mutex> lock(names_mu_);
  auto it = names_.find(id);
  return it == names_.end() ? "" : it->second;
}

}  // namespace hvd
