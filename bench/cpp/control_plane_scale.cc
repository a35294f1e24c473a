// The control plane at scale, simulated (issue #32 item 3): N ranks' arrivals
// driven through rank 0's real Coordinator, CoordinatorCache and planFusion in
// one process, with no sockets, the way Engine::readWorkers feeds them (every
// rank's frame in rank order, then takeReady).
//
// For each N it measures, over --reps fresh coordinators:
//   cached: a step of --ops allreduces whose names every rank has cached
//           (N x ops slot-id arrivals, then one fused response); cost per op
//   new:    a name seen for the first time (N full requests, validation, a
//           new cache slot); cost per op, the coordinator alone
//   new with its frames (issue #47), two ways: rank 0's work for a new name
//           from the frames it reads to the frames it queues:
//     star:    N - 1 frames, one per rank (decodeWorkerFrame), the
//              coordinator's work, one encodeResponses and N - 1 sends
//     leaders: --per-host ranks per host; rank 0's own host's ranks send
//              directly, each other host's leader sends one relay frame of
//              its own frame and its ranks' (decodeRelay, then
//              decodeWorkerFrame of each), and the response goes once to
//              each of rank 0's host's ranks and once to each leader
//           A send is what FrameSocket::send costs before the kernel: the
//           frame appended, after its length, to the link's outbox.
//   kernel: what the kernel adds to a new op, both ways, over real sockets
//           (--sockets: TCP on loopback, as rank 0's links to other hosts
//           are, or AF_UNIX pairs): the other ranks' ends write the very
//           frames the way above decoded, then, timed, rank 0 recv()s every
//           link until EAGAIN into a 64 KiB buffer (FrameSocket::readAvailable)
//           and send()s the response frame that way encoded, after its
//           length, on every link; the other ends' reads are not timed. Up
//           to the N whose 2 (N - 1) descriptors the file limit allows.
//   memory: bytes the coordinator holds (mallinfo2's in-use bytes, before
//           and after), per simulated rank: at steady state with --ops names
//           cached, and per rank per added cache slot
// and checks every response while it measures. The ranks' frames are encoded
// before the clock starts: only rank 0's work is timed. Prints a table; --json
// writes the figures for bench/control_plane_plot.py.
#include <arpa/inet.h>
#include <fcntl.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/control_frames.h"
#include "core/coordinator.h"

using namespace hvd;

namespace {

// Cache slots of each simulated coordinator: --ops names, then up to
// kMaxNewOps new names for each of the three ways a new op is measured.
constexpr size_t kCacheCapacity = 1024;
constexpr long kMaxNewOps = 256;
constexpr int kMaxOps = static_cast<int>(kCacheCapacity - 3 * kMaxNewOps);

struct Options {
  int min_ranks = 2;
  int max_ranks = 16384;
  int ops = 8;        // allreduces per cached step (one fused response)
  int per_host = 8;   // ranks per host, host leaders' way of a new op
  int reps = 5;       // fresh coordinators per N
  long arrivals = 200000;  // per timed cached set: steps = arrivals / (N x ops)
  long new_arrivals = 100000;  // per timed set of new ops
  long kernel_arrivals = 20000;  // per timed kernel set: frames rank 0 reads, star way
  bool tcp = true;               // --sockets tcp (loopback) or unix (socketpair)
  std::string json;
};

// A gradient's request as a rank sends it: above the inline threshold, a
// name longer than std::string's inline buffer (as real parameter names are).
Request gradient(const std::string& name) {
  Request q;
  q.type = OpType::kAllreduce;
  q.dtype = DataType::kFloat32;
  q.reduce_op = ReduceOp::kAverage;
  q.name = name;
  q.shape = {256, 256};
  return q;
}

std::string opName(const char* kind, int i) {
  return std::string("allreduce.model.layer") + std::to_string(i) + "." + kind + ".weight.grad";
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "control_plane_scale: %s\n", what.c_str());
  std::exit(1);
}

size_t heapInUse() { return mallinfo2().uordblks; }

// This thread's CPU time, not the wall clock: the machine is shared, and a
// time slice lost to another process is not the coordinator's cost.
double cpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + t.tv_nsec * 1e-9;
}

