// How fast two cores of this machine hand data to each other, window by
// window: the shared-memory plane's two ways of writing its segment
// (csrc/core/slot_writes.h) without the plane, hvd-torch or torch.
//
// Two threads, pinned to two cores, take turns: each copies the 256 KiB its
// peer just wrote into a private buffer, then writes its own 256 KiB for the
// peer, with plain stores (memcpy: the peer reads the lines from this core's
// cache) or with streaming stores (hvd::streamCopy: from memory). Per window
// it prints the round-trip time of one cache line and GB/s each way. On a
// virtual machine the rates change while it runs, as the host moves the
// virtual cores (docs/architecture.md, "Where the cores sit").
//
//   bench/cpp/build/core_link [--windows 20] [--cpus 0,1] [--json out.json]
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/stream_copy.h"

namespace {

constexpr size_t kBytes = size_t{256} << 10;

enum class Work { kNone, kCached, kStreamed, kStop };

struct alignas(64) Shared {
  alignas(64) std::atomic<long> turn{0};  // odd: the peer's turn
  alignas(64) std::atomic<int> work{static_cast<int>(Work::kNone)};
  alignas(64) char slot[2][kBytes];
  alignas(64) char own[2][kBytes];
};

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) != 0) {
    std::fprintf(stderr, "core_link: cannot pin to cpu %d\n", cpu);
    std::exit(2);
  }
}

// One side's turn: read what the peer wrote, write for the peer.
void turn(Shared& s, int me, Work work) {
  if (work == Work::kNone) return;
  std::memcpy(s.own[me], s.slot[1 - me], kBytes);
  if (work == Work::kStreamed) {
    hvd::streamCopy(s.slot[me], s.own[me], kBytes);
  } else {
    std::memcpy(s.slot[me], s.own[me], kBytes);
  }
}

void peer(Shared& s, int cpu) {
  pin(cpu);
  for (long v = 1;; v += 2) {
    while (s.turn.load(std::memory_order_acquire) != v) {
      if (s.work.load(std::memory_order_relaxed) == static_cast<int>(Work::kStop)) return;
    }
    turn(s, 1, static_cast<Work>(s.work.load(std::memory_order_relaxed)));
    s.turn.store(v + 1, std::memory_order_release);
  }
}

// Seconds per round trip of `rounds` turns each way.
double roundTrips(Shared& s, long& v, Work work, int rounds) {
  s.work.store(static_cast<int>(work), std::memory_order_relaxed);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < rounds; ++i) {
    turn(s, 0, work);
    s.turn.store(v + 1, std::memory_order_release);
    while (s.turn.load(std::memory_order_acquire) != v + 2) {
    }
    v += 2;
  }
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  return took.count() / rounds;
}

}  // namespace

int main(int argc, char** argv) {
  int windows = 20, cpu_a = 0, cpu_b = 1;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--windows" && i + 1 < argc) {
      windows = std::atoi(argv[++i]);
    } else if (arg == "--cpus" && i + 1 < argc) {
      if (std::sscanf(argv[++i], "%d,%d", &cpu_a, &cpu_b) != 2) return 2;
    } else if (arg == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else {
      std::fprintf(stderr, "usage: core_link [--windows N] [--cpus A,B] [--json FILE]\n");
      return 2;
    }
  }
  auto shared = std::make_unique<Shared>();
  Shared& s = *shared;
  std::memset(s.slot, 1, sizeof(s.slot));
  std::memset(s.own, 2, sizeof(s.own));
  pin(cpu_a);
  std::thread other(peer, std::ref(s), cpu_b);
  long v = 0;
  std::printf("# cpus %d and %d; per window: one cache line's round trip, then 2 x 256 KiB a "
              "round trip written each way\n# %6s %10s %14s %14s\n",
              cpu_a, cpu_b, "window", "rtt(ns)", "plain(GB/s)", "stream(GB/s)");
  std::vector<double> rtt, plain, stream;
  for (int w = 0; w < windows; ++w) {
    rtt.push_back(roundTrips(s, v, Work::kNone, 20000) * 1e9);
    plain.push_back(2 * kBytes / roundTrips(s, v, Work::kCached, 300) / 1e9);
    stream.push_back(2 * kBytes / roundTrips(s, v, Work::kStreamed, 300) / 1e9);
    std::printf("  %6d %10.0f %14.1f %14.1f\n", w, rtt.back(), plain.back(), stream.back());
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
  }
  s.work.store(static_cast<int>(Work::kStop));
  other.join();
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f == nullptr) return 1;
    const auto list = [&](const std::vector<double>& xs) {
      std::string out = "[";
      for (size_t i = 0; i < xs.size(); ++i) out += (i ? ", " : "") + std::to_string(xs[i]);
      return out + "]";
    };
    std::fprintf(f, "{\"cpus\": [%d, %d], \"rtt_ns\": %s, \"plain_GBps\": %s, \"stream_GBps\": %s}\n",
                 cpu_a, cpu_b, list(rtt).c_str(), list(plain).c_str(), list(stream).c_str());
    std::fclose(f);
  }
  return 0;
}
