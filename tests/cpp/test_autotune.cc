// The autotuner (csrc/core/autotune.h) against a synthetic cost model with a
// known best setting, on a fake clock: it scores every grid value of each
// free knob, keeps fixed knobs, logs each trial and settles on the best.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "check.h"
#include "core/autotune.h"

using namespace hvd;

namespace {

constexpr size_t kMiB = 1 << 20;

// Step time in microseconds for a step of 32 tensors: best at a fusion
// threshold of 16 MiB and an inline threshold of 128 KiB.
int64_t stepMicros(const Tunables& t) {
  int64_t us = 1000;
  us += t.fusion_threshold == 16 * kMiB ? 0 : 400;
  us += t.inline_threshold == (128 << 10) ? 0 : 300;
  return us;
}

struct Run {
  std::vector<Tunables> seen;  // the values in force at each step
  Tunables final;
  int changes = 0;
};

// Drives `steps` training steps: a one-off broadcast first, then 32 named
// ops per step, whose completion times follow the cost model.
Run drive(Autotuner& tuner, int steps) {
  Run run;
  auto now = Autotuner::Clock::time_point{};
  tuner.completed("broadcast.weights", 4096, now);
  for (int s = 0; s < steps; ++s) {
    const Tunables t = tuner.current();
    run.seen.push_back(t);
    const auto step = std::chrono::microseconds(stepMicros(t));
    for (int i = 0; i < 32; ++i) {
      now += step / 32;
      if (tuner.completed("grad." + std::to_string(i), 64 << 10, now)) ++run.changes;
    }
  }
  run.final = tuner.current();
  return run;
}

std::vector<std::string> lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(f, line);) out.push_back(line);
  return out;
}

// A log file of this process's own under TMPDIR, so the test runs from any
// directory (a sanitizer build's too) and never meets another run's file.
std::string logPath(const char* name) {
  const char* dir = std::getenv("TMPDIR");
  const std::string path = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") +
                           "/hvd_autotune_" + std::to_string(getpid()) + "_" + name;
  std::remove(path.c_str());
  return path;
}

AutotuneConfig config(const std::string& log) {
  AutotuneConfig c;
  c.enabled = true;
  c.log_path = log;
  c.warmup_samples = 1;
  c.steps_per_sample = 3;
  return c;
}

}  // namespace

TEST(settles_on_the_best_grid_point_of_each_knob) {
  const std::string log = logPath("both.csv");
  std::string error;
  Autotuner tuner(config(log), Tunables{}, &error);
  CHECK(error.empty());
  Run run = drive(tuner, 200);
  CHECK(tuner.settled());
  CHECK_EQ(run.final.fusion_threshold, 16 * kMiB);
  CHECK_EQ(run.final.inline_threshold, size_t{128 << 10});
  // Header, 5 inline trials, 6 fusion trials, the settled row.
  const auto rows = lines(log);
  CHECK_EQ(rows.size(), size_t{1 + 5 + 6 + 1});
  CHECK_EQ(rows.front(), std::string("trial,knob,fusion_threshold,inline_threshold,bytes_per_second"));
  CHECK_EQ(rows.back().rfind("settled,,16777216,131072,", 0), size_t{0});
  // After settling nothing moves.
  CHECK(run.seen.back().fusion_threshold == 16 * kMiB);
  std::remove(log.c_str());
}

TEST(a_fixed_knob_is_never_tried) {
  const std::string log = logPath("fixed.csv");
  AutotuneConfig c = config(log);
  c.inline_fixed = true;
  std::string error;
  Tunables start;
  start.inline_threshold = 0;
  Autotuner tuner(c, start, &error);
  Run run = drive(tuner, 200);
  CHECK(tuner.settled());
  CHECK_EQ(run.final.fusion_threshold, 16 * kMiB);
  for (const Tunables& t : run.seen) CHECK_EQ(t.inline_threshold, size_t{0});
  CHECK_EQ(lines(log).size(), size_t{1 + 6 + 1});
  std::remove(log.c_str());
}

TEST(the_trial_budget_bounds_the_search) {
  AutotuneConfig c = config("");
  c.max_samples = 2;
  std::string error;
  Autotuner tuner(c, Tunables{}, &error);
  drive(tuner, 200);
  CHECK(tuner.settled());
  // Two inline trials (0 and 16 KiB): the better of those, fusion untouched.
  CHECK_EQ(tuner.current().fusion_threshold, size_t{64 << 20});
}

TEST(every_knob_fixed_settles_at_once) {
  AutotuneConfig c = config("");
  c.inline_fixed = c.fusion_fixed = true;
  std::string error;
  Autotuner tuner(c, Tunables{}, &error);
  CHECK(tuner.settled());
}

int main() { return check::runAll(); }
