#include "partner_links.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <stdexcept>

#include "address.h"
#include "process_sets.h"
#include "rank_handshake.h"

namespace hvd {

void PartnerLinks::connect(StoreClient& store, const std::string& prefix,
                           const std::vector<int>& partners) {
  const auto deadline = std::chrono::steady_clock::now() + config_.start_timeout;
  partners_ = partners;
  links_.clear();
  links_.resize(topology_.size);
  std::vector<bool> higher(topology_.size, false);
  bool any_higher = false;
  for (int p : partners_) {
    if (p < 0 || p >= topology_.size || p == topology_.rank)
      throw std::invalid_argument("PartnerLinks: partner " + std::to_string(p));
    if (p > topology_.rank) higher[p] = any_higher = true;
  }
  const std::string me = std::to_string(topology_.rank);
  int listen_fd = -1;
  if (any_higher) {
    const std::string address =
        topology_.cross_size == 1 ? std::string("127.0.0.1") : localAddress(config_);
    int port = 0;
    listen_fd = listenTcp(address, &port);
    ::fcntl(listen_fd, F_SETFL, ::fcntl(listen_fd, F_GETFL) | O_NONBLOCK);
    store.set(prefix + "agree/" + me, Endpoint{address, port}.encode());
  }
  try {
    // Lower partners first: each listens before it connects anywhere, and
    // rank 0 connects nowhere, so every handshake here is answered.
    for (int p : partners_) {
      if (p > topology_.rank) continue;
      const std::string who = "rank " + std::to_string(p);
      std::string record;
      try {
        record = store.get(prefix + "agree/" + std::to_string(p), config_.start_timeout);
      } catch (const StoreTimeout&) {
        throw std::runtime_error("hvd_torch rendezvous failed on rank " + me + ": " + who +
                                 " did not publish its agreement address");
      }
      const Endpoint at = Endpoint::decode(record);
      const std::string where = who + " at " + at.host + ":" + std::to_string(at.port);
      const int fd = connectTcp(at.host, at.port, deadline);
      if (fd < 0)
        throw std::runtime_error("hvd_torch rendezvous failed on rank " + me + ": cannot reach " + where);
      auto sock = std::make_unique<FrameSocket>(fd);
      proveToPeer(*sock, static_cast<uint32_t>(topology_.rank), "agreement", config_.secret, where,
                  deadline, config_.start_timeout, [&](const char* what) {
                    return "hvd_torch rendezvous failed on rank " + me + ": " + what;
                  });
      // Nothing else goes out before the listener has taken the proof.
      std::string welcome;
      if (!sock->readOne(welcome, deadline))
        throw std::runtime_error("hvd_torch rendezvous failed on rank " + me + ": " + where +
                                 " did not welcome this rank");
      sock->limitFrames(kMaxControlFrame);
      links_[p] = std::move(sock);
    }
    if (any_higher) {
      AcceptOptions options;
      options.purpose = "agreement";
      options.secret = config_.secret;
      options.who = "rank " + me + "'s agreement listener";
      options.deadline = deadline;
      options.welcome_each = true;
      auto accepted = acceptRanks(listen_fd, higher, options, [&](const std::vector<int>& missing) {
        return "hvd_torch rendezvous failed on rank " + me +
               ": agreement partners that never connected: " + rankList(missing);
      });
      for (int p : partners_) {
        if (p <= topology_.rank) continue;
        links_[p] = std::move(accepted[p]);
        links_[p]->flushBlocking(config_.start_timeout);  // the welcome
      }
    }
  } catch (...) {
    if (listen_fd >= 0) ::close(listen_fd);
    throw;
  }
  if (listen_fd >= 0) ::close(listen_fd);
}

void PartnerLinks::send(int rank, const std::string& frame) {
  FrameSocket* s = links_.at(rank).get();
  if (s == nullptr) return;  // dropped: the caller has its failure
  s->send(frame);
  s->flush();
}

bool PartnerLinks::readFrom(int rank, std::vector<std::string>& frames) {
  FrameSocket* s = links_.at(rank).get();
  return s != nullptr && s->readAvailable(frames);
}

void PartnerLinks::watchList(std::vector<pollfd>& fds, std::vector<FrameSocket*>& owners) const {
  for (int p : partners_) {
    const FrameSocket* s = links_[p].get();
    if (s == nullptr) continue;
    fds.push_back({s->fd(), static_cast<short>(POLLIN | (s->wantsWrite() ? POLLOUT : 0)), 0});
    owners.push_back(links_[p].get());
  }
}

bool PartnerLinks::hasOutput() const {
  for (int p : partners_)
    if (links_[p] && links_[p]->hasOutput()) return true;
  return false;
}

bool PartnerLinks::hasInput() const {
  for (int p : partners_)
    if (links_[p] && links_[p]->hasInput()) return true;
  return false;
}

void PartnerLinks::drop(int rank) { links_.at(rank).reset(); }

void PartnerLinks::flushAll() {
  for (int p : partners_)
    if (links_[p]) links_[p]->flush();
}

void PartnerLinks::close() {
  links_.clear();
  links_.resize(topology_.size);
}

}  // namespace hvd
