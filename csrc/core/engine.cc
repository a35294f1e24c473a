#include "engine.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "log.h"

namespace hvd {

Engine::Engine(const Topology& topology, const EngineConfig& config)
    : topology_(topology), config_(config), process_sets_(topology.size) {
  tunables_.fusion_threshold = config.fusion_threshold;
  tunables_.inline_threshold = config.inline_threshold;
}

std::shared_ptr<Engine> Engine::start(const Topology& topology, const EngineConfig& config,
                                      const BackendFactory& make_backend, uint64_t generation,
                                      DevicePlaneFactory make_device,
                                      std::unique_ptr<StoreClient> store) {
  std::shared_ptr<Engine> engine(new Engine(topology, config));
  engine->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (engine->wake_fd_ < 0) throw std::runtime_error("eventfd failed");
  engine->connect(make_backend, std::move(make_device), generation, std::move(store));
  engine->startObservers();
  engine->timelineChanged();
  HVD_LOG(kDebug) << "rank " << topology.rank << " of " << topology.size << ": engine connected";
  engine->thread_ = std::thread([e = engine.get()] { e->loop(); });
  return engine;
}

Engine::~Engine() {
  shutdown();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void Engine::connect(const BackendFactory& make_backend, DevicePlaneFactory make_device,
                     uint64_t generation, std::unique_ptr<StoreClient> store) {
  if (topology_.rank == 0) {
    coordinator_ = std::make_unique<Coordinator>(topology_.size, config_.fusion_threshold,
                                                 config_.cache_capacity);
    coordinator_->setAverageOverContributors(config_.join_average_contributors);
  }
  if (topology_.size > 1) {
    if (config_.store_host.empty() && !store) {
      throw std::runtime_error(
          "HOROVOD_SIZE=" + std::to_string(topology_.size) +
          " but no rendezvous store is set (HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT): start the job "
          "with hvdrun, or set the variables a launcher sets");
    }
    store_ = store ? std::move(store)
                   : std::make_unique<StoreClient>(config_.store_host, config_.store_port,
                                                   config_.secret, config_.start_timeout);
    const std::string scope = config_.rendezvous_scope.empty()
                                  ? "g" + std::to_string(generation)
                                  : config_.rendezvous_scope;
    const std::string prefix = "hvd/" + scope + "/";
    sets_.setRendezvous(store_.get(), prefix, make_backend, std::move(make_device));
    store_->set(prefix + "arrived/" + std::to_string(topology_.rank), config_.hostname);
    control_.connect(*store_, prefix);
    backend_ = make_backend(topology_, config_, *store_, prefix + "data/");
    // The data plane's choice is every rank's: the ranks share one host.
    if (std::string(backend_->name()) == "shm") {
      attachRingsAndLane(prefix + "control/");
    } else {
      control_.attachHostRings(*store_, prefix + "control/");
    }
    connectAgreement(prefix + "agreement/");
  }
  if (topology_.size == 1) sets_.setRendezvous(nullptr, "", make_backend, std::move(make_device));
  sets_.openGlobal(backend_.get());
}

void Engine::attachRingsAndLane(const std::string& prefix) {
  // Every rank must map the same geometry: rank 0's settings decide it.
  size_t slots = 0;
  size_t row_bytes = 0;
  if (topology_.rank == 0) {
    if (config_.fast_lane && config_.shm_control && config_.fast_lane_bytes > 0 &&
        topology_.size < 4096) {
      slots = std::min<size_t>(config_.cache_capacity, 4096);
      row_bytes = config_.fast_lane_bytes;
    }
    store_->set(prefix + "lane", std::to_string(slots) + " " + std::to_string(row_bytes));
  } else {
    const std::string geometry = store_->get(prefix + "lane", config_.start_timeout);
    std::sscanf(geometry.c_str(), "%zu %zu", &slots, &row_bytes);
  }
  const size_t extra = slots > 0 ? FastLane::footprint(topology_.size, slots, row_bytes) : 0;
  control_.attachRings(*store_, prefix, extra);
  if (extra > 0 && control_.extraArea() != nullptr) {
    auto fast = std::make_unique<FastLane>(control_.extraArea(), topology_.size, topology_.rank,
                                           slots, row_bytes, config_.caller_spin,
                                           config_.fast_lane && config_.callers_drive);
    Lane::Sink& sink = *this;  // private base: converted here, not in make_unique
    lane_ = std::make_unique<Lane>(std::move(fast), config_.lane_defer, sink);
  }
}

std::string Engine::controlPlane() const { return control_.plane(); }

std::string Engine::backendName(int32_t process_set) const {
  return sets_.backendName(process_set);
}


Status Engine::refusal() const {
  return broken_.ok() ? Status::shutdown("hvd_torch has been shut down") : broken_;
}

Status Engine::stopped() {
  std::lock_guard<std::mutex> lock(mu_);
  return accepting() ? Status() : refusal();
}

bool Engine::queueForEngine(Entry&& e) {
  Status refused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (accepting()) {
      queue_.push_back(std::move(e));
      return true;
    }
    refused = refusal();
  }
  // Stopped meanwhile: the queue may never be taken again.
  e.work->complete(std::move(refused));
  return false;
}

void Engine::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (lane_) lane_->stop();
  ringWakeFd();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> baton(baton_);  // a driver may still be in a round
  timeline_.stop();  // after the thread: its last events are in the file
  control_.close();
  partners_.close();
  backend_.reset();
  store_.reset();
}

