#include "engine.h"

#include "address.h"
#include "cpu_relax.h"
#include "log.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace hvd {

namespace {

// Control frame kinds. Ranks -> coordinator:
constexpr uint8_t kRequests = 0;  // u32 n, n x (u8 cached, i32 slot | Request, u8 inline, bytes)
constexpr uint8_t kBye = 1;       // the rank called shutdown()
// Coordinator -> ranks:
constexpr uint8_t kResponses = 0;  // u32 n, n x Response
constexpr uint8_t kAbort = 1;      // str reason: a rank is gone, fail everything
constexpr uint8_t kWelcome = 2;    // every rank has connected
constexpr uint8_t kTunables = 3;   // u64 fusion threshold, u64 inline threshold (autotune.h)

}  // namespace

Engine::Engine(const Topology& topology, const EngineConfig& config)
    : topology_(topology), config_(config), process_sets_(topology.size) {
  tunables_.fusion_threshold = config.fusion_threshold;
  tunables_.inline_threshold = config.inline_threshold;
}

std::shared_ptr<Engine> Engine::start(const Topology& topology, const EngineConfig& config,
                                      const BackendFactory& make_backend, uint64_t generation,
                                      DevicePlaneFactory make_device) {
  std::shared_ptr<Engine> engine(new Engine(topology, config));
  engine->make_device_ = std::move(make_device);
  engine->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (engine->wake_fd_ < 0) throw std::runtime_error("eventfd failed");
  engine->connect(make_backend, generation);
  engine->startObservers();
  HVD_LOG(kDebug) << "rank " << topology.rank << " of " << topology.size << ": engine connected";
  engine->thread_ = std::thread([e = engine.get()] { e->loop(); });
  return engine;
}

Engine::~Engine() {
  shutdown();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void Engine::connect(const BackendFactory& make_backend, uint64_t generation) {
  if (topology_.rank == 0) {
    coordinator_ = std::make_unique<Coordinator>(topology_.size, config_.fusion_threshold,
                                                 config_.cache_capacity);
  }
  if (topology_.size > 1) {
    if (config_.store_host.empty()) {
      throw std::runtime_error(
          "HOROVOD_SIZE=" + std::to_string(topology_.size) +
          " but no rendezvous store is set (HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT): start the job "
          "with hvdrun, or set the variables a launcher sets");
    }
    store_ = std::make_unique<StoreClient>(config_.store_host, config_.store_port, config_.secret,
                                           config_.start_timeout);
    const std::string scope = config_.rendezvous_scope.empty()
                                  ? "g" + std::to_string(generation)
                                  : config_.rendezvous_scope;
    const std::string prefix = "hvd/" + scope + "/";
    prefix_ = prefix;
    make_backend_ = make_backend;
    store_->set(prefix + "arrived/" + std::to_string(topology_.rank), config_.hostname);
    if (topology_.rank == 0) {
      connectCoordinator(prefix);
    } else {
      connectWorker(prefix);
    }
    backend_ = make_backend(topology_, config_, *store_, prefix + "data/");
    // The data plane's choice is every rank's: the ranks share one host.
    if (std::string(backend_->name()) == "shm") attachControlRings(prefix + "control/");
  }
  SetRuntime& global = runtimes_[0];
  process_sets_.find(0, &global.ranks);
  global.index = topology_.rank;
  global.executor = Executor(backend_.get(), topology_.size, topology_.rank);
  if (backend_ && backend_->directForms()) global.inline_cap = config_.shm_inline_cap;
  std::lock_guard<std::mutex> lock(mu_);
  backend_names_[0] = backendName();
}

// Rank 0 makes one segment with two rings per other rank (to it, from it),
// the others map it, rank 0 unlinks the name; then each control socket sends
// and receives through its rings. Rank 0's HVD_TORCH_SHM_CONTROL decides; a
// rank that cannot map the segment keeps every rank on TCP. Nothing is in
// flight on the sockets here: the handshake is over, the loop not started.
void Engine::attachControlRings(const std::string& prefix) {
  constexpr size_t kRingBytes = size_t{256} << 10;
  const size_t lane = 2 * ByteRing::footprint(kRingBytes);
  const auto timeout = config_.start_timeout;
  const int n = topology_.size;
  bool ok = true;
  if (topology_.rank == 0) {
    std::string name = config_.shm_control ? ShmSegment::uniqueName() : "";
    try {
      if (!name.empty()) control_segment_ = ShmSegment::create(name, lane * (n - 1));
    } catch (const std::exception& e) {
      HVD_LOG(kWarning) << "control frames stay on TCP: " << e.what();
      name.clear();
    }
    store_->set(prefix + "name", name);
    if (name.empty()) return;
    for (int r = 1; r < n; ++r)
      ok = store_->get(prefix + "mapped/" + std::to_string(r), timeout) == "1" && ok;
    control_segment_.unlink();
    store_->set(prefix + "verdict", ok ? "1" : "0");
  } else {
    const std::string name = store_->get(prefix + "name", timeout);
    if (name.empty()) return;
    try {
      control_segment_ = ShmSegment::open(name, lane * (n - 1));
    } catch (const std::exception& e) {
      HVD_LOG(kWarning) << "control frames stay on TCP: " << e.what();
      ok = false;
    }
    store_->set(prefix + "mapped/" + std::to_string(topology_.rank), ok ? "1" : "0");
    ok = store_->get(prefix + "verdict", timeout) == "1";
  }
  if (!ok) {
    control_segment_ = ShmSegment();
    return;
  }
  // Rank r's lane: the ring to rank 0, then the ring back.
  for (int r = 1; r < n; ++r) {
    char* at = control_segment_.data() + lane * (r - 1);
    rings_.push_back(std::make_unique<ByteRing>(at, kRingBytes));
    rings_.push_back(std::make_unique<ByteRing>(at + lane / 2, kRingBytes));
  }
  auto up = [&](int r) { return rings_[2 * (r - 1)].get(); };
  auto down = [&](int r) { return rings_[2 * (r - 1) + 1].get(); };
  if (topology_.rank == 0) {
    for (int r = 1; r < n; ++r) workers_[r]->attachRings(down(r), up(r));
  } else {
    to_coordinator_->attachRings(up(topology_.rank), down(topology_.rank));
  }
}

std::string Engine::controlPlane() const {
  if (topology_.size == 1) return "local";
  return rings_.empty() ? "tcp" : "shm";
}

std::string Engine::backendName(int32_t process_set) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = backend_names_.find(process_set);
  return it == backend_names_.end() ? "" : it->second;
}

