// The control channel's framing (frame_socket.h) over a socket pair, with and
// without shared-memory rings (byte_ring.h): frames arrive whole and in order,
// a frame larger than its ring gets through, and no doorbell is lost between
// a writer's flush and its next read (the hang issue #28's pools found).
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "core/byte_ring.h"
#include "core/frame_socket.h"
#include "core/types.h"

using namespace hvd;

namespace {

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

// Two connected FrameSockets; with a ring capacity, a ring each way.
struct Pair {
  std::unique_ptr<FrameSocket> a, b;
  std::vector<std::unique_ptr<char[]>> memory;
  std::vector<std::unique_ptr<ByteRing>> rings;

  explicit Pair(size_t ring_capacity = 0) {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) throw std::runtime_error("socketpair");
    a = std::make_unique<FrameSocket>(fds[0]);
    b = std::make_unique<FrameSocket>(fds[1]);
    if (ring_capacity == 0) return;
    for (int i = 0; i < 2; ++i) {
      const size_t bytes = ByteRing::footprint(ring_capacity);
      memory.emplace_back(new char[bytes]());
      rings.push_back(std::make_unique<ByteRing>(memory.back().get(), ring_capacity));
    }
    a->attachRings(rings[0].get(), rings[1].get());
    b->attachRings(rings[1].get(), rings[0].get());
  }
};

// One engine cycle as Engine::cycle() runs it: flush, then read what came.
// `polled` is what poll() said of the socket before the cycle.
void cycle(FrameSocket& s, std::vector<std::string>& got) {
  if (readable(s.fd())) s.noteReadable();
  s.flush();
  s.readAvailable(got);
}

// Whether an engine with this socket would go to sleep now with work left:
// nothing on the socket and nothing in its incoming ring.
bool wouldSleep(FrameSocket& s) { return !readable(s.fd()) && !s.hasInput(); }

std::string pattern(size_t n, char seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 7);
  return s;
}

// Drives both ends, cycle by cycle, as two engines that sleep whenever
// wouldSleep() says so; fails (returns false) if both would sleep with
// bytes still queued: a lost wake-up.
bool deliver(Pair& p, std::vector<std::string>& at_a, std::vector<std::string>& at_b,
             size_t want_a, size_t want_b) {
  for (int round = 0; round < 100000; ++round) {
    if (at_a.size() >= want_a && at_b.size() >= want_b) return true;
    const bool a_idle = wouldSleep(*p.a) && !p.b->hasInput();
    const bool b_idle = wouldSleep(*p.b) && !p.a->hasInput();
    if (a_idle && b_idle && (p.a->hasOutput() || p.b->hasOutput())) return false;
    cycle(*p.a, at_a);
    cycle(*p.b, at_b);
  }
  return false;
}

}  // namespace

TEST(frames_arrive_whole_and_in_order_over_the_socket) {
  Pair p;
  p.a->send("one");
  p.a->send("");
  p.a->send(pattern(100000, 'x'));
  std::vector<std::string> at_a, at_b;
  CHECK(deliver(p, at_a, at_b, 0, 3));
  CHECK_EQ(at_b.size(), size_t{3});
  if (at_b.size() == 3) {
    CHECK_EQ(at_b[0], std::string("one"));
    CHECK_EQ(at_b[1], std::string(""));
    CHECK(at_b[2] == pattern(100000, 'x'));
  }
}

TEST(frames_larger_than_the_ring_arrive_whole_both_ways) {
  Pair p(64);
  p.a->send(pattern(5000, 'a'));
  p.b->send(pattern(3000, 'b'));
  p.a->send("after");
  std::vector<std::string> at_a, at_b;
  CHECK(deliver(p, at_a, at_b, 1, 2));
  CHECK_EQ(at_a.size(), size_t{1});
  CHECK_EQ(at_b.size(), size_t{2});
  if (at_a.size() == 1) CHECK(at_a[0] == pattern(3000, 'b'));
  if (at_b.size() == 2) {
    CHECK(at_b[0] == pattern(5000, 'a'));
    CHECK_EQ(at_b[1], std::string("after"));
  }
}

