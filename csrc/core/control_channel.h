// The engine's control channel: a star of connections between rank 0 (the
// coordinator) and every other rank, set up over the rendezvous store (a
// handshake that checks the job's secret), carrying length-prefixed frames
// (frame_socket.h, encoded by control_frames.h). When every rank is on one
// host the frames move through shared-memory rings (byte_ring.h) and the
// sockets carry only doorbells and, by closing, a peer's death.
//
// Threading: connect() and attachRings() before the engine's loop starts;
// plane() from any thread after that; everything else on the thread that
// holds the engine's baton.
#pragma once

#include <poll.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "byte_ring.h"
#include "frame_socket.h"
#include "shm_segment.h"
#include "store_client.h"
#include "topology.h"
#include "types.h"

namespace hvd {

class ControlChannel {
 public:
  ControlChannel(const Topology& topology, const EngineConfig& config)
      : topology_(topology), config_(config) {}

  // The handshake under the store's `prefix`: rank 0 listens and accepts
  // every other rank, the others connect to it. Throws std::runtime_error
  // naming the store and the ranks that never arrived.
  void connect(StoreClient& store, const std::string& prefix);
  // Every rank on one host: frames from now on go through rings in one shared
  // segment (rank 0's HVD_TORCH_SHM_CONTROL decides; a rank that cannot map
  // it keeps every rank on TCP). `extra`: bytes more in the segment, after
  // the rings, for the engine's fast lane (extraArea()).
  void attachRings(StoreClient& store, const std::string& prefix, size_t extra = 0);
  // The `extra` bytes of attachRings, zero-filled at creation; null without rings.
  char* extraArea() const { return rings_.empty() ? nullptr : segment_.data() + extra_at_; }
  // "shm", "tcp", or "local" (one rank).
  std::string plane() const;
  // Frames travel on the sockets (no rings, several ranks): poll them often.
  bool framesOnSockets() const { return rings_.empty() && topology_.size > 1; }

  // Rank 0: sends a frame to every other rank. Others: to rank 0.
  void sendToAll(const std::string& frame);
  void sendToCoordinator(const std::string& frame);
  // Rank 0: stops reading and writing `rank`'s connection (it said goodbye;
  // its close follows). Frames to it are dropped from then on.
  void dropWorker(int rank);
  // Not rank 0: the failure of every op that still needs rank 0 once its
  // connection closed (one wording wherever it is noticed).
  static StatusError coordinatorLost();
  // Not rank 0: stops reading rank 0's closed connection (the engine decides
  // whether anything still needs it); a later send fails as a lost peer.
  void dropCoordinator();
  // Rank 0: frames from `rank`; others: from rank 0. False once the peer
  // closed (or was dropped).
  bool readFrom(int rank, std::vector<std::string>& frames);
  bool readFromCoordinator(std::vector<std::string>& frames);

  // The shape of one wait: the sockets to poll (after `wake_fd`, owned by the
  // caller) and, for each, its socket (null for wake_fd).
  void watchList(int wake_fd, std::vector<pollfd>& fds, std::vector<FrameSocket*>& owners) const;
  // A frame's bytes are waiting in a ring (no system call to know).
  bool hasInput() const;
  // Bytes queued to send (with rings: waiting for the reader to make room).
  bool hasOutput() const;
  // Writes what the sockets or rings take now.
  void flushAll();
  // poll() saw the sockets readable (or may have: after a hand-over).
  void noteAllReadable();
  // Before a sleep in poll(): tells ring writers to ring; false when input came meanwhile.
  bool sleepIfIdle();
  void awake();

  // Not rank 0, shutting down: tells rank 0, so its ops that need this rank
  // fail now (best effort: a gone coordinator is no error here).
  void sayBye();
  // Rank 0, failing: tells every rank why, then goes quiet (best effort).
  void abortAll(const Status& status);
  // The data plane only says "connection reset"; the control channel knows
  // who died: rank 0's abort (with the kind rank 0 failed with) if one was
  // read already, else whatever it says within two seconds (the abort, or a
  // peer failure naming the rank); an ok status if it says nothing.
  Status diagnosePeerFailure();
  // Closes every connection (the rings stay mapped until destruction).
  void close();

 private:
  void connectCoordinator(StoreClient& store, const std::string& prefix);
  void connectWorker(StoreClient& store, const std::string& prefix);
  std::string missingRanksMessage(StoreClient& store, const std::string& prefix, const char* what);

  const Topology& topology_;
  const EngineConfig& config_;
  std::vector<std::unique_ptr<FrameSocket>> workers_;  // rank 0: index = rank
  std::unique_ptr<FrameSocket> to_coordinator_;        // other ranks
  ShmSegment segment_;                                 // the rings, when attached
  size_t extra_at_ = 0;                                // where extraArea() starts
  std::vector<std::unique_ptr<ByteRing>> rings_;
  Status abort_;  // rank 0's abort, once readFromCoordinator has read it
};

}  // namespace hvd