void Engine::openProcessSet(int32_t id, const std::vector<int64_t>& ranks64) {
  std::vector<int> ranks(ranks64.begin(), ranks64.end());
  process_sets_.add(id, ranks);
  const int index = indexIn(ranks, topology_.rank);
  if (index < 0) return;
  SetRuntime rt;
  rt.ranks = ranks;
  rt.index = index;
  if (ranks.size() > 1) {
    // Every member runs this response at the same point of the one order,
    // so they all reach this rendezvous together.
    Topology sub = topology_;
    sub.rank = index;
    sub.size = static_cast<int>(ranks.size());
    sub.members = ranks;
    rt.backend = make_backend_(sub, config_, *store_, prefix_ + "set" + std::to_string(id) + "/");
  }
  rt.executor = Executor(rt.backend.get(), static_cast<int>(ranks.size()), index, ranks);
  if (rt.backend && rt.backend->directForms()) rt.inline_cap = config_.shm_inline_cap;
  {
    std::lock_guard<std::mutex> lock(mu_);
    backend_names_[id] = rt.backend ? rt.backend->name() : "local";
  }
  runtimes_[id] = std::move(rt);
}

Executor& Engine::executorFor(int32_t id, SetRuntime& rt, Plane plane, int device) {
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
  rt.device_plane = make_device_(device, set, config_, store_.get(), prefix);
  rt.device = device;
  rt.device_executor = std::make_unique<Executor>(rt.device_plane.backend.get(), set.size, rt.index,
                                                  id == 0 ? std::vector<int>{} : rt.ranks,
                                                  rt.device_plane.memory.get());
  return *rt.device_executor;
}

std::string Engine::missingRanksMessage(const std::string& prefix, const char* what) {
  std::vector<int> missing;
  try {
    auto keys = store_->listKeys(prefix + "arrived/");
    for (int r = 0; r < topology_.size; ++r) {
      const std::string key = prefix + "arrived/" + std::to_string(r);
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) missing.push_back(r);
    }
  } catch (const std::exception&) {
  }
  std::ostringstream os;
  os << "hvd_torch rendezvous failed on rank " << topology_.rank << ": " << what << " within "
     << config_.start_timeout.count() / 1000 << " s (HOROVOD_START_TIMEOUT); store "
     << config_.store_host << ":" << config_.store_port << "; ranks that never arrived: "
     << rankList(missing);
  return os.str();
}

void Engine::connectCoordinator(const std::string& prefix) {
  const auto deadline = std::chrono::steady_clock::now() + config_.start_timeout;
  // One host: loopback only. Several: the address peers reach us at (address.h).
  const std::string address =
      topology_.cross_size == 1 ? std::string("127.0.0.1") : localAddress(config_);
  int port = 0;
  int listen_fd = listenTcp(address, &port);
  store_->set(prefix + "control", address + ":" + std::to_string(port));
  workers_.resize(topology_.size);
  int connected = 0;
  while (connected < topology_.size - 1) {
    int fd = acceptTcp(listen_fd, deadline);
    if (fd < 0) {
      ::close(listen_fd);
      std::vector<int> missing;
      for (int r = 1; r < topology_.size; ++r)
        if (!workers_[r]) missing.push_back(r);
      throw std::runtime_error(missingRanksMessage(prefix, "not every rank connected") +
                               "; ranks not connected to the coordinator: " + rankList(missing));
    }
    auto sock = std::make_unique<FrameSocket>(fd);
    std::string hello;
    if (!sock->readOne(hello, deadline)) continue;
    try {
      Reader r(hello);
      uint32_t rank = r.get<uint32_t>();
      std::string secret = r.getString();
      // A stranger (wrong secret, bad rank) is dropped; the others go on.
      if (secret != config_.secret || rank == 0 || rank >= static_cast<uint32_t>(topology_.size) ||
          workers_[rank]) {
        continue;
      }
      workers_[rank] = std::move(sock);
      ++connected;
    } catch (const WireError&) {
      continue;
    }
  }
  ::close(listen_fd);
  Writer w;
  w.put<uint8_t>(kWelcome);
  for (int r = 1; r < topology_.size; ++r) {
    workers_[r]->send(w.buffer());
    workers_[r]->flushBlocking(config_.start_timeout);
  }
}