void submit(Coordinator& c, Arrival&& a) {
  const Status status = c.add(std::move(a));
  if (!status.ok()) fail(status.message);
}

// A new name's responses: exactly one, to execute it, with its new slot.
int32_t checkNew(const std::vector<Response>& out, const Request& q) {
  if (out.size() != 1 || out[0].kind != Response::kExecute || out[0].cache_ids.size() != 1 ||
      out[0].cache_ids[0] < 0 || out[0].names.size() != 1 || out[0].names[0] != q.name)
    fail("a new op did not come back as one cached execute response");
  return out[0].cache_ids[0];
}

// Negotiates `name` in full: every rank sends its request. Returns the slot.
int32_t negotiateNew(Coordinator& c, int n, const Request& q) {
  for (int r = 0; r < n; ++r) {
    Arrival a;
    a.rank = r;
    a.request = q;
    submit(c, std::move(a));
  }
  return checkNew(c.takeReady(), q);
}

// The job's hosts for the host leaders' way: host h holds ranks
// [h * per_host, min(n, (h + 1) * per_host)), and its first rank leads it.
struct Hosts {
  int n = 0;
  int per_host = 0;
  int count() const { return (n + per_host - 1) / per_host; }
  int first(int h) const { return h * per_host; }
  int end(int h) const { return std::min(n, (h + 1) * per_host); }
};

// Frames rank 0 handles per new op, each way: the links it reads (at least a
// read each), the frames it decodes off them (a relay frame counted once, not
// the frames inside it) and the frames it sends.
struct FrameCounts {
  long reads = 0;
  long frames = 0;
  long writes = 0;
};

FrameCounts starCounts(int n) { return {n - 1L, n - 1L, n - 1L}; }

// With host leaders, rank 0's links are its own host's other ranks and each
// other host's leader, whose own arrivals travel in its relay frame with its
// ranks' (control_relay.cc): one frame per link.
FrameCounts leaderCounts(const Hosts& hosts) {
  FrameCounts c;
  c.reads = c.writes = c.frames = (hosts.end(0) - 1) + (hosts.count() - 1);
  return c;
}

// A rank's frame for its one new request, as its engine encodes it.
std::string arrivalFrame(const Request& q) {
  std::vector<Arrival> one(1);
  one[0].request = q;
  return encodeArrivals(one);
}

// What rank 0 reads for one new name, made before the clock starts; every
// frame is its own buffer, as each arrives on its own link.
struct Incoming {
  Request own;  // rank 0's own request, which reaches its coordinator unencoded
  std::vector<std::pair<int, std::string>> direct;  // (rank, frame): a link per rank
  struct Leader {
    int rank = 0;
    int end = 0;         // its host is [rank, end)
    std::string relay;   // its own frame and its host's ranks'
  };
  std::vector<Leader> leaders;
};

Incoming starFrames(int n, const Request& q) {
  Incoming in;
  in.own = q;
  for (int r = 1; r < n; ++r) in.direct.emplace_back(r, arrivalFrame(q));
  return in;
}

Incoming leaderFrames(const Hosts& hosts, const Request& q) {
  Incoming in;
  in.own = q;
  for (int r = 1; r < hosts.end(0); ++r) in.direct.emplace_back(r, arrivalFrame(q));
  for (int h = 1; h < hosts.count(); ++h) {
    Incoming::Leader leader;
    leader.rank = hosts.first(h);
    leader.end = hosts.end(h);
    std::vector<Relayed> items;
    for (int r = leader.rank; r < leader.end; ++r) items.push_back({r, false, arrivalFrame(q)});
    leader.relay = encodeRelay(items);
    in.leaders.push_back(std::move(leader));
  }
  return in;
}

void feed(Coordinator& c, const std::string& frame, int rank) {
  WorkerFrame f = decodeWorkerFrame(frame, rank);
  if (f.kind != WorkerFrame::kRequests || f.arrivals.size() != 1) fail("a rank's frame decoded wrong");
  submit(c, std::move(f.arrivals[0]));
}

