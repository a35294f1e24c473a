#include "autotune.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "topology.h"

namespace hvd {

namespace {

double envDouble(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  double x = std::strtod(v, &end);
  if (end == v || *end != '\0' || x < 0) {
    throw std::invalid_argument(std::string(name) + "=" + v + ": expected a non-negative number");
  }
  return x;
}

bool isSet(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

// Completions without the anchor recurring after which one step is counted
// anyway (ops whose names never repeat).
constexpr size_t kStepFallback = 4096;

}  // namespace

AutotuneConfig AutotuneConfig::fromEnvironment() {
  AutotuneConfig c;
  c.enabled = envInt("HOROVOD_AUTOTUNE", 0) != 0;
  c.log_path = envString("HOROVOD_AUTOTUNE_LOG", "");
  c.warmup_samples = static_cast<int>(envInt("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", 3));
  c.steps_per_sample = static_cast<int>(envInt("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", 10));
  c.max_samples = static_cast<int>(envInt("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", 20));
  c.gaussian_process_noise = envDouble("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", 0.8);
  if (c.warmup_samples < 0 || c.steps_per_sample < 1 || c.max_samples < 1) {
    throw std::invalid_argument(
        "HOROVOD_AUTOTUNE_WARMUP_SAMPLES must be >= 0, HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE and "
        "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES >= 1");
  }
  c.fusion_fixed = isSet("HOROVOD_FUSION_THRESHOLD");
  c.inline_fixed = isSet("HVD_TORCH_INLINE_THRESHOLD");
  return c;
}

const std::vector<size_t>& Autotuner::fusionGrid() {
  static const std::vector<size_t> grid = {0, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 128 << 20};
  return grid;
}

const std::vector<size_t>& Autotuner::inlineGrid() {
  static const std::vector<size_t> grid = {0, 16 << 10, 128 << 10, 1 << 20, 4 << 20};
  return grid;
}

Autotuner::Autotuner(const AutotuneConfig& config, const Tunables& initial, std::string* error)
    : config_(config), current_(initial), best_(initial) {
  error->clear();
  if (!config_.log_path.empty()) {
    log_ = std::fopen(config_.log_path.c_str(), "w");
    if (log_ == nullptr) {
      *error = "cannot open HOROVOD_AUTOTUNE_LOG " + config_.log_path + ": " + std::strerror(errno);
    } else {
      std::fputs("trial,knob,fusion_threshold,inline_threshold,bytes_per_second\n", log_);
      std::fflush(log_);
    }
  }
  if (!config_.inline_fixed) knobs_.push_back({"inline_threshold", &Tunables::inline_threshold, inlineGrid()});
  if (!config_.fusion_fixed) knobs_.push_back({"fusion_threshold", &Tunables::fusion_threshold, fusionGrid()});
  warmup_steps_left_ = config_.warmup_samples * config_.steps_per_sample;
  if (knobs_.empty()) settle();  // every knob was set by the user
}

Autotuner::~Autotuner() {
  if (log_) std::fclose(log_);
}

bool Autotuner::completed(const std::string& name, size_t bytes, Clock::time_point now) {
  if (settled_) return false;
  if (name != anchor_ && seen_.insert(name).second && ++since_anchor_ < kStepFallback) {
    step_bytes_ += bytes;
    return false;
  }
  if (name != anchor_ && since_anchor_ < kStepFallback) {
    // A name came back before the anchor did: the anchor is not part of the
    // loop (the first op was a one-off, say a broadcast of the parameters).
    // Anchor on this one; the partial step is not counted.
    anchor_ = name;
    step_start_ = now;
    step_bytes_ = bytes;
    since_anchor_ = 0;
    seen_.clear();
    return false;
  }
  // A step ended; this op starts the next one.
  const Tunables before = current_;
  stepEnded(std::chrono::duration<double>(now - step_start_).count(), step_bytes_);
  step_start_ = now;
  step_bytes_ = bytes;
  since_anchor_ = 0;
  seen_.clear();
  return before.fusion_threshold != current_.fusion_threshold ||
         before.inline_threshold != current_.inline_threshold;
}

void Autotuner::stepEnded(double seconds, size_t bytes) {
  if (warmup_steps_left_ > 0) {
    if (--warmup_steps_left_ == 0) startTrial();
    return;
  }
  if (skip_steps_ > 0) {
    --skip_steps_;
    return;
  }
  step_rates_.push_back(seconds > 0 ? static_cast<double>(bytes) / seconds : 0.0);
  if (static_cast<int>(step_rates_.size()) >= config_.steps_per_sample) finishTrial();
}

bool Autotuner::startTrial() {
  if (warmup_steps_left_ > 0) return false;
  const Knob& k = knobs_[knob_];
  current_.*k.field = k.grid[candidate_];
  // The step in which the new values reach every rank mixes old and new.
  skip_steps_ = 1;
  step_rates_.clear();
  return true;
}

bool Autotuner::finishTrial() {
  std::vector<double> rates = step_rates_;
  std::nth_element(rates.begin(), rates.begin() + rates.size() / 2, rates.end());
  const double score = rates[rates.size() / 2];
  ++trials_;
  history_.push_back({current_, score});
  const Knob& k = knobs_[knob_];
  logRow(k.name, current_, score);
  if (score > knob_best_score_) {
    knob_best_score_ = score;
    knob_best_value_ = current_.*k.field;
  }
  if (score > best_score_) {
    best_score_ = score;
    best_ = current_;
  }
  const bool budget_left = trials_ < config_.max_samples;
  if (++candidate_ < k.grid.size() && budget_left) return startTrial();
  // This knob is done: keep its best value and move to the next one.
  current_.*k.field = knob_best_value_;
  ++knob_;
  candidate_ = 0;
  knob_best_score_ = -1;
  if (knob_ < knobs_.size() && budget_left) return startTrial();
  return settle();
}

bool Autotuner::settle() {
  settled_ = true;
  // The settled values' own score: the best trial that ran with them.
  double score = 0;
  for (const auto& [t, s] : history_) {
    if (t.fusion_threshold == current_.fusion_threshold &&
        t.inline_threshold == current_.inline_threshold)
      score = std::max(score, s);
  }
  logRow("", current_, score);
  if (log_) {
    std::fclose(log_);
    log_ = nullptr;
  }
  return true;
}

void Autotuner::logRow(const char* knob, const Tunables& t, double score) {
  if (log_ == nullptr) return;
  const std::string trial = settled_ ? "settled" : std::to_string(trials_);
  std::fprintf(log_, "%s,%s,%zu,%zu,%.0f\n", trial.c_str(), knob, t.fusion_threshold,
               t.inline_threshold, score);
  std::fflush(log_);
}

}  // namespace hvd
