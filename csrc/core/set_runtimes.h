// The process sets this rank is in, as the engine runs them: each set's
// ranks, this rank's place in it, its data plane (the global backend, or a
// Gloo context of its own) and its executors (host, and a device plane made
// by the set's first op on GPU memory). The coordinator's kAddProcessSet and
// kRemoveProcessSet responses open and close them here.
//
// Threading: backendName() from any thread; the rest on the thread that holds
// the engine's baton.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend.h"
#include "executor.h"
#include "store_client.h"
#include "topology.h"
#include "types.h"

namespace hvd {

struct SetRuntime {
  std::vector<int> ranks;            // global ranks, ascending
  int index = 0;                     // this rank's position in ranks
  size_t inline_cap = SIZE_MAX;      // bound on the inline threshold for this set
  std::unique_ptr<Backend> backend;  // its own Gloo context (null: global set or one rank)
  Executor executor{nullptr, 1};
  // Plane::kDevice, made by the first op of the set on device memory.
  int device = -1;
  DevicePlane device_plane;
  std::unique_ptr<Executor> device_executor;
};

class SetRuntimes {
 public:
  SetRuntimes(const Topology& topology, const EngineConfig& config)
      : topology_(topology), config_(config) {}

  // Where new sets meet (the store and its key prefix) and how they build
  // their planes; make_device may be empty (no device plane built).
  void setRendezvous(StoreClient* store, const std::string& prefix, BackendFactory make_backend,
                     DevicePlaneFactory make_device);
  // The global set (id 0) over the engine's backend (null: one rank).
  void openGlobal(Backend* backend);
  // A new set: a member connects a backend of its own (every member runs this
  // at the same point of the one order of responses, so they meet).
  void open(int32_t id, const std::vector<int>& ranks);
  void remove(int32_t id);
  // Null when this rank is not in set `id` (or it does not exist). The
  // pointer stays valid until remove(id), whatever open() adds.
  SetRuntime* find(int32_t id);
  // The set's executor for `plane`; a device plane is made on first use.
  Executor& executorFor(int32_t id, SetRuntime& rt, Plane plane, int device);
  // A dead peer: device collectives waiting on it would spin forever, and
  // this host's ranks in a shared-memory collective would wait for this one
  // until the op timeout (Backend::abort; the global set's backend is the
  // engine's to abort).
  void abortAll();
  // "shm", "gloo", "local" for a set this rank is in; "" otherwise. Any thread.
  std::string backendName(int32_t id) const;

 private:
  const Topology& topology_;
  const EngineConfig& config_;
  StoreClient* store_ = nullptr;
  std::string prefix_;
  BackendFactory make_backend_;
  DevicePlaneFactory make_device_;
  std::unordered_map<int32_t, SetRuntime> sets_;  // node-based: find()'s pointers stay valid
  mutable std::mutex names_mu_;
  std::unordered_map<int32_t, std::string> names_;  // backendName()'s, by set
};

}  // namespace hvd