// Rank 0's work for one new name, from what it read to what it queued:
// decode every frame (a relay's, then each one in it, checking that its
// leader speaks only for its own host, as ControlChannel::takeLinkFrames
// does), feed the coordinator, encode its response once and append it to
// every link's outbox (FrameSocket::send before its flush, whose erase the
// clear() stands for). Returns the new slot; the response frame is left in
// `response`, for the kernel's part.
int32_t newWithFrames(Coordinator& c, int n, const Incoming& in, std::vector<std::string>& outboxes,
                      std::string& response) {
  Arrival mine;
  mine.rank = 0;
  mine.request = in.own;
  submit(c, std::move(mine));
  for (const auto& [rank, frame] : in.direct) feed(c, frame, rank);
  for (const Incoming::Leader& leader : in.leaders) {
    if (!isRelayFrame(leader.relay)) fail("a leader's relay frame is not one");
    for (const Relayed& item : decodeRelay(leader.relay, n)) {
      if (item.closed || item.rank < leader.rank || item.rank >= leader.end)
        fail("a leader relayed a rank not of its host");
      feed(c, item.frame, item.rank);
    }
  }
  const std::vector<Response> out = c.takeReady();
  const int32_t slot = checkNew(out, in.own);
  std::string frame = encodeResponses(out);
  const uint32_t length = static_cast<uint32_t>(frame.size());
  for (std::string& box : outboxes) {
    box.append(reinterpret_cast<const char*>(&length), sizeof length);
    box += frame;
  }
  for (std::string& box : outboxes) box.clear();
  response = std::move(frame);
  return slot;
}

// One steady-state step: every rank names every op by its slot.
void cachedStep(Coordinator& c, int n, const std::vector<int32_t>& slots) {
  for (int r = 0; r < n; ++r) {
    for (int32_t slot : slots) {
      Arrival a;
      a.rank = r;
      a.cache_id = slot;
      submit(c, std::move(a));
    }
  }
  std::vector<Response> out = c.takeReady();
  size_t names = 0;
  for (const auto& r : out) {
    if (r.kind != Response::kExecute) fail("a cached op did not come back as execute");
    for (int32_t id : r.cache_ids)
      if (id < 0) fail("a cached op came back without its slot");
    names += r.names.size();
  }
  if (names != slots.size()) fail("a cached step lost or duplicated an op");
}

struct Point {
  int ranks = 0;
  std::vector<double> cached_us;  // per op, one per rep
  std::vector<double> new_us;
  std::vector<double> star_us;     // per new op with its frames, one per rep
  std::vector<double> leaders_us;
  std::vector<double> star_over_leaders;  // per rep: the same coordinator's two
  FrameCounts star, leaders;
  // The kernel's part of a new op, per rep; empty above the descriptor limit.
  std::vector<double> kernel_star_us, kernel_leaders_us;  // thread CPU time
  std::vector<double> kernel_star_wall_us, kernel_leaders_wall_us;
  std::vector<double> kernel_star_over_leaders;
  int kernel_new_ops = 0;
  std::vector<double> bytes_per_rank;       // steady state, ops names cached
  std::vector<double> slot_bytes_per_rank;  // each further cache slot
  int steps = 0;
  int new_ops = 0;
};

// One way's new ops: the frames rank 0 read for each and the response frame
// it sent, kept for the kernel's part.
struct WayFrames {
  std::vector<Incoming> ops;
  std::vector<std::string> responses;
};

// `count` new names, each with the frames `make` gives it, made before the
// clock starts; returns rank 0's CPU µs per new op.
template <typename Make>
double timeWithFrames(Coordinator& c, int n, int count, const char* kind, int rep, size_t links,
                      Make make, WayFrames& way) {
  way.ops.clear();
  for (int i = 0; i < count; ++i) way.ops.push_back(make(gradient(opName(kind, rep * 1000 + i))));
  way.responses.assign(way.ops.size(), std::string());
  // Each link's outbox has room already, as a connection's does after its
  // first frames.
  std::vector<std::string> outboxes(links);
  for (std::string& box : outboxes) box.reserve(512);
  const double t0 = cpuSeconds();
  for (size_t i = 0; i < way.ops.size(); ++i)
    newWithFrames(c, n, way.ops[i], outboxes, way.responses[i]);
  return (cpuSeconds() - t0) * 1e6 / count;
}

