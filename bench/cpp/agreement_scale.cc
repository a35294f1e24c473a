// Issue #47's cached-op agreement at scale, simulated: N ranks' BitAgreement
// and CachedRounds (csrc/core) in one process, their messages carried through
// the wire encoding in first-in first-out order, with no sockets. Each step
// every rank submits the same --ops cached allreduces; one round agrees on
// them; every rank's outcome is checked (one fused response naming every op,
// in slot order) and the bench stops on a wrong one.
//
// For each N it reports:
//   rank 0's CPU per cached op: everything rank 0 does for a step (submit,
//     its vector, its messages encoded and decoded, the round, the outcome
//     with its fusion plan), over the step's ops; thread CPU time, so a time
//     slice lost to another process is not counted;
//   the mean over all ranks of the same (rank 0 is not special any more: the
//     total work is N times this);
//   messages and bytes each rank sends per step (the most over ranks);
//   the critical path: messages in sequence per round, and a simulated time
//     per step at --alpha-us per message plus its bytes at --gbps, flat (one
//     participant per rank) and with host leaders (--per-host ranks a host
//     agree through shared memory first: one pass, --shm-us);
//   rank 0's memory: bytes in use for its CachedRounds with --capacity slots
//     learnt, its BitAgreement and its coordinator's slots (mallinfo2, before
//     and after).
// What it leaves out: the transport (sockets, rings) and the engine's loop.
#include <malloc.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "core/cached_rounds.h"
#include "core/response_cache.h"

using namespace hvd;

namespace {

struct Options {
  int min_ranks = 2;
  int max_ranks = 16384;
  int ops = 8;
  int capacity = 1024;
  long messages = 400000;  // per N: steps = messages / (N x log2 N), at least --min-steps
  int min_steps = 3;
  double alpha_us = 10.0;  // one message across hosts
  double gbps = 10.0;
  int per_host = 8;
  double shm_us = 1.0;     // one pass through a host's shared memory
  std::string json;
};

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "agreement_scale: %s\n", what.c_str());
  std::exit(1);
}

double cpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Large blocks come from mmap and count apart (hblkhd).
size_t heapInUse() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

ReadyOp gradientOp(int slot) {
  ReadyOp op;
  op.request.type = OpType::kAllreduce;
  op.request.dtype = DataType::kFloat32;
  op.request.reduce_op = ReduceOp::kAverage;
  op.request.name = "allreduce.model.layer" + std::to_string(slot) + ".weight.grad";
  op.request.shape = {256, 256};
  op.response.kind = Response::kExecute;
  op.response.type = OpType::kAllreduce;
  op.response.names = {op.request.name};
  op.response.cache_ids = {slot};
  return op;
}

struct Rank {
  std::unique_ptr<CachedRounds> rounds;
  std::unique_ptr<BitAgreement> agreement;
  double cpu = 0;       // seconds spent on this rank's work
  size_t sent_bytes = 0;
  size_t sent_messages = 0;
  uint64_t applied = 0;
};

struct Point {
  int ranks = 0;
  int steps = 0;
  double rank0_us_per_op = 0;
  double mean_us_per_op = 0;
  size_t messages_per_rank = 0;  // per step, the most over ranks
  size_t bytes_per_rank = 0;
  int path_messages = 0;         // flat
  double path_us = 0;
  int leader_path_messages = 0;  // host leaders
  double leader_path_us = 0;
  size_t rank0_bytes = 0;        // memory
};

struct Net {
  struct InFlight {
    int from, to;
    std::string bytes;
  };
  std::deque<InFlight> queue;
};

// Collects rank r's sends into the network, timing it as rank r's work.
void send(Rank& k, int r, Net& net) {
  std::vector<std::pair<int, AgreementMessage>> out;
  k.agreement->takeSends(out);
  for (auto& [to, m] : out) {
    net.queue.push_back({r, to, m.encode()});
    k.sent_bytes += net.queue.back().bytes.size();
    ++k.sent_messages;
  }
}

void checkOutcome(const CachedRounds::Outcome& o, int r, const Options& opt) {
  if (o.run.size() != 1 || o.run[0].names.size() != static_cast<size_t>(opt.ops))
    fail("rank " + std::to_string(r) + ": expected one fused response of " +
         std::to_string(opt.ops) + " ops, got " + std::to_string(o.run.size()) + " responses");
  for (int i = 0; i < opt.ops; ++i)
    if (o.run[0].cache_ids[i] != i) fail("rank " + std::to_string(r) + ": ops out of slot order");
}

