#include "coordinator.h"

#include <cstring>
#include <sstream>

#include "reduction_plan.h"

namespace hvd {

Coordinator::Coordinator(int size, size_t fusion_threshold, size_t cache_capacity)
    : size_(size), fusion_threshold_(fusion_threshold), sets_(size), joined_(size, false),
      cache_(cache_capacity) {}

bool Coordinator::readyToRun(const Pending& p) const {
  // Counted, not scanned, while no rank has joined: a scan per arrival made
  // each op cost O(N^2) here (70 % of rank 0's time at 1024 simulated ranks,
  // docs/control_plane_scale.md). Only members arrive, each once (add()).
  if (p.count == static_cast<int>(p.members.size())) return true;
  if (joined_count_ == 0) return false;
  for (int r : p.members)
    if (!p.arrived[r] && !joined_[r]) return false;
  return true;
}

void Coordinator::markReady(const std::string& key, const Pending& p) {
  int first = 0;
  while (!p.arrived[first]) ++first;  // some rank has arrived: add() was called
  const Request& q = requestOf(p, first);
  if (q.group.empty()) {
    ready_.push_back(key);
    return;
  }
  // A group becomes ready as a unit, so its members run (and fuse) together.
  const std::string group = tableKey(q.process_set, q.group);
  auto& members = groups_[group];
  members.push_back(key);
  if (static_cast<int32_t>(members.size()) >= q.group_size) {
    ready_.insert(ready_.end(), members.begin(), members.end());
    groups_.erase(group);
  }
}

void Coordinator::join(int rank) {
  if (!joined_[rank]) {
    joined_[rank] = true;
    ++joined_count_;
  }
  // Ops that waited only for this rank can run now.
  for (auto& [key, p] : table_) {
    if (!p.ready && readyToRun(p)) {
      p.ready = true;
      markReady(key, p);
    }
  }
  if (joined_count_ == size_) {
    Response r;
    r.kind = Response::kDone;
    r.type = OpType::kJoin;
    r.names = {"join"};
    r.cache_ids = {-1};
    r.last_joined_rank = rank;
    joins_done_.push_back(r);
    joined_.assign(size_, false);
    joined_count_ = 0;
  }
}

const Request& Coordinator::requestOf(const Pending& p, int rank) const {
  const Kept& a = p.by_rank[rank];
  return a.cache_id >= 0 ? (*cache_.find(a.cache_id))[rank] : *a.request;
}

bool Coordinator::isMember(const std::vector<int>& members, int rank) const {
  // Members are distinct and ascending (changeProcessSets), so a set of size_
  // is every rank: no search per arrival for the global set.
  if (static_cast<int>(members.size()) == size_) return rank >= 0 && rank < size_;
  return indexIn(members, rank) >= 0;
}

Status Coordinator::add(Arrival&& arrival) {
  const std::vector<Request>* slot = nullptr;
  if (arrival.cache_id >= 0) {
    slot = cache_.find(arrival.cache_id);
    if (slot == nullptr) {
      return Status::internal("internal: rank " + std::to_string(arrival.rank) +
                              " named unknown cache slot " + std::to_string(arrival.cache_id));
    }
    // Under the agreement slots keep no requests: every arrival comes in full.
    if (slot->size() != static_cast<size_t>(size_)) {
      return Status::internal("internal: rank " + std::to_string(arrival.rank) + " named cache slot " +
                              std::to_string(arrival.cache_id) +
                              ", whose requests rank 0 does not keep (the ranks agree on cached ops)");
    }
  }
  // A cached arrival's request stays in its slot (requestOf), read here only
  // for an op's first arrival, an error or the timeline: a copy per arrival
  // was a quarter of rank 0's time per cached op at 1024 simulated ranks, and
  // a read per arrival (a cache miss: a slot holds N requests) over half of
  // what remained (docs/control_plane_scale.md).
  auto request = [&]() -> const Request& {
    return slot ? (*slot)[arrival.rank] : arrival.request;
  };
  // A slot never holds a process-set change (negotiate() gives them none).
  if (!slot && arrival.request.type == OpType::kRemoveProcessSet) {
    const int32_t id = arrival.request.set_id;
    std::vector<int> members;
    if (sets_.find(id, &members) && indexIn(members, arrival.rank) >= 0) {
      removing_[id].push_back(arrival.rank);
      std::vector<std::string> keys;
      for (const auto& [key, pending] : table_)
        if (pending.process_set == id) keys.push_back(key);
      for (const auto& key : keys) failIfStranded(key);
    }
  }
  // A slot keeps its name's key: no string is built per cached arrival, and
  // once its op is in the table no lookup by name either (in_flight_: the
  // hash and compare of the key were a third of a cached arrival's cost).
  std::string fresh_key;
  if (!slot) fresh_key = tableKey(arrival.request.process_set, arrival.request.name);
  const std::string& key = slot ? cache_.key(arrival.cache_id) : fresh_key;
  Pending* known = slot && static_cast<size_t>(arrival.cache_id) < in_flight_.size()
                       ? in_flight_[arrival.cache_id]
                       : nullptr;
  auto found = known ? table_.end() : table_.find(key);
  if (found != table_.end()) known = &found->second;
  // The set's members are copied once per op, with its first arrival.
  const bool member = known ? isMember(known->members, arrival.rank)
                            : sets_.find(request().process_set, &members_scratch_) &&
                                  indexIn(members_scratch_, arrival.rank) >= 0;
  if (!member) {
    return Status::refused("rank " + std::to_string(arrival.rank) + " submitted '" +
                           request().name + "' on process set " +
                           std::to_string(request().process_set) +
                           ", which does not exist or does not contain it");
  }
  if (!known) known = &insertPending(key)->second;
  Pending& p = *known;
  if (slot && p.slot < 0) {
    if (in_flight_.size() <= static_cast<size_t>(arrival.cache_id))
      in_flight_.resize(arrival.cache_id + 1, nullptr);
    in_flight_[arrival.cache_id] = &p;
    p.slot = arrival.cache_id;
  }
  if (p.count == 0) {
    const Request& q = request();
    p.name = q.name;
    p.process_set = q.process_set;
    p.type = q.type;
    p.members.swap(members_scratch_);
    p.by_rank.resize(size_);
    p.arrived.assign(size_, false);
    p.first_arrival = std::chrono::steady_clock::now();
  }
  if (p.arrived[arrival.rank]) {
    return Status::refused("an operation named '" + p.name + "' is already in flight on rank " +
                           std::to_string(arrival.rank));
  }
  p.arrived[arrival.rank] = true;
  p.last_rank = arrival.rank;
  if (timeline_ && timeline_->active()) traceArrival(p, request(), arrival.rank);
  Kept& kept = p.by_rank[arrival.rank];
  // A cached arrival leaves kept.request as it was (a recycled entry's old
  // value, or none), and one without data kept.inline_data: everything reads
  // an arrival's request through requestOf(), and its data only when it has some.
  if (!slot) {
    if (kept.request) {
      *kept.request = std::move(arrival.request);
    } else {
      kept.request = std::make_unique<Request>(std::move(arrival.request));
    }
  }
  kept.rank = arrival.rank;
  kept.cache_id = arrival.cache_id;
  kept.has_inline = arrival.has_inline;
  if (arrival.has_inline) kept.inline_data.swap(arrival.inline_data);
  ++p.count;
  if (!removing_.empty() && failIfStranded(key)) return Status::Ok();
  if (!p.ready && readyToRun(p)) {
    p.ready = true;
    markReady(key, p);
  }
  return Status::Ok();
}

Coordinator::Table::iterator Coordinator::insertPending(const std::string& key) {
  if (spare_.empty()) return table_.emplace(key, Pending()).first;
  Table::node_type node = std::move(spare_.back());
  spare_.pop_back();
  node.key() = key;
  return table_.insert(std::move(node)).position;
}

void Coordinator::forgetSlot(Pending& p) {
  if (p.slot < 0) return;
  in_flight_[p.slot] = nullptr;
  p.slot = -1;
}

void Coordinator::recycle(Table::node_type node) {
  // A negotiated op's entry keeps its vectors' and strings' buffers for the
  // next name: a steady stream of ops allocates nothing here.
  if (spare_.size() >= kSpareEntries) return;
  Pending& p = node.mapped();
  p.count = 0;
  p.ready = false;
  p.last_rank = -1;
  spare_.push_back(std::move(node));
}

bool Coordinator::failIfStranded(const std::string& key) {
  // remove_process_set() blocks its caller until every rank asks for the
  // removal; an op on the set that a removing member has not submitted would
  // wait for it forever (and the other members, inside that op, would never
  // ask). Fail such an op now, on the ranks that submitted it, naming the
  // remover: whichever of the op and the removal reaches rank 0 first.
  auto it = table_.find(key);
  if (it == table_.end() || it->second.ready) return false;
  Pending& p = it->second;
  auto removing = removing_.find(p.process_set);
  if (removing == removing_.end()) return false;
  int remover = -1;
  for (int r : removing->second)
    if (!p.arrived[r]) remover = r;
  if (remover < 0) return false;
  std::vector<int> waiting;
  for (int r : p.members)
    if (p.arrived[r]) waiting.push_back(r);
  Response r;
  r.kind = Response::kError;
  r.type = requestOf(p, waiting.at(0)).type;
  r.names = {p.name};
  r.process_set = p.process_set;
  r.cache_ids = {-1};
  r.error = std::string(opTypeName(r.type)) + " '" + p.name + "' on process set " +
            std::to_string(p.process_set) + ": rank " + std::to_string(remover) +
            " called remove_process_set() for this set without submitting it (ranks " +
            rankList(waiting) +
            " did); every rank must finish its operations on a set before removing it";
  failed_.push_back(std::move(r));
  if (timeline_ && timeline_->active()) traceNegotiated(p);
  forgetSlot(p);
  table_.erase(it);
  return true;
}

std::vector<Response> Coordinator::takeReady() {
  std::vector<ReadyOp> ops;
  ops.reserve(ready_.size());
  for (const auto& key : ready_) {
    // Out of the table first: a removal checks the table for the set's other ops.
    Table::node_type node = table_.extract(key);
    Pending& p = node.mapped();
    forgetSlot(p);
    if (timeline_ && timeline_->active()) traceNegotiated(p);
    ops.push_back(negotiate(p));
    recycle(std::move(node));
  }
  ready_.clear();
  // All or none: if one member of a group is invalid, the whole group fails.
  std::unordered_map<std::string, std::string> group_errors;
  for (const auto& op : ops) {
    if (!op.request.group.empty() && op.response.kind == Response::kError)
      group_errors.emplace(op.request.group, op.response.error);
  }
  for (auto& op : ops) {
    auto it = group_errors.find(op.request.group);
    if (op.request.group.empty() || it == group_errors.end()) continue;
    op.response.kind = Response::kError;
    op.response.error = "group '" + op.request.group + "' failed: " + it->second;
    op.response.inline_result.clear();
    op.response.cache_ids = {-1};
  }
  // A slot is given (or a name's slot given new requests) only to an op that
  // succeeds: every rank then learns its meaning from the response.
  for (auto& op : ops) {
    if (op.slot_requests.empty() || op.response.kind == Response::kError) continue;
    // Rare (a name negotiated in full): the key is made again here.
    const std::string key = tableKey(op.request.process_set, op.request.name);
    if (!keep_slot_requests_) op.slot_requests.clear();
    op.response.cache_ids = {cache_.insert(key, std::move(op.slot_requests))};
  }
  std::vector<Response> out = planFusion(std::move(ops), fusion_threshold_);
  out.insert(out.begin(), failed_.begin(), failed_.end());
  failed_.clear();
  // "Everyone joined" goes last: after every op that the last join released.
  out.insert(out.end(), joins_done_.begin(), joins_done_.end());
  joins_done_.clear();
  return out;
}

namespace {

bool reduces(OpType t) { return t == OpType::kAllreduce || t == OpType::kReducescatter; }

}  // namespace

ReadyOp Coordinator::negotiate(Pending& p) {
  ReadyOp op;
  Response& r = op.response;
  const Kept& lead = p.by_rank[p.members[0]];
  bool all_same_slot = true;  // every member arrived, naming one slot
  bool all_inline = true;     // every rank that arrived sent its data
  for (int rank : p.members) {
    all_same_slot = all_same_slot && p.arrived[rank] && p.by_rank[rank].cache_id >= 0 &&
                    p.by_rank[rank].cache_id == lead.cache_id;
    all_inline = all_inline && (!p.arrived[rank] || p.by_rank[rank].has_inline);
  }
  const OpType type = requestOf(p, p.last_rank).type;
  all_inline = all_inline && reduces(type);
  if (all_same_slot && type != OpType::kAllgather && type != OpType::kAlltoall) {
    // The steady state (a slot validated when it was made, and no per-rank
    // values to collect): one copy of one request, for fusion.
    op.request = requestOf(p, p.members[0]);
    r.type = type;
    r.process_set = op.request.process_set;
    r.names.push_back(std::move(p.name));
    r.cache_ids.push_back(lead.cache_id);
    if (type == OpType::kBarrier) {
      r.kind = Response::kDone;
    } else if (all_inline) {
      r.inline_result = reduceInline(op.request, p);
      r.kind = Response::kInline;
    }
    return op;
  }
  std::vector<Request> reqs;
  std::vector<int> ranks;  // who submitted (the set's members but the joined ranks)
  reqs.reserve(p.members.size());
  ranks.reserve(p.members.size());
  for (int rank : p.members) {
    if (!p.arrived[rank]) continue;
    Kept& a = p.by_rank[rank];  // read from reqs from here on
    reqs.push_back(a.cache_id >= 0 ? requestOf(p, rank) : std::move(*a.request));
    ranks.push_back(rank);
  }
  const std::string& name = reqs[0].name;
  r.names = {name};
  r.process_set = reqs[0].process_set;
  const bool partial = reqs.size() < p.members.size();
  op.request = reqs[0];
  r.type = reqs[0].type;
  if (r.type == OpType::kRemoveProcessSet) {
    for (const auto& q : reqs) removing_.erase(q.set_id);  // negotiated now, whatever the outcome
  }

  // A slot every rank named was validated when it was created: skip the checks.
  // What cannot run without the joined ranks is refused first: validating it
  // against the ranks that did submit would only confuse.
  Status error = partial ? refuseWhileJoined(reqs[0], p) : Status::Ok();
  if (error.ok() && !all_same_slot) error = validate(reqs, ranks);
  if (!error.ok()) {
    r.kind = Response::kError;
    r.error_code = error.code;
    r.error = std::move(error.message);
    r.cache_ids = {-1};
    return op;
  }
  if (partial) {
    // Joined ranks take part (zeros in, no rows for an allgather, the root's
    // data received and dropped): they need the op's shape and dtype.
    if (average_over_contributors_) r.contributors = static_cast<int32_t>(reqs.size());
    r.templates = {reqs[0]};
    if (r.type == OpType::kAllgather && !r.templates[0].shape.empty()) r.templates[0].shape[0] = 0;
    r.cache_ids = {-1};
  } else if (all_same_slot) {
    r.cache_ids = {lead.cache_id};
  } else if (r.type == OpType::kAddProcessSet || r.type == OpType::kRemoveProcessSet ||
             reqs[0].single_use) {
    r.cache_ids = {-1};  // one-off: not worth a slot
  } else {
    // Slots hold every rank's request at its global rank (others left empty);
    // takeReady caches them once the op cannot fail any more.
    op.slot_requests.resize(size_);
    for (size_t i = 0; i < reqs.size(); ++i) op.slot_requests[ranks[i]] = reqs[i];
    r.cache_ids = {-1};
  }

  if (r.type == OpType::kAllgather) {
    // Every member's rows, in set order; a joined rank gives none.
    std::vector<int64_t> dims;
    size_t next = 0;
    for (int rank : p.members) {
      if (!p.arrived[rank]) {
        dims.push_back(0);
        continue;
      }
      const Request& q = reqs[next++];
      dims.push_back(q.shape.empty() ? 1 : q.shape[0]);
    }
    r.rank_first_dims = {dims};
  } else if (r.type == OpType::kAlltoall) {
    std::vector<int64_t> matrix;
    for (const auto& q : reqs)
      matrix.insert(matrix.end(), q.send_splits.begin(), q.send_splits.end());
    r.alltoall_splits = {matrix};
  }
  if (r.type == OpType::kAddProcessSet || r.type == OpType::kRemoveProcessSet) {
    changeProcessSets(reqs, r);
  } else if (r.type == OpType::kBarrier) {
    r.kind = Response::kDone;
  } else if (all_inline) {
    // Small allreduces finish here: one round trip to the coordinator
    // instead of a negotiation plus a collective.
    r.inline_result = reduceInline(reqs[0], p);
    r.kind = Response::kInline;
  }
  return op;
}

void Coordinator::changeProcessSets(const std::vector<Request>& reqs, Response& r) {
  const Request& q = reqs[0];
  auto refuse = [&](const std::string& why) {
    r.kind = Response::kError;
    r.error = std::string(opTypeName(q.type)) + ": " + why;
  };
  if (q.type == OpType::kRemoveProcessSet) {
    const int32_t id = q.set_id;
    if (id == 0) return refuse("the global process set (0) cannot be removed");
    if (!sets_.find(id, nullptr)) return refuse("process set " + std::to_string(id) + " does not exist");
    for (const auto& [key, pending] : table_) {
      if (pending.process_set == id) {
        return refuse("process set " + std::to_string(id) + " still has operations in flight ('" +
                      pending.name + "'); synchronize them first");
      }
    }
    sets_.remove(id);
    r.kind = Response::kDone;
    return;
  }
  const std::vector<int> ranks(q.set_ranks.begin(), q.set_ranks.end());
  if (ranks.empty()) return refuse("a process set needs at least one rank");
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size_)
      return refuse("rank " + std::to_string(ranks[i]) + " is out of range for " +
                    std::to_string(size_) + " ranks (ranks " + rankList(ranks) + ")");
    if (i > 0 && ranks[i] <= ranks[i - 1])
      return refuse("ranks must be distinct, in ascending order: " + rankList(ranks));
  }
  for (int32_t id : sets_.ids()) {
    std::vector<int> existing;
    sets_.find(id, &existing);
    if (existing == ranks)
      return refuse("process set " + std::to_string(id) + " already has ranks " + rankList(ranks));
  }
  const int32_t id = next_set_id_++;
  sets_.add(id, ranks);
  r.kind = Response::kDone;
  r.new_set_id = id;
}