// Rank 0's links as sockets, for the kernel's part: rank0[i] is rank 0's end
// of link i, non-blocking as FrameSocket's is, peer[i] the other rank's
// (blocking). TCP links are made as FrameSocket's are (loopback, TCP_NODELAY
// on both ends) and closed with a reset, so that thousands of them per N
// leave no TIME_WAIT behind to use up the ephemeral ports of the next N.
class Links {
 public:
  Links(bool tcp, size_t count) : tcp_(tcp) {
    int listener = -1;
    sockaddr_in addr{};
    socklen_t len = sizeof addr;
    if (tcp_) {
      listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
          ::listen(listener, SOMAXCONN) != 0 ||
          ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
        fail(std::string("cannot listen on loopback: ") + std::strerror(errno));
    }
    for (size_t i = 0; i < count; ++i) {
      int mine = -1, theirs = -1;
      if (tcp_) {
        theirs = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (theirs < 0 || ::connect(theirs, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
            (mine = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC)) < 0)
          fail("link " + std::to_string(i) + " did not connect: " + std::strerror(errno));
        const int one = 1;
        ::setsockopt(mine, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        ::setsockopt(theirs, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      } else {
        int pair[2];
        if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
          fail("socketpair " + std::to_string(i) + ": " + std::strerror(errno));
        mine = pair[0];
        theirs = pair[1];
      }
      ::fcntl(mine, F_SETFL, ::fcntl(mine, F_GETFL) | O_NONBLOCK);
      rank0.push_back(mine);
      peer.push_back(theirs);
    }
    if (listener >= 0) ::close(listener);
  }
  ~Links() {
    const linger reset{1, 0};
    for (size_t i = 0; i < rank0.size(); ++i) {
      if (tcp_) ::setsockopt(peer[i], SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
      ::close(peer[i]);
      ::close(rank0[i]);
    }
  }
  Links(const Links&) = delete;
  Links& operator=(const Links&) = delete;

  std::vector<int> rank0, peer;

 private:
  bool tcp_;
};

// A frame as it crosses a link: its length, then its bytes (FrameSocket::send).
std::string onWire(const std::string& frame) {
  const uint32_t length = static_cast<uint32_t>(frame.size());
  std::string wire(reinterpret_cast<const char*>(&length), sizeof length);
  return wire + frame;
}

// What each of rank 0's links carries to it for one new op, in link order:
// the direct ranks' frames, then the leaders' relay frames.
std::vector<std::string> linkFrames(const Incoming& in) {
  std::vector<std::string> wires;
  for (const auto& [rank, frame] : in.direct) wires.push_back(onWire(frame));
  for (const Incoming::Leader& leader : in.leaders) wires.push_back(onWire(leader.relay));
  return wires;
}

void writeAll(int fd, const std::string& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t w = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail(std::string("a rank's write failed: ") + std::strerror(errno));
    off += static_cast<size_t>(w);
  }
}

// Until `bytes` wait in the socket's receive queue: the timed reads then find
// every frame whole, as rank 0's do when poll() has said so.
void awaitQueued(int fd, size_t bytes) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (int queued = 0;;) {
    if (::ioctl(fd, FIONREAD, &queued) != 0) fail(std::string("FIONREAD: ") + std::strerror(errno));
    if (static_cast<size_t>(queued) >= bytes) return;
    if (std::chrono::steady_clock::now() > deadline) fail("a rank's frame did not reach rank 0");
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, 1);
  }
}

struct KernelTimes {
  double cpu_us = 0;   // per new op, thread CPU time (the syscalls' included)
  double wall_us = 0;  // per new op, the wall clock
};