std::shared_ptr<Work> Engine::enqueue(Entry entry, SubmitMode mode) {
  auto work = std::make_shared<Work>();
  entry.work = work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!accepting()) {
      work->complete(refusal());
      return work;
    }
    // Checked here, on the caller's thread, so the second submission raises
    // at once and never reaches the other ranks (which would pair it with
    // their next op of that name).
    const std::string key = tableKey(entry.request.process_set, entry.request.name);
    auto it = in_flight_.find(key);
    if (it != in_flight_.end()) {
      auto earlier = it->second.lock();
      if (earlier && !earlier->done()) {
        throw DuplicateName(
            std::string(entry.request.isBundle() ? "grouped_allreduce"
                                                 : opTypeName(entry.request.type)) +
            " '" + entry.request.name +
            "': an operation with the same name is already in flight on rank " +
            std::to_string(topology_.rank) +
            (entry.request.process_set ? " in process set " +
                                             std::to_string(entry.request.process_set)
                                       : std::string()) +
            " and has not completed; wait for it (synchronize) or use a different name");
      }
    }
    in_flight_[key] = work;
    if (in_flight_.size() >= sweep_in_flight_at_) {
      for (auto i = in_flight_.begin(); i != in_flight_.end();) {
        auto w = i->second.lock();
        i = (!w || w->done()) ? in_flight_.erase(i) : std::next(i);
      }
      sweep_in_flight_at_ = 2 * in_flight_.size() + 64;
    }
    if (!lane_) queue_.push_back(std::move(entry));
  }
  if (lane_) {
    // The lane sees every submission first, outside the lock (lane.h): it
    // runs it here, keeps it until its caller waits, or registers it and
    // leaves it to the engine.
    if (lane_->submit(entry, mode)) return work;
    if (!queueForEngine(std::move(entry))) return work;
  }
  if (mode == SubmitMode::kAsync) wake();
  return work;
}