namespace {

template <typename Fn>
std::string describe(const std::vector<Request>& reqs, const std::vector<int>& ranks, Fn value) {
  std::ostringstream os;
  for (size_t i = 0; i < reqs.size(); ++i)
    os << (i ? ", " : "") << "rank " << ranks[i] << " " << value(reqs[i]);
  return os.str();
}

// A grouped allreduce travels as one bundle (Request::isBundle): its error
// names the first member that differs, as the group's members would one by one.
std::string bundleMismatch(const std::vector<Request>& reqs, const std::vector<int>& ranks) {
  const Request& a = reqs[0];
  const std::string group = "group '" + a.name + "' failed: ";
  auto members = [](const Request& x) {
    return x.isBundle() ? std::to_string(x.bundle_shapes.size()) + " tensors"
                        : std::string("one tensor (not grouped)");
  };
  const size_t count = a.bundle_shapes.size();
  for (const auto& q : reqs) {
    if (!q.isBundle() || q.bundle_shapes.size() != count)
      return group + "mismatched group sizes across ranks: " + describe(reqs, ranks, members);
  }
  for (size_t i = 0; i < count; ++i) {
    auto shape = [i](const Request& x) {
      Request one;
      one.shape = x.bundle_shapes[i];
      return one.shapeString();
    };
    for (const auto& q : reqs) {
      if (q.bundle_shapes[i] != a.bundle_shapes[i])
        return group + "allreduce '" + bundleMemberName(a.name, i) +
               "': mismatched shapes across ranks: " + describe(reqs, ranks, shape);
    }
  }
  return group + "mismatched member shapes across ranks";
}

}  // namespace

