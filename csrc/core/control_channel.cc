#include "control_channel.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <new>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "address.h"
#include "control_frames.h"
#include "hmac_sha256.h"
#include "log.h"
#include "process_sets.h"
#include "wire.h"

namespace hvd {

namespace {

using Clock = std::chrono::steady_clock;

// The largest frame before a rank has proven itself, either way: a hello, a
// challenge or a proof is under 100 bytes; 4 KiB as the store allows.
constexpr uint32_t kHandshakeFrameLimit = 4096;
// The largest frame after it (FrameSocket::limitFrames): a control frame is
// a list of requests or responses, about 100 bytes per tensor plus its name;
// a million tensors with long names stay under this, and a peer's length
// header can no longer ask for 4 GiB.
constexpr uint32_t kMaxControlFrame = 256u << 20;
// How long one connection may take over its handshake: two round trips for a
// rank, so seconds are plenty; an idle or slow stranger is dropped after it.
constexpr std::chrono::milliseconds kHandshakeTimeout{5000};
// Connections accepted in one turn of the loop before the others get a look.
constexpr int kAcceptsPerTurn = 64;

// HMAC-SHA256(secret, "hvd-torch control <role>" | version | rank | client
// nonce | server nonce): the rank binds each proof to the connection's
// claim, the role keeps one side's proof from serving as the other's.
std::string handshakeProof(const char* role, const std::string& secret, uint32_t rank,
                           const std::string& client_nonce, const std::string& server_nonce) {
  Writer w;
  const std::string purpose = std::string("hvd-torch control ") + role;
  w.putBytes(purpose.data(), purpose.size());
  w.put<uint32_t>(kControlProtocolVersion);
  w.put<uint32_t>(rank);
  w.putBytes(client_nonce.data(), client_nonce.size());
  w.putBytes(server_nonce.data(), server_nonce.size());
  const Digest256 d = hmacSha256(secret, w.buffer());
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

// One connection to rank 0 that has not proven itself yet.
struct Pending {
  std::unique_ptr<FrameSocket> sock;
  Clock::time_point deadline;
  bool challenged = false;  // hello read, challenge sent: a proof comes next
  uint32_t rank = 0;
  std::string client_nonce;
  std::string server_nonce;
};

}  // namespace

void ControlChannel::connect(StoreClient& store, const std::string& prefix) {
  if (topology_.rank == 0) {
    connectCoordinator(store, prefix);
  } else {
    connectWorker(store, prefix);
  }
}

// Rank 0 handshakes every connection at once, never blocking on one: poll()
// over the listener and every pending connection, each with its own short
// deadline, at most `max_pending` of them (a new one drops the oldest that
// has not said hello, else the oldest), each
// holding at most one handshake frame. So an idle, slow or flooding stranger
// costs a socket and 4 KiB for 5 s at most, and the ranks behind it connect
// as fast as without it. Messages: hello, challenge, proof per rank (52, 80
// and 40 bytes with their length headers), then the welcome.
void ControlChannel::connectCoordinator(StoreClient& store, const std::string& prefix) {
  const auto deadline = Clock::now() + config_.start_timeout;
  const auto handshake_timeout = std::min<std::chrono::milliseconds>(kHandshakeTimeout,
                                                                     config_.start_timeout);
  const size_t max_pending = 4 * static_cast<size_t>(topology_.size) + 64;
  // One host: loopback only. Several: the address peers reach us at (address.h).
  const std::string address =
      topology_.cross_size == 1 ? std::string("127.0.0.1") : localAddress(config_);
  int port = 0;
  int listen_fd = listenTcp(address, &port);
  ::fcntl(listen_fd, F_SETFL, ::fcntl(listen_fd, F_GETFL) | O_NONBLOCK);
  store.set(prefix + "control", Endpoint{address, port}.encode());
  workers_.resize(topology_.size);
  std::deque<Pending> pending;
  int connected = 0;

  // One step of a pending connection's handshake, on what it sent. False:
  // drop it (a stranger, a wrong proof, a protocol error, or it went away).
  auto advance = [&](Pending& p) -> bool {
    std::vector<std::string> frames;
    const bool open = p.sock->readAvailable(frames);
    if (frames.size() > 1) return false;  // a rank waits for each answer
    if (frames.empty()) {
      if (open && p.sock->wantsWrite()) p.sock->flush();
      return open;
    }
    if (!p.challenged) {
      const Hello h = decodeHello(frames[0]);
      if (h.version != kControlProtocolVersion) {
        HVD_LOG(kWarning) << "rank 0 refused a connection that speaks control protocol version "
                          << h.version << "; this rank 0 speaks version "
                          << kControlProtocolVersion << " (run the same hvd-torch everywhere)";
        Challenge refusal;  // our version alone: the rank names both and fails
        p.sock->send(encodeChallenge(refusal));
        return false;
      }
      if (h.rank == 0 || h.rank >= static_cast<uint32_t>(topology_.size) || workers_[h.rank] ||
          h.nonce.size() != kHandshakeNonceBytes) {
        return false;
      }
      p.rank = h.rank;
      p.client_nonce = h.nonce;
      p.server_nonce = randomBytes(kHandshakeNonceBytes);
      Challenge c;
      c.nonce = p.server_nonce;
      c.proof = handshakeProof("server", config_.secret, p.rank, p.client_nonce, p.server_nonce);
      p.sock->send(encodeChallenge(c));
      p.challenged = true;
      return open;
    }
    const std::string proof = decodeProof(frames[0]);
    const std::string want =
        handshakeProof("client", config_.secret, p.rank, p.client_nonce, p.server_nonce);
    if (!constantTimeEqual(proof, want) || workers_[p.rank]) return false;
    p.sock->limitFrames(kMaxControlFrame);
    workers_[p.rank] = std::move(p.sock);
    ++connected;
    return false;  // out of the pending list, into workers_
  };

  // Room for a new connection: the oldest that has not said hello goes first,
  // so connections that only connected never push out a rank mid-handshake
  // (a round trip); only when every one has said hello does the oldest go.
  auto dropOldest = [&pending]() {
    auto victim = std::find_if(pending.begin(), pending.end(),
                               [](const Pending& p) { return !p.challenged; });
    pending.erase(victim != pending.end() ? victim : pending.begin());
  };

  std::vector<pollfd> fds;
  while (connected < topology_.size - 1) {
    auto now = Clock::now();
    // Deadlines grow with arrival order, and the order is kept (dropOldest
    // erases, never reorders): the expired are at the front.
    while (!pending.empty() && pending.front().deadline <= now) pending.pop_front();
    if (now >= deadline) {
      ::close(listen_fd);
      std::vector<int> missing;
      for (int r = 1; r < topology_.size; ++r)
        if (!workers_[r]) missing.push_back(r);
      throw std::runtime_error(missingRanksMessage(store, prefix, "not every rank connected") +
                               "; ranks not connected to the coordinator: " + rankList(missing));
    }
    fds.assign(1, pollfd{listen_fd, POLLIN, 0});
    for (const Pending& p : pending) {
      fds.push_back(pollfd{p.sock->fd(), static_cast<short>(POLLIN | (p.sock->wantsWrite() ? POLLOUT : 0)), 0});
    }
    // Pending deadlines grow with arrival order: the front's is the earliest.
    auto wake = pending.empty() ? deadline : std::min(deadline, pending.front().deadline);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count();
    if (::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(ms, 0) + 1)) < 0 &&
        errno != EINTR) {
      const int err = errno;
      ::close(listen_fd);
      throw std::runtime_error(std::string("rank 0's control listener: poll failed: ") +
                               std::strerror(err));
    }
    // Handshakes first, then new connections (whose accepting may drop the oldest).
    std::deque<Pending> kept;
    for (size_t i = 0; i < pending.size(); ++i) {
      Pending& p = pending[i];
      bool keep = true;
      if (fds[i + 1].revents != 0) {
        try {
          keep = advance(p);
        } catch (const WireError&) {
          keep = false;  // a malformed frame: a stranger, dropped
        } catch (const StatusError&) {
          keep = false;  // the connection broke while we answered it
        } catch (const std::bad_alloc&) {
          // Nothing a stranger sends is meant to get here (its frames are
          // capped at 4 KiB); if memory runs out anyway, drop it and say so.
          HVD_LOG(kWarning) << "rank 0 ran out of memory while handshaking a connection; dropped it";
          keep = false;
        }
      }
      if (keep && p.sock) kept.push_back(std::move(p));
    }
    pending.swap(kept);
    if (fds[0].revents & POLLIN) {
      for (int i = 0; i < kAcceptsPerTurn; ++i) {
        const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
          // Out of descriptors: give back the oldest stranger's and go on next turn.
          if ((errno == EMFILE || errno == ENFILE) && !pending.empty()) dropOldest();
          break;
        }
        if (pending.size() >= max_pending) dropOldest();
        Pending p;
        p.sock = std::make_unique<FrameSocket>(fd);
        // Anyone who reaches the port gets here: hold no more than a
        // handshake frame for them until they prove the secret.
        p.sock->limitFrames(kHandshakeFrameLimit);
        p.deadline = Clock::now() + handshake_timeout;
        pending.push_back(std::move(p));
      }
    }
  }
  ::close(listen_fd);
  pending.clear();
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
  // Until rank 0 has proven the secret, whatever answers is a stranger too.
  to_coordinator_->limitFrames(kHandshakeFrameLimit);
  const uint32_t rank = static_cast<uint32_t>(topology_.rank);
  Hello hello;
  hello.rank = rank;
  hello.nonce = randomBytes(kHandshakeNonceBytes);
  to_coordinator_->send(encodeHello(hello));
  to_coordinator_->flushBlocking(config_.start_timeout);
  const std::string unproven =
      "hvd_torch rendezvous failed on rank " + std::to_string(rank) + ": rank 0 at " + where +
      " could not prove it knows the job's secret (is something else listening on the port?)";
  std::string frame;
  if (!to_coordinator_->readOne(frame, deadline)) {
    throw std::runtime_error(missingRanksMessage(store, prefix, "rank 0 did not answer this rank's hello"));
  }
  Challenge challenge;
  try {
    challenge = decodeChallenge(frame);
  } catch (const WireError&) {
    throw std::runtime_error(unproven);
  }
  if (challenge.version != kControlProtocolVersion) {
    throw std::runtime_error("hvd_torch rendezvous failed on rank " + std::to_string(rank) +
                             ": control protocol version mismatch: this rank speaks version " +
                             std::to_string(kControlProtocolVersion) + ", rank 0 at " + where +
                             " speaks version " + std::to_string(challenge.version) +
                             " (run the same hvd-torch everywhere)");
  }
  const std::string want =
      handshakeProof("server", config_.secret, rank, hello.nonce, challenge.nonce);
  if (challenge.nonce.size() != kHandshakeNonceBytes || !constantTimeEqual(challenge.proof, want)) {
    throw std::runtime_error(unproven);
  }
  to_coordinator_->send(
      encodeProof(handshakeProof("client", config_.secret, rank, hello.nonce, challenge.nonce)));
  to_coordinator_->flushBlocking(config_.start_timeout);
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
  for (int rank = 1; rank < topology_.size; ++rank) workers_[rank]->send(frame);
}

void ControlChannel::sendToCoordinator(const std::string& frame) { to_coordinator_->send(frame); }

bool ControlChannel::readFrom(int rank, std::vector<std::string>& frames) {
  return workers_[rank]->readAvailable(frames);
}

bool ControlChannel::readFromCoordinator(std::vector<std::string>& frames) {
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
