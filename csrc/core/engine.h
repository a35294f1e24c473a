// The engine: one per process between init() and shutdown(). It owns the
// background thread that negotiates submitted operations with the other ranks
// and runs them on the backend.
//
// Control plane: a star of TCP connections to rank 0 (the coordinator). A rank
// sends each new request (or its cache slot) to the coordinator as soon as it
// is submitted; the coordinator answers with responses once every rank has
// submitted a name. The background thread sleeps in poll() on an eventfd
// (local submissions) and those sockets, so a lone op never waits for a timer.
// Protocol and costs: docs/architecture.md.
//
// On one host, every submission meets the lane (lane.h) first: it may run a
// cached op on its caller's thread or keep an async one until its caller
// waits. The engine negotiates and runs the rest, and hands the lane what
// the rounds teach it (learn(), bystander(), joined()).
//
// Threading: enqueue(), drive(), topology() and backendName() may be called
// from any thread. shutdown() from any one thread, once. Everything else runs
// on whichever thread holds the baton: the background thread, or a caller
// that drives while it waits for its op (drive(); docs/architecture.md,
// "Callers drive"). The engine never calls the lane holding mu_; the lane
// calls back (Lane::Sink) holding its own locks, which come first.
#pragma once

#include <poll.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "autotune.h"
#include "backend.h"
#include "bit_agreement.h"
#include "cached_rounds.h"
#include "control_channel.h"
#include "control_frames.h"
#include "coordinator.h"
#include "entry.h"
#include "executor.h"
#include "frame_socket.h"
#include "lane.h"
#include "partner_links.h"
#include "process_sets.h"
#include "shm_segment.h"
#include "stall_inspector.h"
#include "response_cache.h"
#include "set_runtimes.h"
#include "store_client.h"
#include "submit_mode.h"
#include "timeline.h"
#include "topology.h"

namespace hvd {

// enqueue() of a name this rank already has in flight: the caller's mistake.
struct DuplicateName : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

class Engine final : private Lane::Sink {
 public:
  // Meets the other ranks and starts the background thread. `generation`
  // counts init() calls in this process, so a re-init never reads the previous
  // rendezvous' keys. Throws std::runtime_error naming the store address and
  // the ranks that never arrived when the rendezvous fails.
  // make_device may be empty (a build without a device plane: no op is ever
  // submitted on Plane::kDevice).
  // `store`: the rendezvous store to use instead of connecting to the one
  // config names (in-process ranks in tests).
  static std::shared_ptr<Engine> start(const Topology& topology, const EngineConfig& config,
                                       const BackendFactory& make_backend, uint64_t generation,
                                       DevicePlaneFactory make_device = nullptr,
                                       std::unique_ptr<StoreClient> store = nullptr);
  ~Engine();

  // Fails what is still pending with a shutdown status and joins the thread.
  void shutdown();

  // Hands an operation to the background thread. Never blocks on the network.
  // Throws DuplicateName, and submits nothing, when this rank already has an
  // operation of that name on that process set that has not completed
  // (Horovod's "same name as another tensor that is currently being processed").
  // `mode` (submit_mode.h): kAsync wakes the background thread; kCallerWaits
  // leaves it to the caller's drive(), and a cached op may run at once on the
  // fast lane (lane.h), its work then complete on return; kGroupMember
  // leaves it asleep until wake() or a later enqueue.
  std::shared_ptr<Work> enqueue(Entry entry, SubmitMode mode = SubmitMode::kAsync);
  void wake() override;
  // Runs the background thread's work on this thread until `work` completes
  // or config().caller_spin passes, sparing the two thread hand-offs per op.
  // Returns false when it did not complete it (driving is off, the engine is
  // busy or stopped): the caller then waits on `work` as before.
  bool drive(const Work& work);
  // Ops whose waiting caller completed them in drive() (diagnostics, tests).
  uint64_t drivenOps() const { return driven_ops_.load(); }
  // Submissions sent to rank 0 as a response-cache slot instead of a full
  // request (diagnostics, tests).
  uint64_t cachedSubmissions() const { return cached_submissions_.load(); }
  // Cached ops run by an agreement among the ranks, without rank 0, and its
  // rounds (diagnostics, tests; engine_agreement.cc); 0 when it is off.
  uint64_t agreedOps() const { return agreed_ops_.load(); }
  uint64_t agreementRounds() const { return agreement_rounds_.load(); }
  // Ops run on the fast lane, and lane arrivals that gave up waiting
  // (diagnostics, tests); 0 without a lane.
  uint64_t laneOps() const { return lane_ ? lane_->ranOps() : 0; }
  uint64_t laneGaveUp() const { return lane_ ? lane_->gaveUp() : 0; }
  bool laneOff() const { return lane_ && lane_->off(); }
  // Sends this rank's deferred async ops (lane.h) to the engine: a poll()
  // that finds its op not done makes sure it progresses.
  void flushDeferred() {
    if (lane_) lane_->resolveAll(false);
  }