Status Coordinator::validate(const std::vector<Request>& reqs,
                             const std::vector<int>& ranks) const {
  const Request& a = reqs[0];
  const std::string what = std::string(opTypeName(a.type)) + " '" + a.name + "'";
  auto mismatch = [&](const char* field, auto value) {
    return Status::refused(what + ": mismatched " + field +
                           " across ranks: " + describe(reqs, ranks, value));
  };
  for (const auto& q : reqs) {
    if (q.type != a.type) {
      auto type = [](const Request& x) { return opTypeName(x.type); };
      return Status::refused("mismatched operations for tensor '" + a.name +
                             "': " + describe(reqs, ranks, type));
    }
  }
  for (const auto& q : reqs) {
    if (q.dtype != a.dtype) return mismatch("dtypes", [](const Request& x) { return dataTypeName(x.dtype); });
  }
  for (const auto& q : reqs) {
    if (q.group != a.group || q.group_size != a.group_size)
      return mismatch("groups", [](const Request& x) {
        return "'" + x.group + "' of " + std::to_string(x.group_size);
      });
  }
  // A CPU tensor on one rank and a CUDA tensor on another (or two planes)
  // would run different collectives: refuse. Device indices may differ.
  for (const auto& q : reqs) {
    if ((q.device >= 0) != (a.device >= 0) || q.plane != a.plane)
      return mismatch("devices", [](const Request& x) { return x.deviceString(); });
  }
  for (const auto& q : reqs) {
    if (q.process_set != a.process_set)
      return mismatch("process sets", [](const Request& x) { return x.process_set; });
  }
  auto shape = [](const Request& x) { return x.shapeString(); };
  if (a.type == OpType::kAllreduce) {
    for (const auto& q : reqs) {
      if (q.bundle_shapes != a.bundle_shapes) return Status::refused(bundleMismatch(reqs, ranks));
    }
  }
  if (a.type == OpType::kAllgather || a.type == OpType::kAlltoall) {
    for (const auto& q : reqs) {
      bool same_rows = q.shape.size() == a.shape.size() &&
                       std::equal(q.shape.begin() + (q.shape.empty() ? 0 : 1), q.shape.end(),
                                  a.shape.begin() + (a.shape.empty() ? 0 : 1));
      if (!same_rows)
        return mismatch("shapes (all dimensions but the first must match)", shape);
    }
  } else if (a.type != OpType::kBarrier) {
    for (const auto& q : reqs) {
      if (q.shape != a.shape) return mismatch("shapes", shape);
    }
  }
  if (a.type == OpType::kAllreduce || a.type == OpType::kReducescatter) {
    for (const auto& q : reqs) {
      if (q.reduce_op != a.reduce_op)
        return mismatch("reduce ops", [](const Request& x) { return reduceOpName(x.reduce_op); });
      if (q.prescale != a.prescale)
        return mismatch("prescale factors", [](const Request& x) { return x.prescale; });
      if (q.postscale != a.postscale)
        return mismatch("postscale factors", [](const Request& x) { return x.postscale; });
    }
  }
  if (a.type == OpType::kAlltoall) {
    for (const auto& q : reqs) {
      if (q.send_splits.size() != reqs.size())
        return mismatch("splits (one entry per rank expected)",
                        [](const Request& x) { return x.send_splits.size(); });
    }
  }
  if (a.type == OpType::kAddProcessSet) {
    for (const auto& q : reqs) {
      if (q.set_ranks != a.set_ranks)
        return mismatch("process set ranks", [](const Request& x) {
          return rankList(std::vector<int>(x.set_ranks.begin(), x.set_ranks.end()));
        });
    }
  }
  if (a.type == OpType::kRemoveProcessSet) {
    for (const auto& q : reqs) {
      if (q.set_id != a.set_id)
        return mismatch("process set ids", [](const Request& x) { return rankList({x.set_id}); });
    }
  }
  if (a.type == OpType::kBroadcast) {
    for (const auto& q : reqs) {
      if (q.root_rank != a.root_rank)
        return mismatch("root ranks", [](const Request& x) { return x.root_rank; });
    }
  }
  return Status::Ok();
}

