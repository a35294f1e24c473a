// Fuzz target: FrameSocket's reassembly of frames (csrc/core/frame_socket.h)
// from what a peer writes, over a socket pair (nothing else is reached).
//
// Input: one byte picks the mode.
//   raw:     the rest is a byte stream a peer writes in pieces (one byte
//            gives each piece's length); the frames read back must be exactly
//            the complete frames of that stream, in order, none of them past
//            the first frame over the socket's frame limit (also from the
//            input), and once the peer hangs up the socket says it is closed.
//   sockets: the rest is a list of payloads that one FrameSocket sends to
//            another; they arrive whole and in order.
//   rings:   the same through a pair of small shared-memory rings (the
//            capacity is from the input, so frames wrap and outgrow them).
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <stdexcept>
#include <vector>

#include "core/byte_ring.h"
#include "core/frame_socket.h"
#include "fuzz_check.h"

using namespace hvd;

namespace {

void socketPair(int fds[2]) {
  FUZZ_CHECK(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
}

// The complete frames at the front of `stream`, up to the first one over
// `limit` (*refused is set then).
std::vector<std::string> referenceFrames(const std::string& stream, uint32_t limit, bool* refused) {
  std::vector<std::string> out;
  size_t at = 0;
  *refused = false;
  while (stream.size() - at >= 4) {
    uint32_t n;
    std::memcpy(&n, stream.data() + at, 4);
    if (n > limit) {
      *refused = true;
      break;
    }
    if (stream.size() - at - 4 < n) break;
    out.push_back(stream.substr(at + 4, n));
    at += 4 + n;
  }
  return out;
}

void rawStream(fuzz::Input& in) {
  const uint32_t limit = in.byte() == 0 ? UINT32_MAX : in.u32() % 512;
  int fds[2];
  socketPair(fds);
  FrameSocket reader(fds[0]);
  reader.limitFrames(limit);
  std::string written;
  std::vector<std::string> got;
  bool open = true;
  while (!in.empty()) {
    const std::string piece = in.bytes(in.byte());
    FUZZ_CHECK(::send(fds[1], piece.data(), piece.size(), MSG_NOSIGNAL) ==
               static_cast<ssize_t>(piece.size()));
    written += piece;
    open = reader.readAvailable(got) && open;
  }
  ::close(fds[1]);
  const bool open_after_close = reader.readAvailable(got);
  bool refused = false;
  const std::vector<std::string> want = referenceFrames(written, limit, &refused);
  FUZZ_CHECK(got == want);
  // Open until the peer hung up, unless a frame was refused.
  FUZZ_CHECK(open == !refused || (refused && !open));
  FUZZ_CHECK(!open_after_close);
}

std::vector<std::string> payloads(fuzz::Input& in) {
  std::vector<std::string> out;
  while (!in.empty()) out.push_back(in.bytes(in.byte()));
  return out;
}

void sockets(fuzz::Input& in) {
  const std::vector<std::string> sent = payloads(in);
  int fds[2];
  socketPair(fds);
  FrameSocket a(fds[0]), b(fds[1]);
  std::vector<std::string> got;
  for (const auto& p : sent) {
    a.send(p);
    FUZZ_CHECK(b.readAvailable(got));
  }
  FUZZ_CHECK(!a.hasOutput());
  FUZZ_CHECK(got == sent);
}

void rings(fuzz::Input& in) {
  const size_t capacity = 1 + in.byte() % 96;
  const std::vector<std::string> sent = payloads(in);
  int fds[2];
  socketPair(fds);
  FrameSocket a(fds[0]), b(fds[1]);
  std::vector<std::unique_ptr<char[]>> memory;
  std::vector<std::unique_ptr<ByteRing>> ring;
  for (int i = 0; i < 2; ++i) {
    memory.emplace_back(new char[ByteRing::footprint(capacity)]());
    ring.push_back(std::make_unique<ByteRing>(memory.back().get(), capacity));
  }
  a.attachRings(ring[0].get(), ring[1].get());
  b.attachRings(ring[1].get(), ring[0].get());
  std::vector<std::string> got, none;
  for (const auto& p : sent) {
    a.send(p);
    // Each turn moves at least one byte: the reader empties the ring, the
    // writer refills it. Bounded by the bytes to move.
    for (size_t turn = 0; turn <= 4 + p.size() && (a.hasOutput() || b.hasInput()); ++turn) {
      b.noteReadable();
      FUZZ_CHECK(b.readAvailable(got));
      a.noteReadable();
      FUZZ_CHECK(a.readAvailable(none));
      a.flush();
    }
    FUZZ_CHECK(!a.hasOutput());
  }
  b.noteReadable();
  FUZZ_CHECK(b.readAvailable(got));
  FUZZ_CHECK(none.empty());
  FUZZ_CHECK(got == sent);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (64 << 10)) return 0;  // within one socket buffer: nothing blocks
  fuzz::Input in(data, size);
  switch (in.byte() % 3) {
    case 0: rawStream(in); break;
    case 1: sockets(in); break;
    default: rings(in); break;
  }
  return 0;
}