  const Topology& topology() const { return topology_; }
  const char* backendName() const { return backend_ ? backend_->name() : "local"; }
  // The data plane of a process set this rank is in ("shm", "gloo", "local"
  // for one rank); "" for a set it is not in.
  std::string backendName(int32_t process_set) const;
  // How control frames travel: "shm", "tcp", or "local" (one rank).
  std::string controlPlane() const;
  // Connections this rank's control channel made at start (rank 0 with host
  // leaders: its host's ranks and one per other host), and frames it relayed
  // for its host as a leader (diagnostics, tests). Any thread.
  size_t controlLinks() const { return control_.links(); }
  uint64_t relayedFrames() const { return control_.relayed(); }
  const EngineConfig& config() const { return config_; }
  // Every registered process set (any thread may read it).
  const ProcessSetTable& processSets() const { return process_sets_; }
  // Rank 0's records the job (hvd.start_timeline); other ranks' stay stopped.
  Timeline& timeline() { return timeline_; }
  // After rank 0's timeline started or stopped: ops leave the fast lane while
  // it records, so that it shows them. Any thread.
  void timelineChanged() {
    if (lane_ && coordinator_) lane_->setPaused(timeline_.active());
  }
  // The fusion and inline thresholds in force on this rank (the autotuner's
  // latest, sent by rank 0). Any thread.
  Tunables tunables();

 private:
  Engine(const Topology& topology, const EngineConfig& config);
  void connect(const BackendFactory& make_backend, DevicePlaneFactory make_device,
               uint64_t generation, std::unique_ptr<StoreClient> store);

  bool inputWaiting() const;
  // Writes the eventfd the background thread sleeps on.
  void ringWakeFd();
  // owners[i]: the socket of fds[i] (null for the eventfd).
  bool waitForEvents(std::vector<pollfd>& fds, const std::vector<FrameSocket*>& owners,
                     int timeout_ms, std::unique_lock<std::mutex>& baton);
  void checkStalls();
  void loop();
  // One round of the background work, on whichever thread holds the baton.
  // False once the engine stopped (shutdown or failure).
  bool cycle(bool background_thread);
  // The descriptors the background thread sleeps on.
  void watchList(std::vector<pollfd>& fds, std::vector<FrameSocket*>& owners) const;
  // Background thread: lets waiting drivers run until they have been gone
  // for engine_spin, or something only it can handle arrives.
  void handOver(std::unique_lock<std::mutex>& baton, const std::vector<pollfd>& fds);
  // The coordinator of a process set it is not in: it must read frames even
  // with no op of its own pending.
  bool actsOnOthersFrames() const;
  // Driver: waits for input without sleeping; false at the deadline or once
  // `work` completed.
  bool awaitInput(std::vector<pollfd>& fds, const std::vector<FrameSocket*>& owners,
                  const Work& work, std::chrono::steady_clock::time_point deadline);
  void takeSubmissions();
  void readWorkers();
  void readCoordinator();
  void dispatch(std::vector<Response> responses);
  void run(const Response& response);
  void fail(const Status& status);
  // A kAddProcessSet or kRemoveProcessSet response (`entry`: the request):
  // the registry every thread reads, and this rank's runtimes of its sets.
  void changeProcessSets(const Response& response, Entry& entry);
  // Rank 0: hands one arrival to the coordinator; `own` is the request of
  // this rank's own arrival (its error fails that entry), else null.
  void arrive(Arrival arrival, const Request* own);
  // Every rank on one host: rank 0 sizes the fast lane for the job, the
  // control rings carry it (null lane when off).
  void attachRingsAndLane(const std::string& prefix);

  // Issue #47, engine_agreement.cc: cached ops agreed among the ranks, not
  // negotiated by rank 0 (docs/control_plane_scale.md, "The agreement").
  // Rank 0's setting decides for the job; off with the fast lane.
  void connectAgreement(const std::string& prefix);
  // takeSubmissions' part: true when the agreement took `e` (submitted, or
  // held until its stale slot is forgotten); it is then in pending_.
  bool submitToAgreement(Entry& e, const std::string& key);
  // A cached name's op sent inline to rank 0: the ranks that submitted it to
  // the agreement send theirs there too, at the next round.
  void sentInline(const std::string& key);
  // A response every rank runs: the slots it names, learnt by every rank
  // (`member`: this rank is in its process set).
  void learnSlots(const Response& response, bool member);
  // Reads the partners, starts rounds, applies finished ones in order.
  void progressRounds();
  void readPartners();
  void sendAgreement();
  // A round's outcome, once rank 0's batches it counts have arrived.
  bool applyOutcome();
  // Ops of forgotten slots (or while a rank has joined): to rank 0 in full.
  void renegotiate(const std::vector<int32_t>& slots);
  // Rank 0's responses, run at the round that counts them (every rank alike).
  void runBatch(std::vector<Response> responses);
  // Cached ops that wait long go to rank 0, whose stall inspector names who
  // is missing.
  void checkAgreementStall();
  Entry& addPending(const std::string& key, Entry&& e);
  // Rank 0: HOROVOD_TIMELINE and HOROVOD_AUTOTUNE at start().
  void startObservers();
  // Rank 0: the autotuner's new values, used here and sent to every rank.
  void applyTunables(const Tunables& t);
  void traceDispatched(const std::vector<Response>& responses);
  void traceRan(const Response& response);