Status Coordinator::refuseWhileJoined(const Request& q, const Pending& p) const {
  const std::string what = std::string(opTypeName(q.type)) + " '" + q.name + "'";
  switch (q.type) {
    case OpType::kAllreduce:
    case OpType::kReducescatter:
    case OpType::kAllgather:
      return Status::Ok();
    case OpType::kBroadcast:
      if (q.root_rank >= 0 && q.root_rank < size_ && p.arrived[q.root_rank]) return Status::Ok();
      return Status::refused(what + ": its root rank " + std::to_string(q.root_rank) +
                             " has joined, so there is nothing to broadcast");
    default:
      return Status::refused(what + " cannot run while some ranks have joined (allreduce, "
                                    "allgather, broadcast and reducescatter can)");
  }
}

std::string Coordinator::reduceInline(const Request& q, Pending& p) const {
  const size_t n = static_cast<size_t>(q.numElements());
  const size_t bytes = q.numBytes();
  std::vector<std::string*> rows;  // the members that arrived, in rank order
  for (int rank : p.members) {
    if (!p.arrived[rank]) continue;
    std::string& data = p.by_rank[rank].inline_data;
    data.resize(bytes);
    rows.push_back(&data);
  }
  if (rows.empty()) return std::string(bytes, '\0');  // (a ready op has a contributor)
  // Joined ranks contribute nothing; Average divides by the whole set, as if
  // they sent zeros (Horovod), or by those who did, when so configured.
  const int divisor = average_over_contributors_ ? static_cast<int>(rows.size())
                                                 : static_cast<int>(p.members.size());
  const ReductionPlan plan(q.dtype, q.reduce_op, q.prescale, q.postscale, divisor);
  // The rows are ours to scale in place, then the first holds the result.
  for (std::string* row : rows) plan.prescale(&(*row)[0], n);
  std::string acc = std::move(*rows[0]);
  plan.combine(&acc[0], static_cast<int>(rows.size()),
               [&](int r) -> const void* { return r == 0 ? acc.data() : rows[r]->data(); }, n);
  plan.finish(&acc[0], n);
  return acc;
}

void Coordinator::traceArrival(const Pending& p, const Request& request, int rank) {
  const std::string row = timelineRow(p.process_set, p.type, p.name);
  if (p.count == 0) timeline_->begin(row, timelinePhase(request.type, "NEGOTIATE_"));
  timeline_->tick(row, std::to_string(rank));
}

void Coordinator::traceNegotiated(const Pending& p) {
  // Which rank came last, and how long the first one waited for it: the
  // question a timeline is usually opened to answer.
  const auto waited = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::steady_clock::now() - p.first_arrival);
  timeline_->end(timelineRow(p.process_set, p.type, p.name),
                 "\"last_rank\": " + std::to_string(p.last_rank) +
                     ", \"ranks\": " + std::to_string(p.count) +
                     ", \"waited_us\": " + std::to_string(waited.count()));
}

std::vector<Coordinator::Waiting> Coordinator::waiting() const {
  std::vector<Waiting> out;
  auto now = std::chrono::steady_clock::now();
  for (const auto& [key, p] : table_) {
    Waiting w{p.name, p.process_set, {}, now - p.first_arrival};
    for (int r : p.members)
      if (!p.arrived[r] && !joined_[r]) w.missing_ranks.push_back(r);
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace hvd
