// The control channel's frames, encoded and decoded in one place: what ranks
// send the coordinator (their arrivals, their goodbye) and what it sends them
// (responses, an abort, the autotuner's values, the handshake's hello and
// welcome). The engine decides what to send and when; this file only says
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

// Ranks -> coordinator.
struct WorkerFrame {
  enum Kind : uint8_t { kRequests = 0, kBye = 1 };
  Kind kind = kRequests;
  std::vector<Arrival> arrivals;  // kRequests; each with the sender's rank
};
std::string encodeArrivals(const std::vector<Arrival>& arrivals);
std::string encodeBye();
// `rank`: the sender (the socket it came on), written into each arrival.
WorkerFrame decodeWorkerFrame(const std::string& frame, int rank);

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

// The handshake's first frame, rank -> coordinator: who it is and the job's secret.
struct Hello {
  uint32_t rank = 0;
  std::string secret;
};
std::string encodeHello(const Hello& hello);
Hello decodeHello(const std::string& frame);

}  // namespace hvd
