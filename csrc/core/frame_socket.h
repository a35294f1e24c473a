// Length-prefixed frames over a TCP socket: the control plane between the
// coordinator (rank 0) and every other rank. Reads never block and return
// whole frames only. Sends queue and write what the socket takes: a rank must
// never block in send() while its peer blocks in a collective that needs it.
// With rings attached (every rank on one host), the frames' bytes go through
// shared memory instead and the socket carries only doorbells (byte_ring.h)
// and, by closing, a peer's death.
//
// Threading: one thread at a time per socket (the holder of the engine's
// baton).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "byte_ring.h"

namespace hvd {

class FrameSocket {
 public:
  explicit FrameSocket(int fd);
  ~FrameSocket();
  FrameSocket(const FrameSocket&) = delete;
  FrameSocket& operator=(const FrameSocket&) = delete;

  int fd() const { return fd_; }
  // Queues a frame and writes as much as the socket takes now.
  // Throws std::runtime_error when the peer is gone.
  void send(const std::string& payload);
  // Writes queued bytes without blocking; throws when the peer is gone.
  void flush();
  // Bytes queued that the socket would take once writable (never with rings:
  // the reader rings when it has made room).
  bool wantsWrite() const { return !outbox_.empty() && out_ring_ == nullptr; }
  // Bytes queued, through either plane (with rings: waiting for the reader's room).
  bool hasOutput() const { return !outbox_.empty(); }
  // Blocks until everything queued is written (handshakes, last words).
  void flushBlocking(std::chrono::milliseconds timeout);
  // Appends every complete frame that has arrived. Returns false once the
  // peer closed the connection or it failed (frames before that are kept).
  bool readAvailable(std::vector<std::string>& frames);
  // From now on a frame whose length header says more than max_bytes fails
  // the connection (readAvailable() returns false; the frames before it are
  // kept) instead of being buffered: the handshake reads from anyone who can
  // connect, and a u32 length would otherwise let them make it hold 4 GiB.
  void limitFrames(uint32_t max_bytes) { max_frame_ = max_bytes; }
  // Blocks until one frame arrives or the deadline passes (handshakes only);
  // frames that came with it are kept for readAvailable().
  bool readOne(std::string& frame, std::chrono::steady_clock::time_point deadline);

  // From now on frames go out through `out` and come in through `in` (both
  // ends switch between two frames: nothing may be in flight on the socket).
  void attachRings(ByteRing* out, ByteRing* in);
  bool hasRings() const { return in_ring_ != nullptr; }
  // Rings: a frame's bytes have arrived (readAvailable() will not be idle).
  bool hasInput() const { return !held_.empty() || (in_ring_ != nullptr && !in_ring_->empty()); }
  // Rings: before the engine sleeps in poll(); false when input came meanwhile.
  bool sleepIfIdle() { return in_ring_ == nullptr || in_ring_->sleepIfEmpty(); }
  void awake() {
    if (in_ring_ != nullptr) in_ring_->wake();
  }
  // poll() saw the socket readable: with rings, readAvailable() reads the
  // socket (doorbells, a close) only then, sparing a system call per round.
  void noteReadable() { socket_readable_ = true; }

 private:
  // Moves the complete frames at the front of inbox_ to `frames`; false (and
  // the connection failed) at a length header over max_frame_.
  bool takeFrames(std::vector<std::string>& frames);
  void ringDoorbell();
  void flushToRing();

  int fd_;
  ByteRing* out_ring_ = nullptr;
  ByteRing* in_ring_ = nullptr;
  bool socket_readable_ = true;
  uint32_t max_frame_ = UINT32_MAX;
  bool refused_ = false;  // a frame over max_frame_ arrived: the connection failed
  std::string inbox_;
  std::vector<std::string> held_;  // frames readOne read past its one
  std::string outbox_;
};

// Listening socket on `host` (port 0 = any free port).
int listenTcp(const std::string& host, int* port);
// Connects with retries until the deadline; returns -1 on failure.
int connectTcp(const std::string& host, int port, std::chrono::steady_clock::time_point deadline);
// Accepts one connection, waiting until the deadline; -1 on timeout.
int acceptTcp(int listen_fd, std::chrono::steady_clock::time_point deadline);

}  // namespace hvd
