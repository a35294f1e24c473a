// The timeline: a Chrome-trace ("JSON array format") file of what the engine
// did, readable by Perfetto and chrome://tracing, in Horovod's layout: one
// process row (pid) per tensor name, phases as begin/end events on it
// (NEGOTIATE_ALLREDUCE with a zero-length tick per rank as it arrives, then
// ALLREDUCE with nested QUEUE, MEMCPY_IN_FUSION_BUFFER, GLOO_ALLREDUCE, ...),
// and optional CYCLE_START instants. Only rank 0 records (it coordinates, so
// it sees every rank's arrival); docs/toolbox.md, "Timeline".
//
// Cost: when stopped, every recording call is one relaxed atomic load. When
// running, a call takes a mutex and appends a small record (a name and a
// timestamp) to a vector; a writer thread of its own swaps that vector out,
// formats the JSON and writes it. The background thread never formats or
// touches the file.
//
// Latency: the record that makes the pending vector non-empty wakes the
// writer (one notify per batch, not per record), which waits kFlushDelay for
// the rest of the burst and then writes: an event is in the file within
// kFlushDelay plus one write (a Horovod user's script or test opens the file
// 0.1 s after an op), and a busy engine costs at most 1 s / kFlushDelay
// writes a second. An idle timeline wakes nobody. The pending vector is bounded: past
// kMaxPending records new ones are dropped and counted (a "dropped" count is
// written at stop), so a stalled disk can never grow memory without bound.
//
// File validity: every write of the writer thread ends with "]", and the next
// one overwrites that bracket, so the file is complete JSON after each flush
// and after stop(), and still loads while the job runs.
//
// Threading: start(), stop() and active() from any thread; the recording
// calls (begin, end, tick, marker) from any thread, in practice the engine's
// background thread. Events of one name must be recorded from one thread so
// that their begin/end pairs nest.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "types.h"

namespace hvd {

class Timeline {
 public:
  Timeline() = default;
  ~Timeline() { stop(); }
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Opens (truncates) `path` and starts recording. A running timeline is
  // stopped first (its file is closed complete). Returns an error message,
  // empty on success.
  std::string start(const std::string& path, bool mark_cycles);
  // Writes what is pending, closes the array and the file. No-op when stopped.
  void stop();

  bool active() const { return active_.load(std::memory_order_relaxed); }
  bool markCycles() const { return mark_cycles_.load(std::memory_order_relaxed); }

  // `row` is the tensor's row (its name). `args` is a JSON object body
  // without braces ("\"dtype\": \"float32\"") or empty.
  void begin(const std::string& row, std::string phase, std::string args = {});
  void end(const std::string& row, std::string args = {});
  // A zero-length event on the row: Horovod's per-rank arrival tick.
  void tick(const std::string& row, const std::string& label);
  // A global instant (all rows): CYCLE_START.
  void marker(std::string label);

  static constexpr size_t kMaxPending = 1 << 20;
  static constexpr std::chrono::milliseconds kFlushDelay{20};

 private:
  struct Record {
    char ph;            // 'B', 'E', 'X' (zero duration), 'i' (global instant), 'M' (pid 0)
    std::string phase;  // the event's name ('B', 'i')
    std::string row;
    std::string label;  // 'X': the tick's name
    std::string args;
    int64_t ts_us;
  };
  void record(Record r);
  void writerLoop();
  void writeBatch(const std::vector<Record>& batch);
  int rowPid(const std::string& row);

  std::atomic<bool> active_{false};
  std::atomic<bool> mark_cycles_{false};
  std::mutex control_mu_;  // serialises start()/stop()

  std::mutex mu_;  // guards everything below up to the writer's own state
  std::condition_variable wake_;
  std::vector<Record> pending_;
  size_t dropped_ = 0;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point origin_;

  // Writer thread only (and stop() after joining it).
  std::thread writer_;
  std::FILE* file_ = nullptr;
  bool first_write_ = true;
  std::unordered_map<std::string, int> pids_;  // row -> pid, numbered in first-seen order
};

// Begins `phase` on every row when built, ends it when destroyed: the
// executor's MEMCPY_IN_FUSION_BUFFER, GLOO_ALLREDUCE, ... around a section.
// A null or stopped timeline costs one branch.
class TimelineSpan {
 public:
  TimelineSpan(Timeline* timeline, const std::vector<std::string>& rows, const std::string& phase)
      : timeline_(timeline && timeline->active() ? timeline : nullptr), rows_(rows) {
    if (timeline_)
      for (const std::string& row : rows_) timeline_->begin(row, phase);
  }
  ~TimelineSpan() {
    if (timeline_)
      for (const std::string& row : rows_) timeline_->end(row);
  }
  TimelineSpan(const TimelineSpan&) = delete;
  TimelineSpan& operator=(const TimelineSpan&) = delete;

 private:
  Timeline* timeline_;
  const std::vector<std::string>& rows_;
};

// Escapes a string for a JSON string literal (names may hold quotes).
std::string jsonEscape(const std::string& s);

// The row of an op, Horovod's: "<op>.<name>" ("allreduce.grad"), plus its
// process set when not the global one (two sets may use one name at once).
// Horovod's C++ layer prefixes every name with its op; ours negotiates the
// user's name as given (csrc/torch/adapter.cc, opName), and the Python
// helpers already pass Horovod's full names ("allreduce.<param>" from
// DistributedOptimizer, "broadcast.<name>" from broadcast_parameters), as do
// unnamed ops ("allreduce.noname.<n>", "grouped_allreduce.noname.<n>"). So a
// name that already starts with "<op>." or "grouped_<op>." (or is the op
// itself: "join") is not prefixed again; only a user's own name spelled
// "allreduce.x" for an allreduce differs from Horovod (which would show
// "allreduce.allreduce.x").
std::string timelineRow(int32_t process_set, OpType type, const std::string& name);
// Horovod's phase names: "ALLREDUCE", "NEGOTIATE_ALLREDUCE", "GLOO_ALLREDUCE".
std::string timelinePhase(OpType type, const char* prefix = "");

}  // namespace hvd
