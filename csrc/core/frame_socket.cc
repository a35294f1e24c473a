#include "frame_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "types.h"

namespace hvd {

namespace {

int msUntil(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(left.count());
}

void tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

bool resolve(const std::string& host, int port, sockaddr_storage* addr, socklen_t* len) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return false;
  std::memcpy(addr, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  freeaddrinfo(res);
  return true;
}

}  // namespace

FrameSocket::FrameSocket(int fd) : fd_(fd) {
  tune(fd_);
  fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK);
}

FrameSocket::~FrameSocket() {
  if (fd_ >= 0) ::close(fd_);
}

void FrameSocket::send(const std::string& payload) {
  uint32_t n = static_cast<uint32_t>(payload.size());
  outbox_.append(reinterpret_cast<const char*>(&n), 4);
  outbox_ += payload;
  flush();
}

void FrameSocket::attachRings(ByteRing* out, ByteRing* in) {
  out_ring_ = out;
  in_ring_ = in;
  inbox_.clear();  // nothing follows the last handshake frame on the socket
  flushToRing();
}

void FrameSocket::ringDoorbell() {
  const char bell = 1;
  // A full socket buffer already holds doorbells the peer has not read.
  if (::send(fd_, &bell, 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN &&
      errno != EWOULDBLOCK && errno != EINTR) {
    throw transportFailure(std::string("control connection lost: ") + std::strerror(errno));
  }
}

void FrameSocket::flushToRing() {
  while (!outbox_.empty()) {
    const size_t n = out_ring_->write(outbox_.data(), outbox_.size());
    outbox_.erase(0, n);
    if (n > 0 && out_ring_->readerSleeping()) ringDoorbell();
    if (!outbox_.empty() && out_ring_->waitForRoom()) return;
  }
}

void FrameSocket::flush() {
  if (out_ring_ != nullptr) return flushToRing();
  size_t off = 0;
  while (off < outbox_.size()) {
    ssize_t w = ::send(fd_, outbox_.data() + off, outbox_.size() - off, MSG_NOSIGNAL);
    if (w > 0) {
      off += static_cast<size_t>(w);
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    } else {
      throw transportFailure(std::string("control connection lost: ") + std::strerror(errno));
    }
  }
  outbox_.erase(0, off);
}

void FrameSocket::flushBlocking(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  flush();
  while (out_ring_ != nullptr && !outbox_.empty()) {
    // The reader rings when it has made room; poll a little at a time anyway.
    if (std::chrono::steady_clock::now() >= deadline)
      throw transportFailure("control connection stalled while sending");
    pollfd p{fd_, POLLIN, 0};
    ::poll(&p, 1, 1);
    flush();
  }
  while (wantsWrite()) {
    pollfd p{fd_, POLLOUT, 0};
    int ms = msUntil(deadline);
    if (ms == 0) throw transportFailure("control connection stalled while sending");
    ::poll(&p, 1, ms);
    flush();
  }
}

bool FrameSocket::readAvailable(std::vector<std::string>& frames) {
  for (auto& f : held_) frames.push_back(std::move(f));
  held_.clear();
  if (refused_) return false;
  bool open = true;
  char buf[65536];
  const bool read_socket = in_ring_ == nullptr || socket_readable_;
  socket_readable_ = false;
  // At most this much per call: a peer that sends as fast as we read cannot
  // keep us here (poll() reports the rest: the caller comes back).
  size_t budget = size_t{1} << 20;
  while (read_socket && budget > 0) {
    ssize_t r = ::recv(fd_, buf, sizeof(buf), 0);
    if (r > 0) {
      budget -= std::min(budget, static_cast<size_t>(r));
      // With rings, what comes over the socket is doorbells.
      if (in_ring_ == nullptr) {
        inbox_.append(buf, static_cast<size_t>(r));
        // Frame what has arrived before reading on: a length header over
        // the limit fails the connection now, with at most one read of the
        // bytes streamed after it held, not all that came meanwhile.
        if (!takeFrames(frames)) return false;
      }
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    open = false;  // 0 = orderly close, <0 = reset
    break;
  }
  if (in_ring_ != nullptr) {
    // Read after the socket: a peer that wrote its last frames and exited
    // has them in the ring.
    in_ring_->read(inbox_);
    if (in_ring_->takeWaitingWriter() && open) ringDoorbell();
    // The socket just drained may have held the peer's "room in your ring"
    // doorbell, rung after our last flush: act on it now, or a frame larger
    // than the ring waits for a doorbell that was already taken.
    if (read_socket && open && !outbox_.empty()) flushToRing();
  }
  if (!takeFrames(frames)) return false;
  return open;
}

bool FrameSocket::takeFrames(std::vector<std::string>& frames) {
  size_t off = 0;
  while (inbox_.size() - off >= 4) {
    uint32_t n;
    std::memcpy(&n, inbox_.data() + off, 4);
    if (n > max_frame_) {
      refused_ = true;
      inbox_.clear();
      inbox_.shrink_to_fit();
      return false;
    }
    if (inbox_.size() - off - 4 < n) break;
    frames.emplace_back(inbox_, off + 4, n);
    off += 4 + n;
  }
  inbox_.erase(0, off);
  return true;
}

bool FrameSocket::readOne(std::string& frame, std::chrono::steady_clock::time_point deadline) {
  std::vector<std::string> frames;
  while (true) {
    if (!readAvailable(frames) && frames.empty()) return false;
    if (!frames.empty()) {
      frame = std::move(frames[0]);
      // What came with it (a partner's first message after its welcome)
      // waits for the next read.
      held_.assign(std::make_move_iterator(frames.begin() + 1),
                   std::make_move_iterator(frames.end()));
      return true;
    }
    pollfd p{fd_, POLLIN, 0};
    int ms = msUntil(deadline);
    if (ms == 0 || ::poll(&p, 1, ms) == 0) return false;
  }
}

int listenTcp(const std::string& host, int* port) {
  sockaddr_storage addr{};
  socklen_t len = 0;
  if (!resolve(host, *port, &addr, &len)) throw std::runtime_error("cannot resolve " + host);
  int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd, 128) != 0) {
    int e = errno;
    ::close(fd);
    throw std::runtime_error("cannot listen on " + host + ": " + std::strerror(e));
  }
  sockaddr_storage bound{};
  socklen_t blen = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &blen);
  *port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return fd;
}

int connectTcp(const std::string& host, int port, std::chrono::steady_clock::time_point deadline) {
  sockaddr_storage addr{};
  socklen_t len = 0;
  while (true) {
    if (resolve(host, port, &addr, &len)) {
      int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0) return fd;
      if (fd >= 0) ::close(fd);
    }
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

int acceptTcp(int listen_fd, std::chrono::steady_clock::time_point deadline) {
  while (true) {
    pollfd p{listen_fd, POLLIN, 0};
    int ms = msUntil(deadline);
    int r = ::poll(&p, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) return fd;
  }
}

}  // namespace hvd