// The kernel's part of the first `count` new ops of a way, on the first
// links.rank0 links it needs. Per op, not timed: every other end writes its
// frame (the bytes the way decoded); timed: rank 0 reads every link until
// EAGAIN, one 64 KiB buffer as FrameSocket::readAvailable, then sends the
// response on every link; not timed: the other ends read it back and compare.
// Over loopback TCP a send() also runs the receiving end's TCP input, in the
// sender's thread, while rank 0's own input ran when the other ends wrote: per
// link and op rank 0 is still charged about one transmit and one receive, as
// over a NIC, whose receive path runs in softirq on rank 0's host.
KernelTimes timeKernel(const Links& links, const WayFrames& way, size_t count) {
  char buf[65536];
  double cpu = 0, wall = 0;
  std::string back;
  for (size_t k = 0; k < count; ++k) {
    const std::vector<std::string> in = linkFrames(way.ops[k]);
    const std::string out = onWire(way.responses[k]);
    if (in.size() > links.rank0.size()) fail("fewer links than a way needs");
    size_t expected = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      writeAll(links.peer[i], in[i]);
      expected += in[i].size();
    }
    for (size_t i = 0; i < in.size(); ++i) awaitQueued(links.rank0[i], in[i].size());
    size_t got = 0, sent = 0;
    const double c0 = cpuSeconds();
    const auto w0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < in.size(); ++i) {
      for (;;) {
        const ssize_t r = ::recv(links.rank0[i], buf, sizeof buf, 0);
        if (r > 0) {
          got += static_cast<size_t>(r);
        } else if (r < 0 && errno == EINTR) {
          continue;
        } else {
          break;  // EAGAIN: read out; anything else fails the count below
        }
      }
    }
    for (size_t i = 0; i < in.size(); ++i) {
      const ssize_t w = ::send(links.rank0[i], out.data(), out.size(), MSG_NOSIGNAL);
      if (w > 0) sent += static_cast<size_t>(w);
    }
    wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    cpu += cpuSeconds() - c0;
    if (got != expected)
      fail("rank 0 read " + std::to_string(got) + " bytes, not " + std::to_string(expected));
    if (sent != out.size() * in.size()) fail("rank 0's response did not fit in a socket's buffer");
    for (size_t i = 0; i < in.size(); ++i) {
      back.resize(out.size());
      const ssize_t r = ::recv(links.peer[i], back.data(), back.size(), MSG_WAITALL);
      if (r != static_cast<ssize_t>(back.size()) || back != out)
        fail("a rank did not read rank 0's response back");
    }
  }
  return {cpu * 1e6 / count, wall * 1e6 / count};
}

// The two ways take turns going first, rep by rep: neither always pays for
// the other's cold caches.
template <typename A, typename B>
void inTurn(int rep, A&& first, B&& second) {
  if (rep % 2 == 0) {
    first();
    second();
  } else {
    second();
    first();
  }
}