// One step on every rank; rank r's CPU goes to ranks[r].cpu.
void step(std::vector<Rank>& ranks, Net& net, const Options& opt) {
  const int n = static_cast<int>(ranks.size());
  const size_t words = ranks[0].rounds->layout().total();
  for (int r = 0; r < n; ++r) {
    Rank& k = ranks[r];
    const double t0 = cpuSeconds();
    for (int s = opt.ops - 1; s >= 0; --s) k.rounds->submit(s);
    k.agreement->start(k.rounds->vector());
    send(k, r, net);
    k.cpu += cpuSeconds() - t0;
  }
  while (!net.queue.empty()) {
    Net::InFlight f = std::move(net.queue.front());
    net.queue.pop_front();
    Rank& k = ranks[f.to];
    const double t0 = cpuSeconds();
    Status s = k.agreement->receive(f.from, AgreementMessage::decode(f.bytes, words));
    if (!s.ok()) fail(s.message);
    send(k, f.to, net);
    if (!k.agreement->active() && k.agreement->round() > k.applied) {
      checkOutcome(k.rounds->apply(k.agreement->result()), f.to, opt);
      ++k.applied;
    }
    k.cpu += cpuSeconds() - t0;
  }
  for (int r = 0; r < n; ++r) {
    Rank& k = ranks[r];
    if (k.applied == k.agreement->round()) continue;
    // One rank alone finishes at start().
    const double t0 = cpuSeconds();
    checkOutcome(k.rounds->apply(k.agreement->result()), r, opt);
    ++k.applied;
    k.cpu += cpuSeconds() - t0;
  }
}

int log2Floor(int n) {
  int l = 0;
  while ((2 << l) <= n) ++l;
  return l;
}

// Messages in sequence in one round of P participants: log2 P exchanges,
// and two more (hand over, hand back) when P is not a power of two.
int pathMessages(int p) { return log2Floor(p) + ((p & (p - 1)) ? 2 : 0); }

Point measure(const Options& opt, int n) {
  Point p;
  p.ranks = n;
  std::vector<Rank> ranks(n);
  for (int r = 0; r < n; ++r) {
    ranks[r].rounds = std::make_unique<CachedRounds>(opt.capacity, 64 << 20);
    for (int s = 0; s < opt.ops; ++s) ranks[r].rounds->learn(s, gradientOp(s), true);
    ranks[r].agreement = std::make_unique<BitAgreement>(n, r, ranks[r].rounds->layout());
  }
  Net net;
  step(ranks, net, opt);  // warm-up: buffers at their size
  for (Rank& k : ranks) k.cpu = 0, k.sent_bytes = 0, k.sent_messages = 0;
  const double per_step = std::max(1.0, n * std::max(1, log2Floor(n)) * 1.0);
  p.steps = std::max(opt.min_steps, static_cast<int>(opt.messages / per_step));
  for (int i = 0; i < p.steps; ++i) step(ranks, net, opt);
  double total = 0;
  for (const Rank& k : ranks) {
    total += k.cpu;
    p.messages_per_rank = std::max(p.messages_per_rank, k.sent_messages / p.steps);
    p.bytes_per_rank = std::max(p.bytes_per_rank, k.sent_bytes / p.steps);
  }
  const double ops = static_cast<double>(p.steps) * opt.ops;
  p.rank0_us_per_op = ranks[0].cpu / ops * 1e6;
  p.mean_us_per_op = total / n / ops * 1e6;
  const double message_us =
      opt.alpha_us + AgreementMessage::encodedBytes(ranks[0].rounds->layout().total()) * 8.0 /
                         (opt.gbps * 1e3);
  p.path_messages = pathMessages(n);
  p.path_us = p.path_messages * message_us;
  const int hosts = std::max(1, n / opt.per_host);
  p.leader_path_messages = pathMessages(hosts);
  // The host's ranks hand their vectors to the leader and read the result back.
  p.leader_path_us = p.leader_path_messages * message_us + (n > 1 ? 2 * opt.shm_us : 0);
  return p;
}

