// The control channel's set-up (control_channel.h): who connects to whom,
// the handshakes, and the shared-memory rings of a host.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "address.h"
#include "control_channel.h"
#include "control_frames.h"
#include "log.h"
#include "process_sets.h"
#include "rank_handshake.h"

namespace hvd {

namespace {

using Clock = std::chrono::steady_clock;

std::string hostKey(int cross_rank, int local_rank) {
  return "host/" + std::to_string(cross_rank) + "/" + std::to_string(local_rank);
}

}  // namespace

void ControlChannel::connect(StoreClient& store, const std::string& prefix) {
  // Rank 0 decides for the job. Leaders need rank 0 to be its host's first
  // rank: it is its own host's leader.
  try {
    if (topology_.rank == 0) {
      leaders_ = config_.host_leaders && topology_.cross_size > 1 && topology_.local_rank == 0 &&
                 topology_.cross_rank == 0;
      store.set(prefix + "leaders", leaders_ ? "1" : "0");
    } else if (topology_.cross_size > 1) {  // one host: never (rank 0 is every rank's host)
      leaders_ = store.get(prefix + "leaders", config_.start_timeout) == "1";
    }
    // Who is where: the leaders read their hosts' ranks, rank 0 the leaders.
    if (leaders_)
      store.set(prefix + hostKey(topology_.cross_rank, topology_.local_rank),
                std::to_string(topology_.rank));
  } catch (const StoreTimeout&) {
    throw std::runtime_error(missingRanksMessage(store, prefix, "rank 0 did not start the control channel"));
  }
  if (topology_.rank == 0) {
    connectCoordinator(store, prefix);
  } else if (leaders_ && topology_.cross_rank != 0 && topology_.local_rank == 0) {
    connectLeader(store, prefix);
  } else if (leaders_ && topology_.cross_rank != 0) {
    const int leader = rankAt(store, prefix, topology_.cross_rank, 0);
    connectUpstream(store, prefix, "leader/" + std::to_string(topology_.cross_rank), leader);
  } else {
    connectUpstream(store, prefix, "control", 0);
  }
  size_t made = to_coordinator_ ? 1 : 0;
  for (const Link& link : links_) made += link.sock ? 1 : 0;
  links_made_.store(made);
}

int ControlChannel::rankAt(StoreClient& store, const std::string& prefix, int cross_rank,
                           int local_rank) {
  std::string text;
  try {
    text = store.get(prefix + hostKey(cross_rank, local_rank), config_.start_timeout);
  } catch (const StoreTimeout&) {
    throw std::runtime_error(missingRanksMessage(
        store, prefix,
        ("no rank said it is local rank " + std::to_string(local_rank) + " of host " +
         std::to_string(cross_rank) + " (HOROVOD_CROSS_RANK, HOROVOD_LOCAL_RANK)").c_str()));
  }
  char* end = nullptr;
  const long rank = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || rank < 0 || rank >= topology_.size) {
    throw std::runtime_error("hvd_torch rendezvous failed on rank " + std::to_string(topology_.rank) +
                             ": the store's entry for local rank " + std::to_string(local_rank) +
                             " of host " + std::to_string(cross_rank) + " is '" + text +
                             "', not a rank of the job");
  }
  return static_cast<int>(rank);
}

// The ranks that said they are local ranks 1 .. local_size - 1 of host
// `cross_rank`, by lane (local rank - 1).
std::vector<int> ControlChannel::hostRanks(StoreClient& store, const std::string& prefix,
                                           int cross_rank) {
  std::vector<int> ranks;
  for (int l = 1; l < topology_.local_size; ++l) ranks.push_back(rankAt(store, prefix, cross_rank, l));
  return ranks;
}

// Rank 0: every other rank, or with host leaders its host's ranks and the
// other hosts' leaders (which then say whose frames they relay).
void ControlChannel::connectCoordinator(StoreClient& store, const std::string& prefix) {
  std::vector<int> host, others;
  if (!leaders_) {
    for (int r = 1; r < topology_.size; ++r) others.push_back(r);
  } else {
    host = hostRanks(store, prefix, 0);
    for (int c = 1; c < topology_.cross_size; ++c) others.push_back(rankAt(store, prefix, c, 0));
  }
  // One host: loopback only. Several: the address peers reach us at (address.h).
  const std::string address =
      topology_.cross_size == 1 ? std::string("127.0.0.1") : localAddress(config_);
  connectHub(store, prefix, host, others, address, "control");
  link_of_.assign(topology_.size, -1);
  for (size_t i = 0; i < links_.size(); ++i) link_of_[links_[i].rank] = static_cast<int>(i);
  if (leaders_) readRosters();
}

// A host's leader: its host's ranks first, then rank 0, then its roster.
void ControlChannel::connectLeader(StoreClient& store, const std::string& prefix) {
  leader_ = true;
  const std::vector<int> roster = hostRanks(store, prefix, topology_.cross_rank);
  connectHub(store, prefix, roster, {}, localAddress(config_),
             "leader/" + std::to_string(topology_.cross_rank));
  connectUpstream(store, prefix, "control", 0);
  to_coordinator_->send(encodeRoster(roster));
  to_coordinator_->flushBlocking(config_.start_timeout);
}

