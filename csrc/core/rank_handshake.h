// The handshake of every TCP connection between the job's ranks (the control
// channel's star to rank 0, and the agreement's links between partners,
// partner_links.h): each side proves the job's secret to the other over fresh
// nonces, so the secret never crosses the wire (docs/security.md). The frames
// are control_frames.h's hello, challenge and proof; the proofs are bound to
// the connection's purpose, so one kind of connection's proof never serves
// another's.
//
// Threading: free functions; each call owns the sockets it is given.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "frame_socket.h"

namespace hvd {

// The largest frame before a peer has proven itself, either way: a hello, a
// challenge or a proof is under 100 bytes; 4 KiB as the store allows.
constexpr uint32_t kHandshakeFrameLimit = 4096;
// The largest frame after it (FrameSocket::limitFrames): a control frame is
// a list of requests or responses, about 100 bytes per tensor plus its name;
// a million tensors with long names stay under this, and a peer's length
// header can no longer ask for 4 GiB.
constexpr uint32_t kMaxControlFrame = 256u << 20;

// HMAC-SHA256(secret, "hvd-torch <purpose> <role>" | version | rank | client
// nonce | server nonce): the rank binds each proof to the connection's claim,
// the role keeps one side's proof from serving as the other's, the purpose
// ("control", "agreement") one kind of connection's from serving another's.
std::string handshakeProof(const std::string& purpose, const char* role, const std::string& secret,
                           uint32_t rank, const std::string& client_nonce,
                           const std::string& server_nonce);

struct AcceptOptions {
  std::string purpose;        // as in handshakeProof
  std::string secret;
  std::string who;            // this side, for logs: "rank 0", "rank 5's agreement listener"
  std::chrono::steady_clock::time_point deadline;
  std::chrono::milliseconds handshake_timeout{5000};
  size_t max_pending = 64;    // connections not yet proven, held at once
  // Welcome each rank as soon as its proof checks (control_frames.h): the
  // rank then knows its next frame cannot arrive with its proof, where this
  // side would take it for a protocol error. Off: the caller welcomes.
  bool welcome_each = false;
};

// Accepts on `listen_fd` (non-blocking, owned by the caller) until every rank
// r with expected[r] has proven itself; returns their sockets by rank (null
// elsewhere), limited to kMaxControlFrame. Never blocks on one connection:
// poll() over the listener and every pending connection, each with its own
// deadline, at most max_pending of them, each holding at most one handshake
// frame; strangers, wrong proofs and a second connection for a rank are
// dropped. At the deadline throws std::runtime_error(missing(ranks)).
std::vector<std::unique_ptr<FrameSocket>> acceptRanks(
    int listen_fd, const std::vector<bool>& expected, const AcceptOptions& options,
    const std::function<std::string(const std::vector<int>&)>& missing);

// The connecting side on `sock` (connected): hello, then checks the
// listener's proof, then sends this rank's. `peer`: "rank 0 at host:port",
// for messages. Throws std::runtime_error: `silent(what)` when the peer does
// not answer by the deadline, a version mismatch naming both, or a peer that
// cannot prove the secret.
void proveToPeer(FrameSocket& sock, uint32_t rank, const std::string& purpose,
                 const std::string& secret, const std::string& peer,
                 std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds timeout,
                 const std::function<std::string(const char*)>& silent);

}  // namespace hvd
