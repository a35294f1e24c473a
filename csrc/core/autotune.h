// Autotuning (HOROVOD_AUTOTUNE=1): rank 0 tries settings of the engine's
// knobs while the job trains, scores each by the bytes per second its
// collectives moved over a window of training steps, and settles on the best.
//
// The knobs are the Tunables: the fusion threshold (read by the coordinator
// when it fuses) and the inline threshold (read by every rank when it decides
// whether an allreduce's data goes to rank 0 with its request). Rank 0 owns
// the tuner and sends every change to the other ranks in a control frame
// ahead of the next responses (engine.cc, kTunables), so every rank uses the
// same values from the same point of the one response order. A knob the user
// set explicitly (HOROVOD_FUSION_THRESHOLD, HVD_TORCH_INLINE_THRESHOLD) is
// fixed, as in Horovod.
//
// Steps: the engine has no cycles, so a step is found from the ops
// themselves: a name (the anchor) completes once per step, so each time it
// completes again a step has ended. The anchor is the first name to come
// back: a training loop submits the same names each step, so this counts
// steps exactly after the first one or two; if names never repeat (unnamed
// ops), every 4096 completions count as one step.
//
// Search: coordinate search over a fixed grid per knob (inline threshold
// first, since while an op goes inline fusion never sees it, then the fusion
// threshold), each trial's score the median of its steps' bytes per second
// (robust to one slow step), at most max_samples trials; then it settles.
// Protocol and cost: docs/architecture.md, "Autotune".
//
// Threading: rank 0's, used only by the thread that holds the engine's baton
// (its background thread or a caller driving its op, engine.h: one at a time).
#pragma once

#include <chrono>
#include <cstdio>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace hvd {

struct Tunables {
  size_t fusion_threshold = 64 << 20;
  size_t inline_threshold = 1 << 20;
};

struct AutotuneConfig {
  bool enabled = false;             // HOROVOD_AUTOTUNE
  std::string log_path;             // HOROVOD_AUTOTUNE_LOG: CSV, one row per trial
  int warmup_samples = 3;           // HOROVOD_AUTOTUNE_WARMUP_SAMPLES: samples ignored first
  int steps_per_sample = 10;        // HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE: steps scored per trial
  int max_samples = 20;             // HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES: most trials
  double gaussian_process_noise = 0.8;  // HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE: unused
  bool fusion_fixed = false;        // HOROVOD_FUSION_THRESHOLD is set
  bool inline_fixed = false;        // HVD_TORCH_INLINE_THRESHOLD is set

  // Throws std::invalid_argument naming the variable when a value is malformed.
  static AutotuneConfig fromEnvironment();
};

class Autotuner {
 public:
  using Clock = std::chrono::steady_clock;

  // Returns an error message in *error (empty on success) if the log cannot
  // be opened; the tuner then runs without a log.
  Autotuner(const AutotuneConfig& config, const Tunables& initial, std::string* error);
  ~Autotuner();
  Autotuner(const Autotuner&) = delete;
  Autotuner& operator=(const Autotuner&) = delete;

  // An op named `name` moving `bytes` completed on rank 0 at `now`. Returns
  // true when current() changed (the engine then applies and sends it).
  bool completed(const std::string& name, size_t bytes, Clock::time_point now);

  const Tunables& current() const { return current_; }
  bool settled() const { return settled_; }

  // The grids searched (exposed for tests and docs).
  static const std::vector<size_t>& fusionGrid();
  static const std::vector<size_t>& inlineGrid();

 private:
  struct Knob {
    const char* name;
    size_t Tunables::*field;
    std::vector<size_t> grid;
  };
  void stepEnded(double seconds, size_t bytes);
  bool startTrial();
  bool finishTrial();
  bool settle();
  void logRow(const char* knob, const Tunables& t, double score);

  AutotuneConfig config_;
  Tunables current_;
  Tunables best_;  // the best trial seen (reported; the search keeps per-knob bests)
  double best_score_ = -1;
  std::vector<std::pair<Tunables, double>> history_;  // every trial and its score
  bool settled_ = false;
  std::FILE* log_ = nullptr;
  int trials_ = 0;

  std::vector<Knob> knobs_;
  size_t knob_ = 0;       // the knob being searched
  size_t candidate_ = 0;  // its grid index on trial
  double knob_best_score_ = -1;
  size_t knob_best_value_ = 0;

  // Step detection and the current trial's measurements.
  std::string anchor_;
  std::unordered_set<std::string> seen_;  // names completed since the anchor
  Clock::time_point step_start_{};
  size_t step_bytes_ = 0;
  size_t since_anchor_ = 0;
  int warmup_steps_left_ = 0;
  int skip_steps_ = 0;  // the first step of a trial straddles the change
  std::vector<double> step_rates_;
};

}  // namespace hvd
