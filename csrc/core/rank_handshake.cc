#include "rank_handshake.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <new>
#include <stdexcept>

#include "control_frames.h"
#include "hmac_sha256.h"
#include "log.h"
#include "types.h"
#include "wire.h"

namespace hvd {

namespace {

using Clock = std::chrono::steady_clock;

// Connections accepted in one turn of the loop before the others get a look.
constexpr int kAcceptsPerTurn = 64;

// One connection that has not proven itself yet.
struct Pending {
  std::unique_ptr<FrameSocket> sock;
  Clock::time_point deadline;
  bool challenged = false;  // hello read, challenge sent: a proof comes next
  uint32_t rank = 0;
  std::string client_nonce;
  std::string server_nonce;
};

}  // namespace

std::string handshakeProof(const std::string& purpose, const char* role, const std::string& secret,
                           uint32_t rank, const std::string& client_nonce,
                           const std::string& server_nonce) {
  Writer w;
  const std::string text = "hvd-torch " + purpose + " " + role;
  w.putBytes(text.data(), text.size());
  w.put<uint32_t>(kControlProtocolVersion);
  w.put<uint32_t>(rank);
  w.putBytes(client_nonce.data(), client_nonce.size());
  w.putBytes(server_nonce.data(), server_nonce.size());
  const Digest256 d = hmacSha256(secret, w.buffer());
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

// A new connection, when max_pending are held, drops the oldest that has not
// said hello, else the oldest. So an idle, slow or flooding stranger costs a
// socket and 4 KiB for handshake_timeout at most, and the ranks behind it
// connect as fast as without it. Messages: hello, challenge, proof per rank
// (52, 80 and 40 bytes with their length headers).
std::vector<std::unique_ptr<FrameSocket>> acceptRanks(
    int listen_fd, const std::vector<bool>& expected, const AcceptOptions& o,
    const std::function<std::string(const std::vector<int>&)>& missing) {
  const auto handshake_timeout = std::min<std::chrono::milliseconds>(
      o.handshake_timeout,
      std::chrono::duration_cast<std::chrono::milliseconds>(o.deadline - Clock::now()) +
          std::chrono::milliseconds(1));
  const int size = static_cast<int>(expected.size());
  std::vector<std::unique_ptr<FrameSocket>> proven(size);
  const int wanted = static_cast<int>(std::count(expected.begin(), expected.end(), true));
  int connected = 0;
  std::deque<Pending> pending;

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
        HVD_LOG(kWarning) << o.who << " refused a connection that speaks control protocol version "
                          << h.version << "; this rank speaks version " << kControlProtocolVersion
                          << " (run the same hvd-torch everywhere)";
        Challenge refusal;  // our version alone: the rank names both and fails
        p.sock->send(encodeChallenge(refusal));
        return false;
      }
      if (h.rank >= static_cast<uint32_t>(size) || !expected[h.rank] || proven[h.rank] ||
          h.nonce.size() != kHandshakeNonceBytes) {
        return false;
      }
      p.rank = h.rank;
      p.client_nonce = h.nonce;
      p.server_nonce = randomBytes(kHandshakeNonceBytes);
      Challenge c;
      c.nonce = p.server_nonce;
      c.proof = handshakeProof(o.purpose, "server", o.secret, p.rank, p.client_nonce, p.server_nonce);
      p.sock->send(encodeChallenge(c));
      p.challenged = true;
      return open;
    }
    const std::string proof = decodeProof(frames[0]);
    const std::string want =
        handshakeProof(o.purpose, "client", o.secret, p.rank, p.client_nonce, p.server_nonce);
    if (!constantTimeEqual(proof, want) || proven[p.rank]) return false;
    p.sock->limitFrames(kMaxControlFrame);
    if (o.welcome_each) p.sock->send(encodeWelcome());
    proven[p.rank] = std::move(p.sock);
    ++connected;
    return false;  // out of the pending list, into proven
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
  while (connected < wanted) {
    auto now = Clock::now();
    // Deadlines grow with arrival order, and the order is kept (dropOldest
    // erases, never reorders): the expired are at the front.
    while (!pending.empty() && pending.front().deadline <= now) pending.pop_front();
    if (now >= o.deadline) {
      std::vector<int> absent;
      for (int r = 0; r < size; ++r)
        if (expected[r] && !proven[r]) absent.push_back(r);
      throw std::runtime_error(missing(absent));
    }
    fds.assign(1, pollfd{listen_fd, POLLIN, 0});
    for (const Pending& p : pending) {
      fds.push_back(pollfd{p.sock->fd(), static_cast<short>(POLLIN | (p.sock->wantsWrite() ? POLLOUT : 0)), 0});
    }
    // Pending deadlines grow with arrival order: the front's is the earliest.
    auto wake = pending.empty() ? o.deadline : std::min(o.deadline, pending.front().deadline);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count();
    if (::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(ms, 0) + 1)) < 0 &&
        errno != EINTR) {
      throw std::runtime_error(o.who + "'s listener: poll failed: " + std::strerror(errno));
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
          HVD_LOG(kWarning) << o.who << " ran out of memory while handshaking a connection; dropped it";
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
        if (pending.size() >= o.max_pending) dropOldest();
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
  return proven;
}

void proveToPeer(FrameSocket& sock, uint32_t rank, const std::string& purpose,
                 const std::string& secret, const std::string& peer, Clock::time_point deadline,
                 std::chrono::milliseconds timeout,
                 const std::function<std::string(const char*)>& silent) {
  // Until the peer has proven the secret, whatever answers is a stranger too.
  sock.limitFrames(kHandshakeFrameLimit);
  Hello hello;
  hello.rank = rank;
  hello.nonce = randomBytes(kHandshakeNonceBytes);
  sock.send(encodeHello(hello));
  sock.flushBlocking(timeout);
  const std::string unproven =
      "hvd_torch rendezvous failed on rank " + std::to_string(rank) + ": " + peer +
      " could not prove it knows the job's secret (is something else listening on the port?)";
  std::string frame;
  if (!sock.readOne(frame, deadline)) {
    throw std::runtime_error(silent((peer + " did not answer this rank's hello").c_str()));
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
                             std::to_string(kControlProtocolVersion) + ", " + peer +
                             " speaks version " + std::to_string(challenge.version) +
                             " (run the same hvd-torch everywhere)");
  }
  const std::string want = handshakeProof(purpose, "server", secret, rank, hello.nonce, challenge.nonce);
  if (challenge.nonce.size() != kHandshakeNonceBytes || !constantTimeEqual(challenge.proof, want)) {
    throw std::runtime_error(unproven);
  }
  sock.send(encodeProof(handshakeProof(purpose, "client", secret, rank, hello.nonce, challenge.nonce)));
  sock.flushBlocking(timeout);
}

}  // namespace hvd
