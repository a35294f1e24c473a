// The control plane at scale, simulated (issue #32 item 3): N ranks' arrivals
// driven through rank 0's real Coordinator, CoordinatorCache and planFusion in
// one process, with no sockets, the way Engine::readWorkers feeds them (every
// rank's frame in rank order, then takeReady). What the engine adds around
// this (decoding frames, encoding responses) is not measured here.
//
// For each N it measures, over --reps fresh coordinators:
//   cached: a step of --ops allreduces whose names every rank has cached
//           (N x ops slot-id arrivals, then one fused response); cost per op
//   new:    a name seen for the first time (N full requests, validation, a
//           new cache slot); cost per op
//   memory: bytes the coordinator holds (mallinfo2's in-use bytes, before
//           and after), per simulated rank: at steady state with --ops names
//           cached, and per rank per added cache slot
// and checks every response while it measures. Prints a table; --json writes
// the figures for bench/control_plane_plot.py.
#include <malloc.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/coordinator.h"

using namespace hvd;

namespace {

struct Options {
  int min_ranks = 2;
  int max_ranks = 4096;
  int ops = 8;        // allreduces per cached step (one fused response)
  int reps = 5;       // fresh coordinators per N
  long arrivals = 200000;  // per timed cached set: steps = arrivals / (N x ops)
  long new_arrivals = 100000;  // per timed set of new ops
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

// Negotiates `name` in full: every rank sends its request. Returns the slot.
int32_t negotiateNew(Coordinator& c, int n, const Request& q) {
  for (int r = 0; r < n; ++r) {
    Arrival a;
    a.rank = r;
    a.request = q;
    submit(c, std::move(a));
  }
  std::vector<Response> out = c.takeReady();
  if (out.size() != 1 || out[0].kind != Response::kExecute || out[0].cache_ids.size() != 1 ||
      out[0].cache_ids[0] < 0)
    fail("a new op did not come back as one cached execute response");
  return out[0].cache_ids[0];
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
  std::vector<double> bytes_per_rank;       // steady state, ops names cached
  std::vector<double> slot_bytes_per_rank;  // each further cache slot
  int steps = 0;
  int new_ops = 0;
};

void measure(const Options& o, int n, Point& p) {
  p.ranks = n;
  p.steps = static_cast<int>(std::max(2L, o.arrivals / (static_cast<long>(n) * o.ops)));
  p.new_ops = static_cast<int>(std::clamp(o.new_arrivals / n, 2L, 256L));
  for (int rep = 0; rep < o.reps; ++rep) {
    const size_t heap0 = heapInUse();
    {
      Coordinator c(n, size_t{64} << 20, 1024);
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
      if (c.cacheSize() != static_cast<size_t>(o.ops + p.new_ops)) fail("cache size is off");
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

void writeJson(const Options& o, const std::vector<Point>& points) {
  FILE* f = std::fopen(o.json.c_str(), "w");
  if (!f) fail("cannot write " + o.json);
  auto list = [f](const std::vector<double>& v) {
    std::fputc('[', f);
    for (size_t i = 0; i < v.size(); ++i) std::fprintf(f, "%s%.4f", i ? ", " : "", v[i]);
    std::fputc(']', f);
  };
  std::fprintf(f, "{\n  \"bench\": \"control_plane_scale\",\n  \"ops_per_step\": %d,\n  \"reps\": %d,\n",
               o.ops, o.reps);
  std::fprintf(f, "  \"points\": [\n");
  for (size_t i = 0; i < points.size(); ++i) {
    const Point& p = points[i];
    std::fprintf(f, "    {\"ranks\": %d, \"steps\": %d, \"new_ops\": %d,\n     \"cached_us_per_op\": ",
                 p.ranks, p.steps, p.new_ops);
    list(p.cached_us);
    std::fprintf(f, ",\n     \"new_us_per_op\": ");
    list(p.new_us);
    std::fprintf(f, ",\n     \"bytes_per_rank\": ");
    list(p.bytes_per_rank);
    std::fprintf(f, ",\n     \"slot_bytes_per_rank\": ");
    list(p.slot_bytes_per_rank);
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
    else if (arg == "--reps") o.reps = std::atoi(value());
    else if (arg == "--arrivals") o.arrivals = std::atol(value());
    else if (arg == "--new-arrivals") o.new_arrivals = std::atol(value());
    else if (arg == "--json") o.json = value();
    else fail("unknown option " + arg +
              " (--min-ranks --max-ranks --ops --reps --arrivals --new-arrivals --json)");
  }
  if (o.min_ranks < 2 || o.max_ranks < o.min_ranks || o.ops < 1 || o.ops > 512 || o.reps < 1)
    fail("need 2 <= --min-ranks <= --max-ranks, 1 <= --ops <= 512, --reps >= 1");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::printf("rank 0's control plane, %d ranks simulated in one process; %d allreduces per\n"
              "cached step; min / median / max over %d fresh coordinators per row\n\n",
              o.max_ranks, o.ops, o.reps);
  std::printf("%6s  %-24s %12s  %-24s %12s %12s\n", "ranks", "cached us/op", "ns/rank/op",
              "new op us", "B/rank", "B/rank/slot");
  std::vector<Point> points;
  for (int n = o.min_ranks; n <= o.max_ranks; n *= 2) {
    Point p;
    measure(o, n, p);
    const Spread c = spread(p.cached_us), w = spread(p.new_us);
    const Spread b = spread(p.bytes_per_rank), s = spread(p.slot_bytes_per_rank);
    char cached[64], fresh[64];
    std::snprintf(cached, sizeof cached, "%.2f / %.2f / %.2f", c.min, c.median, c.max);
    std::snprintf(fresh, sizeof fresh, "%.1f / %.1f / %.1f", w.min, w.median, w.max);
    std::printf("%6d  %-24s %12.1f  %-24s %12.0f %12.0f\n", n, cached, c.median * 1e3 / n, fresh,
                b.median, s.median);
    std::fflush(stdout);
    points.push_back(std::move(p));
  }
  if (!o.json.empty()) writeJson(o, points);
  return 0;
}
