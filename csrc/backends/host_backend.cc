#include "host_backend.h"

#include <map>

#include "../core/store_client.h"
#include "gloo/gloo_backend.h"
#include "hierarchical_backend.h"
#include "host_record.h"
#include "shm/shm_backend.h"

namespace hvd {

namespace {

HostRecord describeSelf(const EngineConfig& config) {
  HostRecord self;
  self.shm = config.shm;
  self.split_reduce = config.hierarchical_allreduce;
  self.split_gather = config.hierarchical_allgather;
  self.host = config.hostname;
  return self;
}

// A topology for the group of `positions` (in the parent) in which this rank
// is `rank`, with the parent's other facts (cross_size picks Gloo's address).
Topology group(const Topology& parent, int rank, const std::vector<int>& positions) {
  Topology t = parent;
  t.rank = rank;
  t.size = static_cast<int>(positions.size());
  t.members.clear();
  for (int p : positions) t.members.push_back(parent.globalRank(p));
  return t;
}

}  // namespace

std::unique_ptr<Backend> makeHostBackend(const Topology& topology, const EngineConfig& config,
                                         StoreClient& store, const std::string& prefix) {
  const int n = topology.size;
  store.set(prefix + "who/" + std::to_string(topology.rank), describeSelf(config).encode());
  std::vector<HostRecord> who(n);
  for (int r = 0; r < n; ++r)
    who[r] = HostRecord::decode(store.get(prefix + "who/" + std::to_string(r), config.start_timeout));
  bool same_switches = true;
  std::map<std::string, int> host_index;  // by name, in order of first rank
  HostLayout layout;
  for (int r = 0; r < n; ++r) {
    same_switches = same_switches && who[r].sameSwitches(who[0]);
    const std::string& host = who[r].host;
    auto it = host_index.emplace(host, static_cast<int>(host_index.size())).first;
    layout.host_of.push_back(it->second);
    if (it->second == static_cast<int>(layout.members.size())) layout.members.emplace_back();
    layout.members[it->second].push_back(r);
  }
  const bool shm = same_switches && who[0].shm;
  if (shm && layout.members.size() == 1) {
    if (auto backend = tryShmBackend(topology, config, store, prefix)) return backend;
  }
  const bool split_reduce = same_switches && who[0].split_reduce;
  const bool split_gather = same_switches && who[0].split_gather;
  bool shared_host = false;
  for (const auto& m : layout.members) shared_host = shared_host || m.size() > 1;
  if (!shm || layout.members.size() == 1 || !shared_host || !(split_reduce || split_gather)) {
    return makeGlooBackend(topology, config, store, prefix);
  }
  // Several hosts, some shared: shm inside each, Gloo between their leaders.
  const int host = layout.host_of[topology.rank];
  const std::vector<int>& mine = layout.members[host];
  const int local_rank =
      static_cast<int>(std::find(mine.begin(), mine.end(), topology.rank) - mine.begin());
  std::unique_ptr<Backend> local;
  if (mine.size() > 1) {
    const Topology t = group(topology, local_rank, mine);
    const std::string p = prefix + "host" + std::to_string(host) + "/";
    local = tryShmBackend(t, config, store, p);
    if (!local) local = makeGlooBackend(t, config, store, p);
  }
  std::unique_ptr<Backend> leaders;
  if (local_rank == 0) {
    std::vector<int> firsts;
    for (const auto& m : layout.members) firsts.push_back(m[0]);
    leaders = makeGlooBackend(group(topology, host, firsts), config, store, prefix + "leaders/");
  }
  auto all = makeGlooBackend(topology, config, store, prefix + "all/");
  return std::make_unique<HierarchicalBackend>(std::move(layout), topology.rank, std::move(local),
                                               std::move(leaders), std::move(all), split_reduce,
                                               split_gather);
}

}  // namespace hvd
