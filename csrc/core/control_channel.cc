#include "control_channel.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "address.h"
#include "control_frames.h"
#include "log.h"
#include "process_sets.h"
#include "rank_handshake.h"
#include "wire.h"

namespace hvd {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

void ControlChannel::connect(StoreClient& store, const std::string& prefix) {
  if (topology_.rank == 0) {
    connectCoordinator(store, prefix);
  } else {
    connectWorker(store, prefix);
  }
}

// Rank 0 handshakes every connection at once, never blocking on one
// (rank_handshake.h's acceptRanks), then welcomes every rank.
void ControlChannel::connectCoordinator(StoreClient& store, const std::string& prefix) {
  // One host: loopback only. Several: the address peers reach us at (address.h).
  const std::string address =
      topology_.cross_size == 1 ? std::string("127.0.0.1") : localAddress(config_);
  int port = 0;
  int listen_fd = listenTcp(address, &port);
  ::fcntl(listen_fd, F_SETFL, ::fcntl(listen_fd, F_GETFL) | O_NONBLOCK);
  store.set(prefix + "control", Endpoint{address, port}.encode());
  AcceptOptions options;
  options.purpose = "control";
  options.secret = config_.secret;
  options.who = "rank 0";
  options.deadline = Clock::now() + config_.start_timeout;
  options.max_pending = 4 * static_cast<size_t>(topology_.size) + 64;
  std::vector<bool> expected(topology_.size, true);
  expected[0] = false;
  try {
    workers_ = acceptRanks(listen_fd, expected, options, [&](const std::vector<int>& missing) {
      return missingRanksMessage(store, prefix, "not every rank connected") +
             "; ranks not connected to the coordinator: " + rankList(missing);
    });
  } catch (...) {
    ::close(listen_fd);
    throw;
  }
  ::close(listen_fd);
  const std::string welcome = encodeWelcome();
  for (int r = 1; r < topology_.size; ++r) {
    workers_[r]->send(welcome);
    workers_[r]->flushBlocking(config_.start_timeout);
  }
}

void ControlChannel::connectWorker(StoreClient& store, const std::string& prefix) {
  const auto deadline = Clock::now() + config_.start_timeout;
  std::string address;
  try {
    address = store.get(prefix + "control", config_.start_timeout);
  } catch (const StoreTimeout&) {
    throw std::runtime_error(missingRanksMessage(store, prefix, "rank 0 did not publish its address"));
  }
  const Endpoint coordinator = Endpoint::decode(address);
  const std::string where = coordinator.host + ":" + std::to_string(coordinator.port);
  int fd = connectTcp(coordinator.host, coordinator.port, deadline);
  if (fd < 0) {
    throw std::runtime_error(missingRanksMessage(store, prefix, ("cannot reach rank 0 at " + where).c_str()));
  }
  to_coordinator_ = std::make_unique<FrameSocket>(fd);
  proveToPeer(*to_coordinator_, static_cast<uint32_t>(topology_.rank), "control", config_.secret,
              "rank 0 at " + where, deadline, config_.start_timeout,
              [&](const char* what) { return missingRanksMessage(store, prefix, what); });
  std::string welcome;
  if (!to_coordinator_->readOne(welcome, deadline)) {
    throw std::runtime_error(missingRanksMessage(store, prefix, "rank 0 did not see every rank"));
  }
  to_coordinator_->limitFrames(kMaxControlFrame);
}

std::string ControlChannel::missingRanksMessage(StoreClient& store, const std::string& prefix,
                                                const char* what) {
  std::vector<int> missing;
  try {
    auto keys = store.listKeys(prefix + "arrived/");
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

// Rank 0 makes one segment with two rings per other rank (to it, from it),
// the others map it, rank 0 unlinks the name; then each control socket sends
// and receives through its rings. Rank 0's HVD_TORCH_SHM_CONTROL decides; a
// rank that cannot map the segment keeps every rank on TCP. Nothing is in
// flight on the sockets here: the handshake is over, the loop not started.
void ControlChannel::attachRings(StoreClient& store, const std::string& prefix, size_t extra) {
  constexpr size_t kRingBytes = size_t{256} << 10;
  const size_t lane = 2 * ByteRing::footprint(kRingBytes);
  const auto timeout = config_.start_timeout;
  const int n = topology_.size;
  extra_at_ = (lane * (n - 1) + 63) / 64 * 64;
  const size_t bytes = extra_at_ + extra;
  bool ok = true;
  if (topology_.rank == 0) {
    std::string name = config_.shm_control ? ShmSegment::uniqueName() : "";
    try {
      if (!name.empty()) segment_ = ShmSegment::create(name, bytes);
    } catch (const std::exception& e) {
      HVD_LOG(kWarning) << "control frames stay on TCP: " << e.what();
      name.clear();
    }
    store.set(prefix + "name", name);
    if (name.empty()) return;
    for (int r = 1; r < n; ++r)
      ok = store.get(prefix + "mapped/" + std::to_string(r), timeout) == "1" && ok;
    segment_.unlink();
    store.set(prefix + "verdict", ok ? "1" : "0");
  } else {
    const std::string name = store.get(prefix + "name", timeout);
    if (name.empty()) return;
    try {
      segment_ = ShmSegment::open(name, bytes);
    } catch (const std::exception& e) {
      HVD_LOG(kWarning) << "control frames stay on TCP: " << e.what();
      ok = false;
    }
    store.set(prefix + "mapped/" + std::to_string(topology_.rank), ok ? "1" : "0");
    ok = store.get(prefix + "verdict", timeout) == "1";
  }
  if (!ok) {
    segment_ = ShmSegment();
    return;
  }
  // Rank r's lane: the ring to rank 0, then the ring back.
  for (int r = 1; r < n; ++r) {
    char* at = segment_.data() + lane * (r - 1);
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

std::string ControlChannel::plane() const {
  if (topology_.size == 1) return "local";
  return rings_.empty() ? "tcp" : "shm";
}

void ControlChannel::sendToAll(const std::string& frame) {
  for (int rank = 1; rank < topology_.size; ++rank)
    if (workers_[rank]) workers_[rank]->send(frame);
}

void ControlChannel::dropWorker(int rank) { workers_.at(rank).reset(); }

void ControlChannel::sendToCoordinator(const std::string& frame) {
  if (!to_coordinator_) {
    throw ControlChannel::coordinatorLost();
  }
  to_coordinator_->send(frame);
}

StatusError ControlChannel::coordinatorLost() {
  return transportFailure("lost the control connection to rank 0 (the coordinator): it exited, "
                          "crashed or called shutdown()");
}

void ControlChannel::dropCoordinator() { to_coordinator_.reset(); }

bool ControlChannel::readFrom(int rank, std::vector<std::string>& frames) {
  return workers_[rank] && workers_[rank]->readAvailable(frames);
}

bool ControlChannel::readFromCoordinator(std::vector<std::string>& frames) {
  if (!to_coordinator_) return false;
  const bool open = to_coordinator_->readAvailable(frames);
  // Rank 0's abort is its last frame. The responses read with it still run
  // (an inline result needs no peer); one that fails on the data plane asks
  // diagnosePeerFailure, which must not wait on a socket that has told all.
  if (!frames.empty() && isAbortFrame(frames.back()))
    abort_ = decodeCoordinatorFrame(frames.back()).abort;
  return open;
}

void ControlChannel::watchList(int wake_fd, std::vector<pollfd>& fds,
                               std::vector<FrameSocket*>& owners) const {
  fds.clear();
  owners.clear();
  fds.push_back({wake_fd, POLLIN, 0});
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

bool ControlChannel::hasInput() const {
  for (const auto& w : workers_)
    if (w && w->hasInput()) return true;
  return to_coordinator_ && to_coordinator_->hasInput();
}

bool ControlChannel::hasOutput() const {
  for (const auto& w : workers_)
    if (w && w->hasOutput()) return true;
  return to_coordinator_ && to_coordinator_->hasOutput();
}

void ControlChannel::flushAll() {
  for (auto& w : workers_)
    if (w) w->flush();
  if (to_coordinator_) to_coordinator_->flush();
}

void ControlChannel::noteAllReadable() {
  for (auto& w : workers_)
    if (w) w->noteReadable();
  if (to_coordinator_) to_coordinator_->noteReadable();
}

bool ControlChannel::sleepIfIdle() {
  bool idle = true;
  for (auto& w : workers_)
    if (w) idle = w->sleepIfIdle() && idle;
  if (to_coordinator_) idle = to_coordinator_->sleepIfIdle() && idle;
  return idle;
}

void ControlChannel::awake() {
  for (auto& w : workers_)
    if (w) w->awake();
  if (to_coordinator_) to_coordinator_->awake();
}

void ControlChannel::sayBye() {
  if (!to_coordinator_) return;
  try {
    to_coordinator_->send(encodeBye());
    to_coordinator_->flushBlocking(std::chrono::milliseconds(1000));
  } catch (const std::exception&) {
  }
}

void ControlChannel::abortAll(const Status& status) {
  const std::string abort = encodeAbort(status);
  for (auto& sock : workers_) {
    if (!sock) continue;
    try {
      sock->send(abort);
      sock->flushBlocking(std::chrono::milliseconds(1000));
    } catch (const std::exception&) {
    }
  }
}

Status ControlChannel::diagnosePeerFailure() {
  if (!abort_.ok()) return abort_;  // already read, with the frames before it
  // The data plane only says "connection reset"; the control plane knows who
  // died. Give it a moment to tell us, so the error names the rank.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (std::chrono::steady_clock::now() < deadline) {
    std::vector<std::string> frames;
    if (to_coordinator_) {
      bool open = to_coordinator_->readAvailable(frames);
      for (const auto& f : frames) {
        CoordinatorFrame c = decodeCoordinatorFrame(f);
        if (c.kind == CoordinatorFrame::kAbort) return c.abort;
      }
      if (!open) return Status::peerFailure("lost the control connection to rank 0 (the coordinator)");
    }
    for (int rank = 1; rank < static_cast<int>(workers_.size()); ++rank) {
      if (workers_[rank] && !workers_[rank]->readAvailable(frames)) {
        return Status::peerFailure("rank " + std::to_string(rank) +
                                   " exited or lost its connection to the coordinator (rank 0)");
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return Status::Ok();
}

void ControlChannel::close() {
  workers_.clear();
  to_coordinator_.reset();
}

}  // namespace hvd
