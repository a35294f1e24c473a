// The agreement's connections (bit_agreement.h): each rank to the few ranks
// it exchanges agreement messages with (BitAgreement::partners(), at most
// log2 N + 1), over TCP, authenticated as the control channel's are
// (rank_handshake.h, purpose "agreement"), carrying length-prefixed frames
// (frame_socket.h). Of two partners, the higher rank connects and the lower
// listens, so the set-up cannot wait in a circle: rank 0 only listens, and a
// rank listens before it connects anywhere.
//
// Threading: connect() before the engine's loop starts; everything else on
// the thread that holds the engine's baton.
#pragma once

#include <poll.h>

#include <memory>
#include <string>
#include <vector>

#include "frame_socket.h"
#include "store_client.h"
#include "topology.h"
#include "types.h"

namespace hvd {

class PartnerLinks {
 public:
  PartnerLinks(const Topology& topology, const EngineConfig& config)
      : topology_(topology), config_(config) {}

  // Listens, publishes this rank's endpoint under `prefix`, connects to the
  // lower partners and accepts the higher ones. Throws std::runtime_error
  // naming the partners that never came by config.start_timeout.
  void connect(StoreClient& store, const std::string& prefix, const std::vector<int>& partners);
  const std::vector<int>& partners() const { return partners_; }

  void send(int rank, const std::string& frame);
  // Frames from partner `rank`; false once it closed or broke.
  bool readFrom(int rank, std::vector<std::string>& frames);
  // Appends each link's socket to a wait (owners: the sockets).
  void watchList(std::vector<pollfd>& fds, std::vector<FrameSocket*>& owners) const;
  bool hasOutput() const;
  // Frames already read off a socket (poll() will not report them).
  bool hasInput() const;
  // Closes one partner's link (it closed its end).
  void drop(int rank);
  void flushAll();
  void close();

 private:
  const Topology& topology_;
  const EngineConfig& config_;
  std::vector<int> partners_;
  std::vector<std::unique_ptr<FrameSocket>> links_;  // by rank; null for non-partners
};

}  // namespace hvd
