#include "topology.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <thread>

namespace hvd {

long envInt(const char* name, long fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0') {
    throw std::invalid_argument(std::string("environment variable ") + name + "='" + v +
                                "' is not an integer");
  }
  return x;
}

std::string envString(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v == nullptr || *v == '\0') ? fallback : std::string(v);
}

namespace {

std::string hexDecode(const std::string& hex) {
  if (hex.size() % 2 != 0) throw std::invalid_argument("HOROVOD_SECRET_KEY is not hex");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  return out;
}

}  // namespace

Topology Topology::fromEnvironment() {
  Topology t;
  t.rank = static_cast<int>(envInt("HOROVOD_RANK", 0));
  t.size = static_cast<int>(envInt("HOROVOD_SIZE", 1));
  t.local_rank = static_cast<int>(envInt("HOROVOD_LOCAL_RANK", t.rank));
  t.local_size = static_cast<int>(envInt("HOROVOD_LOCAL_SIZE", t.size));
  t.cross_rank = static_cast<int>(envInt("HOROVOD_CROSS_RANK", 0));
  t.cross_size = static_cast<int>(envInt("HOROVOD_CROSS_SIZE", 1));
  if (t.size < 1 || t.rank < 0 || t.rank >= t.size) {
    throw std::invalid_argument("HOROVOD_RANK=" + std::to_string(t.rank) + " is not in [0, HOROVOD_SIZE=" +
                                std::to_string(t.size) + ")");
  }
  return t;
}