// Listens on `address`, publishes it under `key`, and accepts every rank of
// `host` (this host's, each with its lane in the host's rings: its index)
// and of `others` (the handshake proves the job's secret both ways), then
// welcomes them. A rank named twice, or this rank named, fails the start.
void ControlChannel::connectHub(StoreClient& store, const std::string& prefix,
                                const std::vector<int>& host, const std::vector<int>& others,
                                const std::string& address, const std::string& key) {
  std::vector<bool> expected(topology_.size, false);
  std::vector<int> lane(topology_.size, -1);
  for (size_t i = 0; i < host.size() + others.size(); ++i) {
    const bool local = i < host.size();
    const int r = local ? host[i] : others[i - host.size()];
    if (expected[r] || r == topology_.rank) {
      throw std::runtime_error("hvd_torch rendezvous failed on rank " + std::to_string(topology_.rank) +
                               ": rank " + std::to_string(r) +
                               " is named twice by the hosts' entries (HOROVOD_CROSS_RANK, "
                               "HOROVOD_LOCAL_RANK disagree across ranks)");
    }
    expected[r] = true;
    if (local) lane[r] = static_cast<int>(i);
  }
  int port = 0;
  int listen_fd = listenTcp(address, &port);
  ::fcntl(listen_fd, F_SETFL, ::fcntl(listen_fd, F_GETFL) | O_NONBLOCK);
  store.set(prefix + key, Endpoint{address, port}.encode());
  const std::string me =
      topology_.rank == 0 ? std::string("rank 0") : "host leader rank " + std::to_string(topology_.rank);
  AcceptOptions options;
  options.purpose = "control";
  options.secret = config_.secret;
  options.who = me;
  options.deadline = Clock::now() + config_.start_timeout;
  options.max_pending = 4 * (host.size() + others.size()) + 64;
  std::vector<std::unique_ptr<FrameSocket>> socks;
  try {
    socks = acceptRanks(listen_fd, expected, options, [&](const std::vector<int>& missing) {
      return missingRanksMessage(store, prefix, "not every rank connected") + "; ranks not connected to " +
             me + ": " + rankList(missing);
    });
  } catch (...) {
    ::close(listen_fd);
    throw;
  }
  ::close(listen_fd);
  const std::string welcome = encodeWelcome();
  for (int r = 0; r < topology_.size; ++r) {
    if (!socks[r]) continue;
    socks[r]->send(welcome);
    socks[r]->flushBlocking(config_.start_timeout);
    Link link;
    link.rank = r;
    link.sock = std::move(socks[r]);
    link.lane = lane[r];
    links_.push_back(std::move(link));
  }
}

// Rank 0: each leader's first frame names the ranks it relays for; together
// with rank 0's own links they must be every rank, each once.
void ControlChannel::readRosters() {
  const auto deadline = Clock::now() + config_.start_timeout;
  for (size_t i = 0; i < links_.size(); ++i) {
    Link& link = links_[i];
    if (link.lane >= 0) continue;  // a rank of rank 0's host
    const std::string who = "host leader rank " + std::to_string(link.rank);
    std::string frame;
    if (!link.sock->readOne(frame, deadline))
      throw std::runtime_error("hvd_torch rendezvous failed on rank 0: " + who +
                               " did not say which ranks it relays within the start timeout");
    try {
      link.roster = decodeRoster(frame, topology_.size);
    } catch (const WireError& e) {
      throw std::runtime_error("hvd_torch rendezvous failed on rank 0: " + who +
                               " sent a malformed roster: " + e.what());
    }
    for (int r : link.roster) {
      if (link_of_[r] != -1) {
        throw std::runtime_error("hvd_torch rendezvous failed on rank 0: " + who + " relays rank " +
                                 std::to_string(r) + ", which rank 0 already reaches (rank " +
                                 std::to_string(links_[link_of_[r]].rank) +
                                 "'s link): HOROVOD_CROSS_RANK/HOROVOD_LOCAL_RANK disagree");
      }
      link_of_[r] = static_cast<int>(i);
    }
    link.leader = true;
    link.sock->limitFrames(kMaxControlFrame + kRelayOverhead);
  }
  std::vector<int> unreached;
  for (int r = 1; r < topology_.size; ++r)
    if (link_of_[r] == -1) unreached.push_back(r);
  if (!unreached.empty()) {
    throw std::runtime_error("hvd_torch rendezvous failed on rank 0: no host leader relays ranks " +
                             rankList(unreached) +
                             " (HOROVOD_CROSS_RANK/HOROVOD_LOCAL_RANK/HOROVOD_CROSS_SIZE disagree)");
  }
}

