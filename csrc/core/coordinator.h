// Negotiation on rank 0: collects every rank's requests by name, and once all
// ranks of the op's process set have submitted a name, validates that they agree and emits the
// response (execute, inline result, done, or an error naming each rank's
// value). Ranks may submit names in different orders; the coordinator's
// emission order is the one order every rank executes in.
//
// Threading: rank 0's, used only by the thread that holds the engine's baton
// (its background thread or a caller driving its op, engine.h: one at a time).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "fusion.h"
#include "message.h"
#include "process_sets.h"
#include "response_cache.h"
#include "timeline.h"

namespace hvd {

struct Arrival {
  int rank = 0;
  Request request;         // valid when cache_id < 0 (Coordinator::requestOf)
  int32_t cache_id = -1;   // >= 0: "my request is slot cache_id"
  bool has_inline = false; // the rank sent its allreduce data with the request
  std::string inline_data;
};

class Coordinator {
 public:
  Coordinator(int size, size_t fusion_threshold, size_t cache_capacity);

  // Not ok when the arrival itself is invalid: kInternal for a slot rank 0
  // never gave out (the ranks' caches disagree: a bug), kRefused for a rank
  // outside the op's process set or a name this rank already has in flight.
  // The caller fails that rank's op with it.
  Status add(Arrival&& arrival);

  // Responses for everything that became ready since the last call, fused.
  std::vector<Response> takeReady();

  // Names some ranks submitted and others have not, with the ranks missing
  // and how long the first rank has waited (stall reporting).
  struct Waiting {
    std::string name;
    int32_t process_set;
    std::vector<int> missing_ranks;
    std::chrono::steady_clock::duration waited;
  };
  std::vector<Waiting> waiting() const;
  bool hasWaiting() const { return !table_.empty(); }

  size_t cacheSize() const { return cache_.size(); }

  // Under the agreement (issue #47) cached ops never come here, so a slot
  // keeps its name alone, not every rank's request: rank 0's memory per
  // cached name no longer grows with the job. A cached arrival is then an
  // internal error.
  void keepSlotRequests(bool keep) { keep_slot_requests_ = keep; }

  // The autotuner's fusion threshold, applied from the next takeReady().
  void setFusionThreshold(size_t bytes) { fusion_threshold_ = bytes; }
  // Records negotiation (first arrival to response, a tick per rank) on it.
  void setTimeline(Timeline* timeline) { timeline_ = timeline; }

  // join(): `rank` has no more work. Until every rank has joined, ops that
  // all other ranks submitted run without it: allreduce and reducescatter
  // with zeros from joined ranks, allgather with no rows from them, broadcast
  // from a root that has not joined (Horovod's rules). When the last rank
  // joins, a kDone response for the name "join" carries that rank in last_joined_rank.
  void join(int rank);
  // Average while some ranks have joined: over the whole set (Horovod's rule,
  // joined ranks count as zeros) or, with true, over the ranks that submitted
  // (HVD_TORCH_JOIN_AVERAGE=contributors).
  void setAverageOverContributors(bool on) { average_over_contributors_ = on; }

 private:
  // What an arrival leaves in its Pending entry, one per rank. The request is
  // out of line: a cached arrival (the steady state) never fills it, and an
  // entry without a whole Request (240 bytes) inline keeps a pending op of many
  // ranks small (docs/control_plane_scale.md).
  struct Kept {
    int rank = 0;
    int32_t cache_id = -1;
    bool has_inline = false;
    std::unique_ptr<Request> request;  // when cache_id < 0; kept for reuse
    std::string inline_data;
  };
  struct Pending {
    std::string name;          // as submitted (the table's key adds the set)
    int32_t process_set = 0;
    OpType type = OpType::kAllreduce;  // its first arrival's (the timeline's row)
    std::vector<int> members;  // the set's global ranks
    std::vector<Kept> by_rank;
    std::vector<bool> arrived;
    int count = 0;
    bool ready = false;
    std::chrono::steady_clock::time_point first_arrival;
    int last_rank = -1;  // the latest to arrive (timeline)
    int32_t slot = -1;   // the cache slot that finds this entry in in_flight_
  };
  void traceArrival(const Pending& p, const Request& request, int rank);
  void traceNegotiated(const Pending& p);

  ReadyOp negotiate(Pending& pending);
  // kAddProcessSet / kRemoveProcessSet, once every rank asked for the same.
  void changeProcessSets(const std::vector<Request>& reqs, Response& r);
  // kRefused naming every rank's value when the ranks' requests disagree.
  Status validate(const std::vector<Request>& reqs, const std::vector<int>& ranks) const;
  // The arrived members' inline data, reduced in rank order (consumed).
  std::string reduceInline(const Request& q, Pending& p) const;
  // An op some ranks joined before: ok when it can run without them, else
  // kRefused saying why not.
  Status refuseWhileJoined(const Request& q, const Pending& p) const;

  // An arrived rank's request: its slot's when it named one (unchanged until
  // this name is negotiated again, which needs this entry), else its own.
  const Request& requestOf(const Pending& p, int rank) const;
  bool isMember(const std::vector<int>& members, int rank) const;
  bool readyToRun(const Pending& p) const;
  void markReady(const std::string& name, const Pending& p);

  int size_;
  size_t fusion_threshold_;
  bool average_over_contributors_ = false;
  bool keep_slot_requests_ = true;
  Timeline* timeline_ = nullptr;
  ProcessSetTable sets_;
  int32_t next_set_id_ = 1;  // ids are never reused, like cache slots
  std::vector<bool> joined_;
  int joined_count_ = 0;
  CoordinatorCache cache_;
  // Keyed by tableKey(process set, name), as are ready_ and groups_.
  using Table = std::unordered_map<std::string, Pending>;
  Table table_;
  // Entries of negotiated ops, kept for new names (recycle()).
  static constexpr size_t kSpareEntries = 64;
  std::vector<Table::node_type> spare_;
  std::vector<int> members_scratch_;  // a new entry's members, swapped in
  Table::iterator insertPending(const std::string& key);
  void recycle(Table::node_type node);
  // Slot id -> its name's entry while in table_ (null otherwise), so cached
  // arrivals skip the lookup by name; table_'s nodes do not move while in it.
  std::vector<Pending*> in_flight_;
  void forgetSlot(Pending& p);  // before the entry leaves table_
  std::vector<std::string> ready_;  // keys in the order they completed
  // Grouped keys every rank submitted, held until the whole group has.
  std::unordered_map<std::string, std::vector<std::string>> groups_;
  std::vector<Response> joins_done_;  // "every rank has joined", to emit last
  // Ops failed because a member that never submitted them asked to remove
  // their process set (it waits in the removal, so they could never complete).
  std::vector<Response> failed_;
  // Set id -> members that asked to remove it, until the removal negotiates.
  std::unordered_map<int32_t, std::vector<int>> removing_;
  // Fails the op under `key` if a member asked to remove its set without
  // submitting it; returns whether it did.
  bool failIfStranded(const std::string& key);
};

}  // namespace hvd
