// Who this process is in the job, and the engine's settings, read from the
// launcher's environment. Horovod's variable names are accepted so existing
// launch scripts work unchanged.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "autotune.h"
#include "slot_writes.h"

namespace hvd {

struct Topology {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;
  int cross_size = 1;
  // For a group inside the job (a process set, the ranks of one host), where
  // rank and size count positions in it: the global rank at each position,
  // for messages. Empty: positions are global ranks.
  std::vector<int> members;
  int globalRank(int position) const { return members.empty() ? position : members[position]; }

  // Throws std::invalid_argument naming the variable when a value is malformed.
  static Topology fromEnvironment();
};

struct EngineConfig {
  std::string store_host;  // empty: no store (size 1 only)
  int store_port = 0;
  std::string secret;      // raw bytes
  // Store keys of this rendezvous live under "hvd/<scope>/". Empty: a
  // per-process init() counter. Elastic drivers set one scope per round
  // (HVD_TORCH_RENDEZVOUS_SCOPE), since a fresh worker's counter starts at 0
  // while survivors' counters do not.
  std::string rendezvous_scope;
  size_t fusion_threshold = 64 << 20;        // HOROVOD_FUSION_THRESHOLD
  size_t cache_capacity = 1024;              // HOROVOD_CACHE_CAPACITY (0 disables)
  // Allreduces whose bytes x (size - 1) fit go through rank 0 with the
  // request instead of through Gloo (one round trip, no negotiation).
  size_t inline_threshold = 1 << 20;         // HVD_TORCH_INLINE_THRESHOLD
  // The same for a set on the shared-memory plane: 16 KiB unless the user
  // set the threshold or autotune tunes it.
  size_t shm_inline_cap = 16 << 10;
  // Control frames through shared memory when the global set's data plane is
  // shm (HVD_TORCH_SHM_CONTROL, default 1; rank 0's setting decides).
  bool shm_control = true;
  std::chrono::milliseconds start_timeout{30000};  // HOROVOD_START_TIMEOUT (s)
  std::chrono::milliseconds op_timeout{30000};     // HOROVOD_GLOO_TIMEOUT_SECONDS
  std::string hostname;                      // HOROVOD_HOSTNAME
  std::string iface;  // HOROVOD_GLOO_IFACE: the NIC for control and data (address.h)
  // How long a waiting thread polls (yielding) before it sleeps: the
  // background loop after each event, and a caller in synchronize().
  // Default 100 us while local ranks <= cores, else 0.
  // Stall handling (rank 0): warn after stall_warning, fail every rank after
  // stall_shutdown (0 = never). Horovod never fails; we do, after 15 minutes:
  // longer than common single-rank pauses (a checkpoint, rank-0 validation),
  // short enough that a deadlocked job ends and frees its machines.
  bool stall_check = true;                             // !HOROVOD_STALL_CHECK_DISABLE
  std::chrono::seconds stall_warning{60};              // HOROVOD_STALL_CHECK_TIME_SECONDS
  std::chrono::seconds stall_shutdown{900};            // HOROVOD_STALL_SHUTDOWN_TIME_SECONDS
  std::chrono::microseconds engine_spin{100};  // HVD_TORCH_ENGINE_SPIN_US
  std::chrono::microseconds caller_spin{100};  // HVD_TORCH_CALLER_SPIN_US
  // A thread waiting for an op runs the engine's work itself while it spins
  // (Engine::drive); needs caller_spin > 0.
  bool callers_drive = true;  // HVD_TORCH_CALLERS_DRIVE
  // Blocking cached ops of a one-host job in one pass through shared memory
  // (fast_lane.h), for inputs up to fast_lane_bytes per rank. Rank 0's
  // HVD_TORCH_FAST_LANE=0 turns the lane off for the job; another rank's
  // only stops that rank from running ops on it. Off by default with more
  // ranks on the host than cores.
  bool fast_lane = true;                 // HVD_TORCH_FAST_LANE
  size_t fast_lane_bytes = 64 << 10;     // HVD_TORCH_FAST_LANE_BYTES
  // An async op of a cached name waits for its caller's synchronize to run
  // on the lane, for at most this long; then it goes to the engine (0: every
  // async op goes to the engine at once).
  std::chrono::microseconds lane_defer{1000};  // HVD_TORCH_FAST_LANE_DEFER_US
  // Cached ops agreed among the ranks by rounds of recursive doubling, with
  // no work for rank 0 (issue #47; docs/control_plane_scale.md). Rank 0's
  // setting decides for the job; never with the fast lane (one host), which
  // runs cached ops in one pass through shared memory. kAuto: on for a job
  // across hosts, off on one host (whose Gloo-only jobs keep rank 0's star).
  enum class Agreement { kOff, kOn, kAuto };
  Agreement agreement = Agreement::kAuto;  // HVD_TORCH_AGREEMENT = 0, 1 or auto
  // Across hosts, each host's first rank relays its ranks' control frames to
  // rank 0, which then holds one connection per other host (issue #47;
  // control_channel.h). Rank 0's setting decides for the job.
  bool host_leaders = true;  // HVD_TORCH_HOST_LEADERS
  // Average while some ranks have joined: over the whole set (false, Horovod)
  // or over the ranks that submitted (HVD_TORCH_JOIN_AVERAGE=contributors).
  bool join_average_contributors = false;  // HVD_TORCH_JOIN_AVERAGE
  // Data plane choices every member of a set must agree on (host_backend.cc).
  bool shm = true;                     // HVD_TORCH_SHM
  bool hierarchical_allreduce = true;  // HOROVOD_HIERARCHICAL_ALLREDUCE (shm inside hosts)
  bool hierarchical_allgather = true;  // HOROVOD_HIERARCHICAL_ALLGATHER
  size_t shm_slot_bytes = 0;           // HVD_TORCH_SHM_SLOT_BYTES (0: the plane's choice)
  // How large shm ops write the segment (slot_writes.h), each rank's own
  // choice: HVD_TORCH_SHM_STREAM = auto, 0 (plain) or 1 (streamed).
  SlotWrites shm_slot_writes = SlotWrites::kAuto;
  // Rank 0's observers.
  std::string timeline_path;           // HOROVOD_TIMELINE ("DYNAMIC": start_timeline())
  bool timeline_mark_cycles = false;   // HOROVOD_TIMELINE_MARK_CYCLES
  AutotuneConfig autotune;             // HOROVOD_AUTOTUNE*, read by autotune.cc

  // The engine's one reader of the environment: every variable the engine
  // reads is read here (and in AutotuneConfig::fromEnvironment, which it
  // calls), except HOROVOD_LOG_LEVEL/HOROVOD_LOG_HIDE_TIME, which logging
  // reads before any config exists (log.cc).
  static EngineConfig fromEnvironment();
};

// Environment lookups shared by both.
long envInt(const char* name, long fallback);
std::string envString(const char* name, const std::string& fallback);

}  // namespace hvd
