// Reading the control channel, and a host leader's relay (issue #47,
// control_channel.h): a leader hands its host's ranks' frames, and its own,
// to rank 0 in one relay frame per read or send, each tagged with its rank,
// and rank 0's frames (every one of which goes to every rank) on to each of
// its ranks. Rank 0 takes a relay frame apart and checks that the leader
// speaks only for the ranks of its roster.
#include <algorithm>

#include "control_channel.h"
#include "control_frames.h"
#include "process_sets.h"
#include "wire.h"

namespace hvd {

void ControlChannel::readWorkers(std::vector<FromWorker>& frames, std::vector<int>& lost) {
  for (size_t i = 0; i < links_.size(); ++i)
    if (links_[i].sock) takeLinkFrames(i, frames, lost);
}

void ControlChannel::takeLinkFrames(size_t index, std::vector<FromWorker>& frames, std::vector<int>& lost) {
  Link& link = links_[index];
  std::vector<std::string> raw;
  const bool open = link.sock->readAvailable(raw);
  for (std::string& f : raw) {
    if (!link.leader || !isRelayFrame(f)) {
      if (!dropped(link.rank)) frames.push_back({link.rank, std::move(f)});
      continue;
    }
    std::vector<Relayed> items;
    try {
      items = decodeRelay(f, topology_.size);
    } catch (const WireError& e) {
      throw transportFailure("host leader rank " + std::to_string(link.rank) +
                             " sent rank 0 a malformed relay frame: " + e.what());
    }
    for (Relayed& item : items) {
      // Its own frames come this way too.
      if (link_of_[item.rank] != static_cast<int>(index) || (item.closed && item.rank == link.rank)) {
        throw transportFailure("host leader rank " + std::to_string(link.rank) + " relayed a frame of rank " +
                               std::to_string(item.rank) + ", which is not among its host's ranks " +
                               rankList(link.roster));
      }
      if (dropped(item.rank)) continue;
      if (item.closed) {
        lost.push_back(item.rank);
      } else {
        frames.push_back({item.rank, std::move(item.frame)});
      }
    }
  }
  if (open) return;
  if (dropped(link.rank)) {
    // A leader that said goodbye and left: its ranks that had not can no
    // longer reach rank 0, as if they had said it too.
    for (int r : link.roster)
      if (!dropped(r)) frames.push_back({r, encodeBye()});
  } else {
    lost.push_back(link.rank);
  }
  link.sock.reset();
}

std::string ControlChannel::lostMessage(int rank) const {
  const int index = link_of_.empty() ? -1 : link_of_[rank];
  if (index < 0 || links_[index].rank == rank) {
    if (index >= 0 && links_[index].leader && !links_[index].roster.empty()) {
      return "rank " + std::to_string(rank) + " (the host leader of ranks " +
             rankList(links_[index].roster) +
             ") exited or lost its connection to the coordinator (rank 0)";
    }
    return "rank " + std::to_string(rank) + " exited or lost its connection to the coordinator (rank 0)";
  }
  return "rank " + std::to_string(rank) + " exited or lost its connection to its host leader (rank " +
         std::to_string(links_[index].rank) + ")";
}

void ControlChannel::dropWorker(int rank) {
  if (dropped_.empty()) dropped_.assign(topology_.size, false);
  dropped_[rank] = true;
  const int index = link_of_.empty() ? -1 : link_of_[rank];
  if (index < 0) return;
  // A leader's link carries its ranks' frames until it closes.
  Link& link = links_[index];
  if (link.rank == rank && link.roster.empty()) link.sock.reset();
}

bool ControlChannel::readFromCoordinator(std::vector<std::string>& frames) {
  if (leader_) relayUp();
  if (!to_coordinator_) return false;
  const size_t first = frames.size();
  const bool open = to_coordinator_->readAvailable(frames);
  if (leader_) {
    relayDown(frames, first);
    if (!open) closeHost();  // rank 0 is gone: its ranks learn it as this rank does
  }
  // Rank 0's abort is its last frame. The responses read with it still run
  // (an inline result needs no peer); one that fails on the data plane asks
  // diagnosePeerFailure, which must not wait on a socket that has told all.
  if (frames.size() > first && isAbortFrame(frames.back()))
    abort_ = decodeCoordinatorFrame(frames.back()).abort;
  return open;
}

void ControlChannel::relayUp(const std::string* own) {
  std::vector<Relayed> items;
  size_t bytes = 0;
  bool lost = false;
  auto send = [&] {
    if (items.empty()) return;
    // Rank 0 gone: the read that follows finds it closed.
    if (to_coordinator_) {
      try {
        to_coordinator_->send(encodeRelay(items));
      } catch (const StatusError&) {
        lost = true;
      }
    }
    items.clear();
    bytes = 0;
  };
  // A relay frame holds one entry, or several of at most kRelayBatch bytes
  // in all: never over rank 0's limit for a leader's frames.
  auto add = [&](Relayed item) {
    const size_t size = item.frame.size() + 16;
    if (!items.empty() && bytes + size > kRelayBatch) send();
    bytes += size;
    items.push_back(std::move(item));
  };
  if (own != nullptr) add({topology_.rank, false, *own});
  for (Link& link : links_) {
    if (!link.sock) continue;
    std::vector<std::string> frames;
    const bool open = link.sock->readAvailable(frames);
    relayed_ += frames.size() + (open ? 0 : 1);
    for (std::string& f : frames) add({link.rank, false, std::move(f)});
    if (!open) {
      add({link.rank, true, {}});
      link.sock.reset();
    }
  }
  send();
  if (own != nullptr && (lost || !to_coordinator_)) throw coordinatorLost();
}

void ControlChannel::relayDown(const std::vector<std::string>& frames, size_t first) {
  if (first == frames.size()) return;
  for (Link& link : links_) {
    if (!link.sock) continue;
    try {
      for (size_t i = first; i < frames.size(); ++i) link.sock->send(frames[i]);
    } catch (const StatusError&) {
      // The rank is gone: relayUp finds its connection closed and tells rank 0.
    }
  }
}

void ControlChannel::closeHost() {
  for (Link& link : links_) {
    if (!link.sock) continue;
    try {
      link.sock->flushBlocking(std::chrono::milliseconds(200));
    } catch (const std::exception&) {
    }
  }
  links_.clear();
}

}  // namespace hvd