// Not rank 0: connects to the rank whose address is under `key` (rank 0, or
// this host's leader), proves the job's secret, waits for the welcome.
void ControlChannel::connectUpstream(StoreClient& store, const std::string& prefix,
                                     const std::string& key, int hub_rank) {
  upstream_rank_ = hub_rank;
  const std::string hub =
      hub_rank == 0 ? std::string("rank 0") : "host leader rank " + std::to_string(hub_rank);
  const auto deadline = Clock::now() + config_.start_timeout;
  std::string address;
  try {
    address = store.get(prefix + key, config_.start_timeout);
  } catch (const StoreTimeout&) {
    throw std::runtime_error(missingRanksMessage(store, prefix, (hub + " did not publish its address").c_str()));
  }
  const Endpoint endpoint = Endpoint::decode(address);
  const std::string where = endpoint.host + ":" + std::to_string(endpoint.port);
  int fd = connectTcp(endpoint.host, endpoint.port, deadline);
  if (fd < 0) {
    throw std::runtime_error(missingRanksMessage(store, prefix, ("cannot reach " + hub + " at " + where).c_str()));
  }
  to_coordinator_ = std::make_unique<FrameSocket>(fd);
  proveToPeer(*to_coordinator_, static_cast<uint32_t>(topology_.rank), "control", config_.secret,
              hub + " at " + where, deadline, config_.start_timeout,
              [&](const char* what) { return missingRanksMessage(store, prefix, what); });
  std::string welcome;
  if (!to_coordinator_->readOne(welcome, deadline)) {
    throw std::runtime_error(missingRanksMessage(store, prefix, (hub + " did not see every rank").c_str()));
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

void ControlChannel::attachRings(StoreClient& store, const std::string& prefix, size_t extra) {
  attachLanes(store, prefix, static_cast<size_t>(topology_.size - 1), topology_.rank - 1, extra, true);
}

void ControlChannel::attachHostRings(StoreClient& store, const std::string& prefix) {
  if (!leaders_ || topology_.local_size < 2) return;
  const bool hub = topology_.rank == 0 || leader_;
  attachLanes(store, prefix + "host" + std::to_string(topology_.cross_rank) + "/",
              static_cast<size_t>(topology_.local_size - 1), hub ? -1 : topology_.local_rank - 1, 0,
              false);
}

// One rank (my_lane -1: rank 0, or a host's leader) makes one segment with
// two rings per lane (to the accepting end, from it), the others map it, the
// maker unlinks the name; then each connection sends and receives through its
// lane's rings. `by_rank` (every rank on one host): lane r - 1 is rank r's
// connection to whichever rank accepted it (rank 0, or with host leaders its
// leader), so one segment serves both shapes; else (a host's segment) lane
// l - 1 is local rank l's connection to the leader. The maker's
// HVD_TORCH_SHM_CONTROL decides; a rank that cannot map the segment keeps
// them all on TCP. Nothing is in flight on the sockets here: the handshake is
// over, the loop not started.
void ControlChannel::attachLanes(StoreClient& store, const std::string& prefix, size_t lanes,
                                 int my_lane, size_t extra, bool by_rank) {
  constexpr size_t kRingBytes = size_t{256} << 10;
  const size_t lane = 2 * ByteRing::footprint(kRingBytes);
  const auto timeout = config_.start_timeout;
  extra_at_ = (lane * lanes + 63) / 64 * 64;
  const size_t bytes = extra_at_ + extra;
  bool ok = true;
  if (my_lane < 0) {
    std::string name = config_.shm_control ? ShmSegment::uniqueName() : "";
    try {
      if (!name.empty()) segment_ = ShmSegment::create(name, bytes);
    } catch (const std::exception& e) {
      HVD_LOG(kWarning) << "control frames stay on TCP: " << e.what();
      name.clear();
    }
    store.set(prefix + "name", name);
    if (name.empty()) return;
    for (size_t l = 0; l < lanes; ++l)
      ok = store.get(prefix + "mapped/" + std::to_string(l), timeout) == "1" && ok;
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
    store.set(prefix + "mapped/" + std::to_string(my_lane), ok ? "1" : "0");
    ok = store.get(prefix + "verdict", timeout) == "1";
  }
  if (!ok) {
    segment_ = ShmSegment();
    return;
  }
  // Lane l: the ring to the hub, then the ring back.
  for (size_t l = 0; l < lanes; ++l) {
    char* at = segment_.data() + lane * l;
    rings_.push_back(std::make_unique<ByteRing>(at, kRingBytes));
    rings_.push_back(std::make_unique<ByteRing>(at + lane / 2, kRingBytes));
  }
  auto up = [&](int l) { return rings_[2 * l].get(); };
  auto down = [&](int l) { return rings_[2 * l + 1].get(); };
  for (Link& link : links_) {
    const int l = by_rank ? link.rank - 1 : link.lane;
    if (l >= 0) link.sock->attachRings(down(l), up(l));
  }
  if (to_coordinator_) {
    const int l = by_rank ? topology_.rank - 1 : my_lane;
    if (l >= 0) to_coordinator_->attachRings(up(l), down(l));
  }
}

}  // namespace hvd