// `kernel`: whether this N's links fit in the descriptor limit.
void measure(const Options& o, int n, bool kernel, Point& p) {
  p.ranks = n;
  p.steps = static_cast<int>(std::max(2L, o.arrivals / (static_cast<long>(n) * o.ops)));
  p.new_ops = static_cast<int>(std::clamp(o.new_arrivals / n, 2L, kMaxNewOps));
  const Hosts hosts{n, o.per_host};
  p.star = starCounts(n);
  p.leaders = leaderCounts(hosts);
  // Made before the coordinators, so that their heap figures leave them out.
  std::unique_ptr<Links> links;
  if (kernel && o.kernel_arrivals > 0) {
    links = std::make_unique<Links>(o.tcp, static_cast<size_t>(p.star.writes));
    p.kernel_new_ops =
        static_cast<int>(std::clamp(o.kernel_arrivals / n, 1L, static_cast<long>(p.new_ops)));
  }
  for (int rep = 0; rep < o.reps; ++rep) {
    const size_t heap0 = heapInUse();
    {
      Coordinator c(n, size_t{64} << 20, kCacheCapacity);
      std::vector<int32_t> slots;
      for (int i = 0; i < o.ops; ++i) slots.push_back(negotiateNew(c, n, gradient(opName("cached", i))));
      cachedStep(c, n, slots);  // the table's spare entries now hold their buffers
      const size_t heap_steady = heapInUse();
      p.bytes_per_rank.push_back(static_cast<double>(heap_steady - heap0) / n);

      double t0 = cpuSeconds();
      for (int s = 0; s < p.steps; ++s) cachedStep(c, n, slots);
      p.cached_us.push_back((cpuSeconds() - t0) * 1e6 / (static_cast<double>(p.steps) * o.ops));

      // The requests are made before the clock starts: a rank's own copy is
      // not the coordinator's cost.
      std::vector<Request> fresh;
      for (int i = 0; i < p.new_ops; ++i) fresh.push_back(gradient(opName("new", rep * 1000 + i)));
      const size_t heap_before_new = heapInUse();
      t0 = cpuSeconds();
      for (const auto& q : fresh) negotiateNew(c, n, q);
      p.new_us.push_back((cpuSeconds() - t0) * 1e6 / p.new_ops);
      const size_t heap_after_new = heapInUse();
      p.slot_bytes_per_rank.push_back(static_cast<double>(heap_after_new - heap_before_new) /
                                      (static_cast<double>(n) * p.new_ops));

      // The two ways alternate which goes first, so that a drift in the
      // machine or in the coordinator's heap lands on both.
      WayFrames star_frames, leader_frames;
      auto star = [&] {
        p.star_us.push_back(timeWithFrames(c, n, p.new_ops, "star", rep, p.star.writes,
                                           [n](const Request& q) { return starFrames(n, q); },
                                           star_frames));
      };
      auto leaders = [&] {
        p.leaders_us.push_back(
            timeWithFrames(c, n, p.new_ops, "leaders", rep, p.leaders.writes,
                           [&hosts](const Request& q) { return leaderFrames(hosts, q); },
                           leader_frames));
      };
      inTurn(rep, star, leaders);
      p.star_over_leaders.push_back(p.star_us.back() / p.leaders_us.back());
      if (c.cacheSize() != static_cast<size_t>(o.ops + 3 * p.new_ops)) fail("cache size is off");
      if (!links) continue;

      // The kernel's part, of the same frames, in the same order. A
      // connection's first frames pay for buffers a running job's already
      // holds: one untimed op over every link first.
      if (rep == 0) timeKernel(*links, star_frames, 1);
      const size_t count = static_cast<size_t>(p.kernel_new_ops);
      auto kernel_star = [&] {
        const KernelTimes t = timeKernel(*links, star_frames, count);
        p.kernel_star_us.push_back(t.cpu_us);
        p.kernel_star_wall_us.push_back(t.wall_us);
      };
      auto kernel_leaders = [&] {
        const KernelTimes t = timeKernel(*links, leader_frames, count);
        p.kernel_leaders_us.push_back(t.cpu_us);
        p.kernel_leaders_wall_us.push_back(t.wall_us);
      };
      inTurn(rep, kernel_star, kernel_leaders);
      p.kernel_star_over_leaders.push_back(p.kernel_star_us.back() / p.kernel_leaders_us.back());
    }
  }
}

struct Spread {
  double min, median, max;
};

Spread spread(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v.front(), v[v.size() / 2], v.back()};
}