bool Engine::cycle(bool background_thread) {
  // Cleared before the queue is taken (takeSubmissions): a submission
  // after this point writes again, one before it is in the queue taken.
  wake_posted_.store(false);
  bool stop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.ok()) return false;
    stop = stopping_;
  }
  if (stop) {
    if (!background_thread) return false;  // shutting down is the background thread's, once
    control_.sayBye();
    fail(Status::shutdown("hvd_torch was shut down before this operation completed"));
    return false;
  }
  try {
    if (lane_ && coordinator_) lane_->setPaused(timeline_.active());
    control_.flushAll();
    if (agreement_) partners_.flushAll();
    takeSubmissions();
    if (coordinator_) {
      readWorkers();
      checkStalls();
    } else {
      readCoordinator();
    }
    if (agreement_) progressRounds();
  } catch (const StatusError& e) {
    fail(e.status);
  } catch (const InternalError& e) {
    fail(Status::internal(e.what()));
  } catch (const std::exception& e) {
    // Transport failures arrive as StatusError: anything else is ours.
    fail(Status::internal(std::string("internal: unexpected error: ") + e.what()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  return broken_.ok();
}

void Engine::takeSubmissions() {
  // Swapped with the queue: both keep their capacity, so a steady stream of
  // submissions allocates nothing here.
  std::vector<Entry>& fresh = taken_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fresh.swap(queue_);
  }
  if (fresh.empty()) return;
  std::vector<Arrival>& arrivals = arrivals_;  // keeps its capacity
  arrivals.clear();  // after a throw
  own_requests_.clear();
  for (Entry& e : fresh) {
    const std::string& name = e.request.name;
    const std::string key = tableKey(e.request.process_set, name);
    SetRuntime* set = sets_.find(e.request.process_set);
    if (set == nullptr) {
      e.work->complete(Status::invalidArgument(
          std::string(opTypeName(e.request.type)) + " '" + name + "': rank " +
          std::to_string(topology_.rank) + " is not in process set " +
          std::to_string(e.request.process_set) + " (or it does not exist)"));
      continue;
    }
    const int set_size = static_cast<int>(set->ranks.size());
    if (pending_.count(key)) {
      e.work->complete(Status::invalidArgument(
          std::string(opTypeName(e.request.type)) + ": an operation named '" + name +
          "' is already in flight on rank " + std::to_string(topology_.rank) +
          "; wait for it (synchronize) before submitting the name again"));
      continue;
    }
    Arrival a;
    a.rank = topology_.rank;
    const bool cacheable = config_.cache_capacity > 0 && e.request.type != OpType::kJoin &&
                           e.request.type != OpType::kAddProcessSet &&
                           e.request.type != OpType::kRemoveProcessSet && !e.request.single_use;
    a.cache_id = cacheable ? rank_cache_.lookup(key, e.request) : -1;
    if (e.request.type == OpType::kJoin) {
      joined_ = true;
      if (lane_) lane_->joined(true);
      if (rounds_) rounds_->setJoined(true);
    }
    // A host-staged input is being copied from the GPU: every read below and
    // in the executor needs it complete.
    if (e.ready && e.request.plane != Plane::kDevice) {
      e.ready->synchronize();
      e.ready.reset();
    }
    // Inline data flows through rank 0, which receives and sends (size - 1)
    // copies: worth it while that traffic stays below the threshold. The
    // threshold bounds everything this rank has in flight inline, not one op:
    // a burst of ops (a gradient set) takes the collective path, where the
    // coordinator fuses them, instead of queueing behind rank 0's socket.
    // Device memory never goes inline (the host cannot read it).
    const bool reduces = e.request.type == OpType::kAllreduce ||
                         e.request.type == OpType::kReducescatter;
    const size_t traffic = e.request.numBytes() * static_cast<size_t>(set_size - 1);
    const bool goes_inline = reduces && set_size > 1 && e.request.plane != Plane::kDevice &&
                             inline_in_flight_ + traffic <=
                                 std::min(tunables_.inline_threshold, set->inline_cap);
    // The ranks agree on a cached op among themselves (engine_agreement.cc),
    // unless it goes inline: rank 0's reduction in rank order keeps a small
    // op's bits what they were. What goes to rank 0 goes in full (its slots
    // keep no requests).
    if (agreement_ && cacheable) {
      if (!goes_inline && submitToAgreement(e, key)) continue;
      if (goes_inline) sentInline(key);
    }
    if (agreement_) a.cache_id = -1;
    // A cached op goes as its slot alone: rank 0's coordinator reads the
    // request from the slot.
    if (a.cache_id < 0) {
      a.request = e.request;
    } else {
      cached_submissions_.fetch_add(1, std::memory_order_relaxed);
    }
    if (goes_inline) {
      a.has_inline = true;
      if (e.parts.empty()) {
        a.inline_data.assign(static_cast<const char*>(e.input), e.request.numBytes());
      } else {
        const size_t elem = dataTypeSize(e.request.dtype);
        a.inline_data.reserve(e.request.numBytes());
        for (const auto& part : e.parts)
          a.inline_data.append(static_cast<const char*>(part.in), part.count * elem);
      }
      e.inline_traffic = traffic;
      inline_in_flight_ += traffic;
    }
    own_requests_.push_back(&addPending(key, std::move(e)).request);
    arrivals.push_back(std::move(a));
  }
  fresh.clear();
  if (coordinator_) {
    for (size_t i = 0; i < arrivals.size(); ++i) arrive(std::move(arrivals[i]), own_requests_[i]);
  } else if (!arrivals.empty()) {
    control_.sendToCoordinator(encodeArrivals(arrivals));
  }
  arrivals.clear();
  own_requests_.clear();
  if (coordinator_) dispatch(coordinator_->takeReady());
}

Entry& Engine::addPending(const std::string& key, Entry&& e) {
  PendingTable::iterator added;
  if (spare_pending_.empty()) {
    added = pending_.emplace(key, std::move(e)).first;
  } else {
    PendingTable::node_type node = std::move(spare_pending_.back());
    spare_pending_.pop_back();
    node.key() = key;
    node.mapped() = std::move(e);
    added = pending_.insert(std::move(node)).position;
  }
  return added->second;
}

void Engine::arrive(Arrival a, const Request* own) {
  if (a.cache_id < 0 && a.request.type == OpType::kJoin) {
    coordinator_->join(a.rank);
    return;
  }
  const int rank = a.rank;
  Status status = coordinator_->add(std::move(a));
  if (status.ok()) return;
  // Another rank's submission the coordinator cannot answer: that rank checked
  // it before sending, so the ranks' state disagrees (a bug, not a peer gone).
  if (own == nullptr) throw InternalError("rank " + std::to_string(rank) + ": " + status.message);
  Response r;
  r.kind = Response::kError;
  r.names = {own->name};
  r.process_set = own->process_set;
  r.cache_ids = {-1};
  r.error_code = status.code;
  r.error = std::move(status.message);
  run(r);
}

void Engine::readWorkers() {
  worker_frames_.clear();
  lost_ranks_.clear();
  control_.readWorkers(worker_frames_, lost_ranks_);
  for (ControlChannel::FromWorker& from : worker_frames_) {
    const int rank = from.rank;
    if (!departed_.empty() && departed_[rank]) continue;
    WorkerFrame f = decodeWorkerFrame(from.frame, rank);
    if (f.kind == WorkerFrame::kBye) {
      // With the agreement, a rank that leaves may still owe its partners
      // the messages of a round it finished (they come before its links
      // close): only ops rank 0 negotiates need it from now on (below).
      if (agreement_) {
        if (departed_.empty()) departed_.assign(topology_.size, false);
        departed_[rank] = true;
        control_.dropWorker(rank);
        continue;
      }
      throw transportFailure("rank " + std::to_string(rank) +
                             " called shutdown(); collectives that need it cannot complete");
    }
    for (Arrival& a : f.arrivals) arrive(std::move(a), nullptr);
  }
  for (int rank : lost_ranks_) {
    if (!departed_.empty() && departed_[rank]) continue;
    throw transportFailure(control_.lostMessage(rank));
  }
  dispatch(coordinator_->takeReady());
  if (!departed_.empty() && coordinator_->hasWaiting()) {
    const int gone = static_cast<int>(std::find(departed_.begin(), departed_.end(), true) - departed_.begin());
    throw transportFailure("rank " + std::to_string(gone) +
                           " called shutdown(); collectives that need it cannot complete");
  }
}

void Engine::readCoordinator() {
  std::vector<std::string> frames;
  bool open = control_.readFromCoordinator(frames);
  for (const auto& frame : frames) {
    CoordinatorFrame f = decodeCoordinatorFrame(frame);
    if (f.kind == CoordinatorFrame::kAbort) throw StatusError(f.abort);
    if (f.kind == CoordinatorFrame::kTunables) {
      // Rank 0's autotuner moved: from the next submission on, this rank
      // decides inline vs collective as rank 0 does.
      std::lock_guard<std::mutex> lock(mu_);
      tunables_ = f.tunables;
      continue;
    }
    if (agreement_) {
      // Run at the round that counts this batch, as on every rank.
      batches_.push_back(std::move(f.responses));
      ++batches_seen_;
      continue;
    }
    for (const Response& r : f.responses) run(r);
  }
  if (!open && agreement_ && !coordinator_gone_) {
    // Rank 0 may have left after its last op, whose batch and round this rank
    // still finishes (progressRounds decides what can still complete).
    coordinator_gone_ = true;
    control_.dropCoordinator();
    return;
  }
  if (!open && !coordinator_gone_) {
    throw control_.coordinatorLost();
  }
}

void Engine::dispatch(std::vector<Response> responses) {
  if (responses.empty()) return;
  if (topology_.size > 1) {
    const std::string frame = encodeResponses(responses);
    control_.sendToAll(frame);
  }
  if (agreement_) {
    // Every rank runs it at the round that counts it (rank 0's MAX word).
    batches_.push_back(std::move(responses));
    rounds_->setBatches(++batches_seen_);
    return;
  }
  runBatch(std::move(responses));
}

void Engine::runBatch(std::vector<Response> responses) {
  if (!timeline_.active()) {
    for (const auto& r : responses) run(r);
    return;
  }
  traceDispatched(responses);
  for (const auto& r : responses) {
    for (const auto& name : r.names)
      timeline_.end(timelineRow(r.process_set, r.type, name));  // QUEUE
    run(r);
    traceRan(r);
  }
}

Tunables Engine::tunables() {
  std::lock_guard<std::mutex> lock(mu_);
  return tunables_;
}

void Engine::startObservers() {
  if (topology_.rank != 0) return;  // rank 0 sees every rank: it records and tunes for all
  coordinator_->setTimeline(&timeline_);
  const std::string& path = config_.timeline_path;
  // Horovod's "DYNAMIC": no file until hvd.start_timeline().
  if (!path.empty() && path != "DYNAMIC") {
    const std::string error = timeline_.start(path, config_.timeline_mark_cycles);
    if (!error.empty())
      std::fprintf(stderr, "[hvd_torch] WARNING: HOROVOD_TIMELINE: %s\n", error.c_str());
  }
  const AutotuneConfig& autotune = config_.autotune;
  if (autotune.enabled) {
    std::string error;
    autotuner_ = std::make_unique<Autotuner>(autotune, tunables_, &error);
    if (!error.empty()) std::fprintf(stderr, "[hvd_torch] WARNING: %s\n", error.c_str());
  }
}

void Engine::applyTunables(const Tunables& t) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tunables_ = t;
  }
  coordinator_->setFusionThreshold(t.fusion_threshold);
  if (rounds_) rounds_->announceFusionThreshold(t.fusion_threshold);
  // Ahead of any response sent after this one, on every rank's ordered stream.
  const std::string frame = encodeTunables(t);
  control_.sendToAll(frame);
}

