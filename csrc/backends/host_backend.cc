#include "host_backend.h"

#include "gloo/gloo_backend.h"
#include "shm/shm_backend.h"

namespace hvd {

std::unique_ptr<Backend> makeHostBackend(const Topology& topology, const EngineConfig& config,
                                         StoreClient& store, const std::string& prefix) {
  if (auto shm = tryShmBackend(topology, config, store, prefix)) return shm;
  return makeGlooBackend(topology, config, store, prefix);
}

}  // namespace hvd