void writeJson(const Options& o, int kernel_max_ranks, const std::vector<Point>& points) {
  FILE* f = std::fopen(o.json.c_str(), "w");
  if (!f) fail("cannot write " + o.json);
  auto list = [f](const std::vector<double>& v) {
    std::fputc('[', f);
    for (size_t i = 0; i < v.size(); ++i) std::fprintf(f, "%s%.4f", i ? ", " : "", v[i]);
    std::fputc(']', f);
  };
  std::fprintf(f,
               "{\n  \"bench\": \"control_plane_scale\",\n  \"ops_per_step\": %d,\n  \"reps\": %d,\n"
               "  \"per_host\": %d,\n  \"kernel_sockets\": \"%s\",\n  \"kernel_max_ranks\": %d,\n",
               o.ops, o.reps, o.per_host, o.tcp ? "tcp" : "unix", kernel_max_ranks);
  std::fprintf(f, "  \"points\": [\n");
  for (size_t i = 0; i < points.size(); ++i) {
    const Point& p = points[i];
    std::fprintf(f, "    {\"ranks\": %d, \"steps\": %d, \"new_ops\": %d", p.ranks, p.steps,
                 p.new_ops);
    auto field = [&](const char* name, const std::vector<double>& values) {
      std::fprintf(f, ",\n     \"%s\": ", name);
      list(values);
    };
    field("cached_us_per_op", p.cached_us);
    field("new_us_per_op", p.new_us);
    field("bytes_per_rank", p.bytes_per_rank);
    field("slot_bytes_per_rank", p.slot_bytes_per_rank);
    field("star_us_per_new_op", p.star_us);
    field("leaders_us_per_new_op", p.leaders_us);
    field("star_over_leaders", p.star_over_leaders);
    std::fprintf(f,
                 ",\n     \"star_reads_per_new_op\": %ld, \"star_frames_per_new_op\": %ld, "
                 "\"star_writes_per_new_op\": %ld,\n     \"leaders_reads_per_new_op\": %ld, "
                 "\"leaders_frames_per_new_op\": %ld, \"leaders_writes_per_new_op\": %ld",
                 p.star.reads, p.star.frames, p.star.writes, p.leaders.reads, p.leaders.frames,
                 p.leaders.writes);
    if (!p.kernel_star_us.empty()) {
      std::fprintf(f, ",\n     \"kernel_new_ops\": %d", p.kernel_new_ops);
      field("kernel_star_us_per_new_op", p.kernel_star_us);
      field("kernel_leaders_us_per_new_op", p.kernel_leaders_us);
      field("kernel_star_over_leaders", p.kernel_star_over_leaders);
      field("kernel_star_wall_us_per_new_op", p.kernel_star_wall_us);
      field("kernel_leaders_wall_us_per_new_op", p.kernel_leaders_wall_us);
    }
    std::fprintf(f, "}%s\n", i + 1 < points.size() ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
  std::fclose(f);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) fail(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--min-ranks") o.min_ranks = std::atoi(value());
    else if (arg == "--max-ranks") o.max_ranks = std::atoi(value());
    else if (arg == "--ops") o.ops = std::atoi(value());
    else if (arg == "--per-host") o.per_host = std::atoi(value());
    else if (arg == "--reps") o.reps = std::atoi(value());
    else if (arg == "--arrivals") o.arrivals = std::atol(value());
    else if (arg == "--new-arrivals") o.new_arrivals = std::atol(value());
    else if (arg == "--kernel-arrivals") o.kernel_arrivals = std::atol(value());
    else if (arg == "--sockets") {
      const std::string kind = value();
      if (kind != "tcp" && kind != "unix") fail("--sockets is tcp or unix, not " + kind);
      o.tcp = kind == "tcp";
    } else if (arg == "--json") o.json = value();
    else fail("unknown option " + arg +
              " (--min-ranks --max-ranks --ops --per-host --reps --arrivals --new-arrivals"
              " --kernel-arrivals --sockets --json)");
  }
  if (o.min_ranks < 2 || o.max_ranks < o.min_ranks || o.ops < 1 || o.ops > kMaxOps || o.reps < 1 ||
      o.per_host < 1 || o.kernel_arrivals < 0)
    fail("need 2 <= --min-ranks <= --max-ranks, 1 <= --ops <= " + std::to_string(kMaxOps) +
         ", --per-host >= 1, --reps >= 1, --kernel-arrivals >= 0");
  return o;
}

// The file descriptors the kernel's part may use, the soft limit raised to
// the hard one first: an N whose 2 (N - 1) link ends and kSpareFds (stdio,
// the listener, the JSON file) do not fit has no kernel columns. Returns the
// largest N that fits.
constexpr long kSpareFds = 16;

int kernelMaxRanks() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return 0;
  if (lim.rlim_cur < lim.rlim_max) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  const long fds = static_cast<long>(std::min<rlim_t>(lim.rlim_cur, rlim_t{1} << 30));
  return static_cast<int>(std::max(0L, (fds - kSpareFds) / 2 + 1));
}

// "min / median / max" of a column, or "-" where it was not measured.
std::string spreadText(const std::vector<double>& v) {
  if (v.empty()) return "-";
  const Spread s = spread(v);
  char text[64];
  std::snprintf(text, sizeof text, "%.1f / %.1f / %.1f", s.min, s.median, s.max);
  return text;
}

