// The engine's control channel: connections between rank 0 (the
// coordinator) and every other rank, set up over the rendezvous store (a
// handshake that checks the job's secret), carrying length-prefixed frames
// (frame_socket.h, encoded by control_frames.h). When every rank is on one
// host the frames move through shared-memory rings (byte_ring.h) and the
// sockets carry only doorbells and, by closing, a peer's death.
//
// Across hosts (issue #47) rank 0 holds one connection per other host: each
// host's first rank (its leader) relays its ranks' frames to rank 0 in one
// frame (control_relay.cc) and rank 0's frames to them; the ranks of a host
// reach their leader (and rank 0's host, rank 0) through rings in a segment
// of that host. Rank 0's HVD_TORCH_HOST_LEADERS decides (docs/architecture.md,
// "Host leaders").
//
// Threading: connect() and attachRings() before the engine's loop starts;
// plane() from any thread after that; everything else on the thread that
// holds the engine's baton.
#pragma once

#include <poll.h>

#include <atomic>
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
  // every other rank (or, with host leaders, its host's ranks and the other
  // hosts' leaders, which accept their hosts' ranks), the others connect to
  // it. Throws std::runtime_error naming the store and the ranks that never
  // arrived.
  void connect(StoreClient& store, const std::string& prefix);
  // With host leaders: the ranks of this host and their hub (its leader, or
  // rank 0) move their frames through rings in one segment of the host, as
  // attachRings does for a one-host job (the hub's HVD_TORCH_SHM_CONTROL
  // decides; a rank that cannot map it keeps its host on TCP).
  void attachHostRings(StoreClient& store, const std::string& prefix);
  // Connections this rank holds to other ranks' control channels (rank 0:
  // one per other rank, or with host leaders its host's ranks plus one per
  // other host), and frames it relayed for its host (a leader; diagnostics).
  // Any thread (both are atomics).
  size_t links() const { return links_made_.load(); }
  uint64_t relayed() const { return relayed_.load(); }
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
  bool framesOnSockets() const;

  // Rank 0: sends a frame to every other rank. Others: to rank 0.
  void sendToAll(const std::string& frame);
  void sendToCoordinator(const std::string& frame);
  // Rank 0: stops reading `rank`'s frames (it said goodbye; its close
  // follows). Frames to it are dropped from then on.
  void dropWorker(int rank);
  // Not rank 0: the failure of every op that still needs rank 0 once its
  // connection (or its host leader's) closed: one wording wherever it is noticed.
  StatusError coordinatorLost() const;
  // Not rank 0: stops reading rank 0's closed connection (the engine decides
  // whether anything still needs it); a later send fails as a lost peer.
  void dropCoordinator();
  // Rank 0: every frame that arrived, with the rank that sent it (in order
  // per rank); then in `lost`, the ranks whose connection closed before they
  // said goodbye (a host leader's: the leader). A leader that said goodbye
  // and closed brings a goodbye for each of its ranks that had not.
  // Throws StatusError naming the leader when a leader's relay is malformed.
  struct FromWorker {
    int rank;
    std::string frame;
  };
  void readWorkers(std::vector<FromWorker>& frames, std::vector<int>& lost);
  // Rank 0: why a rank in readWorkers' `lost` is gone, for every rank's error.
  std::string lostMessage(int rank) const;
  // Not rank 0: frames from rank 0 (a host leader relays its ranks' frames
  // first, and hands rank 0's on to them). False once the peer closed (or
  // was dropped).
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
  // A connection this rank accepted: rank 0's to each other rank (or to its
  // host's ranks and the other hosts' leaders), a leader's to its host's ranks.
  struct Link {
    int rank = 0;
    std::unique_ptr<FrameSocket> sock;
    bool leader = false;      // rank 0: another host's leader (relay frames come on it)
    std::vector<int> roster;  // rank 0, a leader's link: the ranks it relays (may be none)
    int lane = -1;            // a rank of this host: its lane in the host's rings
  };

  // control_connect.cc: the handshakes.
  void connectHub(StoreClient& store, const std::string& prefix, const std::vector<int>& host,
                  const std::vector<int>& others, const std::string& address, const std::string& key);
  std::vector<int> hostRanks(StoreClient& store, const std::string& prefix, int cross_rank);
  void connectUpstream(StoreClient& store, const std::string& prefix, const std::string& key,
                       int hub_rank);
  // The rank that said it is `local_rank` of host `cross_rank`.
  int rankAt(StoreClient& store, const std::string& prefix, int cross_rank, int local_rank);
  void connectCoordinator(StoreClient& store, const std::string& prefix);
  void connectLeader(StoreClient& store, const std::string& prefix);
  void readRosters();
  std::string missingRanksMessage(StoreClient& store, const std::string& prefix, const char* what);
  void attachLanes(StoreClient& store, const std::string& prefix, size_t lanes, int my_lane,
                   size_t extra, bool by_rank);

  // control_relay.cc: a leader's relay, rank 0's side of it. A relay frame
  // holds at least one frame: its bytes past that frame's.
  static constexpr uint32_t kRelayOverhead = 64;
  static constexpr size_t kRelayBatch = size_t{1} << 20;
  // `own`: a frame of this rank's to send with its host's (sendToCoordinator).
  void relayUp(const std::string* own = nullptr);
  // Hands frames[first..] (rank 0's) on to each of this host's ranks.
  void relayDown(const std::vector<std::string>& frames, size_t first);
  void closeHost();
  void takeLinkFrames(size_t index, std::vector<FromWorker>& frames, std::vector<int>& lost);
  bool dropped(int rank) const { return !dropped_.empty() && dropped_[rank]; }

  const Topology& topology_;
  const EngineConfig& config_;
  bool leaders_ = false;
  bool leader_ = false;       // this rank relays its host's frames
  int upstream_rank_ = 0;     // not rank 0: the rank to_coordinator_ reaches
  std::vector<Link> links_;   // rank 0, a leader: the connections it accepted
  std::vector<int> link_of_;  // rank 0: rank -> index in links_ of its frames' link
  std::vector<bool> dropped_;  // rank 0: ranks that said goodbye (empty: none)
  std::unique_ptr<FrameSocket> to_coordinator_;  // other ranks: to rank 0 or the leader
  std::atomic<size_t> links_made_{0};
  std::atomic<uint64_t> relayed_{0};
  ShmSegment segment_;                                 // the rings, when attached
  size_t extra_at_ = 0;                                // where extraArea() starts
  std::vector<std::unique_ptr<ByteRing>> rings_;
  Status abort_;  // rank 0's abort, once readFromCoordinator has read it
};

}  // namespace hvd