// Rank 0's bytes with the whole cache learnt: its CachedRounds, its
// BitAgreement, and its coordinator's cache, whose slots keep a name and no
// request under the agreement (Coordinator::keepSlotRequests). They do not
// depend on N.
size_t rank0Memory(const Options& opt, int n) {
  const size_t before = heapInUse();
  size_t after;
  {
    auto rounds = std::make_unique<CachedRounds>(opt.capacity, 64 << 20);
    for (int s = 0; s < opt.capacity; ++s) rounds->learn(s, gradientOp(s), true);
    auto agreement = std::make_unique<BitAgreement>(n, 0, rounds->layout());
    auto slots = std::make_unique<CoordinatorCache>(opt.capacity);
    for (int s = 0; s < opt.capacity; ++s)
      if (slots->insert(tableKey(0, gradientOp(s).request.name), {}) != s) fail("slot ids");
    after = heapInUse();
  }
  return after - before;
}

void writeJson(const Options& o, const std::vector<Point>& points) {
  FILE* f = std::fopen(o.json.c_str(), "w");
  if (f == nullptr) fail("cannot write " + o.json);
  std::fprintf(f, "{\"ops\": %d, \"capacity\": %d, \"alpha_us\": %g, \"gbps\": %g, \"per_host\": %d, "
               "\"points\": [", o.ops, o.capacity, o.alpha_us, o.gbps, o.per_host);
  for (size_t i = 0; i < points.size(); ++i) {
    const Point& p = points[i];
    std::fprintf(f, "%s\n  {\"ranks\": %d, \"steps\": %d, \"rank0_us_per_op\": %.4f, "
                 "\"mean_us_per_op\": %.4f, \"messages_per_rank\": %zu, \"bytes_per_rank\": %zu, "
                 "\"path_messages\": %d, \"path_us\": %.2f, \"leader_path_messages\": %d, "
                 "\"leader_path_us\": %.2f, \"rank0_bytes\": %zu}",
                 i ? "," : "", p.ranks, p.steps, p.rank0_us_per_op, p.mean_us_per_op,
                 p.messages_per_rank, p.bytes_per_rank, p.path_messages, p.path_us,
                 p.leader_path_messages, p.leader_path_us, p.rank0_bytes);
  }
  std::fprintf(f, "\n]}\n");
  std::fclose(f);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) fail(a + " needs a value");
      return argv[++i];
    };
    if (a == "--min-ranks") o.min_ranks = std::atoi(value());
    else if (a == "--max-ranks") o.max_ranks = std::atoi(value());
    else if (a == "--ops") o.ops = std::atoi(value());
    else if (a == "--capacity") o.capacity = std::atoi(value());
    else if (a == "--messages") o.messages = std::atol(value());
    else if (a == "--min-steps") o.min_steps = std::atoi(value());
    else if (a == "--alpha-us") o.alpha_us = std::atof(value());
    else if (a == "--gbps") o.gbps = std::atof(value());
    else if (a == "--per-host") o.per_host = std::atoi(value());
    else if (a == "--shm-us") o.shm_us = std::atof(value());
    else if (a == "--json") o.json = value();
    else fail("unknown option " + a);
  }
  if (o.min_ranks < 1 || o.max_ranks < o.min_ranks || o.ops < 1 || o.ops > o.capacity ||
      o.min_steps < 1 || o.per_host < 1)
    fail("bad options");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  std::printf("cached ops agreed without rank 0 (issue #47): %d allreduces per step, %d slots, "
              "%g us + %g Gbit/s per message, %d ranks per host\n",
              opt.ops, opt.capacity, opt.alpha_us, opt.gbps, opt.per_host);
  std::printf("%6s %6s %12s %12s %9s %9s %12s %12s %12s\n", "ranks", "steps", "rank0 us/op",
              "mean us/op", "msgs/rank", "B/rank", "path (flat)", "path (lead)", "rank0 bytes");
  std::vector<Point> points;
  for (int n = opt.min_ranks; n <= opt.max_ranks; n *= 2) {
    Point p = measure(opt, n);
    p.rank0_bytes = rank0Memory(opt, n);
    std::printf("%6d %6d %12.3f %12.3f %9zu %9zu %5d %5.0fus %5d %5.0fus %12zu\n", p.ranks,
                p.steps, p.rank0_us_per_op, p.mean_us_per_op, p.messages_per_rank,
                p.bytes_per_rank, p.path_messages, p.path_us, p.leader_path_messages,
                p.leader_path_us, p.rank0_bytes);
    std::fflush(stdout);
    points.push_back(p);
  }
  if (!opt.json.empty()) writeJson(opt, points);
  return 0;
}