std::string ratioText(const std::vector<double>& v) {
  if (v.empty()) return "-";
  const Spread s = spread(v);
  char text[64];
  std::snprintf(text, sizeof text, "%.2f (%.2f-%.2f)", s.median, s.min, s.max);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  // Freed memory stays in the heap (no trim, no mmap below 32 MiB), as in a
  // rank 0 that has run a while. Otherwise glibc hands part of a finished
  // coordinator's heap back to the kernel, and whichever set of new ops
  // comes next pays for the pages again (up to 2 ms per new op at 16,384
  // ranks, in thread CPU time): the first rep of each N still does.
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  const int kernel_max_ranks = kernelMaxRanks();
  std::printf("rank 0's control plane, up to %d ranks simulated in one process; %d allreduces per\n"
              "cached step; min / median / max over %d fresh coordinators per row.\n"
              "new op us: the coordinator alone. star, leaders: a new op with its frames (decoded,\n"
              "the response encoded once and queued on every link), every rank linked to rank 0 or\n"
              "host leaders of %d ranks per host; star/leaders: median (min-max) of each\n"
              "coordinator's ratio; frames rank 0 reads (links read, and frames decoded: a leader\n"
              "sends its own in its relay) and writes per new op, star / leaders.\n"
              "kernel: the same frames over %s sockets, rank 0's recv() of every link until\n"
              "EAGAIN and send() of the response on every link, thread CPU time per new op (wall:\n"
              "the medians by the wall clock, star / leaders); up to %d ranks (file descriptors)\n\n",
              o.max_ranks, o.ops, o.reps, o.per_host, o.tcp ? "TCP loopback" : "AF_UNIX",
              kernel_max_ranks);
  std::printf("%6s  %-24s %12s  %-24s %12s %12s  %-24s %-24s %-17s %-15s %-15s %-15s  %-24s %-24s "
              "%-17s %-17s\n",
              "ranks", "cached us/op", "ns/rank/op", "new op us", "B/rank", "B/rank/slot",
              "star us/new op", "leaders us/new op", "star/leaders", "reads", "frames", "writes",
              "kernel star us/new op", "kernel leaders us/new op", "kernel s/l", "wall s / l");
  std::vector<Point> points;
  try {
    for (int n = o.min_ranks; n <= o.max_ranks; n *= 2) {
      Point p;
      measure(o, n, n <= kernel_max_ranks, p);
      const Spread c = spread(p.cached_us), w = spread(p.new_us);
      const Spread b = spread(p.bytes_per_rank), s = spread(p.slot_bytes_per_rank);
      const Spread st = spread(p.star_us), le = spread(p.leaders_us);
      const Spread ratio = spread(p.star_over_leaders);
      char cached[64], fresh[64], star[64], leaders[64], ratios[64], reads[64], frames[64], writes[64];
      std::snprintf(cached, sizeof cached, "%.2f / %.2f / %.2f", c.min, c.median, c.max);
      std::snprintf(fresh, sizeof fresh, "%.1f / %.1f / %.1f", w.min, w.median, w.max);
      std::snprintf(star, sizeof star, "%.1f / %.1f / %.1f", st.min, st.median, st.max);
      std::snprintf(leaders, sizeof leaders, "%.1f / %.1f / %.1f", le.min, le.median, le.max);
      std::snprintf(ratios, sizeof ratios, "%.2f (%.2f-%.2f)", ratio.median, ratio.min, ratio.max);
      std::snprintf(reads, sizeof reads, "%ld / %ld", p.star.reads, p.leaders.reads);
      std::snprintf(frames, sizeof frames, "%ld / %ld", p.star.frames, p.leaders.frames);
      std::snprintf(writes, sizeof writes, "%ld / %ld", p.star.writes, p.leaders.writes);
      char wall[64] = "-";
      if (!p.kernel_star_wall_us.empty())
        std::snprintf(wall, sizeof wall, "%.1f / %.1f", spread(p.kernel_star_wall_us).median,
                      spread(p.kernel_leaders_wall_us).median);
      std::printf("%6d  %-24s %12.1f  %-24s %12.0f %12.0f  %-24s %-24s %-17s %-15s %-15s %-15s  %-24s "
                  "%-24s %-17s %-17s\n",
                  n, cached, c.median * 1e3 / n, fresh, b.median, s.median, star, leaders, ratios, reads,
                  frames, writes, spreadText(p.kernel_star_us).c_str(),
                  spreadText(p.kernel_leaders_us).c_str(), ratioText(p.kernel_star_over_leaders).c_str(),
                  wall);
      std::fflush(stdout);
      points.push_back(std::move(p));
    }
  } catch (const std::exception& e) {
    // A frame that does not decode (WireError) is the bench's bug or the
    // encoding's: say so rather than abort.
    fail(std::string("a frame did not decode: ") + e.what());
  }
  if (!o.json.empty()) writeJson(o, kernel_max_ranks, points);
  return 0;
}
