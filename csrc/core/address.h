// Which local address a rank listens on and advertises to its peers (the
// coordinator's control socket and Gloo's TCP device) when the job spans
// several hosts. On one host everything stays on 127.0.0.1.
//
// Threading: pure functions of the config and the kernel's tables; any thread.
#pragma once

#include <string>

#include "topology.h"

namespace hvd {

// The IPv4 address peers on other hosts can reach this rank at:
//   1. HOROVOD_GLOO_IFACE (config.iface) set: that interface's address; an
//      interface that does not exist or has no IPv4 address throws, naming it
//      and this host (a typo must not silently pick another network);
//   2. otherwise the source address the kernel would use to reach the
//      rendezvous store: the store is on the network every rank shares, so the
//      route to it goes out through the right NIC, and no DNS is needed;
//   3. otherwise (no store, no route) config.hostname.
std::string localAddress(const EngineConfig& config);

// Where rank 0's control socket listens, as it publishes it in the store
// ("host:port"; the host is the last ':''s left, so it may hold colons).
// decode() throws WireError for a record without a port in [1, 65535].
struct Endpoint {
  std::string host;
  int port = 0;

  std::string encode() const;
  static Endpoint decode(const std::string& text);
};

}  // namespace hvd
