// The data plane for host memory, chosen per process set once its ranks have
// met: shared memory when every member is on this host (backends/shm),
// otherwise Gloo over TCP (backends/gloo). Every member makes the same
// choice, agreed through the store.
#pragma once

#include <memory>
#include <string>

#include "../core/backend.h"

namespace hvd {

// A BackendFactory (core/backend.h).
std::unique_ptr<Backend> makeHostBackend(const Topology& topology, const EngineConfig& config,
                                         StoreClient& store, const std::string& prefix);

}  // namespace hvd