void Engine::connectWorker(const std::string& prefix) {
  const auto deadline = std::chrono::steady_clock::now() + config_.start_timeout;
  std::string address;
  try {
    address = store_->get(prefix + "control", config_.start_timeout);
  } catch (const StoreTimeout&) {
    throw std::runtime_error(missingRanksMessage(prefix, "rank 0 did not publish its address"));
  }
  const size_t colon = address.rfind(':');
  int fd = connectTcp(address.substr(0, colon), std::stoi(address.substr(colon + 1)), deadline);
  if (fd < 0) {
    throw std::runtime_error(missingRanksMessage(prefix, ("cannot reach rank 0 at " + address).c_str()));
  }
  to_coordinator_ = std::make_unique<FrameSocket>(fd);
  Writer w;
  w.put<uint32_t>(static_cast<uint32_t>(topology_.rank));
  w.putString(config_.secret);
  to_coordinator_->send(w.buffer());
  to_coordinator_->flushBlocking(config_.start_timeout);
  std::string welcome;
  if (!to_coordinator_->readOne(welcome, deadline)) {
    throw std::runtime_error(missingRanksMessage(prefix, "rank 0 did not see every rank"));
  }
}

void Engine::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  ringWakeFd();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> baton(baton_);  // a driver may still be in a round
  timeline_.stop();  // after the thread: its last events are in the file
  workers_.clear();
  to_coordinator_.reset();
  backend_.reset();
  store_.reset();
}

std::shared_ptr<Work> Engine::enqueue(Entry entry, bool wake) {
  auto work = std::make_shared<Work>();
  entry.work = work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.ok()) {
      work->complete(broken_);
      return work;
    }
    if (stopping_) {
      work->complete(Status::shutdown("hvd_torch has been shut down"));
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
    queue_.push_back(std::move(entry));
  }
  if (wake) this->wake();
  return work;
}

void Engine::wake() {
  // Seen true: the background thread has not drained the last write yet and
  // takes the queue after it does, this entry included.
  if (wake_posted_.exchange(true)) return;
  if (!engine_sleeping_.load()) return;  // it spins, and reads wake_posted_
  ringWakeFd();
}

void Engine::ringWakeFd() {
  uint64_t one = 1;
  if (::write(wake_fd_, &one, sizeof(one)) < 0) {
  }
}

bool Engine::inputWaiting() const {
  if (wake_posted_.load(std::memory_order_acquire)) return true;
  for (const auto& w : workers_)
    if (w && w->hasInput()) return true;
  return to_coordinator_ && to_coordinator_->hasInput();
}

bool Engine::waitForEvents(std::vector<pollfd>& fds, const std::vector<FrameSocket*>& owners,
                           int timeout_ms, std::unique_lock<std::mutex>& baton) {
  // Right after activity the next event (an answer, the caller's next op) is
  // usually tens of microseconds away: check without sleeping, yielding the
  // CPU, for a short while first, since a sleep and wake-up costs more than
  // that on a busy machine. An idle engine sleeps in poll() and costs nothing.
  // The rings and the submission flag are memory: looking costs no system
  // call; with rings (or one rank) the sockets carry only doorbells and
  // closes, so they are polled only every few rounds.
  auto noteReadable = [&] {
    for (size_t i = 0; i < fds.size(); ++i)
      if (owners[i] && fds[i].revents) owners[i]->noteReadable();
  };
  auto handOverNow = [&] {
    uint64_t drained;  // a driver's wake-up: handOver() must not take it for news
    if (fds[0].revents && ::read(wake_fd_, &drained, sizeof(drained)) < 0) {
    }
    handOver(baton, fds);
    for (auto& f : fds) f.revents = 0;
    // A close may have come meanwhile. `owners` may be stale: a driver that
    // failed cleared the sockets.
    for (auto& w : workers_)
      if (w) w->noteReadable();
    if (to_coordinator_) to_coordinator_->noteReadable();
    return true;
  };
  const bool frames_on_sockets = rings_.empty() && topology_.size > 1;
  const unsigned poll_every = frames_on_sockets ? 1 : 32;
  const auto until = std::chrono::steady_clock::now() + config_.engine_spin;
  for (unsigned i = 0;; ++i) {
    if (drivers_waiting_.load()) return handOverNow();
    if (inputWaiting()) return true;
    if (i % poll_every == 0) {
      int r = ::poll(fds.data(), fds.size(), 0);
      if (r != 0) {
        noteReadable();
        return r > 0 || errno == EINTR;
      }
      if (std::chrono::steady_clock::now() >= until) break;
    }
    sched_yield();
  }
  // Before sleeping, tell the submitters, drivers and the rings' writers to
  // ring (seq_cst: a driver either sees engine_sleeping_ or we see it).
  engine_sleeping_.store(true);
  bool idle = !wake_posted_.load() && drivers_waiting_.load() == 0;
  for (auto& w : workers_)
    if (w) idle = w->sleepIfIdle() && idle;
  if (to_coordinator_) idle = to_coordinator_->sleepIfIdle() && idle;
  const int r = ::poll(fds.data(), fds.size(), idle ? timeout_ms : 0);
  const int err = errno;
  engine_sleeping_.store(false);
  for (auto& w : workers_)
    if (w) w->awake();
  if (to_coordinator_) to_coordinator_->awake();
  if (r > 0) noteReadable();
  if (r >= 0 && drivers_waiting_.load()) return handOverNow();
  return r >= 0 || err == EINTR;
}