void Engine::traceDispatched(const std::vector<Response>& responses) {
  // Our loop has no cycles: a "cycle" is one batch of responses dispatched.
  if (timeline_.markCycles()) timeline_.marker("CYCLE_START");
  for (const auto& r : responses) {
    const std::string phase = timelinePhase(r.type);
    for (const auto& name : r.names) {
      const std::string row = timelineRow(r.process_set, r.type, name);
      timeline_.begin(row, phase);
      // Until this response runs: behind the batch's earlier responses.
      timeline_.begin(row, "QUEUE");
    }
  }
}

void Engine::traceRan(const Response& r) {
  static const char* const kinds[] = {"collective", "inline", "error", "done"};
  const std::string args = std::string("\"path\": \"") + kinds[r.kind] +
                           "\", \"fused\": " + std::to_string(r.names.size());
  for (const auto& name : r.names) timeline_.end(timelineRow(r.process_set, r.type, name), args);
}

namespace {

// A joined rank's stand-in for an op it never submitted: zeros in, the
// result thrown away. It lets the rank take part in the collective.
Entry phantomEntry(const Request& request, Memory& memory) {
  // At least a byte: an allgather's stand-in has no rows, and a backend may
  // refuse a null buffer even for zero elements.
  std::shared_ptr<void> scratch = memory.zeros(std::max<size_t>(request.numBytes(), 1));
  Entry e;
  e.request = request;
  e.input = scratch.get();
  e.output = scratch.get();
  // An allgather's output: every other rank's rows, received and dropped.
  auto gathered = std::make_shared<std::shared_ptr<void>>();
  const size_t row_bytes = static_cast<size_t>(request.rowElements()) * dataTypeSize(request.dtype);
  e.allocate = [gathered, &memory, row_bytes](int64_t rows) {
    *gathered = memory.zeros(std::max<size_t>(static_cast<size_t>(rows) * row_bytes, 1));
    return gathered->get();
  };
  e.work = std::make_shared<Work>();
  e.keep_alive = scratch;
  return e;
}

// The plane and device of a response's entries on this rank: the first one
// this rank submitted (the coordinator made every rank agree on the plane),
// else a joined rank's stand-in, which takes the other ranks' plane.
std::pair<Plane, int> planeOf(const Response& response, const std::vector<Entry*>& entries) {
  if (!entries.empty()) return {entries[0]->request.plane, entries[0]->request.device};
  if (!response.templates.empty())
    return {response.templates[0].plane, response.templates[0].device};
  return {Plane::kHost, -1};
}

}  // namespace

