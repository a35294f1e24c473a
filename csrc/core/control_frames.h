// The control channel's frames, encoded and decoded in one place: what ranks
// send the coordinator (their arrivals, their goodbye) and what it sends them
// (responses, an abort, the autotuner's values, the handshake's hello,
// challenge, proof and welcome). The engine decides what to send and when; this file only says
// what the bytes are. A malformed frame throws WireError (wire.h).
//
// Threading: free functions of their arguments; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autotune.h"
#include "coordinator.h"
#include "message.h"

namespace hvd {

// Ranks -> coordinator (kRelay and kRoster come from host leaders only and
// decode below, not by decodeWorkerFrame).
struct WorkerFrame {
  enum Kind : uint8_t { kRequests = 0, kBye = 1, kRelay = 2, kRoster = 3 };
  Kind kind = kRequests;
  std::vector<Arrival> arrivals;  // kRequests; each with the sender's rank
};
std::string encodeArrivals(const std::vector<Arrival>& arrivals);
std::string encodeBye();
// `rank`: the sender (the socket it came on), written into each arrival.
WorkerFrame decodeWorkerFrame(const std::string& frame, int rank);

// Host leader -> rank 0 (control_relay.cc): its host's ranks' frames, each
// with the rank that sent it, and the ranks whose connection to it closed.
struct Relayed {
  int rank = 0;
  bool closed = false;  // no frame: this rank's connection to its leader closed
  std::string frame;
};
std::string encodeRelay(const std::vector<Relayed>& items);
bool isRelayFrame(const std::string& frame);
// Every rank is in [1, size): a leader speaks for none outside the job.
std::vector<Relayed> decodeRelay(const std::string& frame, int size);
// Host leader -> rank 0, its first frame after the welcome: the ranks whose
// frames it relays (its host's, not itself), each in [1, size).
std::string encodeRoster(const std::vector<int>& ranks);
std::vector<int> decodeRoster(const std::string& frame, int size);

// Coordinator -> ranks.
struct CoordinatorFrame {
  enum Kind : uint8_t { kResponses = 0, kAbort = 1, kWelcome = 2, kTunables = 3 };
  Kind kind = kResponses;
  std::vector<Response> responses;  // kResponses
  Status abort;                     // kAbort: fail everything with this status
  Tunables tunables;                // kTunables
};
std::string encodeResponses(const std::vector<Response>& responses);
std::string encodeAbort(const Status& status);
std::string encodeWelcome();
std::string encodeTunables(const Tunables& tunables);
CoordinatorFrame decodeCoordinatorFrame(const std::string& frame);
// Without decoding it: is this rank 0's abort?
bool isAbortFrame(const std::string& frame);

// The handshake (control_channel.cc; docs/security.md): each rank and rank 0
// prove the job's secret to each other over fresh nonces, so it never crosses
// the wire. Version 1's hello sent {rank, secret}; it does not decode here.
constexpr uint32_t kControlProtocolVersion = 2;
constexpr size_t kHandshakeNonceBytes = 32;

// Rank -> coordinator, first: its version, its rank, its nonce. A hello of
// another version decodes to that version alone (nothing after it is read),
// so that rank 0 can name both versions.
struct Hello {
  uint32_t version = kControlProtocolVersion;
  uint32_t rank = 0;
  std::string nonce;
};
std::string encodeHello(const Hello& hello);
Hello decodeHello(const std::string& frame);

// Coordinator -> rank: its version, its nonce and its proof; a challenge of
// another version (rank 0 refusing the rank's) decodes to the version alone.
struct Challenge {
  uint32_t version = kControlProtocolVersion;
  std::string nonce;
  std::string proof;
};
std::string encodeChallenge(const Challenge& challenge);
Challenge decodeChallenge(const std::string& frame);

// Rank -> coordinator, once rank 0 has proven itself: the rank's proof.
std::string encodeProof(const std::string& proof);
std::string decodeProof(const std::string& frame);

}  // namespace hvd