EngineConfig EngineConfig::fromEnvironment() {
  EngineConfig c;
  c.store_host = envString("HOROVOD_GLOO_RENDEZVOUS_ADDR", "");
  c.store_port = static_cast<int>(envInt("HOROVOD_GLOO_RENDEZVOUS_PORT", 0));
  c.secret = hexDecode(envString("HOROVOD_SECRET_KEY", ""));
  c.rendezvous_scope = envString("HVD_TORCH_RENDEZVOUS_SCOPE", "");
  c.fusion_threshold = static_cast<size_t>(envInt("HOROVOD_FUSION_THRESHOLD", 64 << 20));
  c.cache_capacity = static_cast<size_t>(envInt("HOROVOD_CACHE_CAPACITY", 1024));
  c.inline_threshold = static_cast<size_t>(envInt("HVD_TORCH_INLINE_THRESHOLD", 1 << 20));
  // Left to us (not set, not tuned): shared memory beats rank 0's socket from
  // tens of KiB on (bench/collectives_bench.py, 2 ranks), so shm sets cap it.
  const bool chosen = !envString("HVD_TORCH_INLINE_THRESHOLD", "").empty() ||
                      envInt("HOROVOD_AUTOTUNE", 0) != 0;
  c.shm_inline_cap = chosen ? c.inline_threshold : size_t{16} << 10;
  c.shm_control = envInt("HVD_TORCH_SHM_CONTROL", 1) != 0;
  c.start_timeout = std::chrono::seconds(envInt("HOROVOD_START_TIMEOUT", 30));
  c.op_timeout = std::chrono::seconds(envInt("HOROVOD_GLOO_TIMEOUT_SECONDS", 30));
  c.hostname = envString("HOROVOD_HOSTNAME", "localhost");
  c.iface = envString("HOROVOD_GLOO_IFACE", "");
  c.stall_check = envInt("HOROVOD_STALL_CHECK_DISABLE", 0) == 0;
  c.stall_warning = std::chrono::seconds(envInt("HOROVOD_STALL_CHECK_TIME_SECONDS", 60));
  c.stall_shutdown = std::chrono::seconds(envInt("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", 900));
  // The engine thread spins only while every rank has a core: with more ranks
  // than cores it would take the core from its own rank's compute or from
  // the peer it waits for. A caller waiting for its op polls while the host
  // has at most two ranks per core: its process has nothing else to do, and
  // its loops' yields hand the core to the one other rank there, often the
  // peer it waits for. With more, a yield goes round a ring of pollers (2
  // cores, 4-byte allreduce: 4 ranks 184 -> 18-45 us, 8 ranks 341 -> 602, 16
  // ranks 779 -> 2489; docs/architecture.md, "More ranks than cores").
  const long local_size = envInt("HOROVOD_LOCAL_SIZE", envInt("HOROVOD_SIZE", 1));
  const long cores = static_cast<long>(std::thread::hardware_concurrency());
  const bool core_each = cores == 0 || local_size <= cores;
  const bool core_pairs = cores == 0 || local_size <= 2 * cores;
  c.engine_spin =
      std::chrono::microseconds(envInt("HVD_TORCH_ENGINE_SPIN_US", core_each ? 100 : 0));
  c.caller_spin =
      std::chrono::microseconds(envInt("HVD_TORCH_CALLER_SPIN_US", core_pairs ? 100 : 0));
  c.callers_drive = envInt("HVD_TORCH_CALLERS_DRIVE", 1) != 0 && c.caller_spin.count() > 0;
  // The lane needs every rank running at once: with more ranks than cores an
  // arrival mostly waits out its patience and then takes the engine anyway
  // (4 ranks on 2 cores: 76 us a 4-byte op, 21 us through driven rounds).
  c.fast_lane = envInt("HVD_TORCH_FAST_LANE", core_each ? 1 : 0) != 0;
  c.fast_lane_bytes = static_cast<size_t>(std::max(0L, envInt("HVD_TORCH_FAST_LANE_BYTES", 64 << 10)));
  c.lane_defer = std::chrono::microseconds(std::max(0L, envInt("HVD_TORCH_FAST_LANE_DEFER_US", 1000)));
  const std::string agreement = envString("HVD_TORCH_AGREEMENT", "auto");
  if (agreement != "auto" && agreement != "0" && agreement != "1") {
    throw std::invalid_argument("HVD_TORCH_AGREEMENT=" + agreement +
                                ": use 'auto' (cached ops agreed among the ranks across hosts), 1 "
                                "(also on one host without the fast lane) or 0 (through rank 0)");
  }
  c.agreement = agreement == "1"   ? EngineConfig::Agreement::kOn
                : agreement == "0" ? EngineConfig::Agreement::kOff
                                   : EngineConfig::Agreement::kAuto;
  c.host_leaders = envInt("HVD_TORCH_HOST_LEADERS", 1) != 0;
  const std::string join_average = envString("HVD_TORCH_JOIN_AVERAGE", "size");
  if (join_average != "size" && join_average != "contributors") {
    throw std::invalid_argument("HVD_TORCH_JOIN_AVERAGE=" + join_average +
                                ": use 'size' (Horovod's Average while ranks have joined: "
                                "over every rank) or 'contributors'");
  }
  c.join_average_contributors = join_average == "contributors";
  c.shm = envInt("HVD_TORCH_SHM", 1) != 0;
  c.hierarchical_allreduce = envInt("HOROVOD_HIERARCHICAL_ALLREDUCE", 1) != 0;
  c.hierarchical_allgather = envInt("HOROVOD_HIERARCHICAL_ALLGATHER", 1) != 0;
  c.shm_slot_bytes = static_cast<size_t>(envInt("HVD_TORCH_SHM_SLOT_BYTES", 0));
  const std::string slot_writes = envString("HVD_TORCH_SHM_STREAM", "auto");
  if (slot_writes != "auto" && slot_writes != "0" && slot_writes != "1") {
    throw std::invalid_argument("HVD_TORCH_SHM_STREAM=" + slot_writes +
                                ": use 'auto' (measure both ways), 0 (plain stores) or 1 "
                                "(streaming stores) for large ops' writes to shared memory");
  }
  c.shm_slot_writes = slot_writes == "auto" ? SlotWrites::kAuto
                      : slot_writes == "1"  ? SlotWrites::kStreamed
                                            : SlotWrites::kCached;
  c.timeline_path = envString("HOROVOD_TIMELINE", "");
  c.timeline_mark_cycles = envInt("HOROVOD_TIMELINE_MARK_CYCLES", 0) != 0;
  c.autotune = AutotuneConfig::fromEnvironment();
  return c;
}

}  // namespace hvd
