// The control channel's traffic once connected (control_channel.h); its
// set-up is control_connect.cc, a host leader's relay control_relay.cc.
#include "control_channel.h"

#include <thread>

#include "control_frames.h"

namespace hvd {

std::string ControlChannel::plane() const {
  if (topology_.size == 1) return "local";
  return rings_.empty() ? "tcp" : "shm";
}

bool ControlChannel::framesOnSockets() const {
  if (topology_.size == 1) return false;
  for (const Link& link : links_)
    if (link.sock && !link.sock->hasRings()) return true;
  return to_coordinator_ && !to_coordinator_->hasRings();
}

void ControlChannel::sendToAll(const std::string& frame) {
  for (Link& link : links_)
    if (link.sock) link.sock->send(frame);
}

void ControlChannel::sendToCoordinator(const std::string& frame) {
  if (!to_coordinator_) {
    throw coordinatorLost();
  }
  // A leader's own frame goes with its host's, in one relay frame.
  if (leader_ && !links_.empty()) {
    relayUp(&frame);
    return;
  }
  to_coordinator_->send(frame);
}

StatusError ControlChannel::coordinatorLost() const {
  if (upstream_rank_ == 0) {
    return transportFailure("lost the control connection to rank 0 (the coordinator): it exited, "
                            "crashed or called shutdown()");
  }
  const std::string leader = std::to_string(upstream_rank_);
  return transportFailure("lost the control connection to rank 0 (the coordinator) through host leader rank " +
                          leader + ": rank " + leader + " or rank 0 exited, crashed or called shutdown()");
}

void ControlChannel::dropCoordinator() {
  to_coordinator_.reset();
  if (leader_) closeHost();
}

void ControlChannel::watchList(int wake_fd, std::vector<pollfd>& fds,
                               std::vector<FrameSocket*>& owners) const {
  fds.clear();
  owners.clear();
  fds.push_back({wake_fd, POLLIN, 0});
  owners.push_back(nullptr);
  auto watch = [&](FrameSocket* s) {
    fds.push_back({s->fd(), static_cast<short>(POLLIN | (s->wantsWrite() ? POLLOUT : 0)), 0});
    owners.push_back(s);
  };
  for (const Link& link : links_)
    if (link.sock) watch(link.sock.get());
  if (to_coordinator_) watch(to_coordinator_.get());
}

bool ControlChannel::hasInput() const {
  for (const Link& link : links_)
    if (link.sock && link.sock->hasInput()) return true;
  return to_coordinator_ && to_coordinator_->hasInput();
}

bool ControlChannel::hasOutput() const {
  for (const Link& link : links_)
    if (link.sock && link.sock->hasOutput()) return true;
  return to_coordinator_ && to_coordinator_->hasOutput();
}

void ControlChannel::flushAll() {
  for (Link& link : links_)
    if (link.sock) link.sock->flush();
  if (to_coordinator_) to_coordinator_->flush();
}

void ControlChannel::noteAllReadable() {
  for (Link& link : links_)
    if (link.sock) link.sock->noteReadable();
  if (to_coordinator_) to_coordinator_->noteReadable();
}

bool ControlChannel::sleepIfIdle() {
  bool idle = true;
  for (Link& link : links_)
    if (link.sock) idle = link.sock->sleepIfIdle() && idle;
  if (to_coordinator_) idle = to_coordinator_->sleepIfIdle() && idle;
  return idle;
}

void ControlChannel::awake() {
  for (Link& link : links_)
    if (link.sock) link.sock->awake();
  if (to_coordinator_) to_coordinator_->awake();
}

void ControlChannel::sayBye() {
  if (!to_coordinator_) return;
  try {
    // A leader first passes on what its ranks sent (their goodbyes among it).
    if (leader_) relayUp();
    to_coordinator_->send(encodeBye());
    to_coordinator_->flushBlocking(std::chrono::milliseconds(1000));
  } catch (const std::exception&) {
  }
}

void ControlChannel::abortAll(const Status& status) {
  const std::string abort = encodeAbort(status);
  for (Link& link : links_) {
    if (!link.sock) continue;
    try {
      link.sock->send(abort);
      link.sock->flushBlocking(std::chrono::milliseconds(1000));
    } catch (const std::exception&) {
    }
  }
}

Status ControlChannel::diagnosePeerFailure() {
  if (!abort_.ok()) return abort_;  // already read, with the frames before it
  // The data plane only says "connection reset"; the control plane knows who
  // died. Give it a moment to tell us, so the error names the rank.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (std::chrono::steady_clock::now() < deadline) {
    if (to_coordinator_) {
      std::vector<std::string> frames;
      const bool open = readFromCoordinator(frames);
      for (const auto& f : frames) {
        if (isAbortFrame(f)) return decodeCoordinatorFrame(f).abort;
      }
      if (!open) return Status::peerFailure(coordinatorLost().status.message);
    }
    if (topology_.rank == 0) {
      std::vector<FromWorker> frames;
      std::vector<int> lost;
      try {
        readWorkers(frames, lost);
      } catch (const StatusError& e) {
        return e.status;
      }
      if (!lost.empty()) return Status::peerFailure(lostMessage(lost[0]));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return Status::Ok();
}

void ControlChannel::close() {
  links_.clear();
  to_coordinator_.reset();
}

}  // namespace hvd