void Engine::changeProcessSets(const Response& response, Entry& entry) {
  if (response.type == OpType::kAddProcessSet) {
    const int32_t id = response.new_set_id;
    const std::vector<int> ranks(entry.request.set_ranks.begin(), entry.request.set_ranks.end());
    process_sets_.add(id, ranks);
    try {
      sets_.open(id, ranks);  // connects the set's data plane through the store
    } catch (const InternalError&) {
      throw;
    } catch (const std::exception& e) {
      throw transportFailure("add_process_set " + std::to_string(id) + " failed on rank " +
                             std::to_string(topology_.rank) + ": " + e.what());
    }
    entry.work->setNewSetId(id);
  } else if (response.type == OpType::kRemoveProcessSet) {
    const int32_t id = entry.request.set_id;
    process_sets_.remove(id);
    sets_.remove(id);
  }
}

void Engine::run(const Response& response) {
  SetRuntime* set = sets_.find(response.process_set);
  // Before anything that depends on this rank: every rank learns alike.
  if (agreement_) learnSlots(response, set != nullptr);
  if (set == nullptr) return;  // another set's op: nothing for us to do
  HVD_LOG(kTrace) << "rank " << topology_.rank << ": run " << response.names.size()
                  << " op(s) of process set " << response.process_set << ", first '"
                  << (response.names.empty() ? "" : response.names[0]) << "'";
  SetRuntime& rt = *set;  // stays valid if a process set opens meanwhile
  std::vector<Entry*> entries;
  entries.reserve(response.names.size());
  // Each entry's place in pending_ (end() for a phantom): its key, its removal.
  std::vector<PendingTable::iterator>& places = run_places_;
  places.clear();
  std::vector<Entry> phantoms;  // reserved: entries points into it
  if (joined_) {
    phantoms.reserve(response.names.size());
    // Others' ops this rank takes part in (or skips) without submitting them:
    // each is an instance of its name on the lane, as on the ranks that did.
    if (lane_ && response.process_set == 0) {
      for (const std::string& name : response.names)
        if (!pending_.count(tableKey(0, name))) lane_->bystander(name);
    }
  }
  Executor* executor = nullptr;
  for (size_t i = 0; i < response.names.size(); ++i) {
    const std::string& name = response.names[i];
    auto it = pending_.find(tableKey(response.process_set, name));
    places.push_back(it);
    if (it != pending_.end()) {
      entries.push_back(&it->second);
    } else if (joined_ && response.kind != Response::kExecute) {
      // Others' op that failed or was reduced inline: nothing for us to do,
      // but the slots the others learn from it, this rank learns too.
      if (lane_ && response.kind == Response::kInline) lane_->learnSlots(response);
      return;
    } else if (joined_ && i < response.templates.size()) {
      if (executor == nullptr) {
        // A joined rank uses its own device when it has one for this set.
        const auto [plane, device] = planeOf(response, entries);
        executor = &sets_.executorFor(response.process_set, rt, plane,
                                rt.device >= 0 ? rt.device : device);
      }
      phantoms.push_back(phantomEntry(response.templates[i], executor->memory()));
      entries.push_back(&phantoms.back());
    } else if (response.kind == Response::kError && response.names.size() == 1) {
      // Others' op failed before this rank submitted it (its process set is
      // being removed): nothing of ours to fail.
      return;
    } else {
      throw InternalError("internal: response for '" + name + "' that rank " +
                               std::to_string(topology_.rank) + " never submitted");
    }
  }
  if (response.type == OpType::kJoin) {
    entries[0]->work->setLastJoinedRank(response.last_joined_rank);
    joined_ = false;
    if (lane_) lane_->joined(false);
    if (rounds_) rounds_->setJoined(false);
  }
  Status status;
  switch (response.kind) {
    case Response::kError:
      status = response.errorStatus();
      break;
    case Response::kInline:
      // Each copy is skipped when empty: an empty output (no rows of a
      // reducescatter for this rank, a tensor of no elements) may have no
      // storage, and memcpy to null is undefined even for 0 bytes (UBSan,
      // make test-sanitize).
      if (response.type == OpType::kReducescatter) {
        const Request& q = entries[0]->request;
        const RowSlice mine =
            reducescatterSlice(q.shape[0], static_cast<int>(rt.ranks.size()), rt.index);
        const size_t row_bytes = static_cast<size_t>(q.rowElements()) * dataTypeSize(q.dtype);
        void* out = entries[0]->allocate(mine.rows);
        if (mine.rows * row_bytes > 0)
          std::memcpy(out, response.inline_result.data() + mine.offset * row_bytes,
                      mine.rows * row_bytes);
      } else if (!entries[0]->parts.empty()) {
        const char* from = response.inline_result.data();
        const size_t elem = dataTypeSize(entries[0]->request.dtype);
        for (const auto& part : entries[0]->parts) {
          if (part.count > 0) std::memcpy(part.out, from, part.count * elem);
          from += part.count * elem;
        }
      } else if (!response.inline_result.empty()) {
        std::memcpy(entries[0]->output, response.inline_result.data(),
                    response.inline_result.size());
      }
      break;
    case Response::kDone:
      changeProcessSets(response, *entries[0]);
      break;
    case Response::kExecute:
      try {
        if (executor == nullptr) {
          const auto [plane, device] = planeOf(response, entries);
          executor = &sets_.executorFor(response.process_set, rt, plane, device);
        }
        executor->execute(response, entries, coordinator_ ? &timeline_ : nullptr);
        // A device plane has only enqueued the work: its end is an event
        // that readers of the outputs order themselves after.
        if (std::shared_ptr<DeviceEvent> done = executor->memory().record()) {
          for (Entry* e : entries) e->work->setDeviceDone(done);
        }
      } catch (const InternalError&) {
        throw;  // the data plane's own invariant: a bug, whatever the peers do
      } catch (const std::exception& e) {
        // The data plane failed: a peer or the network is gone. The control
        // plane may know which rank, or rank 0 may have said why (and with
        // which kind: its own failure may have been a bug).
        const Status why = control_.diagnosePeerFailure();
        const std::string what = std::string(opTypeName(response.type)) + " '" +
                                 response.names[0] + "' failed on rank " +
                                 std::to_string(topology_.rank) + ": " +
                                 (why.ok() ? e.what() : why.message + " (" + e.what() + ")");
        throw StatusError({why.ok() ? Status::kPeerFailure : why.code, what});
      }
      break;
  }
  if (autotuner_ && !autotuner_->settled()) {
    const auto now = std::chrono::steady_clock::now();
    bool changed = false;
    for (size_t i = 0; i < entries.size(); ++i)
      changed = autotuner_->completed(response.names[i], entries[i]->request.numBytes(), now) || changed;
    if (changed) applyTunables(autotuner_->current());
  }
  std::string phantom_key;
  for (size_t i = 0; i < entries.size(); ++i) {
    Entry* e = entries[i];
    const auto place = places[i];
    const bool phantom = place == pending_.end();
    if (phantom) phantom_key = tableKey(response.process_set, response.names[i]);
    if (status.ok() && i < response.cache_ids.size() && response.cache_ids[i] >= 0 &&
        config_.cache_capacity > 0) {
      rank_cache_.remember(phantom ? phantom_key : place->first, e->request,
                           response.cache_ids[i]);
      // Before complete(): the name's next submission must find its slot.
      if (lane_ && response.process_set == 0) lane_->learn(e->request, response, i);
    }
    inline_in_flight_ -= e->inline_traffic;
    // Our references to the tensors go first: a caller woken by complete()
    // that frees its output must free the memory (host_output.h reuses it).
    e->keep_alive.reset();
    e->allocate = nullptr;
    e->work->complete(status);
    if (phantom) continue;
    // The node (and its key's buffer) serves a later submission; the entry
    // itself goes now, as erase() would.
    PendingTable::node_type node = pending_.extract(place);
    if (spare_pending_.size() < kSparePending) {
      node.mapped() = Entry();
      spare_pending_.push_back(std::move(node));
    }
  }
}