namespace {
int64_t steadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

bool Engine::actsOnOthersFrames() const {
  return coordinator_ != nullptr && !process_sets_.allContain(topology_.rank);
}

void Engine::handOver(std::unique_lock<std::mutex>& baton, const std::vector<pollfd>& fds) {
  // While drivers come back (a loop of synchronous ops), they do all the
  // work and this thread only watches: for the wake-up eventfd (another
  // thread's submission, a driver that left work behind) and the sockets (a
  // doorbell, a peer's close), which it cannot read without the baton. Peers
  // see our rings as read (no doorbells). A frame needs reading while no op
  // of ours is pending only on the coordinator of a process set it is not
  // in: there it waits at most engine_spin for a driver before this thread
  // takes the baton back. Elsewhere this thread wakes only when called (and
  // once a second, for rank 0's stall check), so it never takes a busy core
  // from the drivers.
  std::vector<pollfd> watch = fds;
  for (auto& f : watch) f.events = POLLIN;
  const int64_t window = std::chrono::nanoseconds(config_.engine_spin).count();
  const bool prompt = actsOnOthersFrames();
  handed_over_.store(true);
  engine_sleeping_.store(true);  // others' submissions write the eventfd
  if (drivers_waiting_.load() == 0) {
    // The driver we would hand over to gave up meanwhile (drive()) and may
    // have seen us awake, so nobody rings: keep the baton and run its op.
    handed_over_.store(false);
    engine_sleeping_.store(false);
    return;
  }
  baton.unlock();
  while (true) {
    // A driver in a long op (longer than the window) is not disturbed: it
    // rings when it ends.
    const int64_t now = steadyNs();
    int64_t left = 1000000000;  // until called (1 s at most: rank 0's stall check)
    if (prompt && !driving_.load()) {
      left = last_drive_end_ns_.load() + window - now;
    } else if (prompt) {
      left = now - drive_start_ns_.load() < window ? window : 1000000;
    }
    left = std::max<int64_t>(left, 20000);  // never a busy loop
    timespec ts{left / 1000000000, left % 1000000000};
    const int r = ::ppoll(watch.data(), watch.size(), &ts, nullptr);
    uint64_t drained;
    if (r > 0 && watch[0].revents && ::read(wake_fd_, &drained, sizeof(drained)) < 0) {
    }
    if (r > 0) {
      // Something to do: after the driver's op if one is running (blocking,
      // since a close stays readable and polling again would spin).
      baton.lock();
      break;
    }
    if (drivers_waiting_.load() == 0 && steadyNs() - last_drive_end_ns_.load() >= window &&
        baton.try_lock())
      break;
  }
  handed_over_.store(false);
  engine_sleeping_.store(false);
}

bool Engine::awaitInput(std::vector<pollfd>& fds, const std::vector<FrameSocket*>& owners,
                        const Work& work, std::chrono::steady_clock::time_point deadline) {
  // Rounds are pauses, not system calls: a frame is seen within tens of
  // nanoseconds. Yielding now and then lets an oversubscribed peer run.
  // With rings, sockets bring only a peer's close or a doorbell: a look every
  // 256 rounds, not at once (a poll() costs about as much as the 4-byte op's
  // rounds). Bytes waiting to go out are the exception.
  const bool frames_on_sockets = rings_.empty() && topology_.size > 1;
  const unsigned poll_every = frames_on_sockets ? 1 : 256;
  bool writes = false;
  for (const pollfd& p : fds) writes = writes || (p.events & POLLOUT);
  for (unsigned i = writes ? 0 : 1;; ++i) {
    if (work.done()) return false;
    if (inputWaiting()) return true;
    if (i % poll_every == 0) {
      const int r = ::poll(fds.data() + 1, fds.size() - 1, 0);  // not the eventfd: not ours
      if (r != 0) {
        for (size_t k = 1; k < fds.size(); ++k)
          if (fds[k].revents) owners[k]->noteReadable();
        return true;
      }
      if (std::chrono::steady_clock::now() >= deadline) return false;
    }
    if (i % 16 == 15) {
      sched_yield();
    } else {
      cpuRelax();
    }
  }
}

bool Engine::drive(const Work& work) {
  if (work.done()) return true;
  if (!config_.callers_drive) {
    wake();  // the submission skipped it
    return false;
  }
  const auto deadline = std::chrono::steady_clock::now() + config_.caller_spin;
  drivers_waiting_.fetch_add(1);
  // Asleep in poll() with the baton: wake it so that it hands over.
  if (engine_sleeping_.load() && !handed_over_.load()) ringWakeFd();
  std::unique_lock<std::mutex> baton(baton_, std::defer_lock);
  while (!baton.try_lock()) {
    if (work.done() || std::chrono::steady_clock::now() >= deadline) {
      drivers_waiting_.fetch_sub(1);
      // The background thread takes our op (our submission skipped the
      // wake-up). If it has handed the engine over to us, it sleeps until
      // rung: ring it even when a wake-up is posted (wake() would not). The
      // decrement and this load pair with handOver()'s store and check
      // (seq_cst): either we see it asleep, or it sees nobody waiting.
      if (engine_sleeping_.load()) {
        ringWakeFd();
      } else {
        wake();
      }
      return work.done();
    }
    sched_yield();
  }
  drivers_waiting_.fetch_sub(1);
  const int64_t drive_start = steadyNs();
  drive_start_ns_.store(drive_start);
  driving_.store(true);
  std::vector<pollfd> fds;
  std::vector<FrameSocket*> owners;
  bool running = true;
  while (running && !work.done()) {
    running = cycle(false);
    if (!running || work.done()) break;
    watchList(fds, owners);
    if (!awaitInput(fds, owners, work, deadline)) break;
  }
  // What is left for the background thread: ops waiting for peers, bytes a
  // full socket did not take, a stop or failure to act on.
  bool needs_engine = !running || !pending_.empty();
  for (auto& w : workers_)
    if (w) needs_engine = needs_engine || w->wantsWrite();
  if (to_coordinator_) needs_engine = needs_engine || to_coordinator_->wantsWrite();
  const int64_t drive_end = steadyNs();
  last_drive_end_ns_.store(drive_end);
  driving_.store(false);
  baton.unlock();
  // After a long drive the background thread sleeps long (see handOver).
  const auto drove = std::chrono::nanoseconds(drive_end - drive_start);
  if (needs_engine || (drove > config_.engine_spin && actsOnOthersFrames())) ringWakeFd();
  if (!work.done()) return false;
  driven_ops_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void Engine::watchList(std::vector<pollfd>& fds, std::vector<FrameSocket*>& owners) const {
  fds.clear();
  owners.clear();
  fds.push_back({wake_fd_, POLLIN, 0});
  owners.push_back(nullptr);
  for (const auto& w : workers_) {
    if (!w) continue;
    fds.push_back({w->fd(), static_cast<short>(POLLIN | (w->wantsWrite() ? POLLOUT : 0)), 0});
    owners.push_back(w.get());
  }
  if (to_coordinator_) {
    fds.push_back({to_coordinator_->fd(),
                   static_cast<short>(POLLIN | (to_coordinator_->wantsWrite() ? POLLOUT : 0)), 0});
    owners.push_back(to_coordinator_.get());
  }
}

void Engine::loop() {
  std::unique_lock<std::mutex> baton(baton_);
  std::vector<pollfd> fds;
  std::vector<FrameSocket*> owners;
  while (true) {
    watchList(fds, owners);
    // Rank 0 wakes once a second while ops wait for other ranks, to check
    // for stalls; otherwise the loop sleeps until something happens.
    const bool watch = coordinator_ && config_.stall_check && coordinator_->hasWaiting();
    if (!waitForEvents(fds, owners, watch ? 1000 : -1, baton)) {
      fail(Status::peerFailure(std::string("poll failed: ") + std::strerror(errno)));
      return;
    }
    uint64_t drained;
    if (fds[0].revents != 0 && ::read(wake_fd_, &drained, sizeof(drained)) < 0) {
    }
    if (!cycle(true)) return;
  }
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
    if (to_coordinator_) {
      Writer w;
      w.put<uint8_t>(kBye);
      try {
        to_coordinator_->send(w.buffer());
        to_coordinator_->flushBlocking(std::chrono::milliseconds(1000));
      } catch (const std::exception&) {
      }
    }
    fail(Status::shutdown("hvd_torch was shut down before this operation completed"));
    return false;
  }
  try {
    for (auto& w : workers_)
      if (w) w->flush();
    if (to_coordinator_) to_coordinator_->flush();
    takeSubmissions();
    if (coordinator_) {
      readWorkers();
      checkStalls();
    } else {
      readCoordinator();
    }
  } catch (const InternalError& e) {
    fail(Status::internal(e.what()));
  } catch (const std::exception& e) {
    fail(Status::peerFailure(e.what()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  return broken_.ok();
}

std::string Engine::encodeArrivals(const std::vector<Arrival>& arrivals) const {
  Writer w;
  w.put<uint8_t>(kRequests);
  w.put<uint32_t>(static_cast<uint32_t>(arrivals.size()));
  for (const auto& a : arrivals) {
    w.put<uint8_t>(a.cache_id >= 0);
    if (a.cache_id >= 0) {
      w.put<int32_t>(a.cache_id);
    } else {
      a.request.encode(w);
    }
    w.put<uint8_t>(a.has_inline);
    if (a.has_inline) w.putBytes(a.inline_data.data(), a.inline_data.size());
  }
  return std::move(w.buffer());
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
    auto set = runtimes_.find(e.request.process_set);
    if (set == runtimes_.end()) {
      e.work->complete(Status::invalidArgument(
          std::string(opTypeName(e.request.type)) + " '" + name + "': rank " +
          std::to_string(topology_.rank) + " is not in process set " +
          std::to_string(e.request.process_set) + " (or it does not exist)"));
      continue;
    }
    const int set_size = static_cast<int>(set->second.ranks.size());
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
                           e.request.type != OpType::kRemoveProcessSet;
    a.cache_id = cacheable ? rank_cache_.lookup(key, e.request) : -1;
    if (e.request.type == OpType::kJoin) joined_ = true;
    // A cached op goes as its slot alone: rank 0's coordinator reads the
    // request from the slot.
    if (a.cache_id < 0) a.request = e.request;
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
    if (reduces && set_size > 1 && e.request.plane != Plane::kDevice &&
        inline_in_flight_ + traffic <=
            std::min(tunables_.inline_threshold, set->second.inline_cap)) {
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
    own_requests_.push_back(&added->second.request);
    arrivals.push_back(std::move(a));
  }
  fresh.clear();
  if (coordinator_) {
    for (size_t i = 0; i < arrivals.size(); ++i) arrive(std::move(arrivals[i]), own_requests_[i]);
  } else if (!arrivals.empty()) {
    to_coordinator_->send(encodeArrivals(arrivals));
  }
  arrivals.clear();
  own_requests_.clear();
  if (coordinator_) dispatch(coordinator_->takeReady());
}

void Engine::arrive(Arrival a, const Request* own) {
  if (a.cache_id < 0 && a.request.type == OpType::kJoin) {
    coordinator_->join(a.rank);
    return;
  }
  const int rank = a.rank;
  std::string error = coordinator_->add(std::move(a));
  if (error.empty()) return;
  if (own == nullptr) throw std::runtime_error("rank " + std::to_string(rank) + ": " + error);
  Response r;
  r.kind = Response::kError;
  r.names = {own->name};
  r.process_set = own->process_set;
  r.cache_ids = {-1};
  r.error = error;
  run(r);
}

void Engine::readWorkers() {
  for (int rank = 1; rank < topology_.size; ++rank) {
    std::vector<std::string> frames;
    bool open = workers_[rank]->readAvailable(frames);
    for (const auto& frame : frames) {
      Reader r(frame);
      uint8_t kind = r.get<uint8_t>();
      if (kind == kBye) {
        throw std::runtime_error("rank " + std::to_string(rank) +
                                 " called shutdown(); collectives that need it cannot complete");
      }
      uint32_t n = r.get<uint32_t>();
      for (uint32_t i = 0; i < n; ++i) {
        Arrival a;
        a.rank = rank;
        if (r.get<uint8_t>()) {
          a.cache_id = r.get<int32_t>();
        } else {
          a.request = Request::decode(r);
        }
        a.has_inline = r.get<uint8_t>() != 0;
        if (a.has_inline) {
          uint32_t len;
          const char* p = r.getBytes(&len);
          a.inline_data.assign(p, len);
        }
        arrive(std::move(a), nullptr);
      }
    }
    if (!open) {
      throw std::runtime_error("rank " + std::to_string(rank) +
                               " exited or lost its connection to the coordinator (rank 0)");
    }
  }
  dispatch(coordinator_->takeReady());
}

void Engine::readCoordinator() {
  std::vector<std::string> frames;
  bool open = to_coordinator_->readAvailable(frames);
  for (const auto& frame : frames) {
    Reader r(frame);
    uint8_t kind = r.get<uint8_t>();
    if (kind == kAbort) throw std::runtime_error(r.getString());
    if (kind == kTunables) {
      // Rank 0's autotuner moved: from the next submission on, this rank
      // decides inline vs collective as rank 0 does.
      Tunables t;
      t.fusion_threshold = static_cast<size_t>(r.get<uint64_t>());
      t.inline_threshold = static_cast<size_t>(r.get<uint64_t>());
      std::lock_guard<std::mutex> lock(mu_);
      tunables_ = t;
      continue;
    }
    uint32_t n = r.get<uint32_t>();
    for (uint32_t i = 0; i < n; ++i) run(Response::decode(r));
  }
  if (!open) {
    throw std::runtime_error("lost the control connection to rank 0 (the coordinator): it exited, "
                             "crashed or called shutdown()");
  }
}

void Engine::dispatch(std::vector<Response> responses) {
  if (responses.empty()) return;
  if (topology_.size > 1) {
    Writer w;
    w.put<uint8_t>(kResponses);
    w.put<uint32_t>(static_cast<uint32_t>(responses.size()));
    for (const auto& r : responses) r.encode(w);
    for (int rank = 1; rank < topology_.size; ++rank) workers_[rank]->send(w.buffer());
  }
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
  const std::string path = envString("HOROVOD_TIMELINE", "");
  // Horovod's "DYNAMIC": no file until hvd.start_timeline().
  if (!path.empty() && path != "DYNAMIC") {
    const std::string error =
        timeline_.start(path, envInt("HOROVOD_TIMELINE_MARK_CYCLES", 0) != 0);
    if (!error.empty())
      std::fprintf(stderr, "[hvd_torch] WARNING: HOROVOD_TIMELINE: %s\n", error.c_str());
  }
  const AutotuneConfig autotune = AutotuneConfig::fromEnvironment();
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
  // Ahead of any response sent after this one, on every rank's ordered stream.
  Writer w;
  w.put<uint8_t>(kTunables);
  w.put<uint64_t>(t.fusion_threshold);
  w.put<uint64_t>(t.inline_threshold);
  for (int rank = 1; rank < topology_.size; ++rank) workers_[rank]->send(w.buffer());
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
  std::shared_ptr<void> scratch = memory.zeros(request.numBytes());
  Entry e;
  e.request = request;
  e.input = scratch.get();
  e.output = scratch.get();
  e.allocate = [scratch](int64_t) { return scratch.get(); };
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

void Engine::run(const Response& response) {
  auto set = runtimes_.find(response.process_set);
  if (set == runtimes_.end()) return;  // another set's op: nothing for us to do
  HVD_LOG(kTrace) << "rank " << topology_.rank << ": run " << response.names.size()
                  << " op(s) of process set " << response.process_set << ", first '"
                  << (response.names.empty() ? "" : response.names[0]) << "'";
  SetRuntime& rt = set->second;  // a reference stays valid if openProcessSet rehashes
  std::vector<Entry*> entries;
  entries.reserve(response.names.size());
  // Each entry's place in pending_ (end() for a phantom): its key, its removal.
  std::vector<PendingTable::iterator>& places = run_places_;
  places.clear();
  std::vector<Entry> phantoms;  // reserved: entries points into it
  if (joined_) phantoms.reserve(response.names.size());
  Executor* executor = nullptr;
  for (size_t i = 0; i < response.names.size(); ++i) {
    const std::string& name = response.names[i];
    auto it = pending_.find(tableKey(response.process_set, name));
    places.push_back(it);
    if (it != pending_.end()) {
      entries.push_back(&it->second);
    } else if (joined_ && response.kind != Response::kExecute) {
      return;  // others' op that failed or was reduced inline: nothing for us to do
    } else if (joined_ && i < response.templates.size()) {
      if (executor == nullptr) {
        // A joined rank uses its own device when it has one for this set.
        const auto [plane, device] = planeOf(response, entries);
        executor = &executorFor(response.process_set, rt, plane,
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
    entries[0]->work->setFirstDims(response.first_dims[0]);
    joined_ = false;
  }
  Status status;
  switch (response.kind) {
    case Response::kError:
      status = Status::refused(response.error);
      break;
    case Response::kInline:
      if (response.type == OpType::kReducescatter) {
        const Request& q = entries[0]->request;
        const RowSlice mine =
            reducescatterSlice(q.shape[0], static_cast<int>(rt.ranks.size()), rt.index);
        const size_t row_bytes = static_cast<size_t>(q.rowElements()) * dataTypeSize(q.dtype);
        void* out = entries[0]->allocate(mine.rows);
        std::memcpy(out, response.inline_result.data() + mine.offset * row_bytes,
                    mine.rows * row_bytes);
      } else if (!entries[0]->parts.empty()) {
        const char* from = response.inline_result.data();
        const size_t elem = dataTypeSize(entries[0]->request.dtype);
        for (const auto& part : entries[0]->parts) {
          std::memcpy(part.out, from, part.count * elem);
          from += part.count * elem;
        }
      } else {
        std::memcpy(entries[0]->output, response.inline_result.data(),
                    response.inline_result.size());
      }
      break;
    case Response::kDone:
      if (response.type == OpType::kAddProcessSet) {
        const int32_t id = static_cast<int32_t>(response.first_dims.at(0).at(0));
        openProcessSet(id, entries[0]->request.splits);
        entries[0]->work->setFirstDims({id});
      } else if (response.type == OpType::kRemoveProcessSet) {
        const int32_t id = static_cast<int32_t>(entries[0]->request.splits.at(0));
        process_sets_.remove(id);
        runtimes_.erase(id);
        std::lock_guard<std::mutex> lock(mu_);
        backend_names_.erase(id);
      }
      break;
    case Response::kExecute:
      try {
        if (executor == nullptr) {
          const auto [plane, device] = planeOf(response, entries);
          executor = &executorFor(response.process_set, rt, plane, device);
        }
        executor->execute(response, entries, coordinator_ ? &timeline_ : nullptr);
        // A device plane has only enqueued the work: its end is an event
        // that readers of the outputs order themselves after.
        if (std::shared_ptr<DeviceEvent> done = executor->memory().record()) {
          for (Entry* e : entries) e->work->setDeviceDone(done);
        }
      } catch (const std::exception& e) {
        std::string why = diagnosePeerFailure();
        throw std::runtime_error(std::string(opTypeName(response.type)) + " '" + response.names[0] +
                                 "' failed on rank " + std::to_string(topology_.rank) + ": " +
                                 (why.empty() ? e.what() : why + " (" + e.what() + ")"));
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
  const auto now = std::chrono::steady_clock::now();
  if (now - last_stall_check_ < std::chrono::seconds(1)) return;
  last_stall_check_ = now;
  std::ostringstream report;  // one line per op, for the warning
  std::ostringstream brief;   // one line in all, for the error
  bool warn = false;
  bool fatal = false;
  for (const auto& w : coordinator_->waiting()) {
    if (w.waited < config_.stall_warning) continue;
    const long secs = std::chrono::duration_cast<std::chrono::seconds>(w.waited).count();
    const std::string what =
        "'" + w.name + "'" +
        (w.process_set ? " (process set " + std::to_string(w.process_set) + ")" : "");
    report << "\n  " << what << " waited " << secs << " s for ranks " << rankList(w.missing_ranks);
    brief << (warn ? "; " : " ") << what << " waited " << secs << " s for ranks "
          << rankList(w.missing_ranks);
    warn = true;
    fatal = fatal || (config_.stall_shutdown.count() > 0 && w.waited >= config_.stall_shutdown);
  }
  if (fatal) {
    // Fail fast instead of hanging forever: every rank gets this error.
    throw std::runtime_error(
        "stalled: some ranks submitted collectives that other ranks never submitted, for longer "
        "than HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=" +
        std::to_string(config_.stall_shutdown.count()) + " s:" + brief.str());
  }
  if (warn && now - last_stall_warning_ >= config_.stall_warning) {
    last_stall_warning_ = now;
    HVD_LOG(kWarning) << "stall: ranks are waiting for collectives other ranks have not "
                         "submitted (HOROVOD_STALL_CHECK_TIME_SECONDS="
                      << config_.stall_warning.count() << "):" << report.str();
  }
}

std::string Engine::diagnosePeerFailure() {
  // The data plane only says "connection reset"; the control plane knows who
  // died. Give it a moment to tell us, so the error names the rank.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (std::chrono::steady_clock::now() < deadline) {
    std::vector<std::string> frames;
    if (to_coordinator_) {
      bool open = to_coordinator_->readAvailable(frames);
      for (const auto& f : frames) {
        Reader r(f);
        if (r.get<uint8_t>() == kAbort) return r.getString();
      }
      if (!open) return "lost the control connection to rank 0 (the coordinator)";
    }
    for (int rank = 1; rank < static_cast<int>(workers_.size()); ++rank) {
      if (workers_[rank] && !workers_[rank]->readAvailable(frames)) {
        return "rank " + std::to_string(rank) + " exited or lost its connection to the coordinator (rank 0)";
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return "";
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
    Writer w;
    w.put<uint8_t>(kAbort);
    w.putString(status.message);
    for (auto& sock : workers_) {
      if (!sock) continue;
      try {
        sock->send(w.buffer());
        sock->flushBlocking(std::chrono::milliseconds(1000));
      } catch (const std::exception&) {
      }
    }
  }
  // Device collectives waiting on a dead peer would spin on the GPU forever.
  if (status.code == Status::kPeerFailure) {
    for (auto& [id, rt] : runtimes_) {
      if (rt.device_plane.backend) rt.device_plane.backend->abort();
    }
  }
  for (auto& [name, e] : pending_) e.work->complete(status);
  pending_.clear();
  // A submission that takeSubmissions was taking when it threw (the others
  // there were moved into pending_ and have no work left).
  for (Entry& e : taken_)
    if (e.work) e.work->complete(status);
  taken_.clear();
  inline_in_flight_ = 0;
  for (Entry& e : queued) e.work->complete(status);
  workers_.clear();
  to_coordinator_.reset();
}

}  // namespace hvd