TEST(a_room_doorbell_taken_by_a_read_is_acted_on) {
  // The writer fills the ring and waits for room; the reader makes room and
  // rings; the writer's next read drains that doorbell before it flushes
  // again. Without acting on it, both engines would sleep forever.
  Pair p(64);
  p.a->send(pattern(1000, 'r'));  // fills the ring; a waits for room
  CHECK(p.a->hasOutput());
  std::vector<std::string> at_a, at_b;
  p.b->noteReadable();
  p.b->readAvailable(at_b);  // takes 64 bytes, rings a's doorbell
  CHECK(readable(p.a->fd()));
  p.a->noteReadable();
  p.a->readAvailable(at_a);  // drains the doorbell: a must write on
  CHECK(p.b->hasInput() || readable(p.a->fd()));
  CHECK(deliver(p, at_a, at_b, 0, 1));
  CHECK_EQ(at_b.size(), size_t{1});
  if (at_b.size() == 1) CHECK(at_b[0] == pattern(1000, 'r'));
}

TEST(a_closed_peer_is_seen_after_its_last_frames) {
  Pair p(64);
  p.a->send("last");
  std::vector<std::string> at_a, at_b;
  CHECK(deliver(p, at_a, at_b, 0, 1));
  p.a.reset();  // closes a's end
  std::vector<std::string> more;
  p.b->noteReadable();
  CHECK(!p.b->readAvailable(more));
  CHECK(more.empty());
}

TEST(send_to_a_closed_peer_throws) {
  Pair p;
  p.b.reset();
  bool threw = false;
  try {
    for (int i = 0; i < 100; ++i) p.a->send(pattern(100000, 'z'));
  } catch (const std::runtime_error&) {
    threw = true;
  }
  CHECK(threw);
}

// The handshake's limit (control_channel.cc): a header saying more fails the
// connection at once, before its bytes are buffered; the frames before it
// are kept, and a limit lifted lets large frames through again.
TEST(a_frame_over_the_limit_fails_the_connection_without_buffering_it) {
  Pair p;
  p.b->limitFrames(16);
  p.a->send("hello");
  p.a->send(std::string(17, 'x'));
  std::vector<std::string> got;
  CHECK(!p.b->readAvailable(got));
  CHECK_EQ(got.size(), size_t{1});
  if (got.size() == 1) CHECK(got[0] == "hello");
  p.a->send("more");
  CHECK(!p.b->readAvailable(got));  // stays failed
  CHECK_EQ(got.size(), size_t{1});

  Pair q;
  q.b->limitFrames(16);
  q.a->send(std::string(16, 'y'));
  std::vector<std::string> at_b;
  CHECK(q.b->readAvailable(at_b));
  q.b->limitFrames(UINT32_MAX);
  q.a->send(pattern(100, 'l'));
  CHECK(q.b->readAvailable(at_b));
  CHECK_EQ(at_b.size(), size_t{2});
}

// A peer that scribbles on a ring's header (head and tail further apart
// than the ring holds) breaks the connection as a peer failure; before the
// fix, read() copied from beyond the ring (tests/fuzz/regressions/byte_ring).
TEST(a_corrupt_ring_is_a_peer_failure_not_a_read_beyond_it) {
  for (int side = 0; side < 2; ++side) {
    const size_t capacity = 32;
    std::unique_ptr<char[]> memory(new char[ByteRing::footprint(capacity)]());
    ByteRing ring(memory.get(), capacity);
    CHECK_EQ(ring.write("abc", 3), size_t{3});
    const uint64_t bad = side == 0 ? 1000 : uint64_t{5} << 40;  // head, then tail
    std::memcpy(memory.get() + (side == 0 ? 0 : 64), &bad, sizeof(bad));
    std::string got;
    bool read_threw = false, write_threw = false;
    try {
      ring.read(got);
    } catch (const StatusError& e) {
      read_threw = e.status.code == Status::kPeerFailure;
    }
    try {
      ring.write("d", 1);
    } catch (const StatusError& e) {
      write_threw = e.status.code == Status::kPeerFailure;
    }
    CHECK(read_threw);
    CHECK(write_threw);
    CHECK(got.empty());
  }
}

int main() { return check::runAll(); }