void Engine::checkStalls() {
  if (!config_.stall_check) return;
  const auto verdict = stalls_.inspect(coordinator_->waiting(), std::chrono::steady_clock::now());
  // A rank that never submits is, to the others, a peer that is gone.
  if (!verdict.fatal.empty()) throw transportFailure(verdict.fatal);  // every rank gets it
  if (!verdict.warning.empty()) HVD_LOG(kWarning) << verdict.warning;
}

void Engine::fail(const Status& status) {
  HVD_LOG(kDebug) << "rank " << topology_.rank << ": failing pending ops: " << status.message;
  std::vector<Entry> queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.ok() && (status.code == Status::kPeerFailure || status.code == Status::kInternal))
      broken_ = status;
    queued.swap(queue_);
  }
  // Tell the others before going quiet, so they fail now instead of at a timeout.
  if (coordinator_ && (status.code == Status::kPeerFailure || status.code == Status::kInternal)) {
    control_.abortAll(status);
  }
  // Device collectives waiting on a dead peer would spin on the GPU forever;
  // this host's ranks inside a shared-memory collective would wait for this
  // one until the op timeout.
  if (status.code == Status::kPeerFailure) {
    sets_.abortAll();
    if (backend_) backend_->abort();
  }
  for (auto& [name, e] : pending_) e.work->complete(status);
  pending_.clear();
  partners_.close();
  // A submission that takeSubmissions was taking when it threw (the others
  // there were moved into pending_ and have no work left).
  for (Entry& e : taken_)
    if (e.work) e.work->complete(status);
  taken_.clear();
  inline_in_flight_ = 0;
  for (Entry& e : queued) e.work->complete(status);
  if (lane_) lane_->fail(status);
  control_.close();
}

}  // namespace hvd