  const Topology topology_;
  const EngineConfig config_;
  std::unique_ptr<StoreClient> store_;
  std::unique_ptr<Backend> backend_;  // the global set's
  ProcessSetTable process_sets_;
  SetRuntimes sets_{topology_, config_};  // the sets this rank is in (the baton holder's)

  // Submission queue: the only state shared with user threads.
  mutable std::mutex mu_;
  std::vector<Entry> queue_;
  bool stopping_ = false;
  Status broken_;  // not ok once a peer failed: every later op fails with it
  // Whether a submission may still run, and the error it gets when not (mu_ held).
  bool accepting() const { return broken_.ok() && !stopping_; }
  Status refusal() const;
  // Lane::Sink: what the lane does not run comes back here (takes mu_).
  Status stopped() override;
  bool queueForEngine(Entry&& e) override;
  // Names submitted and not yet completed, by tableKey(process set, name).
  std::unordered_map<std::string, std::weak_ptr<Work>> in_flight_;
  size_t sweep_in_flight_at_ = 64;
  int wake_fd_ = -1;
  // True from a wake-up's write until the background thread drains it: a
  // burst of submissions costs one write (a syscall and a context switch).
  std::atomic<bool> wake_posted_{false};
  // True while the background thread sleeps in poll(): only then does a
  // submission write the eventfd (the spinning thread reads wake_posted_).
  std::atomic<bool> engine_sleeping_{false};
  std::thread thread_;
  // Held by whoever runs the background work (see drive()).
  std::mutex baton_;
  std::atomic<int> drivers_waiting_{0};
  std::atomic<bool> handed_over_{false};  // the background thread let drivers run
  std::atomic<bool> driving_{false};      // a driver holds the baton
  std::atomic<uint64_t> driven_ops_{0};
  std::atomic<uint64_t> cached_submissions_{0};
  std::atomic<int64_t> drive_start_ns_{0};     // steady clock
  std::atomic<int64_t> last_drive_end_ns_{0};

  // State of whoever holds the baton (the background thread or a driver).
  std::vector<Entry> taken_;  // the queue, as takeSubmissions took it
  using PendingTable = std::unordered_map<std::string, Entry>;
  PendingTable pending_;  // by tableKey(process set, name)
  // Completed entries' nodes, for new submissions (no node allocated per op).
  static constexpr size_t kSparePending = 64;
  std::vector<PendingTable::node_type> spare_pending_;
  std::vector<PendingTable::iterator> run_places_;  // run()'s scratch
  // takeSubmissions' scratch, kept for its capacity: the arrivals, and for
  // each the request of its pending_ entry.
  std::vector<Arrival> arrivals_;
  std::vector<const Request*> own_requests_;
  // readWorkers' scratch (rank 0), kept for its capacity.
  std::vector<ControlChannel::FromWorker> worker_frames_;
  std::vector<int> lost_ranks_;
  size_t inline_in_flight_ = 0;  // inline traffic of pending_ (see takeSubmissions)
  RankCache rank_cache_;
  bool joined_ = false;  // this rank called join() and waits for the others
  std::unique_ptr<Coordinator> coordinator_;           // rank 0 only
  ControlChannel control_{topology_, config_};  // rank 0's star, or the link to rank 0
  // One host: the fast lane and the deferred async ops (null when off). Its
  // memory is in control_'s segment: declared after it.
  std::unique_ptr<Lane> lane_;
  StallInspector stalls_{config_.stall_warning, config_.stall_shutdown};  // rank 0's

  // The agreement (null when off) and its state, the baton holder's.
  std::unique_ptr<BitAgreement> agreement_;
  std::unique_ptr<CachedRounds> rounds_;
  PartnerLinks partners_{topology_, config_};
  int gone_partner_ = -1;  // a partner that closed its link
  bool coordinator_gone_ = false;  // not rank 0: rank 0's connection closed
  std::vector<bool> departed_;  // rank 0: ranks that said goodbye (by rank; empty: none)
  std::vector<std::string> slot_keys_;  // learnt slot -> tableKey
  std::unordered_map<std::string, int32_t> slot_of_key_;
  std::deque<std::vector<Response>> batches_;  // rank 0's, received and not run
  uint64_t batches_seen_ = 0;   // dispatched (rank 0) or received
  uint64_t batches_run_ = 0;
  uint64_t rounds_applied_ = 0;
  bool outcome_pending_ = false;
  CachedRounds::Outcome outcome_;
  std::chrono::steady_clock::time_point agreed_progress_;  // the last agreed op's run
  std::atomic<uint64_t> agreed_ops_{0};
  std::atomic<uint64_t> agreement_rounds_{0};

  Timeline timeline_;
  Tunables tunables_;  // written by the background thread under mu_
  std::unique_ptr<Autotuner> autotuner_;  // rank 0 with HOROVOD_AUTOTUNE=1
};

}  // namespace hvd
